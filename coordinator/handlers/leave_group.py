"""LeaveGroup (13), v0-5 (docs/groups.md, "LeaveGroup")."""

from __future__ import annotations

from typing import Any

from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext
from ..groups.events import LeaveMember, LeaveRequest

API_KEY = 13


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    version = ctx.api_version
    if version < 3:
        # LeaveGroupRequest.normalizedData: one member
        members: tuple[LeaveMember, ...] = (LeaveMember(request.member_id),)
    else:
        members = tuple(
            LeaveMember(m.member_id, m.group_instance_id, getattr(m, "reason", None)) for m in request.members
        )
    req = LeaveRequest(request.group_id, members)
    consumer = ctx.broker.consumer_groups  # docs/consumer-groups.md, "Classic members"
    rt = consumer if consumer.is_consumer_group(req.group_id) else ctx.broker.groups
    result = await rt.leave(req)
    if version < 3:
        # LeaveGroupResponse.getError: the top-level error, else the first member error.
        error = result.error
        if error == ErrorCode.NONE:
            error = next((m.error for m in result.members if m.error != ErrorCode.NONE), ErrorCode.NONE)
        return {"throttle_time": 0, "error_code": error}
    return {
        "throttle_time": 0,
        "error_code": result.error,
        "members": [
            {"member_id": m.member_id, "group_instance_id": m.group_instance_id, "error_code": m.error}
            for m in result.members
        ],
    }
