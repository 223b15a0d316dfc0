"""Metadata (3): one broker (us), the topics, stable topic ids, the cluster id.

As in ``KafkaApis.handleTopicMetadataRequest``:

* the requested topics are a set: a name (or id) asked for twice is answered once;
* v10 and v11 carry topic ids but may not use them: a null name or a non-zero id there →
  the request fails with INVALID_REQUEST, answered as ``MetadataRequest.getErrorResponse``
  answers it (each requested topic with that error, a null name as "", no brokers);
* auto-creation (v0-v3 always, v4+ when asked, and ``auto.create.topics.enable``) creates a
  missing topic with ``num.partitions`` partitions.  Kafka answers such a topic
  UNKNOWN_TOPIC_OR_PARTITION while its controller creates it; here creation is instant, so it
  is answered at once.

Limits (docs/reliability.md, "Limits"): one request auto-creates at most
``rallypoint.auto.create.topics.max.per.request`` topics and ``rallypoint.create.max.partitions``
partitions, and none past ``rallypoint.max.broker.partitions``; the other missing topics are
answered UNKNOWN_TOPIC_OR_PARTITION -- Kafka's answer for a topic whose creation is under way
(``AutoTopicCreationManager``), which clients retry, so they are created by later requests.
Answers are built in slices that yield to other connections.

Cache (docs/BENCHMARKS.md, hot paths): clients ask the same question again and again (every
``topic.metadata.refresh.interval.ms``, on every error).  An answer whose topics all exist is
kept encoded (at most 4 MiB of answers per broker), keyed by the version, the requested names
(or "all") and the broker's address, and used as long as the topic store has not changed (its ``mutations``
counter: creations, deletions, new partitions, config changes).  Answers with errors, topic
ids in the request, or auto-creation are always built afresh.
"""

from __future__ import annotations

import uuid
import weakref
from typing import Any

from rallypoint.protocol import codec
from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext
from ..cluster import Cluster
from ..slicing import Slicer
from ..topics import Topic, TopicError
from ..topics.store import INTERNAL_TOPICS, validate_topic_name

API_KEY = 3

# Kafka's "no authorized operations computed" sentinel.
_AUTHZ_OPS_UNSET = -2147483648
ZERO_UUID = uuid.UUID(int=0)
# Partition entries built between two checks of the time slice.
_PARTITIONS_PER_TICK = 200
# per broker: at most this many bytes of answers (emptied when full), none larger than a quarter
_CACHE_BYTES = 4 * 1024 * 1024


class _Cache:
    """Encoded answers of one topic store, valid while its ``mutations`` counter stays put."""

    __slots__ = ("answers", "bytes", "mutations")

    def __init__(self) -> None:
        self.mutations = -1
        self.bytes = 0
        self.answers: dict[tuple[Any, ...], codec.Encoded] = {}

    def get(self, mutations: int, key: tuple[Any, ...]) -> codec.Encoded | None:
        if mutations != self.mutations:
            self.answers.clear()
            self.bytes = 0
            self.mutations = mutations
            return None
        return self.answers.get(key)

    def put(self, mutations: int, key: tuple[Any, ...], answer: codec.Encoded) -> None:
        size = len(answer.body)
        if mutations != self.mutations or size > _CACHE_BYTES // 4:
            return  # the store changed while the answer was built, or the answer is too large
        if self.bytes + size > _CACHE_BYTES:
            self.answers.clear()
            self.bytes = 0
        old = self.answers.get(key)
        self.bytes += size - (len(old.body) if old is not None else 0)
        self.answers[key] = answer


_caches: weakref.WeakKeyDictionary[Any, _Cache] = weakref.WeakKeyDictionary()


def _cache_key(ctx: RequestContext, names: tuple[str, ...] | None, allow_auto: bool) -> tuple[Any, ...]:
    b = ctx.broker
    return (
        ctx.api_version,
        names,
        allow_auto,
        ctx.node_id,
        b.cluster.version,
        b.advertised_host,
        b.advertised_port,
        b.cluster_id,
    )


def partition_entry(cluster: Cluster, node: int, topic: str, p: int) -> dict[str, Any]:
    """One partition as Metadata describes it (and DescribeTopicPartitions, which adds the
    eligible-leader lists), answered by ``node``.  No replication, so the leader is the only
    replica; in a cluster of several nodes (docs/cluster.md, "Leadership") a partition whose
    node is offline has no leader (LEADER_NOT_AVAILABLE, Kafka's answer for a partition
    without a live leader)."""
    if cluster.single:
        return {
            "error_code": ErrorCode.NONE,
            "partition_index": p,
            "leader_id": node,
            "leader_epoch": 0,
            "replica_nodes": [node],
            "isr_nodes": [node],
            "offline_replicas": [],
        }
    leader = cluster.leader(topic, p)
    if leader is None:
        home = cluster.preferred(topic, p)
        return {
            "error_code": ErrorCode.LEADER_NOT_AVAILABLE,
            "partition_index": p,
            "leader_id": -1,
            "leader_epoch": 0,
            "replica_nodes": [home],
            "isr_nodes": [],
            "offline_replicas": [home],
        }
    return {
        "error_code": ErrorCode.NONE,
        "partition_index": p,
        "leader_id": leader,
        "leader_epoch": 0,
        "replica_nodes": [leader],
        "isr_nodes": [leader],
        "offline_replicas": [],
    }


