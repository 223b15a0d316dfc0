"""CreatePartitions (37): grow a topic (ControllerApis / ReplicationControlManager.createPartitions).

A name given twice → INVALID_REQUEST "Duplicate topic name."; unknown topic →
UNKNOWN_TOPIC_OR_PARTITION; a count not above the current one → INVALID_PARTITIONS; assignments
whose number differs from the partitions added, or naming brokers other than this one, or of a
size other than the topic's replication factor (1) → INVALID_REPLICA_ASSIGNMENT.
``validate_only`` changes nothing.  New partitions start empty at offset 0.

Limits (docs/reliability.md, "Limits"), checked before anything changes:

* more than ``rallypoint.create.max.partitions`` (10,000) new partitions in the whole request
  → every topic POLICY_VIOLATION "Excessively large number of partitions per request.", the
  answer CreateTopics gives.  Kafka 4.1's controller has no such check here: it fails the
  topic with UNKNOWN_SERVER_ERROR once its 10,000-record batch is full (after building the
  whole placement first), and the fix proposed upstream (KAFKA-19673) answers as we do;
* a topic that would take the broker past ``rallypoint.max.broker.partitions`` →
  POLICY_VIOLATION for that topic.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext
from ..topics import TopicError
from .create_topics import TOO_MANY_PARTITIONS, check_replicas

API_KEY = 37


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    store = ctx.broker.topics
    node = ctx.broker.node_id
    validate_only = bool(request.validate_only)
    counts = Counter(t.name for t in request.topics)
    unique = [t for t in request.topics if counts[t.name] == 1]

    total = 0
    for t in unique:
        topic = store.get(t.name)
        if topic is not None:
            total += max(0, int(t.count) - topic.num_partitions)
    if total > ctx.broker.config["rallypoint.create.max.partitions"]:
        return {
            "throttle_time": 0,
            "results": [
                {"name": t.name, "error_code": ErrorCode.POLICY_VIOLATION, "error_message": TOO_MANY_PARTITIONS}
                for t in request.topics
            ],
        }

    results: list[dict[str, Any]] = []
    for name in sorted(n for n, c in counts.items() if c > 1):
        results.append(
            {"name": name, "error_code": ErrorCode.INVALID_REQUEST, "error_message": "Duplicate topic name."}
        )

    # Phase 1: every check, nothing changed.
    outcome: dict[str, TopicError | int] = {}
    planned = 0
    for t in unique:
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
            if not topic.is_internal:
                store.check_partition_budget(additional, planned)
        except TopicError as e:
            outcome[t.name] = e
            continue
        planned += additional
        outcome[t.name] = count

    # Phase 2: grow (a topic changed by another connection meanwhile is answered as such).
    for t in unique:
        plan = outcome[t.name]
        if isinstance(plan, int) and not validate_only:
            topic = store.get(t.name)
            start = topic.num_partitions if topic is not None else 0
            logs = await store.build_partitions(t.name, max(0, plan - start), start)
            try:
                store.add_partitions(t.name, plan, logs)
            except TopicError as e:
                plan = e
        if isinstance(plan, TopicError):
            results.append({"name": t.name, "error_code": plan.code, "error_message": plan.message})
        else:
            results.append({"name": t.name, "error_code": ErrorCode.NONE, "error_message": None})
    return {"throttle_time": 0, "results": results}
