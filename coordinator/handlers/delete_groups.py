"""DeleteGroups (42), v0-2 (docs/groups.md, "DeleteGroups"): only Empty groups; tombstones before the
answer."""

from __future__ import annotations

from typing import Any

from ..broker import RequestContext

API_KEY = 42


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    result = await ctx.broker.groups.delete_groups(request.groups_names)
    return {
        "throttle_time": 0,
        "results": [{"group_id": gid, "error_code": err} for gid, err in result.results],
    }
