"""Durable share-partition state (what Kafka's share coordinator keeps in ``__share_group_state``).

docs/share-groups.md, "Durable state".  One file, ``<data.dir>/share-group-state.log``, of
frames ``[length u32][crc32c u32][JSON]``; each JSON object is a whole snapshot of one share
partition, as Kafka's ``ShareSnapshotValue`` holds it::

    {"group": g, "topic_id": t, "partition": p, "start_offset": n,
     "state_batches": [[first, last, state, delivery_count], ...]}

or ``{"group": g, "topic_id": t, "partition": p, "deleted": true}``.  The last frame of a
partition wins.  At start-up the file is read up to its first incomplete or corrupt frame (a
torn tail from a crash) and truncated there; when dead frames make up most of the file it is
rewritten with the live snapshots only (a temporary file renamed over it).

Writes are grouped: every snapshot saved while a round is on disk waits for the next round, a
partition saved twice in one round is written once, and a round is one ``write`` (plus one
``fdatasync`` when ``rallypoint.offsets.flush=always``).  :meth:`save` returns once the round
holding its snapshot is written.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import struct
import uuid
from pathlib import Path
from typing import Any, Final

from msgspec import Struct
from rallypoint.protocol.crc import crc32c

from ..logger import get as get_logger
from .partition import RecordState, StateBatch

log = get_logger("rallypoint.share_state")

FILE_NAME: Final = "share-group-state.log"
_FRAME = struct.Struct(">II")
REWRITE_MIN_BYTES = 1 << 20

StateKey = tuple[str, uuid.UUID, int]  # (group id, topic id, partition)


class SavedState(Struct, frozen=True):
    """One share partition's durable state (Kafka's ``ShareSnapshotValue``): start offset and state batches."""

    start_offset: int
    batches: tuple[StateBatch, ...]


def _encode(key: StateKey, state: SavedState | None) -> bytes:
    obj: dict[str, Any] = {"group": key[0], "topic_id": str(key[1]), "partition": key[2]}
    if state is None:
        obj["deleted"] = True
    else:
        obj["start_offset"] = state.start_offset
        obj["state_batches"] = [[b.first_offset, b.last_offset, int(b.state), b.delivery_count] for b in state.batches]
    body = json.dumps(obj, separators=(",", ":")).encode()
    return _FRAME.pack(len(body), crc32c(body)) + body


def _decode(body: bytes) -> tuple[StateKey, SavedState | None]:
    obj = json.loads(body)
    key = (str(obj["group"]), uuid.UUID(obj["topic_id"]), int(obj["partition"]))
    if obj.get("deleted"):
        return key, None
    batches = tuple(StateBatch(int(f), int(la), RecordState(int(s)), int(c)) for f, la, s, c in obj["state_batches"])
    return key, SavedState(int(obj["start_offset"]), batches)


def read_states(path: Path) -> tuple[dict[StateKey, SavedState], int, int]:
    """(live states, bytes of whole valid frames, bytes of live frames) of the file at ``path``."""
    states: dict[StateKey, SavedState] = {}
    sizes: dict[StateKey, int] = {}
    data = path.read_bytes() if path.exists() else b""
    pos = 0
    while pos + _FRAME.size <= len(data):
        length, crc = _FRAME.unpack_from(data, pos)
        body = data[pos + _FRAME.size : pos + _FRAME.size + length]
        if len(body) < length or crc32c(body) != crc:
            break
        try:
            key, state = _decode(body)
        except (ValueError, KeyError, TypeError):
            break
        if state is None:
            states.pop(key, None)
            sizes.pop(key, None)
        else:
            states[key] = state
            sizes[key] = _FRAME.size + length
        pos += _FRAME.size + length
    return states, pos, sum(sizes.values())


class ShareStateStore:
    def __init__(self, data_dir: Path | None, *, fsync: bool = False) -> None:
        self.path = data_dir / FILE_NAME if data_dir is not None else None
        self.fsync = fsync
        self._fd: int | None = None
        self._size = 0
        self._pending: dict[StateKey, SavedState | None] = {}
        self._waiters: list[asyncio.Future[None]] = []
        self._writer: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._closed = False
        self._latest: dict[StateKey, bytes] = {}  # each live partition's last frame (for rewrites)

    # ------------------------------------------------------------------ life cycle

    def load(self) -> dict[StateKey, SavedState]:
        """Read the saved states (truncating a torn tail) and open the file for appends."""
        if self.path is None:
            return {}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        states, valid, live = read_states(self.path)
        size = self.path.stat().st_size if self.path.exists() else 0
        if valid < size:
            log.warning("share_state.truncated", path=str(self.path), at=valid, bytes_cut=size - valid)
            with open(self.path, "r+b") as f:
                f.truncate(valid)
        self._latest = {k: _encode(k, st) for k, st in states.items()}
        if valid > REWRITE_MIN_BYTES and live * 2 < valid:
            self._rewrite_frames(self._latest)
        else:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            self._size = valid
        return states

    def _rewrite_frames(self, frames: dict[StateKey, bytes]) -> None:
        assert self.path is not None
        if self._fd is not None:
            os.close(self._fd)
        tmp = self.path.with_suffix(".log.tmp")
        data = b"".join(frames.values())
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        with contextlib.suppress(OSError):
            dfd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self._size = len(data)
        log.info("share_state.rewritten", path=str(self.path), bytes=len(data), partitions=len(frames))

    async def close(self) -> None:
        self._closed = True
        if self._wake is not None:
            self._wake.set()
        if self._writer is not None:
            with contextlib.suppress(Exception):
                await self._writer
        if self._pending:
            pending, self._pending = self._pending, {}
            self._write_frames({k: _encode(k, st) for k, st in pending.items()})
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.fsync(self._fd)
            os.close(self._fd)
            self._fd = None

    # ------------------------------------------------------------------ writes

    def save_later(self, key: StateKey, state: SavedState | None) -> asyncio.Future[None]:
        """Queue ``state`` (None: the partition's state is deleted) for the next round."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        if self.path is None:
            fut.set_result(None)
            return fut
        self._pending[key] = state
        self._waiters.append(fut)
        if self._writer is None or self._writer.done():
            self._wake = asyncio.Event()
            self._writer = loop.create_task(self._run())
        else:
            assert self._wake is not None
            self._wake.set()
        return fut

    async def save(self, key: StateKey, state: SavedState | None) -> None:
        await self.save_later(key, state)

    async def _run(self) -> None:
        assert self._wake is not None
        while self._pending:
            self._wake.clear()
            pending, self._pending = self._pending, {}
            waiters, self._waiters = self._waiters, []
            frames = {k: _encode(k, st) for k, st in pending.items()}
            try:
                await asyncio.to_thread(self._write_frames, frames)
            except OSError as e:
                log.error("share_state.write_failed", path=str(self.path), error=str(e))
                for w in waiters:
                    if not w.done():
                        w.set_exception(e)
                continue
            for w in waiters:
                if not w.done():
                    w.set_result(None)

    def _write_frames(self, frames: dict[StateKey, bytes]) -> None:
        """One round (in a worker thread): append the frames; rewrite the file when mostly dead."""
        if self._fd is None or not frames:
            return
        data = b"".join(frames.values())
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        self._size += len(data)
        for k, frame in frames.items():
            if frame[_FRAME.size :].endswith(b'"deleted":true}'):
                self._latest.pop(k, None)
            else:
                self._latest[k] = frame
        if self._size > REWRITE_MIN_BYTES and sum(map(len, self._latest.values())) * 2 < self._size:
            self._rewrite_frames(self._latest)
        elif self.fsync:
            getattr(os, "fdatasync", os.fsync)(self._fd)

    @property
    def size(self) -> int:
        return self._size
