"""What the ShareFetch and ShareAcknowledge handlers share: decoding acknowledgement batches
and building the per-topic answer (docs/share-groups.md, "Share sessions")."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext
from ..share.partition import AckBatch
from ..share.runtime import PartitionAnswer, ShareAnswer
from ..share.sessions import TopicIdPartition

ZERO_UUID = uuid.UUID(int=0)


def acks_of(topics: Iterable[Any]) -> dict[TopicIdPartition, list[AckBatch]]:
    """Each partition's acknowledgement batches (a topic id listed twice is merged: librdkafka
    may repeat one)."""
    out: dict[TopicIdPartition, list[AckBatch]] = {}
    for t in topics:
        for p in t.partitions:
            batches = p.acknowledgement_batches
            if batches:
                out.setdefault((t.topic_id or ZERO_UUID, int(p.partition_index)), []).extend(
                    AckBatch(int(b.first_offset), int(b.last_offset), tuple(int(x) for x in b.acknowledge_types))
                    for b in batches
                )
    return out


def node_endpoints(ctx: RequestContext) -> list[dict[str, Any]]:
    b = ctx.broker
    return [{"node_id": b.node_id, "host": b.advertised_host, "port": b.advertised_port, "rack": None}]


def topic_responses(ctx: RequestContext, answer: ShareAnswer, fetch: bool) -> list[dict[str, Any]]:
    leader = {"leader_id": ctx.broker.node_id, "leader_epoch": 0}
    by_topic: dict[uuid.UUID, list[dict[str, Any]]] = {}
    for (tid, p), pa in answer.partitions.items():
        by_topic.setdefault(tid, []).append(_partition(p, pa, leader, fetch))
    return [{"topic_id": tid, "partitions": parts} for tid, parts in by_topic.items()]


def _partition(p: int, pa: PartitionAnswer, leader: dict[str, int], fetch: bool) -> dict[str, Any]:
    if not fetch:  # ShareAcknowledge: error_code is the acknowledgement's
        code = pa.ack_error if pa.ack_error is not None else pa.error
        return {
            "partition_index": p,
            "error_code": code,
            "error_message": pa.ack_message if pa.ack_error is not None else pa.error_message,
            "current_leader": leader,
        }
    return {
        "partition_index": p,
        "error_code": pa.error,
        "error_message": pa.error_message,
        "acknowledge_error_code": pa.ack_error if pa.ack_error is not None else ErrorCode.NONE,
        "acknowledge_error_message": pa.ack_message,
        "current_leader": leader,
        "records": pa.records,  # never null: librdkafka cannot parse a null record set here
        "acquired_records": [
            {"first_offset": a.first_offset, "last_offset": a.last_offset, "delivery_count": a.delivery_count}
            for a in pa.acquired
        ],
    }