async def topic_entry(ctx: RequestContext, topic: Topic, slicer: Slicer) -> dict[str, Any]:
    node = ctx.broker.node_id
    cluster = ctx.broker.cluster
    partitions: list[dict[str, Any]] = []
    for first in range(0, topic.num_partitions, _PARTITIONS_PER_TICK):
        partitions.extend(
            partition_entry(cluster, node, topic.name, p)
            for p in range(first, min(first + _PARTITIONS_PER_TICK, topic.num_partitions))
        )
        await slicer.tick()
    return {
        "error_code": ErrorCode.NONE,
        "name": topic.name,
        "topic_id": topic.topic_id,
        "is_internal": topic.is_internal,
        "partitions": partitions,
        "topic_authorized_operations": _AUTHZ_OPS_UNSET,
    }


def _error_entry(name: str | None, code: ErrorCode, topic_id: Any = None) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "error_code": code,
        "name": name,
        "partitions": [],
        "is_internal": name in INTERNAL_TOPICS,
    }
    if topic_id is not None:
        entry["topic_id"] = topic_id
    return entry


def _invalid_request(requested: Any) -> dict[str, Any]:
    """``MetadataRequest.getErrorResponse(INVALID_REQUEST)``: every topic with the error."""
    return {
        "throttle_time": 0,
        "brokers": [],
        "cluster_id": None,
        "controller_id": -1,
        "topics": [
            {
                "error_code": ErrorCode.INVALID_REQUEST,
                "name": t.name if t.name is not None else "",
                "topic_id": getattr(t, "topic_id", None) or ZERO_UUID,
                "is_internal": False,
                "partitions": [],
            }
            for t in requested
        ],
        "cluster_authorized_operations": _AUTHZ_OPS_UNSET,
    }


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any] | codec.Encoded:
    broker = ctx.broker
    version = ctx.api_version
    store = broker.topics
    requested = request.topics
    if requested is not None and 10 <= version <= 11:
        # KafkaApis: "Topic name can not be null for version ..." / "Topic IDs are not supported
        # in requests for version ..." -- an InvalidRequestException for the whole request.
        if any(t.name is None or (t.topic_id is not None and t.topic_id != ZERO_UUID) for t in requested):
            return _invalid_request(requested)
    # v0: an empty list means all topics; v1+: null means all, empty means none.
    all_topics = requested is None or (version == 0 and len(requested) == 0)
    # v0-v3 always auto-create; v4+ ask for it per request.
    allow_auto = bool(getattr(request, "allow_auto_topic_creation", True)) and store.auto_create
    key: tuple[Any, ...] | None = None
    if all_topics:
        key = _cache_key(ctx, None, allow_auto)
    elif all(getattr(t, "name", None) is not None for t in requested):
        key = _cache_key(ctx, tuple(t.name for t in requested), allow_auto)
    cache = _caches.get(store)
    if cache is None:
        cache = _caches[store] = _Cache()
    mutations = store.mutations
    if key is not None:
        hit = cache.get(mutations, key)
        if hit is not None:
            return hit
    config = broker.config
    topics_left = config["rallypoint.auto.create.topics.max.per.request"]
    partitions_left = config["rallypoint.create.max.partitions"]
    slicer = Slicer()
    topics: list[dict[str, Any]] = []
    if all_topics:
        for t in store.all():
            topics.append(await topic_entry(ctx, t, slicer))
    else:
        seen_names: set[str] = set()
        seen_ids: set[uuid.UUID | None] = set()
        for req_topic in requested:
            name = getattr(req_topic, "name", None)
            topic_id = getattr(req_topic, "topic_id", None)
            if name is None:
                if topic_id in seen_ids:
                    continue
                seen_ids.add(topic_id)
                topic = store.by_id(topic_id) if topic_id is not None else None
                await slicer.tick()
                if topic is None:
                    topics.append(_error_entry(None, ErrorCode.UNKNOWN_TOPIC_ID, topic_id))
                else:
                    topics.append(await topic_entry(ctx, topic, slicer))
                continue
            if name in seen_names:
                continue
            seen_names.add(name)
            await slicer.tick()
            topic = store.get(name)
            if topic is None:
                try:
                    validate_topic_name(name)
                except TopicError as e:
                    topics.append(_error_entry(name, e.code))
                    continue
                if not allow_auto:
                    topics.append(_error_entry(name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
                    continue
                n = store.default_partitions
                if topics_left <= 0 or partitions_left < n:
                    topics.append(_error_entry(name, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
                    continue
                try:
                    topic = await _auto_create(store, name)
                except TopicError as e:
                    # the broker's partition cap: as Kafka answers a creation its controller refused
                    code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if e.code == ErrorCode.POLICY_VIOLATION else e.code
                    topics.append(_error_entry(name, code))
                    continue
                topics_left -= 1
                partitions_left -= n
            topics.append(await topic_entry(ctx, topic, slicer))
    answer = {
        "throttle_time": 0,
        "brokers": [{"node_id": n, "host": h, "port": p, "rack": None} for n, h, p in broker.brokers()],
        "cluster_id": broker.cluster_id,
        "controller_id": broker.controller_id,
        "topics": topics,
        "cluster_authorized_operations": _AUTHZ_OPS_UNSET,
    }
    if key is not None and all(t["error_code"] == ErrorCode.NONE for t in topics):
        encoded = codec.encode_body(API_KEY, version, answer)
        cache.put(mutations, key, encoded)
        return encoded
    return answer


async def _auto_create(store: Any, name: str) -> Topic:
    """Create ``name`` with the default partition count (its logs built in slices)."""
    logs = await store.build_partitions(name, store.default_partitions)
    existing: Topic | None = store.get(name)  # created by another connection meanwhile?
    if existing is not None:
        return existing
    topic: Topic = store.create(name, partitions=logs)
    return topic
