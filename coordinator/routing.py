"""Which node answers a coordinator request (docs/cluster.md, "Coordinators").

With several nodes, a group request sent to a node that does not coordinate the group gets
NOT_COORDINATOR, and a transaction request sent to a node that does not coordinate the
transactional id gets NOT_COORDINATOR, exactly shaped as Kafka's ``getErrorResponse`` shapes it
(the whole request for one group or id; only the foreign entries of a request naming several
groups, such as DescribeGroups or OffsetFetch v8+, the others answered as usual).  The client
then asks FindCoordinator again, as it does against Kafka.

:func:`guarded` wraps the handler table once at start-up when there is more than one node;
with one node nothing is wrapped.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

from rallypoint.protocol.errors import ErrorCode
from rallypoint.protocol.offsets_schema import partition_for

from .broker import Broker, CloseConnection, RequestContext
from .control import shapes

Handler = Callable[[RequestContext, Any], Awaitable[Any]]

# APIs whose request names groups (at the top or entry by entry) and is for their coordinator
GROUP_APIS: Final = frozenset({8, 9, 11, 12, 13, 14, 15, 28, 42, 47, 68, 69, 76, 77})
# APIs about a transactional id (InitProducerId only when it names one)
TXN_APIS: Final = frozenset({22, 24, 25, 26, 65})


def _group_node(broker: Broker, group_id: str) -> int | None:
    return broker.cluster.group_coordinator(partition_for(group_id, broker.groups.config.num_partitions))


def _loading(broker: Broker, group_id: str) -> bool:
    return bool(broker.moves.loading) and partition_for(group_id, broker.groups.config.num_partitions) in (
        broker.moves.loading
    )


def _txn_node(broker: Broker, transactional_id: str) -> int | None:
    return broker.cluster.txn_coordinator(
        partition_for(transactional_id, broker.config["transaction.state.log.num.partitions"])
    )


def _txn_ids(api_key: int, request: Any) -> tuple[str | None, tuple[str, ...]]:
    top = getattr(request, "transactional_id", None)
    if api_key == 24 and getattr(request, "transactions", None):  # AddPartitionsToTxn v4+: a batch
        return None, tuple(t.transactional_id for t in request.transactions)
    if api_key == 65:
        return None, tuple(request.transactional_ids)
    return (top if isinstance(top, str) else None), ()


def guarded(handlers: Mapping[int, Handler], broker: Broker) -> dict[int, Handler]:
    """The handler table with coordinator checks in front of the group and transaction APIs."""
    if broker.cluster.single:
        return dict(handlers)
    out = dict(handlers)
    for key in GROUP_APIS | TXN_APIS:
        if key in out:
            out[key] = _guard(key, out[key])
    return out


def _guard(api_key: int, handler: Handler) -> Handler:
    is_group = api_key in GROUP_APIS

    async def checked(ctx: RequestContext, request: Any) -> Any:
        broker = ctx.broker
        node_of: Callable[[Broker, str], int | None]
        if is_group:
            top, listed = shapes.groups_named(api_key, request)
            node_of = _group_node
        else:
            top, listed = _txn_ids(api_key, request)
            node_of = _txn_node
        here = ctx.node_id
        if top is not None:
            if node_of(broker, top) != here:
                return _not_coordinator(ctx, request, None)
            if is_group and _loading(broker, top):
                # GroupCoordinatorService.heartbeat answers a loading group's Heartbeat NONE
                code = ErrorCode.NONE if api_key == 12 else ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
                return _error(ctx, request, code, None)
            return await handler(ctx, request)
        foreign = frozenset(g for g in listed if node_of(broker, g) != here)
        if not foreign:
            return await handler(ctx, request)
        if len(foreign) == len(set(listed)) or not is_group:
            # every entry is another node's (or a transaction batch: Kafka answers per id, but
            # the clients send one coordinator's ids per request)
            return _not_coordinator(ctx, request, None)
        return await _partial(ctx, request, handler, shapes.Target(groups=foreign))

    return checked


def _not_coordinator(ctx: RequestContext, request: Any, target: shapes.Target | None) -> Any:
    return _error(ctx, request, ErrorCode.NOT_COORDINATOR, target)


def _error(ctx: RequestContext, request: Any, code: ErrorCode, target: shapes.Target | None) -> Any:
    return shapes.error_body(ctx.api_key, ctx.api_version, request, int(code), target, _namer(ctx))


async def _partial(ctx: RequestContext, request: Any, handler: Handler, target: shapes.Target) -> Any:
    namer = _namer(ctx)
    pruned, kept = shapes.prune(request, target, namer)
    errors = shapes.error_body(ctx.api_key, ctx.api_version, request, int(ErrorCode.NOT_COORDINATOR), target, namer)
    if kept == 0:
        return errors
    real = await handler(ctx, pruned)
    if real is None:
        raise CloseConnection("no answer to a partly foreign request")
    key, version = ctx.api_key, ctx.api_version
    return shapes.merge(shapes.as_message(key, version, real), shapes.as_message(key, version, errors))


def _namer(ctx: RequestContext) -> shapes.TopicNamer:
    def name(topic_id: Any) -> str | None:
        t = ctx.broker.topics.by_id(topic_id)
        return None if t is None else t.name

    return name
