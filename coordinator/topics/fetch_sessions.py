"""Incremental fetch sessions (KIP-227), after Kafka's core/.../server/FetchSession.scala.

A request's (session_id, epoch) picks a context:

* epoch 0 or -1 ("full"): any named session is closed; epoch -1 → sessionless, epoch 0 → a
  full fetch that creates a session (if the cache has room) whose id goes in the response;
* epoch > 0 ("incremental"): the session must exist (else FETCH_SESSION_ID_NOT_FOUND), the
  epoch must be the expected one (else INVALID_FETCH_SESSION_EPOCH), and topic-id use must
  match the request version (else FETCH_SESSION_TOPIC_ID_ERROR).  The request's partitions
  are added/updated, forgotten ones removed; the fetch covers every session partition and the
  response carries only partitions with records, a changed high watermark or log start
  offset, or an error.  Partitions that returned records move to the end of the session's
  order (so max_bytes rotates fairly).

Session ids are random positive int32s; the cache holds ``max_entries`` sessions and evicts
one unused for ``eviction_ms``, or else a smaller one older than that (``tryEvict``).
"""

from __future__ import annotations

import random
import uuid
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from msgspec import Struct, field
from rallypoint.protocol.errors import ErrorCode

INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0
FINAL_EPOCH = -1
INT32_MAX = 2**31 - 1
ZERO_UUID = uuid.UUID(int=0)

# Kafka's max.incremental.fetch.session.cache.slots / min.incremental.fetch.session.eviction.ms
DEFAULT_MAX_SESSIONS = 1000
DEFAULT_EVICTION_MS = 120_000

Key = tuple[Any, int]  # (topic name, partition) before v13, (topic id, partition) from v13


def next_epoch(epoch: int) -> int:
    """``FetchMetadata.nextEpoch``."""
    if epoch < 0:
        return FINAL_EPOCH
    if epoch == INT32_MAX:
        return 1
    return epoch + 1


class PartitionRequest(Struct):
    """What a fetch asks of one partition (request fields, or the session's cached copy)."""

    topic: str | None  # None: topic id unknown to this broker
    topic_id: uuid.UUID
    partition: int
    fetch_offset: int
    partition_max_bytes: int
    current_leader_epoch: int = -1
    # Cached response state (sessions only)
    high_watermark: int = -1
    log_start_offset: int = -1

    def update_from(self, req: PartitionRequest) -> None:
        self.fetch_offset = req.fetch_offset
        self.partition_max_bytes = req.partition_max_bytes
        self.current_leader_epoch = req.current_leader_epoch
        if self.topic is None:
            self.topic = req.topic


class FetchSession(Struct):
    """One incremental fetch session: its id, the epoch its next request must carry, and its partitions."""

    id: int
    uses_topic_ids: bool
    creation_ms: int
    last_used_ms: int
    epoch: int
    partitions: OrderedDict[Key, PartitionRequest] = field(default_factory=OrderedDict)


class FetchContext(Struct):
    """What to fetch and how to shape the response."""

    kind: str  # "error" | "sessionless" | "full" | "incremental"
    partitions: list[tuple[Key, PartitionRequest]]
    error: ErrorCode = ErrorCode.NONE
    session: FetchSession | None = None
    request_epoch: int = 0
    uses_topic_ids: bool = False


