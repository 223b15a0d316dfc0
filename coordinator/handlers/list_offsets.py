"""ListOffsets (2): earliest, latest, by timestamp, max timestamp (v7+).

After ReplicaManager.fetchOffset, Partition.fetchOffsetForTimestamp and
UnifiedLog.fetchOffsetByTimestamp, for a topic without tiered storage:

* a partition listed twice → INVALID_REQUEST; a special timestamp the version does not know
  (-3 before v7, -4 before v8, -5 before v9, -6 before v11, other negatives) → UNSUPPORTED_VERSION;
* -1 latest → high watermark (read_committed, v2+: the last stable offset), leader epoch 0;
* -2 earliest and -4 earliest-local → log start offset;
* -5 latest-tiered and -6 earliest-pending-upload → offset -1 (nothing is tiered);
* -3 → the record with the largest timestamp; t ≥ 0 → the first record with timestamp ≥ t
  (not found: offset -1, timestamp -1).  Only the one batch that holds the answer is walked
  (decompressed if need be, bounded like Produce by ``rallypoint.max.uncompressed.batch.bytes``).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext
from ..topics.partition import LEADER_EPOCH
from ._leadership import not_leader

API_KEY = 2

LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3
EARLIEST_LOCAL = -4
LATEST_TIERED = -5
EARLIEST_PENDING_UPLOAD = -6

# ReplicaManager.timestampMinSupportedVersion
_MIN_VERSION = {
    EARLIEST: 1,
    LATEST: 1,
    MAX_TIMESTAMP: 7,
    EARLIEST_LOCAL: 8,
    LATEST_TIERED: 9,
    EARLIEST_PENDING_UPLOAD: 11,
}


def _answer(index: int, code: ErrorCode, timestamp: int = -1, offset: int = -1, epoch: int = -1) -> dict[str, Any]:
    return {
        "partition_index": index,
        "error_code": code,
        "timestamp": timestamp,
        "offset": offset,
        "leader_epoch": epoch,
    }


def _lookup(plog: Any, ts: int, max_uncompressed: int, read_committed: bool = False) -> dict[str, Any]:
    idx = plog.partition
    if ts == LATEST:
        # read_committed (v2+ isolation level 1): the last stable offset
        end = plog.last_stable_offset if read_committed else plog.high_watermark
        return _answer(idx, ErrorCode.NONE, -1, end, LEADER_EPOCH)
    if ts in (EARLIEST, EARLIEST_LOCAL):
        return _answer(idx, ErrorCode.NONE, -1, plog.log_start_offset, LEADER_EPOCH if plog.has_epoch() else -1)
    if ts in (LATEST_TIERED, EARLIEST_PENDING_UPLOAD):
        return _answer(idx, ErrorCode.NONE, -1, -1, -1)
    found = plog.max_timestamp_offset() if ts == MAX_TIMESTAMP else plog.offset_for_timestamp(ts, max_uncompressed)
    if found is None:
        return _answer(idx, ErrorCode.NONE)
    found_ts, offset = found
    return _answer(idx, ErrorCode.NONE, found_ts, offset, LEADER_EPOCH)


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    store = ctx.broker.topics
    version = ctx.api_version
    max_uncompressed = int(ctx.broker.config["rallypoint.max.uncompressed.batch.bytes"])
    counts = Counter((t.name, int(p.partition_index)) for t in request.topics for p in t.partitions)
    read_committed = int(getattr(request, "isolation_level", 0)) == 1
    topics: list[dict[str, Any]] = []
    for t in request.topics:
        topic = store.get(t.name)
        parts: list[dict[str, Any]] = []
        for p in t.partitions:
            idx = int(p.partition_index)
            ts = int(p.timestamp)
            if counts[(t.name, idx)] > 1:
                parts.append(_answer(idx, ErrorCode.INVALID_REQUEST))
                continue
            if ts < 0 and version < _MIN_VERSION.get(ts, 2**15):
                parts.append(_answer(idx, ErrorCode.UNSUPPORTED_VERSION))
                continue
            plog = topic.partition(idx) if topic is not None else None
            if plog is None:
                parts.append(_answer(idx, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
                continue
            elsewhere = not_leader(ctx, t.name, idx)  # docs/cluster.md
            if elsewhere is not None:
                parts.append(_answer(idx, elsewhere))
                continue
            cle = int(getattr(p, "current_leader_epoch", -1))
            if cle >= 0 and cle != LEADER_EPOCH:
                code = ErrorCode.UNKNOWN_LEADER_EPOCH if cle > LEADER_EPOCH else ErrorCode.FENCED_LEADER_EPOCH
                parts.append(_answer(idx, code))
                continue
            parts.append(_lookup(plog, ts, max_uncompressed, read_committed))
        topics.append({"name": t.name, "partitions": parts})
    return {"throttle_time": 0, "topics": topics}
