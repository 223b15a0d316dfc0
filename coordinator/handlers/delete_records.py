"""DeleteRecords (21), v0-2 (docs/configs.md, "DeleteRecords").

As ``ReplicaManager.deleteRecords`` and ``Partition.deleteRecordsOnLeader``: each partition's log
start offset moves up to the given offset (-1: the high watermark) and never back; the answer
is the partition's low watermark after it.  An offset above the high watermark, or negative
other than -1, is OFFSET_OUT_OF_RANGE; an unknown topic or partition
UNKNOWN_TOPIC_OR_PARTITION; an internal topic INVALID_TOPIC_EXCEPTION (low watermark -1 with
every error).  Fetch below the new start answers OFFSET_OUT_OF_RANGE and ListOffsets EARLIEST
returns it.
"""

from __future__ import annotations

from typing import Any, Final

from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext
from ..topics.store import INTERNAL_TOPICS
from ._leadership import not_leader

API_KEY = 21

HIGH_WATERMARK: Final = -1
INVALID_LOW_WATERMARK: Final = -1


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    store = ctx.broker.topics
    topics = []
    for t in request.topics:
        topic = store.get(t.name)
        partitions = []
        for p in t.partitions:
            code, low = ErrorCode.NONE, INVALID_LOW_WATERMARK
            log = topic.partition(p.partition_index) if topic is not None else None
            if t.name in INTERNAL_TOPICS:
                code = ErrorCode.INVALID_TOPIC_EXCEPTION
            elif log is None:
                code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif (elsewhere := not_leader(ctx, t.name, p.partition_index)) is not None:
                code = elsewhere  # docs/cluster.md
            else:
                offset = log.high_watermark if p.offset == HIGH_WATERMARK else int(p.offset)
                if offset < 0 or offset > log.high_watermark:
                    code = ErrorCode.OFFSET_OUT_OF_RANGE
                else:
                    low = log.delete_records_before(offset)
            partitions.append({"partition_index": p.partition_index, "low_watermark": low, "error_code": code})
        topics.append({"name": t.name, "partitions": partitions})
    await store.save_log_starts_async()  # durable data: the new log starts survive a crash
    return {"throttle_time": 0, "topics": topics}
