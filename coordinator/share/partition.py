"""One share partition's record states (KIP-932; Kafka's ``SharePartition``): sans-IO.

docs/share-groups.md, "Record states" is the contract this file implements.  The rules, at the
top so they can be checked against Kafka's in one place:

* Every offset of the in-flight window ``[start_offset, end_offset)`` is in one of four states:
  AVAILABLE → ACQUIRED → ACKNOWLEDGED | ARCHIVED.  ``start_offset`` is the share-partition start
  offset (SPSO), ``end_offset`` one past the last offset ever acquired (SPEO + 1).
* :meth:`SharePartition.acquire` hands a member AVAILABLE offsets in offset order, first those
  inside the window (redeliveries), then new offsets read from the log, at most
  ``max_in_flight`` offsets past the SPSO (``group.share.partition.max.record.locks``).  Each
  acquisition adds one to the offset's delivery count and locks it until ``now + lock_ms``.
* Acknowledgement types: GAP (0) and REJECT (3) → ARCHIVED; ACCEPT (1) → ACKNOWLEDGED;
  RELEASE (2) → AVAILABLE, or ARCHIVED once the delivery count reached ``delivery_limit``
  (``group.share.delivery.count.limit``).  A lock that expires, and a member's records released
  when its share session closes, follow RELEASE's rule.
* Acknowledging an offset that is not ACQUIRED by the acknowledging member is INVALID_RECORD_STATE
  and changes nothing for that partition (the batches of one partition apply all or none).
* The SPSO moves past every leading offset that is ACKNOWLEDGED, ARCHIVED or has no record (a
  compaction gap, or below the log start); their state is then forgotten.
* Records of aborted transactions (read_committed) are ARCHIVED as they enter the window.

Persistent state (:meth:`SharePartition.snapshot`) is the SPSO and the window as runs of
``(first, last, state, delivery_count)``; ACQUIRED offsets are saved as AVAILABLE with their
count, so after a restart they are delivered again (Kafka's share coordinator does the same).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Sequence
from enum import IntEnum

from msgspec import Struct
from rallypoint.protocol.errors import ErrorCode


class RecordState(IntEnum):
    """Kafka's ``RecordState`` ids (also the persisted ``deliveryState``)."""

    AVAILABLE = 0
    ACQUIRED = 1
    ACKNOWLEDGED = 2
    ARCHIVED = 4


class AckType(IntEnum):
    """ShareFetch/ShareAcknowledge ``acknowledge_types`` values (v1)."""

    GAP = 0
    ACCEPT = 1
    RELEASE = 2
    REJECT = 3


TERMINAL = frozenset({RecordState.ACKNOWLEDGED, RecordState.ARCHIVED})


class LogBatch(Struct, frozen=True):
    """What acquisition needs of one log batch: its offsets and whether it is skipped
    (a read_committed consumer never sees an aborted transaction's records)."""

    base_offset: int
    last_offset: int
    aborted: bool = False


class Acquired(Struct, frozen=True):
    """One contiguous run of acquired offsets with one delivery count (``AcquiredRecords``)."""

    first_offset: int
    last_offset: int
    delivery_count: int


class AckBatch(Struct, frozen=True):
    """One ``AcknowledgementBatch``: one type for the whole range, or one per offset."""

    first_offset: int
    last_offset: int
    types: tuple[int, ...]

    def type_at(self, offset: int) -> int:
        return self.types[0] if len(self.types) == 1 else self.types[offset - self.first_offset]


class StateBatch(Struct, frozen=True):
    """A persisted run of offsets sharing a state and a delivery count."""

    first_offset: int
    last_offset: int
    state: RecordState
    delivery_count: int


def ack_batches_error(batches: Sequence[AckBatch]) -> str | None:
    """Kafka's request validation of one partition's acknowledgement batches (INVALID_REQUEST),
    or None: ranges in order and not overlapping, one type or one per offset, known types."""
    prev_last = -1
    for b in batches:
        if b.first_offset < 0 or b.last_offset < b.first_offset:
            return f"Invalid acknowledgement batch {b.first_offset}-{b.last_offset}"
        if b.first_offset <= prev_last:
            return "Acknowledgement batches overlap or are out of order"
        if len(b.types) != 1 and len(b.types) != b.last_offset - b.first_offset + 1:
            return "Acknowledge types must be one, or one for each offset of the batch"
        if any(t not in (0, 1, 2, 3) for t in b.types):
            return "Invalid acknowledge type"
        prev_last = b.last_offset
    return None


