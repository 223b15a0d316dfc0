"""ShareFetch (78), v1: acquire records for a share-group member, with acknowledgements
piggy-backed (docs/share-groups.md, "Share sessions" and "Acquisition").

v1 is what librdkafka 2.16 sends (v2 adds the acquire mode and RENEW, which it never uses).
"""

from __future__ import annotations

from typing import Any

from rallypoint.protocol.codec import ms
from rallypoint.protocol.errors import ErrorCode

from ._share_common import ZERO_UUID, acks_of, node_endpoints, topic_responses

API_KEY = 78


async def handle(ctx: Any, request: Any) -> dict[str, Any]:
    if not request.group_id or not request.member_id:
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.INVALID_REQUEST,
            "error_message": "GroupId and MemberId must be set",
            "acquisition_lock_timeout": 0,
            "responses": [],
            "node_endpoints": [],
        }
    partitions = list(
        dict.fromkeys((t.topic_id or ZERO_UUID, int(p.partition_index)) for t in request.topics for p in t.partitions)
    )
    forgotten = [(t.topic_id or ZERO_UUID, int(p)) for t in request.forgotten_topics_data for p in t.partitions]
    answer = await ctx.broker.share_groups.fetch(
        request.group_id,
        request.member_id,
        int(request.share_session_epoch),
        ctx.connection_id,
        partitions=partitions,
        forgotten=forgotten,
        acks=acks_of(request.topics),
        max_wait_ms=ms(request.max_wait),
        min_bytes=int(request.min_bytes),
        max_bytes=int(request.max_bytes),
        max_records=int(request.max_records),
    )
    return {
        "throttle_time": 0,
        "error_code": answer.error,
        "error_message": answer.error_message,
        "acquisition_lock_timeout": answer.lock_timeout_ms,
        "responses": topic_responses(ctx, answer, fetch=True) if answer.error == ErrorCode.NONE else [],
        "node_endpoints": node_endpoints(ctx),
    }
