"""A gated, recording TCP proxy between real clients and the broker under test.

Clients bootstrap to the tap, and the broker advertises the tap's port, so every connection of
every client goes through it.  The tap

* records what the broker *acknowledged*, straight off the wire: each OffsetCommit partition
  answered with error 0 (group, topic, partition, the offset the request carried) and each
  Produce partition answered with error 0 (base offset and record count).  An answer is
  recorded when it arrives from the broker, before it is passed on, so nothing the broker
  never answered is counted, and nothing it did answer is missed because a client died;
* records every offset a client *tried* to commit, since a commit cut by a crash may or may
  not have reached the disk;
* is a gate: :meth:`WireTap.close` drops every connection and answers new ones by closing
  them, so after a restart the recovered state can be read before any client retries a
  commit that would hide a lost one.

Only OffsetCommit (8) and Produce (0) frames are decoded; everything else passes through.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import threading
import uuid
from dataclasses import dataclass, field
from typing import Any

from rallypoint.protocol import codec, framing

PRODUCE = 0
OFFSET_COMMIT = 8

CommitKey = tuple[str, str, int]  # group, topic, partition
PartitionKey = tuple[str, int]  # topic, partition


@dataclass
class CommitState:
    """One (group, topic, partition): the last offset acknowledged, and the offsets tried since."""

    acked: int | None = None
    tried_since: set[int] = field(default_factory=set)

    def copy(self) -> CommitState:
        return CommitState(self.acked, set(self.tried_since))


@dataclass
class LedgerSnapshot:
    commits: dict[CommitKey, CommitState]
    produced: dict[PartitionKey, list[tuple[int, int]]]  # acknowledged [base, end) ranges


class Ledger:
    """What the broker acknowledged (thread-safe; the tap writes, the runner reads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._commits: dict[CommitKey, CommitState] = {}
        self._produced: dict[PartitionKey, list[tuple[int, int]]] = {}
        self.commits_acked = 0  # partition offsets answered with error 0
        self.commits_failed = 0  # partition offsets answered with an error
        self.batches_acked = 0
        self.records_acked = 0
        self.decode_errors = 0

    def commit_sent(self, group: str, topic: str, partition: int, offset: int) -> None:
        with self._lock:
            self._commits.setdefault((group, topic, partition), CommitState()).tried_since.add(offset)

    def commit_answered(self, group: str, topic: str, partition: int, offset: int, error: int) -> None:
        with self._lock:
            st = self._commits.setdefault((group, topic, partition), CommitState())
            if error != 0:
                self.commits_failed += 1
                return  # may still be on disk (e.g. a failed fsync): stays in tried_since
            # Our committers have one commit in flight per group, so an acknowledgement
            # supersedes everything tried before it.
            st.acked = offset
            st.tried_since.clear()
            self.commits_acked += 1

    def produce_answered(self, topic: str, partition: int, base: int, count: int) -> None:
        with self._lock:
            self._produced.setdefault((topic, partition), []).append((base, base + count))
            self.batches_acked += 1
            self.records_acked += count

    def decode_error(self) -> None:
        with self._lock:
            self.decode_errors += 1

    def snapshot(self) -> LedgerSnapshot:
        with self._lock:
            return LedgerSnapshot(
                {k: v.copy() for k, v in self._commits.items()},
                {k: list(v) for k, v in self._produced.items()},
            )


def batch_record_counts(records: bytes) -> int:
    """Offsets a Produce partition's record batches take: the sum of lastOffsetDelta + 1."""
    pos = 0
    total = 0
    while pos + 27 <= len(records):
        (length,) = struct.unpack_from(">i", records, pos + 8)
        (last_delta,) = struct.unpack_from(">i", records, pos + 23)
        total += last_delta + 1
        pos += 12 + length
    return total


def _topic_name(t: Any, ids: dict[uuid.UUID, str]) -> str:
    name = getattr(t, "name", None)
    if name:
        return str(name)
    tid = getattr(t, "topic_id", None)
    return ids.get(tid, f"id:{tid}") if isinstance(tid, uuid.UUID) else "?"


@dataclass
class _Sent:
    api_key: int
    version: int
    info: Any  # what the answer needs: commit offsets, or produce record counts


class WireTap:
    def __init__(self, ledger: Ledger, host: str = "127.0.0.1") -> None:
        self.ledger = ledger
        self.host = host
        self.topic_ids: dict[uuid.UUID, str] = {}
        self._upstream: int | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="wire-tap", daemon=True)
        self._thread.start()
        self._handlers: set[asyncio.Task[None]] = set()
        self._server = self._call(asyncio.start_server(self._on_client, host, 0))
        self.port = int(self._server.sockets[0].getsockname()[1])
        self.connections = 0

    def _call(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def open(self, broker_port: int) -> None:
        """Let clients through to the broker on ``broker_port``."""
        self._upstream = broker_port

    def close(self) -> None:
        """Drop every connection, refuse new ones; returns once every relay has stopped."""
        self._call(self._close_all())

    async def _close_all(self) -> None:
        self._upstream = None
        tasks = list(self._handlers)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def shutdown(self) -> None:
        self.close()
        self._server.close()
        self._call(self._server.wait_closed())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
        self._loop.close()

    # ------------------------------------------------------------------ relays

    async def _on_client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        port = self._upstream
        if port is None:
            writer.close()
            return
        # The relay runs in its own task, which close() cancels: cancelling the callback task
        # of asyncio.start_server itself makes Python 3.11 log a spurious error.
        relay = asyncio.create_task(self._relay(reader, writer, port))
        self._handlers.add(relay)
        relay.add_done_callback(self._handlers.discard)
        with contextlib.suppress(asyncio.CancelledError):
            await relay

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, port: int) -> None:
        upstream_writer: asyncio.StreamWriter | None = None
        try:
            try:
                up_reader, upstream_writer = await asyncio.wait_for(asyncio.open_connection(self.host, port), 5)
            except (OSError, TimeoutError):
                return
            self.connections += 1
            sent: dict[int, _Sent] = {}
            relays = [
                asyncio.create_task(self._requests(reader, upstream_writer, sent)),
                asyncio.create_task(self._responses(up_reader, writer, sent)),
            ]
            try:
                await asyncio.wait(relays, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for r in relays:
                    r.cancel()
                await asyncio.gather(*relays, return_exceptions=True)
        finally:
            for w in (writer, upstream_writer):
                if w is not None:
                    w.close()

    @staticmethod
    async def _frame(reader: asyncio.StreamReader) -> bytes:
        (size,) = struct.unpack(">i", await reader.readexactly(4))
        return await reader.readexactly(size)

    async def _requests(self, reader: asyncio.StreamReader, up: asyncio.StreamWriter, sent: dict[int, _Sent]) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                frame = await self._frame(reader)
                key, version, corr = framing.peek_api_key_version(frame)
                if key in (PRODUCE, OFFSET_COMMIT):
                    sent[corr] = _Sent(key, version, self._on_request(key, version, frame))
                up.write(struct.pack(">i", len(frame)) + frame)
                await up.drain()

    async def _responses(self, up: asyncio.StreamReader, writer: asyncio.StreamWriter, sent: dict[int, _Sent]) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                frame = await self._frame(up)
                (corr,) = struct.unpack_from(">i", frame)
                req = sent.pop(corr, None)
                if req is not None:
                    self._on_response(req, frame)
                writer.write(struct.pack(">i", len(frame)) + frame)
                await writer.drain()

    # ------------------------------------------------------------------ decoding

    def _on_request(self, key: int, version: int, frame: bytes) -> Any:
        try:
            header = framing.parse_request_header(frame, codec.request_header_version(key, version))
            msg = codec.decode_request(key, version, frame, header.size)
        except Exception:
            self.ledger.decode_error()
            return None
        if key == OFFSET_COMMIT:
            group = str(msg.group_id)
            offsets: dict[PartitionKey, int] = {}
            for t in msg.topics:
                name = _topic_name(t, self.topic_ids)
                for p in t.partitions:
                    offsets[(name, int(p.partition_index))] = int(p.committed_offset)
                    self.ledger.commit_sent(group, name, int(p.partition_index), int(p.committed_offset))
            return group, offsets
        counts: dict[PartitionKey, int] = {}
        for t in msg.topic_data:
            name = _topic_name(t, self.topic_ids)
            for p in t.partition_data:
                counts[(name, int(p.index))] = batch_record_counts(bytes(p.records or b""))
        return counts

    def _on_response(self, req: _Sent, frame: bytes) -> None:
        if req.info is None:
            return
        try:
            _corr, msg = codec.decode_response_frame(req.api_key, req.version, frame)
        except Exception:
            self.ledger.decode_error()
            return
        if req.api_key == OFFSET_COMMIT:
            group, offsets = req.info
            for t in msg.topics:
                name = _topic_name(t, self.topic_ids)
                for p in t.partitions:
                    pk = (name, int(p.partition_index))
                    if pk in offsets:
                        self.ledger.commit_answered(group, name, pk[1], offsets[pk], int(p.error_code))
            return
        counts: dict[PartitionKey, int] = req.info
        for t in msg.responses:
            name = _topic_name(t, self.topic_ids)
            for p in t.partition_responses:
                pk = (name, int(p.index))
                if int(p.error_code) == 0 and pk in counts and counts[pk] > 0:
                    self.ledger.produce_answered(name, pk[1], int(p.base_offset), counts[pk])


# ---------------------------------------------------------------------- checks


@dataclass(frozen=True)
class Loss:
    key: CommitKey
    acked: int
    recovered: int | None


def lost_commits(snapshot: LedgerSnapshot, recovered: dict[CommitKey, int]) -> list[Loss]:
    """Acknowledged commits the restarted broker does not have.

    For each (group, topic, partition) the recovered offset must be the last one acknowledged,
    or one tried after it (a commit cut by the crash may have reached the disk)."""
    out = []
    for key, st in snapshot.commits.items():
        if st.acked is None:
            continue
        have = recovered.get(key)
        if have != st.acked and have not in st.tried_since:
            out.append(Loss(key, st.acked, have))
    return out


def repeated_offsets(produced: dict[PartitionKey, list[tuple[int, int]]]) -> list[tuple[PartitionKey, int]]:
    """(partition, offset) pairs handed out by more than one acknowledged Produce."""
    out = []
    for pk, ranges in produced.items():
        end = -1
        for base, stop in sorted(ranges):
            if base < end:
                out.append((pk, base))
            end = max(end, stop)
    return out


def end_regressions(
    produced: dict[PartitionKey, list[tuple[int, int]]], latest: dict[PartitionKey, int]
) -> list[tuple[PartitionKey, int, int]]:
    """Partitions whose end offset after a restart is below an acknowledged offset:
    (partition, highest acknowledged end, end offset now)."""
    out = []
    for pk, ranges in produced.items():
        acked_end = max(stop for _base, stop in ranges)
        now = latest.get(pk, -1)
        if now < acked_end:
            out.append((pk, acked_end, now))
    return out
