"""Helpers shared by the group handlers (KafkaApis-level checks done before the coordinator)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, TypeVar

from msgspec import Struct
from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext
from ..groups.events import CommitPartition, CommitTopic, TopicErrors

T = TypeVar("T")

ZERO_UUID = uuid.UUID(int=0)


def client_host(ctx: RequestContext) -> str:
    """Kafka records ``InetAddress.toString()`` of the client: "/127.0.0.1"."""
    return shared("/" + str(ctx.client_host))


_SHARED: dict[tuple[type, object], Any] = {}
_SHARED_MAX = 4096
# strings and bytes up to this length are shared (client ids, subscriptions of consumers that
# subscribe alike); the cache then holds at most about 4096 x 512 bytes, whatever clients send
SHARED_BYTES_MAX = 512


def shared(value: T) -> T:
    """One object for equal immutable values that members keep for as long as they live:
    client ids and hosts, protocol types and names, timeouts, small subscriptions.  Thousands
    of members of a test's groups then hold one copy each (docs/BENCHMARKS.md, "Memory per
    member").  Bounded: longer strings and bytes are not kept, and once the cache is full new
    values are returned as they are."""
    if isinstance(value, str | bytes) and len(value) > SHARED_BYTES_MAX:
        return value
    key = (type(value), value)
    got = _SHARED.get(key)
    if got is not None:
        return got  # type: ignore[no-any-return]
    if len(_SHARED) < _SHARED_MAX:
        _SHARED[key] = value
    return value


class HeartbeatAnswer(Protocol):
    """A consumer- or share-group heartbeat's result, as the machines give it."""

    @property
    def error(self) -> ErrorCode: ...
    @property
    def error_message(self) -> str | None: ...
    @property
    def member_id(self) -> str | None: ...
    @property
    def member_epoch(self) -> int: ...
    @property
    def heartbeat_interval_ms(self) -> int: ...
    @property
    def assignment(self) -> Mapping[uuid.UUID, Iterable[int]] | None: ...


def heartbeat_body(r: HeartbeatAnswer, partitions: Callable[[Iterable[int]], list[int]] = list) -> dict[str, Any]:
    """The ConsumerGroupHeartbeat / ShareGroupHeartbeat answer (same layout): the assignment's
    topics in topic-id order, each topic's partitions as ``partitions`` lists them."""
    assignment = None
    if r.assignment is not None:
        assignment = {
            "topic_partitions": [
                {"topic_id": t, "partitions": partitions(ps)}
                for t, ps in sorted(r.assignment.items(), key=lambda kv: str(kv[0]))
            ]
        }
    return {
        "throttle_time": 0,
        "error_code": r.error,
        "error_message": r.error_message,
        "member_id": r.member_id,
        "member_epoch": r.member_epoch,
        "heartbeat_interval": r.heartbeat_interval_ms,
        "assignment": assignment,
    }


def partition_exists(ctx: RequestContext, topic: str, partition: int) -> bool:
    t = ctx.broker.topics.get(topic)
    return t is not None and 0 <= partition < t.num_partitions


class TopicErrorsBuilder:
    """Kafka's ``OffsetCommitResponse.Builder``/``OffsetDeleteResponse.Builder``: errors found
    before the coordinator (unknown topics/partitions) first, then the coordinator's, merged
    per topic name."""

    def __init__(self) -> None:
        self.topics: dict[str, list[tuple[int, ErrorCode]]] = {}
        self.ids: dict[str, uuid.UUID] = {}  # OffsetCommit v10: each topic's id, echoed back

    def add(self, topic: str, partition: int, error: ErrorCode) -> None:
        self.topics.setdefault(topic, []).append((partition, error))

    def add_unknown_id(self, topic_id: uuid.UUID, partitions: Iterable[int]) -> None:
        """OffsetCommit v10: a topic id no topic has: UNKNOWN_TOPIC_ID for each partition."""
        key = f"\x00{topic_id}"  # no topic name can hold NUL: never merges with a named topic
        self.ids[key] = topic_id
        for p in partitions:
            self.add(key, p, ErrorCode.UNKNOWN_TOPIC_ID)

    def merge(self, results: Iterable[TopicErrors]) -> None:
        for t in results:
            self.topics.setdefault(t.name, []).extend(t.partitions)

    def as_list(self) -> list[dict[str, Any]]:
        return [
            {
                "name": name,
                "topic_id": self.ids.get(name, ZERO_UUID),
                "partitions": [{"partition_index": p, "error_code": e} for p, e in parts],
            }
            for name, parts in self.topics.items()
        ]


def commit_topics(ctx: RequestContext, topics: Iterable[Any], out: TopicErrorsBuilder) -> list[CommitTopic]:
    """The partitions of an OffsetCommit or TxnOffsetCommit request that exist; the others are
    answered UNKNOWN_TOPIC_OR_PARTITION in ``out`` before the coordinator is asked
    (``KafkaApis.handleOffsetCommitRequest`` / ``handleTxnOffsetCommitRequest``)."""
    valid: list[CommitTopic] = []
    for t in topics:
        name = t.name
        parts = []
        for p in t.partitions:
            if partition_exists(ctx, name, p.partition_index):
                parts.append(
                    CommitPartition(
                        p.partition_index,
                        p.committed_offset,
                        int(getattr(p, "committed_leader_epoch", -1)),
                        p.committed_metadata,
                    )
                )
            else:
                out.add(name, p.partition_index, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        topic_id = getattr(t, "topic_id", None)
        if topic_id is not None:
            out.ids[name] = topic_id
        if parts:
            valid.append(CommitTopic(name, tuple(parts), topic_id))
    return valid


class NamedTopic(Struct, frozen=True):
    """A v10 request topic (named by id) with its name resolved."""

    name: str
    topic_id: uuid.UUID
    partitions: Any


def resolve_topic_ids(ctx: RequestContext, topics: Iterable[Any], out: TopicErrorsBuilder) -> list[NamedTopic]:
    """OffsetCommit v10 names topics by id (``KafkaApis.handleOffsetCommitRequest``): each known
    id gets its topic's name; an unknown one answers UNKNOWN_TOPIC_ID for all its partitions."""
    named: list[NamedTopic] = []
    for t in topics:
        topic = ctx.broker.topics.by_id(t.topic_id) if t.topic_id is not None else None
        if topic is None:
            out.add_unknown_id(t.topic_id or ZERO_UUID, (p.partition_index for p in t.partitions))
        else:
            named.append(NamedTopic(topic.name, t.topic_id, t.partitions))
    return named
