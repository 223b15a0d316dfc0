"""DescribeProducers (61), v0: the producers a partition knows, for tools such as
``kafka-transactions.sh find-hanging`` (ReplicaManager.activeProducerState): for each producer
id its epoch, last sequence and timestamp, coordinator epoch (0 here) and the first offset of its
open transaction in the partition (-1 when none).  An unknown topic or partition is
UNKNOWN_TOPIC_OR_PARTITION."""

from __future__ import annotations

from typing import Any

from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext

API_KEY = 61


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    topics = []
    for t in request.topics:
        parts = []
        for idx in t.partition_indexes:
            plog = ctx.broker.topics.partition(t.name, int(idx))
            if plog is None:
                parts.append(
                    {
                        "partition_index": idx,
                        "error_code": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                        "error_message": None,
                        "active_producers": [],
                    }
                )
                continue
            producers = [
                {
                    "producer_id": e.producer_id,
                    "producer_epoch": e.epoch,
                    "last_sequence": e.last_seq,
                    "last_timestamp": e.last_timestamp,
                    "coordinator_epoch": 0,
                    "current_txn_start_offset": -1
                    if e.current_txn_first_offset is None
                    else e.current_txn_first_offset,
                }
                for e in plog.producers.entries()
            ]
            parts.append(
                {
                    "partition_index": idx,
                    "error_code": ErrorCode.NONE,
                    "error_message": None,
                    "active_producers": producers,
                }
            )
        topics.append({"name": t.name, "partitions": parts})
    return {"throttle_time": 0, "topics": topics}
