"""DeleteGroups (42), v0-2 (docs/groups.md, "DeleteGroups"): only Empty groups; tombstones before the
answer."""

from __future__ import annotations

from typing import Any

from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext

API_KEY = 42


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    consumer = ctx.broker.consumer_groups
    share = ctx.broker.share_groups
    own: dict[str, ErrorCode] = {}
    for gid in request.groups_names:
        if consumer.is_consumer_group(gid):  # docs/consumer-groups.md, "Deleting"
            own[gid] = await consumer.delete_group(gid)
        elif share.machine.is_share_group(gid):  # docs/share-groups.md, "Describe and list"
            own[gid] = await share.delete_group(gid)
    result = await ctx.broker.groups.delete_groups(
        [g for g in request.groups_names if g not in own or own[g] == ErrorCode.NONE]
    )
    classic = dict(result.results)
    results = []
    for gid in request.groups_names:
        err = own.get(gid, classic.get(gid, ErrorCode.NONE))
        if gid in own and own[gid] == ErrorCode.NONE:
            err = ErrorCode.NONE  # its offsets-only classic entry may or may not have existed
        results.append({"group_id": gid, "error_code": err})
    return {"throttle_time": 0, "results": results}
