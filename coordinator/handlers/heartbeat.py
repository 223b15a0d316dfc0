"""Heartbeat (12), v0-4 (docs/groups.md, "Heartbeat and sessions")."""

from __future__ import annotations

from typing import Any

from ..broker import RequestContext
from ..groups.events import HeartbeatRequest

API_KEY = 12


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    req = HeartbeatRequest(
        request.group_id,
        request.generation_id,
        request.member_id,
        getattr(request, "group_instance_id", None),
    )
    consumer = ctx.broker.consumer_groups  # docs/consumer-groups.md, "Classic members"
    if consumer.is_consumer_group(req.group_id):
        result = await consumer.classic_heartbeat(req)
    else:
        result = await ctx.broker.groups.heartbeat(req)
    return {"throttle_time": 0, "error_code": result.error}
