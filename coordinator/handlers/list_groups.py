"""ListGroups (16), v0-5: StatesFilter (v4+), TypesFilter (v5+).

See docs/groups.md, "DescribeGroups and ListGroups".
"""

from __future__ import annotations

from typing import Any

from rallypoint.protocol.errors import ErrorCode
from rallypoint.protocol.offsets_schema import partition_for

from ..broker import RequestContext

API_KEY = 16


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    states = getattr(request, "states_filter", ()) or ()
    types = getattr(request, "types_filter", ()) or ()
    result = await ctx.broker.groups.list_groups(states, types)
    # consumer groups (docs/consumer-groups.md, "Describe and list"); their ids hide the
    # offsets-only classic entry their commits are stored under
    consumer = ctx.broker.consumer_groups.list_groups(states, types) if result.error == ErrorCode.NONE else []
    # share groups (docs/share-groups.md, "Describe and list")
    if result.error == ErrorCode.NONE:
        consumer += ctx.broker.share_groups.machine.list_groups(states, types)
    ids = {g.group_id for g in consumer}
    listed = [*(g for g in result.groups if g.group_id not in ids), *consumer]
    cluster = ctx.broker.cluster
    if not cluster.single:  # a node lists the groups it coordinates (docs/cluster.md)
        n = ctx.broker.groups.config.num_partitions
        listed = [g for g in listed if cluster.group_coordinator(partition_for(g.group_id, n)) == ctx.node_id]
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
            for g in listed
        ],
    }
