"""CreateTopics (19): Kafka's checks, in the controller's order.

ControllerApis.createTopics and ReplicationControlManager.createTopics/createTopic:

* a name listed twice → INVALID_REQUEST "Duplicate topic name." (answered after the others);
* ``__cluster_metadata`` → INVALID_REQUEST;
* illegal name, or one colliding with an existing topic over '.'/'_' → INVALID_TOPIC_EXCEPTION;
* existing → TOPIC_ALREADY_EXISTS;
* unknown or invalid config → INVALID_CONFIG;
* manual assignments need replication_factor = num_partitions = -1 (INVALID_REQUEST), distinct
  0-based consecutive partitions, non-empty replica lists of registered brokers, one size
  for all (INVALID_REPLICA_ASSIGNMENT);
* replication factor 0 or < -1 → INVALID_REPLICATION_FACTOR; partitions 0 or < -1 →
  INVALID_PARTITIONS; -1 means the default (replication 1, ``num.partitions``); a replication
  factor above 1 cannot be placed on one broker → INVALID_REPLICATION_FACTOR;
* ``validate_only`` answers the same without creating anything.

Limits (docs/reliability.md, "Limits"), checked before anything is created:

* more than ``rallypoint.create.max.partitions`` (Kafka's fixed 10,000) new partitions in the
  whole request → every topic of the request POLICY_VIOLATION "Excessively large number of
  partitions per request." (``ReplicationControlManager.validateTotalNumberOfPartitions``; the
  controller throws, ``CreateTopicsRequest.getErrorResponse`` answers each topic);
* a topic that would take the broker past ``rallypoint.max.broker.partitions`` →
  POLICY_VIOLATION for that topic (the answer of a Kafka ``CreateTopicPolicy`` refusal).

Every topic is checked before the first one is created, so a request never stops halfway;
the partition logs of a large topic are built in slices that yield to other connections.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext
from ..slicing import Slicer
from ..topics import TopicError
from ..topics import configs as topic_configs

API_KEY = 19

DEFAULT_REPLICATION_FACTOR = 1
TOO_MANY_PARTITIONS = "Excessively large number of partitions per request."


def check_replicas(node: int, brokers: list[int], size: int | None) -> None:
    """``ReplicationControlManager.validateManualPartitionAssignment`` on a one-broker cluster."""
    if not brokers:
        raise TopicError(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT, "The manual partition assignment includes an empty replica list."
        )
    prev = None
    for b in sorted(brokers):
        if b != node:
            raise TopicError(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"The manual partition assignment includes broker {b}, but no such broker is registered.",
            )
        if b == prev:
            raise TopicError(
                ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                f"The manual partition assignment includes the broker {prev} more than once.",
            )
        prev = b
    if size is not None and size != len(brokers):
        raise TopicError(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            f"The manual partition assignment includes a partition with {len(brokers)} replica(s), but this "
            f"is not consistent with previous partitions, which have {size} replica(s).",
        )


def _placement(ctx: RequestContext, topic: Any) -> tuple[int, int]:
    """(partitions, replication factor) for a topic, or TopicError."""
    node = ctx.broker.node_id
    assignments = list(topic.assignments)
    rf = int(topic.replication_factor)
    n = int(topic.num_partitions)
    if assignments:
        if rf != -1:
            raise TopicError(
                ErrorCode.INVALID_REQUEST,
                "A manual partition assignment was specified, but replication factor was not set to -1.",
            )
        if n != -1:
            raise TopicError(
                ErrorCode.INVALID_REQUEST,
                "A manual partition assignment was specified, but numPartitions was not set to -1.",
            )
        seen: set[int] = set()
        size: int | None = None
        for a in assignments:
            idx = int(a.partition_index)
            if idx in seen:
                raise TopicError(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT,
                    f"Found multiple manual partition assignments for partition {idx}",
                )
            seen.add(idx)
            brokers = [int(b) for b in a.broker_ids]
            check_replicas(node, brokers, size)
            size = len(brokers)
        for i in range(len(seen)):
            if i not in seen:
                raise TopicError(
                    ErrorCode.INVALID_REPLICA_ASSIGNMENT, "partitions should be a consecutive 0-based integer sequence"
                )
        return len(seen), size or 1
    if rf < -1 or rf == 0:
        raise TopicError(
            ErrorCode.INVALID_REPLICATION_FACTOR,
            "Replication factor must be larger than 0, or -1 to use the default value.",
        )
    if n < -1 or n == 0:
        raise TopicError(ErrorCode.INVALID_PARTITIONS, "Number of partitions was set to an invalid non-positive value.")
    rf = DEFAULT_REPLICATION_FACTOR if rf == -1 else rf
    if rf > 1:
        raise TopicError(
            ErrorCode.INVALID_REPLICATION_FACTOR,
            f"Unable to replicate the partition {rf} time(s): The target replication factor of {rf} cannot be "
            "reached because only 1 broker(s) are registered.",
        )
    return (ctx.broker.topics.default_partitions if n == -1 else n), rf


def _failure(name: str, e: TopicError) -> dict[str, Any]:
    return {
        "name": name,
        "topic_id": uuid.UUID(int=0),
        "error_code": e.code,
        "error_message": e.message,
        "num_partitions": -1,
        "replication_factor": -1,
        "configs": [],
    }


def requested_partitions(topic: Any, default_partitions: int) -> int:
    """Partitions a CreateTopics entry asks for, counted as Kafka's
    ``validateTotalNumberOfPartitions`` counts them (invalid counts add nothing)."""
    if topic.assignments:
        return len(topic.assignments)
    n = int(topic.num_partitions)
    if n == -1:
        return default_partitions
    return max(n, 0)


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    store = ctx.broker.topics
    validate_only = bool(getattr(request, "validate_only", False))
    counts = Counter(t.name for t in request.topics)
    unique = [t for t in request.topics if counts[t.name] == 1]
    total = sum(requested_partitions(t, store.default_partitions) for t in unique)
    if total > ctx.broker.config["rallypoint.create.max.partitions"]:
        refusal = TopicError(ErrorCode.POLICY_VIOLATION, TOO_MANY_PARTITIONS)
        return {"throttle_time": 0, "topics": [_failure(t.name, refusal) for t in request.topics]}

    # Phase 1: every check, nothing created.
    outcome: dict[str, TopicError | tuple[int, int, dict[str, str]]] = {}
    planned = 0
    for t in unique:
        name = t.name
        try:
            store.check_create(name, None, None)  # name, metadata topic, existence, collisions
            clean = topic_configs.validate({c.name: c.value for c in t.configs})
            partitions, rf = _placement(ctx, t)
            store.check_partition_budget(partitions, planned)
        except TopicError as e:
            outcome[name] = e
            continue
        planned += partitions
        outcome[name] = (partitions, rf, clean)

    # Phase 2: create (a topic another connection created meanwhile is answered as such).
    results: list[dict[str, Any]] = []
    slicer = Slicer()
    for t in unique:
        await slicer.tick()
        name = t.name
        plan = outcome[name]
        if isinstance(plan, TopicError):
            results.append(_failure(name, plan))
            continue
        partitions, rf, clean = plan
        if validate_only:
            topic_id = uuid.uuid4()
        else:
            logs = await store.build_partitions(name, partitions)
            try:
                topic_id = store.create(name, partitions, configs=clean, partitions=logs).topic_id
            except TopicError as e:
                results.append(_failure(name, e))
                continue
        results.append(
            {
                "name": name,
                "topic_id": topic_id,
                "error_code": ErrorCode.NONE,
                "error_message": None,
                "topic_config_error_code": 0,
                "num_partitions": partitions,
                "replication_factor": rf,
                "configs": topic_configs.effective(clean, store.broker_values()),
            }
        )
    for name in sorted(n for n, c in counts.items() if c > 1):
        results.append(_failure(name, TopicError(ErrorCode.INVALID_REQUEST, "Duplicate topic name.")))
    return {"throttle_time": 0, "topics": results}
