"""FindCoordinator (10), v0-6: the node coordinating a group (key type 0) or a transactional id
(key type 1): the leader of its ``__consumer_offsets`` / ``__transaction_state`` partition
(docs/cluster.md; with one broker, always this one).

Like Kafka, the ``__consumer_offsets`` (``__transaction_state``) topic is created on first use
and that first answer is COORDINATOR_NOT_AVAILABLE (``KafkaApis.getCoordinator``).  Kafka does not validate the key here
(an empty group id has a coordinator too; the group APIs answer INVALID_GROUP_ID).
"""

from __future__ import annotations

from typing import Any

from rallypoint.protocol.errors import ErrorCode
from rallypoint.protocol.offsets_schema import partition_for

from ..broker import RequestContext
from ..logger import get as get_logger
from ..topics.store import OFFSETS_TOPIC, TRANSACTION_TOPIC

API_KEY = 10

log = get_logger("rallypoint.find_coordinator")

KEY_TYPE_GROUP = 0
KEY_TYPE_TRANSACTION = 1
KEY_TYPE_SHARE = 2

# Errors.java default messages (used in v0-3 answers and for a bad key type).
_MESSAGES = {
    ErrorCode.NONE: "NONE",
    ErrorCode.COORDINATOR_NOT_AVAILABLE: "The coordinator is not available.",
    ErrorCode.INVALID_REQUEST: "This most likely occurs because of a request being malformed by the client "
    "library or the message was sent to an incompatible broker. See the broker logs for more details.",
}


def _offsets_topic_ready(ctx: RequestContext) -> bool:
    """Whether ``__consumer_offsets`` exists; if not, create it (Kafka asks the controller to
    and answers COORDINATOR_NOT_AVAILABLE to every group key of this request)."""
    broker = ctx.broker
    if broker.topics.get(OFFSETS_TOPIC) is not None:
        return True
    try:
        broker.topics.create(OFFSETS_TOPIC, broker.groups.config.num_partitions, is_internal=True)
    except OSError as e:  # its metadata cannot be saved (a full disk): still not available
        log.warning("offsets topic not created", error=str(e))
    return False


def _transaction_topic_ready(ctx: RequestContext) -> bool:
    """Whether ``__transaction_state`` exists; if not, create it and answer
    COORDINATOR_NOT_AVAILABLE this time, as Kafka does."""
    broker = ctx.broker
    if broker.topics.get(TRANSACTION_TOPIC) is not None:
        return True
    try:
        broker.topics.create(TRANSACTION_TOPIC, broker.config["transaction.state.log.num.partitions"], is_internal=True)
    except OSError as e:
        log.warning("transaction topic not created", error=str(e))
    return False


def _node_of(ctx: RequestContext, key_type: int, key: str) -> tuple[int, str, int] | None:
    """(node, host, port) coordinating ``key``: the leader of its ``__consumer_offsets`` or
    ``__transaction_state`` partition (docs/cluster.md); None when that partition has none."""
    broker = ctx.broker
    cluster = broker.cluster
    if cluster.single:
        return broker.node_id, broker.advertised_host, broker.advertised_port
    if key_type == KEY_TYPE_GROUP:
        node = cluster.group_coordinator(broker.groups.partition_for(key))
    else:
        # TransactionStateManager.partitionFor: the same hash as groups', over its own partitions
        node = cluster.txn_coordinator(partition_for(key, broker.config["transaction.state.log.num.partitions"]))
    ep = cluster.endpoint(node) if node is not None else None
    return None if node is None or ep is None else (node, ep[0], ep[1])


def _coordinator(key_type: int, topic_ready: bool) -> ErrorCode:
    if key_type in (KEY_TYPE_GROUP, KEY_TYPE_TRANSACTION):
        return ErrorCode.NONE if topic_ready else ErrorCode.COORDINATOR_NOT_AVAILABLE
    # Share groups (2): Kafka answers INVALID_REQUEST below v6 and when no share coordinator
    # runs; unknown key types fail as an invalid request.
    return ErrorCode.INVALID_REQUEST


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    version = ctx.api_version
    key_type = int(getattr(request, "key_type", KEY_TYPE_GROUP))
    known_type = key_type in (KEY_TYPE_GROUP, KEY_TYPE_TRANSACTION, KEY_TYPE_SHARE)
    if key_type == KEY_TYPE_GROUP:
        ready = _offsets_topic_ready(ctx)
    elif key_type == KEY_TYPE_TRANSACTION:
        ready = _transaction_topic_ready(ctx)
    else:
        ready = False
    if version >= 4:
        coordinators = []
        for key in request.coordinator_keys:
            err = _coordinator(key_type, ready)
            node = _node_of(ctx, key_type, key) if err == ErrorCode.NONE else None
            if err == ErrorCode.NONE and node is None:
                err = ErrorCode.COORDINATOR_NOT_AVAILABLE
            coordinators.append(
                {
                    "key": key,
                    "node_id": node[0] if node else -1,
                    "host": node[1] if node else "",
                    "port": node[2] if node else -1,
                    "error_code": err,
                    # per-key errors carry no message, except a request-level failure
                    "error_message": None if known_type else _MESSAGES[err],
                }
            )
        return {"throttle_time": 0, "coordinators": coordinators}
    err = _coordinator(key_type, ready)
    node = _node_of(ctx, key_type, request.key) if err == ErrorCode.NONE else None
    if err == ErrorCode.NONE and node is None:
        err = ErrorCode.COORDINATOR_NOT_AVAILABLE
    return {
        "throttle_time": 0,
        "error_code": err,
        "error_message": _MESSAGES[err],
        "node_id": node[0] if node else -1,
        "host": node[1] if node else "",
        "port": node[2] if node else -1,
    }
