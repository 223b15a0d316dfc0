"""SyncGroup (14), v0-5 (docs/groups.md, "SyncGroup")."""

from __future__ import annotations

from typing import Any

from ..broker import RequestContext
from ..groups.events import SyncRequest

API_KEY = 14


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    req = SyncRequest(
        group_id=request.group_id,
        generation_id=request.generation_id,
        member_id=request.member_id,
        group_instance_id=getattr(request, "group_instance_id", None),
        protocol_type=getattr(request, "protocol_type", None),
        protocol_name=getattr(request, "protocol_name", None),
        assignments=tuple((a.member_id, bytes(a.assignment)) for a in request.assignments),
        api_version=ctx.api_version,
    )
    consumer = ctx.broker.consumer_groups  # docs/consumer-groups.md, "Classic members"
    rt = consumer if consumer.is_consumer_group(req.group_id) else ctx.broker.groups
    result = await rt.sync(req)
    return {
        "throttle_time": 0,
        "error_code": result.error,
        "protocol_type": result.protocol_type,
        "protocol_name": result.protocol_name,
        "assignment": result.assignment,
    }
