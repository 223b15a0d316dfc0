"""OffsetForLeaderEpoch (23): end offset of a leader epoch (KIP-320 position validation).

Every partition has had one leader epoch, 0, since its first append (the leader epoch cache
of Kafka's LeaderEpochFileCache.endOffsetFor with a single entry):

* requested epoch 0 and the partition was ever written → (0, log end offset);
* anything else → undefined (-1, -1), with no error;
* current_leader_epoch other than 0 (and not -1) → FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH;
* unknown topic or partition → UNKNOWN_TOPIC_OR_PARTITION.
"""

from __future__ import annotations

from typing import Any

from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext
from ..topics.partition import LEADER_EPOCH
from ._leadership import not_leader

API_KEY = 23


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    store = ctx.broker.topics
    topics: list[dict[str, Any]] = []
    for t in request.topics:
        topic = store.get(t.topic)
        parts: list[dict[str, Any]] = []
        for p in t.partitions:
            idx = int(p.partition)
            entry: dict[str, Any] = {
                "partition": idx,
                "error_code": ErrorCode.NONE,
                "leader_epoch": -1,
                "end_offset": -1,
            }
            plog = topic.partition(idx) if topic is not None else None
            cle = int(getattr(p, "current_leader_epoch", -1))
            if plog is None:
                entry["error_code"] = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif (elsewhere := not_leader(ctx, t.topic, idx)) is not None:
                entry["error_code"] = elsewhere  # docs/cluster.md
            elif cle >= 0 and cle != LEADER_EPOCH:
                entry["error_code"] = (
                    ErrorCode.UNKNOWN_LEADER_EPOCH if cle > LEADER_EPOCH else ErrorCode.FENCED_LEADER_EPOCH
                )
            elif int(p.leader_epoch) == LEADER_EPOCH and plog.has_epoch():
                entry["leader_epoch"] = LEADER_EPOCH
                entry["end_offset"] = plog.next_offset
            parts.append(entry)
        topics.append({"topic": t.topic, "partitions": parts})
    return {"throttle_time": 0, "topics": topics}
