"""One partition's in-memory log: opaque record batches, offsets, retention, waiters.

Batches are kept as bytes with their base offset already patched in.  The high watermark is
the log end offset (one replica, acks=all is acks=1), and with no transactions the last
stable offset equals it too.  Retention drops whole oldest batches (never the newest) while
the partition holds more than ``retention_bytes``, advancing the log start offset.

Waiters are ``asyncio.Event`` objects of parked fetches; every append (and deletion of the
partition) sets them, so a long-poll fetch wakes as soon as data arrives.

With a data directory, offsets are handed out only below ``reserved_end``, an end offset the
topic store has already saved: an append that would pass it first asks ``on_reserve`` to save a
higher one, so no offset is handed out twice across a crash (docs/data-plane.md, "Restarts").
After a crash a partition restarts empty with its log start offset below its end offset; a
fetch inside that gap waits for new data, like a fetch inside a gap of a compacted log.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
from collections.abc import Callable
from dataclasses import dataclass

from rallypoint.protocol.errors import ErrorCode
from rallypoint.protocol.records import (
    DEFAULT_MAX_UNCOMPRESSED,
    BatchHeader,
    RecordsError,
    iter_record_times,
    parse_header,
    with_base_offset,
    with_max_timestamp,
)

from .log_validator import BatchError, Checked
from .producers import ProducerStates

LEADER_EPOCH = 0
NO_TIMESTAMP = -1


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int
    log_start_offset: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class ReadResult:
    records: bytes
    high_watermark: int
    log_start_offset: int


class OffsetOutOfRange(Exception):
    pass


class PartitionLog:
    def __init__(self, topic: str, partition: int, start_offset: int = 0, end_offset: int | None = None) -> None:
        self.topic = topic
        self.partition = partition
        self.log_start_offset = start_offset
        self.next_offset = start_offset if end_offset is None else end_offset  # log end offset == high watermark
        # Set by the topic store when it persists end offsets (see the module docstring).
        self.reserved_end: int | None = None
        self.on_reserve: Callable[[PartitionLog, int], None] | None = None
        # Parallel lists; entries before ``_head`` are dropped (compacted away lazily).
        self._base: list[int] = []
        self._pos: list[int] = []  # cumulative byte position of each batch
        self._max_ts: list[int] = []
        # running maximum of _max_ts (never decreases): bisected by offset_for_timestamp
        self._max_ts_so_far: list[int] = []
        self._max_ts_offset: list[int] = []  # offset of the record holding each batch's max timestamp
        self._batches: list[bytes] = []
        self._head = 0
        self._end_pos = 0
        self.producers = ProducerStates()
        self._waiters: set[asyncio.Event] = set()
        self.deleted = False

    # ------------------------------------------------------------------ state

    @property
    def high_watermark(self) -> int:
        return self.next_offset

    @property
    def size_bytes(self) -> int:
        return self._end_pos - (self._pos[self._head] if self._head < len(self._pos) else self._end_pos)

    @property
    def batch_count(self) -> int:
        return len(self._batches) - self._head

    def has_epoch(self) -> bool:
        """Whether the leader epoch cache would hold epoch 0: anything was ever appended.

        The next offset survives restarts, so a partition that had data keeps answering
        epoch 0 (as Kafka's persisted leader-epoch checkpoint would)."""
        return self.next_offset > 0

    # ------------------------------------------------------------------ waiters

    def add_waiter(self, ev: asyncio.Event) -> None:
        self._waiters.add(ev)

    def remove_waiter(self, ev: asyncio.Event) -> None:
        self._waiters.discard(ev)

    def notify(self) -> None:
        for ev in self._waiters:
            ev.set()

    # ------------------------------------------------------------------ append

    def append_client_batch(
        self,
        data: bytes,
        pos: int,
        size: int,
        h: BatchHeader,
        checked: Checked,
        *,
        retention_bytes: int,
        log_append_time: int | None = None,
    ) -> AppendResult:
        """Append one produced batch that passed ``log_validator`` (its header ``h`` and the
        ``checked`` walk of its records), after the idempotent-producer checks of Kafka's
        ``UnifiedLog.analyzeAndValidateProducerState``.  ``log_append_time``: the broker's clock
        for a topic with ``message.timestamp.type=LogAppendTime`` (the batch is stamped with it)."""
        entry = None
        if h.has_producer_id:
            entry = self.producers.get(h.producer_id)
            if entry is not None:
                dup = entry.find_duplicate(h)
                if dup is not None:
                    return AppendResult(dup.first_offset, self.log_start_offset, duplicate=True)
                entry.check(h)
        base = self._append(data, pos, size, h, checked, log_append_time)
        if h.has_producer_id:  # only once appended: a refused batch leaves no producer entry
            (entry or self.producers.entry(h.producer_id)).add(h, base)
        self._retain(retention_bytes)
        return AppendResult(base, self.log_start_offset)

    def _append(
        self, data: bytes, pos: int, size: int, h: BatchHeader, checked: Checked, log_append_time: int | None = None
    ) -> int:
        base = self.next_offset
        end = base + h.last_offset_delta + 1
        if self.on_reserve is not None and (self.reserved_end is None or end > self.reserved_end):
            try:
                self.on_reserve(self, end)
            except OSError as e:  # the end offset cannot be saved: Kafka's answer for a failed log dir
                raise BatchError(ErrorCode.KAFKA_STORAGE_ERROR, f"cannot save the end offset: {e}") from e
        batch = with_base_offset(data, pos, size, base, LEADER_EPOCH)
        max_ts = checked.max_timestamp
        if log_append_time is not None:
            # LogValidator with LogAppendTime: setMaxTimestamp(LOG_APPEND_TIME, now) — every
            # record of the batch now has the broker's time (docs/configs.md, "What takes effect")
            max_ts = log_append_time
            batch = with_max_timestamp(batch, max_ts, log_append_time=True)
        elif max_ts != h.max_timestamp:
            # LogValidator stores the largest timestamp its walk found (setMaxTimestamp), not the
            # producer's claim: the CRC is recomputed then.
            batch = with_max_timestamp(batch, max_ts)
        self._base.append(base)
        self._pos.append(self._end_pos)
        self._max_ts.append(max_ts)
        prev = self._max_ts_so_far[-1] if self._max_ts_so_far else NO_TIMESTAMP
        self._max_ts_so_far.append(max(prev, max_ts))
        self._max_ts_offset.append(base + checked.offset_delta_of_max)
        self._batches.append(batch)
        self._end_pos += size
        self.next_offset = end
        self.notify()
        return base

    def _retain(self, retention_bytes: int) -> None:
        if retention_bytes < 0:
            return
        head = self._head
        last = len(self._batches) - 1
        trimmed = False
        while head < last and self._end_pos - self._pos[head] > retention_bytes:
            head += 1
            trimmed = True
        if not trimmed:
            return
        self._head = head
        self.log_start_offset = self._base[head]
        self.producers.truncate_head(self.log_start_offset)
        if head > 1024 and head * 2 > len(self._batches):
            del self._base[:head], self._pos[:head], self._max_ts[:head], self._batches[:head]
            del self._max_ts_offset[:head]
            self._max_ts_so_far = list(itertools.accumulate(self._max_ts, max))
            self._head = 0

    def delete_records_before(self, offset: int) -> int:
        """DeleteRecords: move the log start offset up to ``offset`` (never back); the batches
        wholly below it go.  Returns the new low watermark.  The caller checks ``offset`` against
        the high watermark (OFFSET_OUT_OF_RANGE above it)."""
        if offset <= self.log_start_offset:
            return self.log_start_offset
        head, last = self._head, len(self._batches) - 1
        while head < last and self._base[head + 1] <= offset:
            head += 1
        if head == last and offset >= self.next_offset:
            head = len(self._batches)  # everything goes
        self._head = head
        self.log_start_offset = offset
        self.producers.truncate_head(offset)
        self.notify()
        return offset

    # ------------------------------------------------------------------ read

    def _index_for(self, offset: int) -> int:
        """Index of the batch containing ``offset`` (first batch with last offset ≥ offset)."""
        # The batch containing offset is the last one whose base offset is <= offset; base offsets
        # of consecutive batches are contiguous, so that batch's last offset is >= offset.
        i = bisect.bisect_right(self._base, offset, lo=self._head) - 1
        return max(i, self._head)

    def check_offset(self, offset: int) -> None:
        if offset < self.log_start_offset or offset > self.next_offset:
            raise OffsetOutOfRange(
                f"Received request for offset {offset} for partition {self.topic}-{self.partition}, "
                f"but we only have log segments in the range {self.log_start_offset} to {self.next_offset}."
            )

    def bytes_available(self, offset: int) -> int:
        """Bytes a fetch at ``offset`` could return now (0 at the end or out of range)."""
        if offset >= self.next_offset or offset < self.log_start_offset or self._head >= len(self._batches):
            return 0
        return self._end_pos - self._pos[self._index_for(offset)]

    def read(self, offset: int, max_bytes: int, min_one: bool) -> ReadResult:
        """Whole batches from the one containing ``offset``, up to ``max_bytes``.

        With ``min_one`` the first batch is returned even if larger (KIP-74).  Raises
        OffsetOutOfRange as ``LocalLog.read`` does.
        """
        self.check_offset(offset)
        if offset == self.next_offset or self._head >= len(self._batches):
            return ReadResult(b"", self.next_offset, self.log_start_offset)  # at the end, or in a gap
        i = self._index_for(offset)
        n = len(self._batches)
        start_pos = self._pos[i]
        j = i
        while j < n:
            end = self._pos[j + 1] if j + 1 < n else self._end_pos
            if end - start_pos > max_bytes and not (min_one and j == i):
                break
            j += 1
        if j == i:
            return ReadResult(b"", self.next_offset, self.log_start_offset)
        data = self._batches[i] if j == i + 1 else b"".join(self._batches[i:j])
        return ReadResult(data, self.next_offset, self.log_start_offset)

    # ------------------------------------------------------------------ timestamps

    def offset_for_timestamp(self, ts: int, max_uncompressed: int = DEFAULT_MAX_UNCOMPRESSED) -> tuple[int, int] | None:
        """(timestamp, offset) of the first record with timestamp ≥ ts (Kafka's
        ``FileRecords.searchForTimestamp``): the first batch whose max timestamp reaches ``ts``
        holds it; that batch alone is walked (decompressed if need be).  Its records were
        validated on append, so the walk is bounded by its bytes."""
        i = bisect.bisect_left(self._max_ts_so_far, ts, lo=self._head)
        n = len(self._batches)
        while i < n and self._max_ts[i] < ts:
            i += 1  # only when the running maximum came from a batch retention dropped
        if i >= n:
            return None
        batch = self._batches[i]
        try:
            for offset, rts in iter_record_times(batch, parse_header(batch), max_uncompressed):
                if rts >= ts and offset >= self.log_start_offset:
                    return rts, offset
        except RecordsError:
            pass  # not after a successful append; answer with the batch as a whole
        return self._max_ts[i], self._base[i]

    def max_timestamp_offset(self) -> tuple[int, int] | None:
        """(timestamp, offset) of the first record with the largest timestamp (ListOffsets -3)."""
        best = NO_TIMESTAMP
        best_i = -1
        for i in range(self._head, len(self._batches)):
            if self._max_ts[i] > best:
                best, best_i = self._max_ts[i], i
        if best_i < 0:
            return None
        return best, self._max_ts_offset[best_i]


__all__ = ["AppendResult", "BatchError", "ErrorCode", "OffsetOutOfRange", "PartitionLog", "ReadResult"]
