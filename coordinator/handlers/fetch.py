"""Fetch (1): long-poll reads with KIP-74 limits and KIP-227 incremental fetch sessions.

The order of work follows KafkaApis.handleFetchRequest: the session context decides which
partitions are fetched; partitions of unknown topic ids get UNKNOWN_TOPIC_ID and of unknown
topics/partitions UNKNOWN_TOPIC_OR_PARTITION (these do not end a long poll early); the rest
are read (coordinator/topics/fetcher.py); the session context then picks what the response
carries.  A parked fetch blocks only its own connection.
"""

from __future__ import annotations

import uuid
from typing import Any

from rallypoint.protocol import codec
from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext
from ..logger import get as get_logger
from ..topics.fetch_sessions import INVALID_SESSION_ID, ZERO_UUID, Key, PartitionRequest
from ..topics.fetcher import ReadSpec, fetch
from ._leadership import LeaderHints, not_leader

API_KEY = 1

log = get_logger("rallypoint.fetch")

READ_COMMITTED = 1


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    broker = ctx.broker
    store = broker.topics
    version = ctx.api_version
    by_id = version >= 13
    now = broker.clock.now_ms()

    # Keyed by partition as Kafka's FetchRequest.fetchData (a LinkedHashMap): a partition listed
    # more than once is fetched and answered once, at its first position with its last values.
    fetch_data: dict[Key, PartitionRequest] = {}
    for t in request.topics:
        if by_id:
            tid: uuid.UUID = t.topic_id
            topic = store.by_id(tid)
            name = topic.name if topic is not None else None
        else:
            name = t.topic
            topic = store.get(name)
            tid = ZERO_UUID
        for p in t.partitions:
            key: Key = (tid if by_id else name, int(p.partition))
            fetch_data[key] = PartitionRequest(
                name,
                tid,
                int(p.partition),
                int(p.fetch_offset),
                int(p.partition_max_bytes),
                int(getattr(p, "current_leader_epoch", -1)),
            )
    forgotten: list[Key] = []
    for f in getattr(request, "forgotten_topics_data", ()):
        fkey = f.topic_id if by_id else f.topic
        forgotten.extend((fkey, int(i)) for i in f.partitions)

    sessions = store.fetch_sessions
    log.debug(
        "fetch",
        version=version,
        session_id=int(getattr(request, "session_id", 0)),
        session_epoch=int(getattr(request, "session_epoch", -1)),
        client_id=ctx.client_id,
    )
    context = sessions.new_context(
        version,
        int(getattr(request, "session_id", 0)),
        int(getattr(request, "session_epoch", -1)),
        list(fetch_data.items()),
        forgotten,
        now,
    )

    specs: list[tuple[int, ReadSpec]] = []
    for _key, req in context.partitions:
        if by_id:
            topic = store.by_id(req.topic_id)
            if topic is not None:
                req.topic = topic.name
        else:
            topic = store.get(req.topic) if req.topic is not None else None
        spec = ReadSpec(None, req.fetch_offset, req.partition_max_bytes, req.current_leader_epoch)
        if topic is None and by_id:
            spec.error = ErrorCode.UNKNOWN_TOPIC_ID
        elif topic is None or topic.partition(req.partition) is None:
            spec.error = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        elif (elsewhere := not_leader(ctx, topic.name, req.partition)) is not None:
            spec.error = elsewhere  # another node leads it (docs/cluster.md)
        else:
            spec.log = topic.partition(req.partition)
        specs.append((req.partition, spec))

    # Readable partitions first, then the erroneous ones, as Kafka assembles its response.
    order = sorted(range(len(specs)), key=lambda i: specs[i][1].error != ErrorCode.NONE)
    ordered_specs = [specs[i] for i in order]
    datas = await fetch(
        ordered_specs,
        max_wait_ms=codec.ms(request.max_wait),
        min_bytes=int(request.min_bytes),
        max_bytes=int(getattr(request, "max_bytes", 2**31 - 1)),
        read_committed=int(getattr(request, "isolation_level", 0)) == READ_COMMITTED,
        closing=lambda: store.closing,
    )
    results = [(context.partitions[i][0], context.partitions[i][1], datas[j]) for j, i in enumerate(order)]
    error, session_id, to_send = sessions.finish(context, results, broker.clock.now_ms())
    if context.kind == "full" and session_id != INVALID_SESSION_ID:
        log.info(
            "fetch session created",
            session_id=session_id,
            partitions=len(results),
            client_id=ctx.client_id,
            connection=ctx.connection_id,
        )
    elif error != ErrorCode.NONE:
        log.info("fetch session error", error=error.name, client_id=ctx.client_id, connection=ctx.connection_id)

    hints = LeaderHints(ctx)
    topics_out: dict[Any, dict[str, Any]] = {}
    for _key, req, data in to_send:
        tkey = req.topic_id if by_id else req.topic
        entry = topics_out.get(tkey)
        if entry is None:
            entry = {"topic_id": req.topic_id} if by_id else {"topic": req.topic}
            entry["partitions"] = []
            topics_out[tkey] = entry
        if version >= 16 and int(data["error_code"]) in (
            ErrorCode.NOT_LEADER_OR_FOLLOWER,
            ErrorCode.FENCED_LEADER_EPOCH,
        ):
            data = {**data, "current_leader": hints.current_leader(req.topic or "", req.partition)}
        entry["partitions"].append(data)
    return {
        "throttle_time": 0,
        "error_code": error,
        "session_id": session_id,
        "responses": list(topics_out.values()),
        "node_endpoints": hints.node_endpoints(),
    }
