"""OffsetFetch (9), v1-9 (docs/groups.md, "OffsetFetch"): v2 null topics = all, v7 RequireStable,
v8 many groups.

v0 (ZooKeeper) is rejected by KRaft brokers and is not in the codec; v10 (topic ids) is not
served.  v9's MemberId/MemberEpoch only matter for KIP-848 groups, which we do not have.
"""

from __future__ import annotations

from typing import Any

from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext
from ..groups.events import OffsetFetchGroupRequest, OffsetFetchGroupResult, OffsetFetchRequest, OffsetFetchResult

API_KEY = 9


def _check_consumer_members(ctx: Any, request: Any, result: OffsetFetchResult) -> OffsetFetchResult:
    """OffsetFetch v9 member check for consumer groups (docs/consumer-groups.md, "Offsets")."""
    machine = ctx.broker.consumer_groups.machine
    checks = {
        g.group_id: machine.validate_offset_fetch(
            g.group_id, getattr(g, "member_id", None), getattr(g, "member_epoch", -1)
        )
        for g in request.groups
    }
    out = []
    for g in result.groups:
        err = checks.get(g.group_id)
        out.append(g if err is None or err == ErrorCode.NONE else OffsetFetchGroupResult(g.group_id, err))
    return OffsetFetchResult(tuple(out))


def _topics(topics: Any) -> tuple[tuple[str, tuple[int, ...]], ...] | None:
    if topics is None:
        return None
    return tuple((t.name, tuple(int(p) for p in t.partition_indexes)) for t in topics)


def _partition(p: Any) -> dict[str, Any]:
    return {
        "partition_index": p.partition,
        "committed_offset": p.offset,
        "committed_leader_epoch": p.leader_epoch,
        "metadata": p.metadata,
        "error_code": p.error,
    }


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    version = ctx.api_version
    require_stable = bool(getattr(request, "require_stable", False))
    if version >= 8:
        groups = tuple(OffsetFetchGroupRequest(g.group_id, _topics(g.topics)) for g in request.groups)
    else:
        groups = (OffsetFetchGroupRequest(request.group_id, _topics(request.topics)),)
    result = await ctx.broker.groups.fetch_offsets(OffsetFetchRequest(groups, require_stable))
    if version >= 9:
        result = _check_consumer_members(ctx, request, result)
    if version >= 8:
        return {
            "throttle_time": 0,
            "groups": [
                {
                    "group_id": g.group_id,
                    "error_code": g.error,
                    "topics": [{"name": t.name, "partitions": [_partition(p) for p in t.partitions]} for t in g.topics],
                }
                for g in result.groups
            ],
        }
    (g,) = result.groups
    if version < 2 and g.error != ErrorCode.NONE:
        # No top-level error before v2: the group error goes on every requested partition
        # (OffsetFetchResponse; Kafka's Scala coordinator built them from the request).
        topics = [
            {
                "name": name,
                "partitions": [
                    {
                        "partition_index": p,
                        "committed_offset": -1,
                        "committed_leader_epoch": -1,
                        "metadata": "",
                        "error_code": g.error,
                    }
                    for p in parts
                ],
            }
            for name, parts in groups[0].topics or ()
        ]
        return {"throttle_time": 0, "topics": topics}
    return {
        "throttle_time": 0,
        "error_code": g.error,
        "topics": [{"name": t.name, "partitions": [_partition(p) for p in t.partitions]} for t in g.topics],
    }
