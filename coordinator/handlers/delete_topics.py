"""DeleteTopics (20): by name (v1-v5 ``topic_names``, v6 ``topics[].name``) or by id (v6).

ControllerApis.deleteTopics: a name or id given twice → INVALID_REQUEST ("Duplicate topic
name." / "Duplicate topic id."); both name and id, or neither → INVALID_REQUEST; unknown name →
UNKNOWN_TOPIC_OR_PARTITION; unknown id → UNKNOWN_TOPIC_ID; a name mapping to an id also given
→ INVALID_REQUEST.  Deleting drops the partitions' data at once and wakes their parked fetches.

Deviation: internal topics (``__consumer_offsets``) are refused with INVALID_REQUEST — KRaft
would delete them, but here the group coordinator owns that topic's data.
"""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext
from ..topics import TopicError

API_KEY = 20

ZERO = uuid.UUID(int=0)


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    store = ctx.broker.topics
    version = ctx.api_version
    results: list[dict[str, Any]] = []

    def answer(name: str | None, tid: uuid.UUID, code: ErrorCode, message: str | None = None) -> None:
        results.append({"name": name, "topic_id": tid, "error_code": code, "error_message": message})

    names: list[str] = []
    ids: list[uuid.UUID] = []
    if version >= 6:
        for t in request.topics:
            tid = t.topic_id or ZERO
            if t.name is None:
                if tid == ZERO:
                    answer(None, ZERO, ErrorCode.INVALID_REQUEST, "Neither topic name nor id were specified.")
                else:
                    ids.append(tid)
            elif tid != ZERO:
                answer(t.name, tid, ErrorCode.INVALID_REQUEST, "You may not specify both topic name and topic id.")
            else:
                names.append(t.name)
    else:
        names = list(request.topic_names)

    name_counts = Counter(names)
    id_counts = Counter(ids)
    for name in sorted(n for n, c in name_counts.items() if c > 1):
        answer(name, ZERO, ErrorCode.INVALID_REQUEST, "Duplicate topic name.")
    for tid in sorted((i for i, c in id_counts.items() if c > 1), key=str):
        answer(None, tid, ErrorCode.INVALID_REQUEST, "Duplicate topic id.")

    targets: dict[uuid.UUID, str] = {}
    for tid in dict.fromkeys(i for i in ids if id_counts[i] == 1):
        topic = store.by_id(tid)
        if topic is None:
            answer(None, tid, ErrorCode.UNKNOWN_TOPIC_ID, "This server does not host this topic ID.")
        else:
            targets[tid] = topic.name
    for name in dict.fromkeys(n for n in names if name_counts[n] == 1):
        topic = store.get(name)
        if topic is None:
            answer(name, ZERO, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "This server does not host this topic-partition.")
        elif topic.topic_id in targets:
            del targets[topic.topic_id]
            answer(
                name,
                topic.topic_id,
                ErrorCode.INVALID_REQUEST,
                "The provided topic name maps to an ID that was already supplied.",
            )
        else:
            targets[topic.topic_id] = name

    deleted: list[str] = []
    deleted_ids: list[uuid.UUID] = []
    for tid, name in targets.items():
        topic = store.by_id(tid)
        if topic is not None and topic.is_internal:
            answer(name, tid, ErrorCode.INVALID_REQUEST, f"Deletion of internal topic {name} is not supported.")
            continue
        try:
            store.delete_by_id(tid)
        except TopicError as e:
            answer(name, tid, e.code, e.message)
            continue
        answer(name, tid, ErrorCode.NONE)
        deleted.append(name)
        deleted_ids.append(tid)
    if deleted_ids:
        ctx.broker.share_groups.on_topics_deleted(deleted_ids)  # their share-partition state goes
    if deleted:
        # Kafka's coordinator drops the committed offsets of deleted topics, writing tombstones
        # (GroupCoordinator.onPartitionsDeleted / GroupMetadataManager.cleanupGroupMetadata).
        ctx.broker.groups.on_topics_deleted(deleted)
    return {"throttle_time": 0, "responses": results}
