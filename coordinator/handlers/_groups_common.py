"""Helpers shared by the group handlers (KafkaApis-level checks done before the coordinator)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext
from ..groups.events import CommitPartition, CommitTopic, TopicErrors


def client_host(ctx: RequestContext) -> str:
    """Kafka records ``InetAddress.toString()`` of the client: "/127.0.0.1"."""
    return "/" + str(ctx.client_host)


def partition_exists(ctx: RequestContext, topic: str, partition: int) -> bool:
    t = ctx.broker.topics.get(topic)
    return t is not None and 0 <= partition < t.num_partitions


class TopicErrorsBuilder:
    """Kafka's ``OffsetCommitResponse.Builder``/``OffsetDeleteResponse.Builder``: errors found
    before the coordinator (unknown topics/partitions) first, then the coordinator's, merged
    per topic name."""

    def __init__(self) -> None:
        self.topics: dict[str, list[tuple[int, ErrorCode]]] = {}

    def add(self, topic: str, partition: int, error: ErrorCode) -> None:
        self.topics.setdefault(topic, []).append((partition, error))

    def merge(self, results: Iterable[TopicErrors]) -> None:
        for t in results:
            self.topics.setdefault(t.name, []).extend(t.partitions)

    def as_list(self) -> list[dict[str, Any]]:
        return [
            {"name": name, "partitions": [{"partition_index": p, "error_code": e} for p, e in parts]}
            for name, parts in self.topics.items()
        ]


def commit_topics(ctx: RequestContext, topics: Iterable[Any], out: TopicErrorsBuilder) -> list[CommitTopic]:
    """The partitions of an OffsetCommit or TxnOffsetCommit request that exist; the others are
    answered UNKNOWN_TOPIC_OR_PARTITION in ``out`` before the coordinator is asked
    (``KafkaApis.handleOffsetCommitRequest`` / ``handleTxnOffsetCommitRequest``)."""
    valid: list[CommitTopic] = []
    for t in topics:
        parts = []
        for p in t.partitions:
            if partition_exists(ctx, t.name, p.partition_index):
                parts.append(
                    CommitPartition(
                        p.partition_index,
                        p.committed_offset,
                        int(getattr(p, "committed_leader_epoch", -1)),
                        p.committed_metadata,
                    )
                )
            else:
                out.add(t.name, p.partition_index, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
        if parts:
            valid.append(CommitTopic(t.name, tuple(parts)))
    return valid
