"""ElectLeaders (43), v0-2 (docs/configs.md, "Cluster and topic descriptions").

Every partition has one replica, this broker, which leads it: a preferred or unclean election
is never needed.  Named partitions answer ELECTION_NOT_NEEDED (unknown ones
UNKNOWN_TOPIC_OR_PARTITION); a request for every partition (no list) answers no partition, as
Kafka leaves out the partitions that needed no election when it elects everywhere.
"""

from __future__ import annotations

from typing import Any

from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext

API_KEY = 43


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    store = ctx.broker.topics
    results = []
    if request.topic_partitions is not None:
        by_topic: dict[str, list[int]] = {}
        for tp in request.topic_partitions:
            by_topic.setdefault(tp.topic, []).extend(int(p) for p in tp.partitions)
        for name, indexes in by_topic.items():
            partition_results = []
            for i in indexes:
                if store.partition(name, i) is None:
                    code, message = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "The partition does not exist."
                else:
                    code, message = ErrorCode.ELECTION_NOT_NEEDED, "Leader election not needed for topic partition."
                partition_results.append({"partition_id": i, "error_code": code, "error_message": message})
            results.append({"topic": name, "partition_result": partition_results})
    return {"throttle_time": 0, "error_code": ErrorCode.NONE, "replica_election_results": results}
