"""Helpers shared by the group handlers (KafkaApis-level checks done before the coordinator)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext
from ..groups.events import TopicErrors


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
