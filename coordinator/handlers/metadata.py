"""Metadata (3): one broker (us), the topics, stable topic ids, the cluster id."""

from __future__ import annotations

from typing import Any

from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext
from ..topics import Topic, TopicError
from ..topics.store import validate_topic_name

API_KEY = 3

# Kafka's "no authorized operations computed" sentinel.
_AUTHZ_OPS_UNSET = -2147483648


def topic_entry(ctx: RequestContext, topic: Topic) -> dict[str, Any]:
    node = ctx.broker.node_id
    return {
        "error_code": ErrorCode.NONE,
        "name": topic.name,
        "topic_id": topic.topic_id,
        "is_internal": topic.is_internal,
        "partitions": [
            {
                "error_code": ErrorCode.NONE,
                "partition_index": p,
                "leader_id": node,
                "leader_epoch": 0,
                "replica_nodes": [node],
                "isr_nodes": [node],
                "offline_replicas": [],
            }
            for p in range(topic.num_partitions)
        ],
        "topic_authorized_operations": _AUTHZ_OPS_UNSET,
    }


def _error_entry(name: str | None, code: ErrorCode, topic_id: Any = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"error_code": code, "name": name, "partitions": [], "is_internal": False}
    if topic_id is not None:
        entry["topic_id"] = topic_id
    return entry


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    broker = ctx.broker
    version = ctx.api_version
    store = broker.topics
    requested = request.topics
    # v0: an empty list means all topics; v1+: null means all, empty means none.
    all_topics = requested is None or (version == 0 and len(requested) == 0)
    # v0-v3 always auto-create; v4+ ask for it per request.
    allow_auto = bool(getattr(request, "allow_auto_topic_creation", True))
    topics: list[dict[str, Any]] = []
    if all_topics:
        topics = [topic_entry(ctx, t) for t in store.all()]
    else:
        for req_topic in requested:
            name = getattr(req_topic, "name", None)
            topic_id = getattr(req_topic, "topic_id", None)
            if name is None:
                topic = store.by_id(topic_id) if topic_id is not None else None
                if topic is None:
                    topics.append(_error_entry(None, ErrorCode.UNKNOWN_TOPIC_ID, topic_id))
                else:
                    topics.append(topic_entry(ctx, topic))
                continue
            topic = store.get(name)
            if topic is None:
                try:
                    validate_topic_name(name)
                except TopicError as e:
                    topics.append(_error_entry(name, e.code))
                    continue
                if allow_auto and store.auto_create:
                    # Kafka answers LEADER_NOT_AVAILABLE while an auto-created topic comes up;
                    # here creation is instant, so the topic is answered at once.
                    try:
                        topic = store.auto_create_topic(name)
                    except TopicError as e:
                        topics.append(_error_entry(name, e.code))
                        continue
                    topics.append(topic_entry(ctx, topic))
                else:
                    topics.append(_error_entry(name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
                continue
            topics.append(topic_entry(ctx, topic))
    return {
        "throttle_time": 0,
        "brokers": [
            {
                "node_id": broker.node_id,
                "host": broker.advertised_host,
                "port": broker.advertised_port,
                "rack": None,
            }
        ],
        "cluster_id": broker.cluster_id,
        "controller_id": broker.node_id,
        "topics": topics,
        "cluster_authorized_operations": _AUTHZ_OPS_UNSET,
    }