class FetchSessionCache:
    def __init__(self, max_entries: int = DEFAULT_MAX_SESSIONS, eviction_ms: int = DEFAULT_EVICTION_MS) -> None:
        self.max_entries = max_entries
        self.eviction_ms = eviction_ms
        self.sessions: dict[int, FetchSession] = {}
        self._rng = random.Random()

    def __len__(self) -> int:
        return len(self.sessions)

    def new_context(
        self,
        version: int,
        session_id: int,
        epoch: int,
        fetch_data: list[tuple[Key, PartitionRequest]],
        forgotten: Iterable[Key],
        now_ms: int,
    ) -> FetchContext:
        """``FetchManager.newContext``."""
        uses_ids = version >= 13
        if epoch in (INITIAL_EPOCH, FINAL_EPOCH):
            if session_id != INVALID_SESSION_ID:
                self.sessions.pop(session_id, None)
            kind = "sessionless" if epoch == FINAL_EPOCH else "full"
            return FetchContext(kind, fetch_data, uses_topic_ids=uses_ids)
        session = self.sessions.get(session_id)
        if session is None:
            return FetchContext("error", [], ErrorCode.FETCH_SESSION_ID_NOT_FOUND)
        if session.epoch != epoch:
            return FetchContext("error", [], ErrorCode.INVALID_FETCH_SESSION_EPOCH)
        if session.uses_topic_ids != uses_ids:
            return FetchContext("error", [], ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR)
        for key, req in fetch_data:
            cached = session.partitions.get(key)
            if cached is None:
                session.partitions[key] = req
            else:
                cached.update_from(req)
        for key in forgotten:
            session.partitions.pop(key, None)
        if not session.partitions:
            del self.sessions[session.id]
            return FetchContext("sessionless", fetch_data, uses_topic_ids=uses_ids)
        session.last_used_ms = now_ms
        session.epoch = next_epoch(session.epoch)
        return FetchContext(
            "incremental",
            list(session.partitions.items()),
            session=session,
            request_epoch=epoch,
            uses_topic_ids=uses_ids,
        )

    def finish(
        self, ctx: FetchContext, results: list[tuple[Key, PartitionRequest, dict[str, Any]]], now_ms: int
    ) -> tuple[ErrorCode, int, list[tuple[Key, PartitionRequest, dict[str, Any]]]]:
        """(top-level error, session id, partitions to send) — ``updateAndGenerateResponseData``."""
        if ctx.kind == "error":
            return ctx.error, INVALID_SESSION_ID, []
        if ctx.kind == "sessionless":
            return ErrorCode.NONE, INVALID_SESSION_ID, results
        if ctx.kind == "full":
            sid = self._maybe_create(ctx, results, now_ms)
            return ErrorCode.NONE, sid, results
        session = ctx.session
        assert session is not None
        if session.epoch != next_epoch(ctx.request_epoch):
            # Another request of this session was answered meanwhile.
            return ErrorCode.INVALID_FETCH_SESSION_EPOCH, session.id, []
        out = []
        for key, req, data in results:
            cached = session.partitions.get(key)
            if cached is None:
                continue
            if _must_respond(cached, data):
                out.append((key, req, data))
                if data.get("records"):
                    session.partitions.move_to_end(key)
        return ErrorCode.NONE, session.id, out

    # ------------------------------------------------------------------ cache

    def _maybe_create(
        self, ctx: FetchContext, results: list[tuple[Key, PartitionRequest, dict[str, Any]]], now_ms: int
    ) -> int:
        size = len(results)
        if len(self.sessions) >= self.max_entries and not self._try_evict(size, now_ms):
            return INVALID_SESSION_ID
        sid = self._new_id()
        session = FetchSession(sid, ctx.uses_topic_ids, now_ms, now_ms, next_epoch(INITIAL_EPOCH))
        for key, req, data in results:
            cached = PartitionRequest(
                req.topic,
                req.topic_id,
                req.partition,
                req.fetch_offset,
                req.partition_max_bytes,
                req.current_leader_epoch,
                high_watermark=int(data.get("high_watermark", -1)),
                log_start_offset=int(data.get("log_start_offset", -1)),
            )
            if int(data.get("error_code", 0)) != 0:
                cached.high_watermark = -1
            session.partitions[key] = cached
        self.sessions[sid] = session
        return sid

    def _new_id(self) -> int:
        while True:
            sid = self._rng.randint(1, INT32_MAX - 1)
            if sid not in self.sessions:
                return sid

    def _try_evict(self, size: int, now_ms: int) -> bool:
        if not self.sessions:
            return False
        lru = min(self.sessions.values(), key=lambda s: (s.last_used_ms, s.id))
        if now_ms - lru.last_used_ms > self.eviction_ms:
            del self.sessions[lru.id]
            return True
        evictable = [s for s in self.sessions.values() if now_ms - s.creation_ms > self.eviction_ms]
        if not evictable:
            return False
        victim = min(evictable, key=lambda s: (len(s.partitions), s.id))
        if size < len(victim.partitions):
            return False
        del self.sessions[victim.id]
        return True


def _must_respond(cached: PartitionRequest, data: dict[str, Any]) -> bool:
    """``CachedPartition.maybeUpdateResponseData`` (updating the cached copy)."""
    must = bool(data.get("records"))
    hw = int(data.get("high_watermark", -1))
    if cached.high_watermark != hw:
        must = True
        cached.high_watermark = hw
    lso = int(data.get("log_start_offset", -1))
    if cached.log_start_offset != lso:
        must = True
        cached.log_start_offset = lso
    if int(data.get("error_code", 0)) != 0:
        cached.high_watermark = -1
        must = True
    return must