class _Rec:
    __slots__ = ("count", "lock", "member", "state")

    def __init__(self, state: RecordState, count: int) -> None:
        self.state = state
        self.count = count
        self.member = ""
        self.lock = 0  # the acquisition that holds it (0: none)


class SharePartition:
    """The in-flight window of one (group, topic partition)."""

    def __init__(
        self,
        start_offset: int,
        *,
        max_in_flight: int = 2000,
        delivery_limit: int = 5,
        state: Iterable[StateBatch] = (),
    ) -> None:
        self.start_offset = start_offset
        self.end_offset = start_offset
        self.max_in_flight = max_in_flight
        self.delivery_limit = delivery_limit
        self._recs: dict[int, _Rec] = {}
        self._locks: dict[int, tuple[int, list[int]]] = {}  # lock id -> (deadline, offsets)
        self._deadlines: list[tuple[int, int]] = []  # heap of (deadline, lock id)
        self._next_lock = 1
        for b in state:
            for off in range(b.first_offset, b.last_offset + 1):
                if off >= start_offset:
                    st = RecordState.AVAILABLE if b.state == RecordState.ACQUIRED else b.state
                    self._recs[off] = _Rec(st, b.delivery_count)
                    self.end_offset = max(self.end_offset, off + 1)
        self._advance()

    # ------------------------------------------------------------------ queries

    def next_fetch_offset(self) -> int:
        """Where the next acquisition starts reading the log: the first AVAILABLE offset in the
        window, else the window's end."""
        for off in range(self.start_offset, self.end_offset):
            rec = self._recs.get(off)
            if rec is not None and rec.state == RecordState.AVAILABLE:
                return off
        return self.end_offset

    def window_full(self) -> bool:
        return self.end_offset - self.start_offset >= self.max_in_flight

    def counts(self) -> dict[str, int]:
        """Offsets in the window by state (the control plane's in-flight view)."""
        out = {s.name.lower(): 0 for s in RecordState}
        for rec in self._recs.values():
            out[rec.state.name.lower()] += 1
        return out

    def state_of(self, offset: int) -> tuple[RecordState, int, str] | None:
        """(state, delivery count, holder) of one offset in the window; None outside it."""
        rec = self._recs.get(offset)
        if rec is None:
            return None
        return rec.state, rec.count, rec.member

    def next_deadline(self) -> int | None:
        """When the earliest live acquisition lock expires."""
        while self._deadlines and self._deadlines[0][1] not in self._locks:
            heapq.heappop(self._deadlines)
        return self._deadlines[0][0] if self._deadlines else None

    # ------------------------------------------------------------------ events

    def truncate_to(self, log_start_offset: int) -> bool:
        """The log's start moved past the SPSO (retention, DeleteRecords): offsets below it are
        gone, whatever their state.  True when the window changed."""
        if log_start_offset <= self.start_offset:
            return False
        for off in range(self.start_offset, min(log_start_offset, self.end_offset)):
            self._recs.pop(off, None)
        self.start_offset = log_start_offset
        self.end_offset = max(self.end_offset, log_start_offset)
        self._advance()
        return True

    def acquire(
        self,
        member: str,
        batches: Iterable[LogBatch],
        *,
        max_records: int,
        now_ms: int,
        lock_ms: int,
    ) -> tuple[list[Acquired], bool]:
        """Acquire AVAILABLE offsets of ``batches`` (log order) for ``member``, at most
        ``max_records``.  Returns the acquired runs and whether the window changed in a way that
        must be persisted (aborted records archived)."""
        out: list[Acquired] = []
        taken: list[int] = []
        changed = False
        lock_id = self._next_lock
        window_end = self.start_offset + self.max_in_flight
        for b in batches:
            if len(taken) >= max_records:
                break
            first = max(b.base_offset, self.start_offset)
            for off in range(first, b.last_offset + 1):
                if len(taken) >= max_records:
                    break
                if off < self.end_offset:
                    rec = self._recs.get(off)
                    if rec is None or rec.state != RecordState.AVAILABLE:
                        continue
                else:
                    if off >= window_end:
                        break
                    rec = _Rec(RecordState.AVAILABLE, 0)
                    self._recs[off] = rec
                    self.end_offset = off + 1
                    if b.aborted:
                        rec.state = RecordState.ARCHIVED
                        changed = True
                        continue
                rec.state = RecordState.ACQUIRED
                rec.count += 1
                rec.member = member
                rec.lock = lock_id
                taken.append(off)
                if out and out[-1].last_offset == off - 1 and out[-1].delivery_count == rec.count:
                    last = out[-1]
                    out[-1] = Acquired(last.first_offset, off, last.delivery_count)
                else:
                    out.append(Acquired(off, off, rec.count))
        if taken:
            self._next_lock += 1
            deadline = now_ms + lock_ms
            self._locks[lock_id] = (deadline, taken)
            heapq.heappush(self._deadlines, (deadline, lock_id))
        if changed:
            self._advance()
        return out, changed

    def acknowledge(self, member: str, batches: Sequence[AckBatch]) -> ErrorCode:
        """Apply one partition's acknowledgements (validated with :func:`ack_batches_error`).
        Work is bounded by the window, whatever ranges a request names."""
        for b in batches:
            if b.first_offset < self.start_offset or b.last_offset >= self.end_offset:
                return ErrorCode.INVALID_RECORD_STATE  # outside the window: nothing there is held
            for off in range(b.first_offset, b.last_offset + 1):
                rec = self._recs.get(off)
                if rec is None or rec.state != RecordState.ACQUIRED or rec.member != member:
                    return ErrorCode.INVALID_RECORD_STATE
        for b in batches:
            for off in range(b.first_offset, b.last_offset + 1):
                rec = self._recs[off]
                t = b.type_at(off)
                if t == AckType.ACCEPT:
                    self._settle(rec, RecordState.ACKNOWLEDGED)
                elif t == AckType.RELEASE:
                    self._release(rec)
                else:  # GAP, REJECT
                    self._settle(rec, RecordState.ARCHIVED)
        self._advance()
        return ErrorCode.NONE

    def release_member(self, member: str) -> int:
        """Release every offset ``member`` holds (its share session closed); how many."""
        n = 0
        for rec in self._recs.values():
            if rec.state == RecordState.ACQUIRED and rec.member == member:
                self._release(rec)
                n += 1
        if n:
            self._advance()
        return n

    def expire_locks(self, now_ms: int) -> int:
        """Release the offsets whose acquisition lock expired at or before ``now_ms``."""
        n = 0
        while self._deadlines and self._deadlines[0][0] <= now_ms:
            _, lock_id = heapq.heappop(self._deadlines)
            entry = self._locks.pop(lock_id, None)
            if entry is None:
                continue
            for off in entry[1]:
                rec = self._recs.get(off)
                if rec is not None and rec.state == RecordState.ACQUIRED and rec.lock == lock_id:
                    self._release(rec)
                    n += 1
        if n:
            self._advance()
        return n

    # ------------------------------------------------------------------ persistence

    def snapshot(self) -> list[StateBatch]:
        """The window as runs (ACQUIRED saved as AVAILABLE; see the module docstring)."""
        out: list[StateBatch] = []
        for off in range(self.start_offset, self.end_offset):
            rec = self._recs.get(off)
            if rec is None:
                continue
            st = RecordState.AVAILABLE if rec.state == RecordState.ACQUIRED else rec.state
            if out and out[-1].last_offset == off - 1 and out[-1].state == st and out[-1].delivery_count == rec.count:
                last = out[-1]
                out[-1] = StateBatch(last.first_offset, off, st, rec.count)
            else:
                out.append(StateBatch(off, off, st, rec.count))
        return out

    # ------------------------------------------------------------------ internals

    def _settle(self, rec: _Rec, state: RecordState) -> None:
        rec.state = state
        rec.member = ""
        rec.lock = 0

    def _release(self, rec: _Rec) -> None:
        self._settle(rec, RecordState.ARCHIVED if rec.count >= self.delivery_limit else RecordState.AVAILABLE)

    def _advance(self) -> None:
        off = self.start_offset
        recs = self._recs
        while off < self.end_offset:
            rec = recs.get(off)
            if rec is not None and rec.state not in TERMINAL:
                break
            recs.pop(off, None)
            off += 1
        self.start_offset = off

    def held_by(self, member: str) -> Iterator[int]:
        for off, rec in self._recs.items():
            if rec.state == RecordState.ACQUIRED and rec.member == member:
                yield off
