"""DescribeTopicPartitions (75), v0 (KIP-966; docs/configs.md, "Cluster and topic descriptions").

As Kafka's ``DescribeTopicPartitionsRequestHandler``: the named topics (or, with none named,
every topic) sorted by name, unknown ones with UNKNOWN_TOPIC_OR_PARTITION; at most
``response_partition_limit`` partitions in all (capped by
``max.request.partition.size.limit``), continued from ``cursor``; when partitions are left,
``next_cursor`` says where the next request starts.  A cursor on a topic the request does not
name is INVALID_REQUEST.  Each partition as Metadata describes it (its leader the only replica;
in a cluster of several nodes, the partition's own leader), no eligible leader replicas.
"""

from __future__ import annotations

import uuid
from typing import Any, Final

from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext
from ..topics.store import INTERNAL_TOPICS
from .metadata import partition_entry

API_KEY = 75

AUTHZ_OPS_UNSET: Final = -(2**31)
# AclOperation codes on a TOPIC: READ 3, WRITE 4, CREATE 5, DELETE 6, ALTER 7, DESCRIBE 8,
# DESCRIBE_CONFIGS 10, ALTER_CONFIGS 11 (every one: no ACLs here)
TOPIC_OPERATIONS: Final = sum(1 << op for op in (3, 4, 5, 6, 7, 8, 10, 11))
ZERO_ID: Final = uuid.UUID(int=0)


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    store = ctx.broker.topics
    node = ctx.broker.node_id
    cluster = ctx.broker.cluster
    limit = max(1, min(int(request.response_partition_limit), ctx.broker.config["max.request.partition.size.limit"]))
    named = sorted({t.name for t in request.topics})
    names = named if named else sorted(t.name for t in store.all())
    cursor = request.cursor
    if cursor is not None:
        if named and cursor.topic_name not in named:
            # InvalidRequestException → getErrorResponse: every requested topic with the error
            return {
                "throttle_time": 0,
                "topics": [_error(n, ErrorCode.INVALID_REQUEST) for n in named],
                "next_cursor": None,
            }
        names = [n for n in names if n >= cursor.topic_name]
    topics: list[dict[str, Any]] = []
    next_cursor: dict[str, Any] | None = None
    left = limit
    for name in names:
        topic = store.get(name)
        if topic is None:
            if named:
                topics.append(_error(name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
            continue
        if left == 0:
            next_cursor = {"topic_name": name, "partition_index": 0}
            break
        first = cursor.partition_index if cursor is not None and name == cursor.topic_name else 0
        last = min(topic.num_partitions, first + left)
        topics.append(
            {
                "error_code": ErrorCode.NONE,
                "name": name,
                "topic_id": topic.topic_id,
                "is_internal": topic.is_internal,
                "partitions": [
                    {**partition_entry(cluster, node, name, p), "eligible_leader_replicas": [], "last_known_elr": []}
                    for p in range(first, last)
                ],
                "topic_authorized_operations": TOPIC_OPERATIONS,
            }
        )
        left -= max(0, last - first)
        if last < topic.num_partitions:
            next_cursor = {"topic_name": name, "partition_index": last}
            break
    return {"throttle_time": 0, "topics": topics, "next_cursor": next_cursor}


def _error(name: str, code: ErrorCode) -> dict[str, Any]:
    return {
        "error_code": code,
        "name": name,
        "topic_id": ZERO_ID,
        "is_internal": name in INTERNAL_TOPICS,
        "partitions": [],
        "topic_authorized_operations": AUTHZ_OPS_UNSET,
    }
