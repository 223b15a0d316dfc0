"""One partition's log: record batches, offsets, retention, compaction, waiters.

Batches are kept as bytes with their base offset already patched in: in segment files
(``files``, durable topic data: :mod:`.segment_files`, docs/data-plane.md, "Durable topic
data") or in memory.  Either way the per-batch index (base and last offsets, positions,
timestamps) is in memory, one int64 array per column.  The high watermark is the log end
offset (one replica, acks=all is acks=1), and with no transactions the last stable offset
equals it too.  Retention drops whole oldest batches, advancing the log start offset: while the
partition holds more than ``retention.bytes`` (never the newest batch), and those whose newest
record is older than ``retention.ms`` (all of them if need be), for topics whose
``cleanup.policy`` holds ``delete``; on disk a segment file goes once all of it is below the log
start.  Compacted topics are cleaned by :mod:`.compaction`; the cleaner never touches the
active segment (docs/configs.md, "Retention and compaction").

Waiters are ``asyncio.Event`` objects of parked fetches; every append (and deletion of the
partition) sets them, so a long-poll fetch wakes as soon as data arrives.

In memory with a data directory, offsets are handed out only below ``reserved_end``, an end
offset the topic store has already saved: an append that would pass it first asks
``on_reserve`` to save a higher one, so no offset is handed out twice across a crash
(docs/data-plane.md, "Restarts").  After a crash such a partition restarts empty with its log
start offset below its end offset; a fetch inside that gap waits for new data, like a fetch
inside a gap of a compacted log.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import mmap
from array import array
from collections.abc import Callable, Iterable
from pathlib import Path

from msgspec import Struct
from rallypoint.protocol.errors import ErrorCode
from rallypoint.protocol.records import (
    CONTROL_COMMIT,
    DEFAULT_MAX_UNCOMPRESSED,
    BatchHeader,
    RecordsError,
    control_type,
    decode_records,
    end_txn_marker,
    iter_record_times,
    parse_header,
    with_base_offset,
    with_max_timestamp,
)

from . import compaction
from .configs import LogPolicy
from .log_validator import BatchError, Checked
from .producers import ProducerStates
from .segment_files import SegmentFiles

LEADER_EPOCH = 0
NO_TIMESTAMP = -1
UNKNOWN_OFFSET = -1  # a batch's max-timestamp offset not known yet (loaded from disk; walked on demand)
DEFAULT_POLICY = LogPolicy(retention_bytes=-1)


def _ints(values: Iterable[int] = ()) -> array[int]:
    """The per-batch index columns are arrays of int64: 8 bytes a batch, not a list of objects."""
    return array("q", values)


class AppendResult(Struct, frozen=True):
    """Where an append went; ``duplicate``: an idempotent retry, answered with the original offsets."""

    base_offset: int
    log_start_offset: int
    duplicate: bool = False


class ReadResult(Struct, frozen=True):
    """Records read from a partition, with its high watermark and log start offset."""

    records: bytes
    high_watermark: int
    log_start_offset: int


class OffsetOutOfRange(Exception):
    pass


class CleanJob(Struct, frozen=True):
    """One compaction pass's input (:meth:`PartitionLog.clean_job`)."""

    version: int  # the log's layout version when the job was made (apply_clean checks it)
    count: int  # batches handed in (from the log's head)
    end_base: int  # base offset of the first batch not handed in (the log end if none)
    batches: list[bytes] | None  # in memory; None: read from ``spans`` by :meth:`run`
    spans: list[tuple[str, int, int]]  # on disk: (segment path, file position, bytes), in order
    first_segment: int  # on disk: base offset of the segment holding the first batch (-1: none)
    max_ts_offsets: list[int]
    now_ms: int
    delete_retention_ms: int
    keep_empty: frozenset[int]
    max_uncompressed: int

    def read(self) -> list[bytes]:
        """The batches handed in (on disk: read through files of its own, so the pass does not
        share the log's descriptors; a segment deleted meanwhile raises OSError)."""
        if self.batches is not None:
            return self.batches
        from rallypoint.protocol.records import split_batches

        out: list[bytes] = []
        for path, pos, size in self.spans:
            with open(path, "rb") as f:
                f.seek(pos)
                data = f.read(size)
            out.extend(data[p : p + n] for p, n in split_batches(data))
        return out

    def run(self) -> compaction.Cleaned:
        """The pass (pure but for reading the segments: safe in another thread)."""
        return compaction.clean(
            self.read(),
            self.max_ts_offsets,
            now_ms=self.now_ms,
            delete_retention_ms=self.delete_retention_ms,
            keep_empty=self.keep_empty,
            max_uncompressed=self.max_uncompressed,
        )


