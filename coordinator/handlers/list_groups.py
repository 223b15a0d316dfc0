"""ListGroups (16), v0-5: StatesFilter (v4+), TypesFilter (v5+).

See docs/groups.md, "DescribeGroups and ListGroups".
"""

from __future__ import annotations

from typing import Any

from ..broker import RequestContext

API_KEY = 16


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    result = await ctx.broker.groups.list_groups(
        getattr(request, "states_filter", ()) or (), getattr(request, "types_filter", ()) or ()
    )
    return {
        "throttle_time": 0,
        "error_code": result.error,
        "groups": [
            {
                "group_id": g.group_id,
                "protocol_type": g.protocol_type,
                "group_state": g.state,
                "group_type": g.group_type,
            }
            for g in result.groups
        ],
    }
