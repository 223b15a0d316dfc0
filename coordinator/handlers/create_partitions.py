"""CreatePartitions (37): grow a topic (ControllerApis / ReplicationControlManager.createPartitions).

A name given twice → INVALID_REQUEST "Duplicate topic name."; unknown topic →
UNKNOWN_TOPIC_OR_PARTITION; a count not above the current one → INVALID_PARTITIONS; assignments
whose number differs from the partitions added, or naming brokers other than this one, or of a
size other than the topic's replication factor (1) → INVALID_REPLICA_ASSIGNMENT.
``validate_only`` changes nothing.  New partitions start empty at offset 0.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext
from ..topics import TopicError
from .create_topics import check_replicas

API_KEY = 37


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    store = ctx.broker.topics
    node = ctx.broker.node_id
    validate_only = bool(request.validate_only)
    counts = Counter(t.name for t in request.topics)
    results: list[dict[str, Any]] = []
    for name in sorted(n for n, c in counts.items() if c > 1):
        results.append(
            {"name": name, "error_code": ErrorCode.INVALID_REQUEST, "error_message": "Duplicate topic name."}
        )
    for t in request.topics:
        if counts[t.name] > 1:
            continue
        count = int(t.count)
        try:
            topic = store.check_add_partitions(t.name, count)
            additional = count - topic.num_partitions
            if t.assignments is not None:
                if len(t.assignments) != additional:
                    raise TopicError(
                        ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                        f"Attempted to add {additional} additional partition(s), but only "
                        f"{len(t.assignments)} assignment(s) were specified.",
                    )
                for a in t.assignments:
                    check_replicas(node, [int(b) for b in a.broker_ids], 1)
            if not validate_only:
                store.add_partitions(t.name, count)
        except TopicError as e:
            results.append({"name": t.name, "error_code": e.code, "error_message": e.message})
            continue
        results.append({"name": t.name, "error_code": ErrorCode.NONE, "error_message": None})
    return {"throttle_time": 0, "results": results}