class PartitionLog:
    def __init__(
        self,
        topic: str,
        partition: int,
        start_offset: int = 0,
        end_offset: int | None = None,
        *,
        files: SegmentFiles | None = None,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.log_start_offset = start_offset
        self.next_offset = start_offset if end_offset is None else end_offset  # log end offset == high watermark
        # Set by the topic store when it persists end offsets (see the module docstring).
        self.reserved_end: int | None = None
        self.on_reserve: Callable[[PartitionLog, int], None] | None = None
        # The per-batch index, one column each; entries before ``_head`` are dropped (lazily).
        self._base = _ints()
        self._last = _ints()  # last offset of each batch
        self._pos = _ints()  # cumulative byte position of each batch
        self._max_ts = _ints()
        # running maximum of _max_ts (never decreases): bisected by offset_for_timestamp
        self._max_ts_so_far = _ints()
        self._max_ts_offset = _ints()  # offset of the record holding each batch's max timestamp
        # The batches themselves: in memory, or in segment files (``files``: durable topic data).
        self._batches: list[bytes] = []
        self.files = files
        self._head = 0
        self._end_pos = 0
        # bumped whenever batches before the active segment go or change (compaction checks it)
        self._version = 0
        # the active segment: its first batch (an index into the columns) and when it was rolled
        self._active = 0
        self._active_since_ms: int | None = None
        # compaction: the first offset not yet cleaned (Kafka's cleaner checkpoint) and the
        # newest delete horizon the cleaner gave a batch of tombstones (NO_TIMESTAMP: none)
        self.first_dirty = start_offset
        self.latest_delete_horizon = NO_TIMESTAMP
        self.producers = ProducerStates()
        # transactions: producer id -> first offset of its open transaction here, and the
        # aborted ones (producer id, first offset, last offset, LSO when it ended), in order
        self.open_txns: dict[int, int] = {}
        self.aborted_txns: list[tuple[int, int, int, int]] = []
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
    def layout_version(self) -> int:
        """Bumped whenever batches before the active segment go or change."""
        return self._version

    @property
    def batch_count(self) -> int:
        return len(self._base) - self._head

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
        policy: LogPolicy = DEFAULT_POLICY,
        now_ms: int = 0,
    ) -> AppendResult:
        """Append one produced batch that passed ``log_validator`` (its header ``h`` and the
        ``checked`` walk of its records), after the idempotent-producer checks of Kafka's
        ``UnifiedLog.analyzeAndValidateProducerState``.  ``policy``: the topic's settings (a
        LogAppendTime topic's batches are stamped with ``now_ms``; segments roll by size and
        age; ``retention.bytes`` applies)."""
        entry = None
        if h.has_producer_id:
            entry = self.producers.get(h.producer_id)
            if entry is not None:
                dup = entry.find_duplicate(h)
                if dup is not None:
                    return AppendResult(dup.first_offset, self.log_start_offset, duplicate=True)
                entry.check(h)
                entry.check_transactional(h)
        self._maybe_roll(size, policy, now_ms)
        base = self._append(data, pos, size, h, checked, now_ms if policy.log_append_time else None)
        self._track_producer(h, base)
        if self.files is not None and (self.files.unflushed >= policy.flush_messages or policy.flush_ms == 0):
            self._flush(now_ms)  # flush.messages / flush.ms=0: fsync before the answer
        self._retain(policy.retention_bytes if policy.delete else policy.memory_bytes)
        return AppendResult(base, self.log_start_offset)

    def _track_producer(self, h: BatchHeader, base: int) -> None:
        """The producer state after a data batch at ``base`` (only once appended: a refused
        batch leaves no producer entry)."""
        if h.has_producer_id:
            e = self.producers.entry(h.producer_id)
            had_txn = e.current_txn_first_offset is not None
            e.add(h, base)
            if not had_txn and e.current_txn_first_offset is not None:
                self.open_txns[h.producer_id] = base

    def _flush(self, now_ms: int) -> None:
        assert self.files is not None
        try:
            self.files.flush(now_ms)
        except OSError as e:
            raise BatchError(ErrorCode.KAFKA_STORAGE_ERROR, f"cannot flush the log: {e}") from e

    def flush(self, now_ms: int, policy: LogPolicy) -> bool:
        """``flush.ms``: fsync the active segment if written to and due (the topic store's
        periodic check).  True if it flushed."""
        f = self.files
        if f is None or not f.unflushed:
            return False
        if f.last_flush_ms is None:
            f.last_flush_ms = now_ms
        if now_ms - f.last_flush_ms < policy.flush_ms:
            return False
        f.flush(now_ms)
        return True

    # ------------------------------------------------------------------ transactions

    @property
    def last_stable_offset(self) -> int:
        """The first offset of the oldest open transaction, else the high watermark."""
        if self.open_txns:
            return min(self.open_txns.values())
        return self.next_offset

    def write_marker(self, producer_id: int, producer_epoch: int, commit: bool, now_ms: int) -> int:
        """Append the COMMIT or ABORT control batch ending the producer's transaction here
        (WriteTxnMarkers for a data partition); an ABORT of a non-empty transaction goes to the
        aborted-transaction index.  Returns the marker's offset."""
        entry = self.producers.entry(producer_id)
        entry.check_marker(producer_epoch)
        offset = self.next_offset
        self._reserve(offset + 1)
        batch = end_txn_marker(offset, now_ms, producer_id, producer_epoch, commit)
        self._store(batch, 1)
        self._end_marker(producer_id, producer_epoch, commit, offset)
        self._index(offset, offset, len(batch), now_ms, offset)
        self.next_offset = offset + 1
        self.notify()
        return offset

    def _end_marker(self, producer_id: int, producer_epoch: int, commit: bool, offset: int) -> None:
        first = self.producers.entry(producer_id).end_txn(producer_epoch)
        self.open_txns.pop(producer_id, None)
        if first is not None and not commit:
            self.aborted_txns.append((producer_id, first, offset, self.last_stable_offset_after(offset + 1)))

    def last_stable_offset_after(self, end: int) -> int:
        return min(self.open_txns.values()) if self.open_txns else end

    def aborted_between(self, start: int, end: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of the aborted transactions overlapping [start, end)."""
        return [(pid, first) for pid, first, last, _lso in self.aborted_txns if last >= start and first < end]

    def _maybe_roll(self, size: int, policy: LogPolicy, now_ms: int) -> None:
        """Start a new active segment before this batch when the active one would pass
        ``segment.bytes`` or is older than ``segment.ms`` (Kafka's ``LogSegment.shouldRoll``,
        without jitter; age counted from the roll)."""
        n = len(self._base)
        if self._active >= n:  # the active segment is empty: this batch opens it
            self._active_since_ms = now_ms
            return
        if self._active_since_ms is None:
            self._active_since_ms = now_ms
        active_bytes = self._end_pos - self._pos[self._active]
        if active_bytes + size > policy.segment_bytes or now_ms - self._active_since_ms >= policy.roll_ms:
            self.roll(now_ms)

    def roll(self, now_ms: int) -> None:
        """Close the active segment now (the next batch opens a new one)."""
        self._active = len(self._base)
        self._active_since_ms = now_ms
        if self.files is not None and self.files.active is not None and self.files.active.size:
            try:
                self.files.roll(self.next_offset, self._end_pos)
            except OSError as e:
                raise BatchError(ErrorCode.KAFKA_STORAGE_ERROR, f"cannot roll the log: {e}") from e

    def _reserve(self, end: int) -> None:
        if self.on_reserve is not None and (self.reserved_end is None or end > self.reserved_end):
            try:
                self.on_reserve(self, end)
            except OSError as e:  # the end offset cannot be saved: Kafka's answer for a failed log dir
                raise BatchError(ErrorCode.KAFKA_STORAGE_ERROR, f"cannot save the end offset: {e}") from e

    def _store(self, batch: bytes, records: int) -> None:
        """Keep one batch's bytes: in memory, or written to the active segment file."""
        if self.files is None:
            self._batches.append(batch)
            return
        try:
            if self.files.active is None:
                self.files.roll(self.next_offset, self._end_pos)
            self.files.write(batch, records)
        except OSError as e:  # Kafka marks the log dir offline; the produce gets KAFKA_STORAGE_ERROR
            raise BatchError(ErrorCode.KAFKA_STORAGE_ERROR, f"cannot write the log: {e}") from e

    def _index(self, base: int, last: int, size: int, max_ts: int, max_ts_offset: int) -> None:
        self._base.append(base)
        self._last.append(last)
        self._pos.append(self._end_pos)
        self._max_ts.append(max_ts)
        prev = self._max_ts_so_far[-1] if self._max_ts_so_far else NO_TIMESTAMP
        self._max_ts_so_far.append(max(prev, max_ts))
        self._max_ts_offset.append(max_ts_offset)
        self._end_pos += size

    def _append(
        self, data: bytes, pos: int, size: int, h: BatchHeader, checked: Checked, log_append_time: int | None = None
    ) -> int:
        base = self.next_offset
        end = base + h.last_offset_delta + 1
        self._reserve(end)
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
        self._store(batch, h.record_count)
        self._index(base, end - 1, size, max_ts, base + checked.offset_delta_of_max)
        self.next_offset = end
        self.notify()
        return base

    def _retain(self, retention_bytes: int) -> None:
        if retention_bytes < 0:
            return
        head = self._head
        last = len(self._base) - 1
        trimmed = False
        while head < last and self._end_pos - self._pos[head] > retention_bytes:
            head += 1
            trimmed = True
        if not trimmed:
            return
        self._advance_head(head, self._base[head])

    def _advance_head(self, head: int, log_start: int) -> None:
        """Batches before index ``head`` go; the log starts at ``log_start`` (≥ their end).
        On disk the segment files wholly before it are deleted (Kafka deletes whole segments;
        the log start offset may lie inside the first one, as after DeleteRecords)."""
        n = len(self._base)
        self._head = head
        self._version += 1
        self.log_start_offset = log_start
        self.first_dirty = max(self.first_dirty, log_start)
        self._active = max(self._active, head)
        self.producers.truncate_head(log_start)
        if self.files is not None:
            if head >= n and self.files.active is not None and self.files.active.size:
                self.files.roll(self.next_offset, self._end_pos)  # everything went: a new segment
            self.files.drop_before(self._pos_at(head))
        if head > 1024 and head * 2 > n:
            for col in (self._base, self._last, self._pos, self._max_ts, self._max_ts_offset):
                del col[:head]
            if self.files is None:
                del self._batches[:head]
            self._max_ts_so_far = _ints(itertools.accumulate(self._max_ts, max))
            self._active -= head
            self._head = 0

    def expire(self, now_ms: int, retention_ms: int) -> int:
        """``retention.ms``: drop the oldest batches whose newest record is older than
        ``retention_ms`` (every batch if all are; Kafka rolls the active segment then); the log
        start offset moves past them.  Returns how many batches went."""
        if retention_ms < 0:
            return 0
        limit = now_ms - retention_ms
        head, n = self._head, len(self._base)
        while head < n and self._max_ts[head] < limit:
            head += 1
        gone = head - self._head
        if gone:
            self._advance_head(head, self._base[head] if head < n else self.next_offset)
            self.notify()
        return gone

    def delete_records_before(self, offset: int) -> int:
        """DeleteRecords: move the log start offset up to ``offset`` (never back); the batches
        wholly below it go.  Returns the new low watermark.  The caller checks ``offset`` against
        the high watermark (OFFSET_OUT_OF_RANGE above it)."""
        if offset <= self.log_start_offset:
            return self.log_start_offset
        # the first batch holding an offset at or above it (all of them may go)
        self._advance_head(bisect.bisect_left(self._last, offset, lo=self._head), offset)
        self.notify()
        return offset

    # ------------------------------------------------------------------ read

    def _index_for(self, offset: int) -> int:
        """Index of the first batch whose last offset is ≥ ``offset`` (the one holding it, or
        the next one when ``offset`` fell in a gap compaction left)."""
        i = bisect.bisect_right(self._base, offset, lo=self._head) - 1
        if i < self._head:
            return self._head
        if self._last[i] < offset:
            return i + 1
        return i

    def _batch(self, i: int) -> bytes:
        if self.files is None:
            return self._batches[i]
        return self.files.read(self._pos[i], self._pos_at(i + 1))

    def check_offset(self, offset: int) -> None:
        if offset < self.log_start_offset or offset > self.next_offset:
            raise OffsetOutOfRange(
                f"Received request for offset {offset} for partition {self.topic}-{self.partition}, "
                f"but we only have log segments in the range {self.log_start_offset} to {self.next_offset}."
            )

    def bytes_available(self, offset: int, upper: int | None = None) -> int:
        """Bytes a fetch at ``offset`` could return now (0 at the end or out of range), below
        ``upper`` when given (read_committed)."""
        if offset >= self.next_offset or offset < self.log_start_offset or self._head >= len(self._base):
            return 0
        i = self._index_for(offset)
        n = len(self._base)
        if upper is not None:
            n = min(n, bisect.bisect_left(self._base, upper, lo=self._head))
        if i >= n:
            return 0
        return self._pos_at(n) - self._pos[i]

    def read(self, offset: int, max_bytes: int, min_one: bool, upper: int | None = None) -> ReadResult:
        """Whole batches from the one containing ``offset``, up to ``max_bytes``, none starting
        at or after ``upper`` (read_committed: the last stable offset).  On disk a read stops at
        the end of the segment it starts in (as Kafka's ``LogSegment.read``).

        With ``min_one`` the first batch is returned even if larger (KIP-74).  Raises
        OffsetOutOfRange as ``LocalLog.read`` does.
        """
        self.check_offset(offset)
        n = len(self._base)
        if offset == self.next_offset or self._head >= n:
            return ReadResult(b"", self.next_offset, self.log_start_offset)  # at the end, or in a gap
        i = self._index_for(offset)
        if upper is not None:
            n = min(n, bisect.bisect_left(self._base, upper, lo=self._head))
        if i >= n:
            return ReadResult(b"", self.next_offset, self.log_start_offset)
        start_pos = self._pos[i]
        limit = start_pos + max_bytes
        if self.files is not None:
            seg_end = self.files.segment_end(start_pos)
            if seg_end < self._pos_at(n):
                n = bisect.bisect_left(self._pos, seg_end, lo=i)
        # the batches that fit: those ending at or before ``limit`` (at least one with min_one)
        j0 = bisect.bisect_right(self._pos, limit, lo=i + 1, hi=n)
        j = n if j0 == n and self._pos_at(n) <= limit else j0 - 1
        if j == i:
            if not min_one:
                return ReadResult(b"", self.next_offset, self.log_start_offset)
            j = i + 1
        if self.files is not None:
            data = self.files.read(start_pos, self._pos_at(j))
        else:
            data = self._batches[i] if j == i + 1 else b"".join(self._batches[i:j])
        return ReadResult(data, self.next_offset, self.log_start_offset)

    # ------------------------------------------------------------------ compaction

    def cleanable_end(self, now_ms: int, policy: LogPolicy) -> int:
        """Index of the first batch the cleaner must leave alone: the active segment's first,
        or an earlier one holding records younger than ``min.compaction.lag.ms`` (on disk: the
        first batch of the segment holding that one, since whole segments are rewritten)."""
        end = self._active
        if policy.min_compaction_lag_ms > 0:
            young = now_ms - policy.min_compaction_lag_ms
            for i in range(self._head, end):
                if self._max_ts[i] > young:
                    end = i
                    break
            if self.files is not None and end < self._active:
                seg_start = self.files.segments[bisect.bisect_right(self.files._starts, self._pos[end]) - 1].start
                end = max(self._head, bisect.bisect_left(self._pos, seg_start, lo=self._head, hi=end))
        return end

    def _pos_at(self, i: int) -> int:
        return self._pos[i] if i < len(self._pos) else self._end_pos

    def dirty_ratio(self, end: int) -> float:
        """Bytes not yet cleaned over all bytes, of the batches before index ``end``."""
        total = self._pos_at(end) - self._pos_at(self._head)
        if total <= 0:
            return 0.0
        dirty_from = self._index_for(self.first_dirty) if self.first_dirty > self.log_start_offset else self._head
        return max(0, self._pos_at(end) - self._pos_at(dirty_from)) / total

    def needs_cleaning(self, now_ms: int, policy: LogPolicy) -> bool:
        """Kafka's ``LogCleanerManager.grabFilthiestCompactedLog`` test for one log: its dirty
        ratio reaches ``min.cleanable.dirty.ratio`` (and something is dirty), or its oldest dirty
        record is older than ``max.compaction.lag.ms``, or the newest delete horizon it set has
        passed."""
        end = self.cleanable_end(now_ms, policy)
        if end > self._head:
            ratio = self.dirty_ratio(end)
            if ratio > 0 and ratio >= policy.min_cleanable_ratio:
                return True
            if ratio > 0 and policy.max_compaction_lag_ms < 2**63 - 1:
                first = self._index_for(max(self.first_dirty, self.log_start_offset))
                if first < end and self._max_ts[first] < now_ms - policy.max_compaction_lag_ms:
                    return True
        return self.latest_delete_horizon != NO_TIMESTAMP and self.latest_delete_horizon <= now_ms

    def clean_job(self, now_ms: int, policy: LogPolicy, max_uncompressed: int = DEFAULT_MAX_UNCOMPRESSED) -> CleanJob:
        """What one cleaning pass works on: the batches before :meth:`cleanable_end` (in memory
        the list of them, not copies; on disk where they lie in the segment files).  The pass
        itself (:meth:`CleanJob.run`) may run in another thread; :meth:`apply_clean` installs its
        result."""
        end = self.cleanable_end(now_ms, policy)
        spans: list[tuple[str, int, int]] = []
        if self.files is not None and end > self._head:
            lo, hi = self._pos[self._head], self._pos_at(end)
            for seg in self.files.segments:
                a, b = max(lo, seg.start), min(hi, seg.end)
                if a < b:
                    spans.append((str(seg.path), a - seg.start, b - a))
        return CleanJob(
            first_segment=self.files.segments[0].base_offset if self.files is not None and self.files.segments else -1,
            version=self._version,
            count=end - self._head,
            end_base=self._base[end] if end < len(self._base) else self.next_offset,
            batches=self._batches[self._head : end] if self.files is None else None,
            spans=spans,
            max_ts_offsets=list(self._max_ts_offset[self._head : end]),
            now_ms=now_ms,
            delete_retention_ms=policy.delete_retention_ms,
            keep_empty=self.producers.last_offsets(),
            max_uncompressed=max_uncompressed,
        )

    def stage_clean(self, job: CleanJob, result: compaction.Cleaned) -> tuple[Path, int] | None:
        """On disk, the cleaned batches written to a new file, ready for :meth:`apply_clean`
        (safe in another thread); None in memory or when nothing is left."""
        if self.files is None or not job.count:
            return None
        return self.files.stage_cleaned(job.first_segment, list(result.batches))

    def apply_clean(self, job: CleanJob, result: compaction.Cleaned, staged: tuple[Path, int] | None = None) -> bool:
        """Install a pass's result unless the batches it read changed meanwhile (retention or
        DeleteRecords moved the log start): then False, and the next pass starts again.  Appends
        only add batches after them, so those stay.  On disk the cleaned batches replace the
        segments they came from (Kafka's swap protocol, :meth:`SegmentFiles.replace_closed`):
        the file :meth:`stage_clean` wrote for this job (``staged``, None if nothing is left)."""
        head = self._head
        end = head + job.count
        if job.version != self._version or end > len(self._base):
            return False
        if end < len(self._base) and self._base[end] != job.end_base:
            return False
        if not job.count:  # nothing was handed in: only the cleaner's bookkeeping moves
            self.first_dirty = max(self.first_dirty, job.end_base)
            self.latest_delete_horizon = result.latest_delete_horizon
            return True
        kept_pos = _ints()
        kept_base = _ints()
        kept_last = _ints()
        kept_ts = _ints()
        pos = 0
        for batch in result.batches:
            h = parse_header(batch)
            kept_pos.append(pos)
            kept_base.append(h.base_offset)
            kept_last.append(h.last_offset)
            kept_ts.append(h.max_timestamp)
            pos += len(batch)
        if self.files is not None and job.count:
            if result.batches and staged is None:
                raise ValueError("apply_clean on disk needs the file stage_clean wrote")
            try:
                self.files.replace_closed(self._pos_at(end), staged)
            except OSError as e:
                raise BatchError(ErrorCode.KAFKA_STORAGE_ERROR, f"cannot install the cleaned log: {e}") from e
        shift = pos - self._pos_at(end)
        self._pos = kept_pos + _ints(p + shift for p in self._pos[end:])
        self._base = kept_base + self._base[end:]
        self._last = kept_last + self._last[end:]
        self._max_ts = kept_ts + self._max_ts[end:]
        self._max_ts_offset = _ints(result.max_ts_offsets) + self._max_ts_offset[end:]
        if self.files is None:
            self._batches = list(result.batches) + self._batches[end:]
        self._end_pos += shift
        self._max_ts_so_far = _ints(itertools.accumulate(self._max_ts, max))
        self._active = len(result.batches) + max(0, self._active - end)
        self._head = 0
        self._version += 1
        self.first_dirty = max(self.first_dirty, job.end_base)
        self.latest_delete_horizon = result.latest_delete_horizon
        self.notify()
        return True

    def clean(
        self, now_ms: int, policy: LogPolicy, max_uncompressed: int = DEFAULT_MAX_UNCOMPRESSED
    ) -> compaction.Cleaned:
        """One cleaning pass here and now (:meth:`clean_job`, :meth:`CleanJob.run`,
        :meth:`stage_clean`, :meth:`apply_clean`)."""
        job = self.clean_job(now_ms, policy, max_uncompressed)
        result = job.run()
        assert self.apply_clean(job, result, self.stage_clean(job, result))
        return result

    # ------------------------------------------------------------------ timestamps

    def offset_for_timestamp(self, ts: int, max_uncompressed: int = DEFAULT_MAX_UNCOMPRESSED) -> tuple[int, int] | None:
        """(timestamp, offset) of the first record with timestamp ≥ ts (Kafka's
        ``FileRecords.searchForTimestamp``): the first batch whose max timestamp reaches ``ts``
        holds it; that batch alone is walked (decompressed if need be).  Its records were
        validated on append, so the walk is bounded by its bytes."""
        i = bisect.bisect_left(self._max_ts_so_far, ts, lo=self._head)
        n = len(self._base)
        while i < n and self._max_ts[i] < ts:
            i += 1  # only when the running maximum came from a batch retention dropped
        if i >= n:
            return None
        batch = self._batch(i)
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
        for i in range(self._head, len(self._base)):
            if self._max_ts[i] > best:
                best, best_i = self._max_ts[i], i
        if best_i < 0:
            return None
        offset = self._max_ts_offset[best_i]
        if offset == UNKNOWN_OFFSET:  # loaded from disk: walk that one batch once
            offset = self._base[best_i]
            batch = self._batch(best_i)
            try:
                for o, rts in iter_record_times(batch, parse_header(batch), DEFAULT_MAX_UNCOMPRESSED):
                    if rts == best:
                        offset = o
                        break
            except RecordsError:
                pass
            self._max_ts_offset[best_i] = offset
        return best, offset

    # ------------------------------------------------------------------ loading from disk

    def load_batch(self, buf: bytes | mmap.mmap, h: BatchHeader) -> None:
        """Index one batch read back from a segment file (already stored there) and replay
        its producer and transaction state, as Kafka's ``ProducerStateManager`` rebuilds it
        from the log at recovery.  ``buf``: what ``h.position`` refers to (for control batches,
        whose record says commit or abort)."""
        base = h.base_offset
        if h.is_control:
            commit = True
            try:
                recs = decode_records(buf, h)
                commit = bool(recs) and control_type(recs[0]) == CONTROL_COMMIT
            except RecordsError:
                pass
            self._end_marker(h.producer_id, h.producer_epoch, commit, base)
        else:
            self._track_producer(h, base)
        self._index(base, h.last_offset, h.size, h.max_timestamp, UNKNOWN_OFFSET)
        self.next_offset = h.next_offset

    def finish_load(self, log_start_offset: int, now_ms: int) -> None:
        """After :meth:`load_batch` of every batch: batches wholly below the saved log start
        offset are dropped, the last segment is the active one."""
        self._active = bisect.bisect_left(self._pos, self.files.active.start) if self.files and self.files.active else 0
        self._active_since_ms = now_ms
        self.next_offset = max(self.next_offset, log_start_offset)
        if log_start_offset > self.log_start_offset:
            self._advance_head(bisect.bisect_left(self._last, log_start_offset, lo=self._head), log_start_offset)
        self.first_dirty = self.log_start_offset


__all__ = ["AppendResult", "BatchError", "ErrorCode", "OffsetOutOfRange", "PartitionLog", "ReadResult"]
