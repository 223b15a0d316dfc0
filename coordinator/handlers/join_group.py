"""JoinGroup (11), v0-9 (docs/groups.md, "JoinGroup")."""

from __future__ import annotations

from typing import Any

from rallypoint.protocol.codec import ms
from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext
from ..groups.events import JoinRequest, JoinResult, Protocol
from ._groups_common import SHARED_BYTES_MAX, client_host, shared

API_KEY = 11


def _protocols(protocols: Any) -> tuple[Protocol, ...]:
    """The member's protocols, one shared tuple for members that offer the same small ones."""
    out = tuple(Protocol(shared(p.name), bytes(p.metadata)) for p in protocols)
    size = sum(len(p.name) + len(p.metadata) for p in out)
    return shared(out) if size <= SHARED_BYTES_MAX else out


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    version = ctx.api_version
    session = ms(request.session_timeout)
    # v0 has no rebalance timeout: Kafka uses the session timeout (maybeOverrideRebalanceTimeout).
    rebalance = ms(request.rebalance_timeout) if version >= 1 else session
    # what a member keeps is shared between members where equal (memory per member)
    req = JoinRequest(
        group_id=request.group_id,
        member_id=request.member_id,
        group_instance_id=getattr(request, "group_instance_id", None),
        session_timeout_ms=shared(session),
        rebalance_timeout_ms=shared(rebalance),
        protocol_type=shared(request.protocol_type),
        protocols=_protocols(request.protocols),
        client_id=shared(ctx.client_id or ""),
        client_host=client_host(ctx),
        api_version=version,
        reason=getattr(request, "reason", None),
    )
    # a classic member of a consumer group (docs/consumer-groups.md, "Classic members")
    consumer = ctx.broker.consumer_groups
    result = await consumer.join(req) if consumer.is_consumer_group(req.group_id) else None
    if result is None and ctx.broker.share_groups.machine.is_share_group(req.group_id):
        # a share group's id: GroupMetadataManager.classicGroupJoin answers this
        result = JoinResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
    if result is None:
        result = await ctx.broker.groups.join(req)
    protocol_name = result.protocol_name
    # JoinGroupResponse: before v7 a null protocol name is sent as ""; from v7 "" becomes null.
    if version < 7 and protocol_name is None:
        protocol_name = ""
    elif version >= 7 and protocol_name == "":
        protocol_name = None
    return {
        "throttle_time": 0,
        "error_code": result.error,
        "generation_id": result.generation_id,
        "protocol_type": result.protocol_type,
        "protocol_name": protocol_name,
        "leader": result.leader,
        "skip_assignment": result.skip_assignment,
        "member_id": result.member_id,
        "members": [
            {"member_id": m.member_id, "group_instance_id": m.group_instance_id, "metadata": m.metadata}
            for m in result.members
        ],
    }
