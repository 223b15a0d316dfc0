"""OffsetDelete (47), v0 (docs/groups.md, "OffsetDelete")."""

from __future__ import annotations

from typing import Any

from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext
from ..groups.events import OffsetDeleteRequest
from ._groups_common import TopicErrorsBuilder, partition_exists

API_KEY = 47


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    out = TopicErrorsBuilder()
    valid: list[tuple[str, tuple[int, ...]]] = []
    for t in request.topics:
        if ctx.broker.topics.get(t.name) is None:
            for p in t.partitions:
                out.add(t.name, p.partition_index, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
            continue
        parts = []
        for p in t.partitions:
            if partition_exists(ctx, t.name, p.partition_index):
                parts.append(p.partition_index)
            else:
                out.add(t.name, p.partition_index, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        if parts:
            valid.append((t.name, tuple(parts)))
    # Unlike OffsetCommit, Kafka asks the coordinator even with nothing valid left.
    result = await ctx.broker.groups.delete_offsets(OffsetDeleteRequest(request.group_id, tuple(valid)))
    if result.error != ErrorCode.NONE:
        # OffsetDeleteResponse.Builder.merge: a top-level error replaces everything.
        return {"throttle_time": 0, "error_code": result.error, "topics": []}
    out.merge(result.topics)
    return {"throttle_time": 0, "error_code": ErrorCode.NONE, "topics": out.as_list()}
