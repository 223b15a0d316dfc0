"""The offsets log component (``broker.offsets_log``): durable, group-committed appends
to ``__consumer_offsets-<N>`` segment files, start-up recovery, and background compaction.

Why one module of about 830 lines: the append path (writers, group-commit sync rounds, segment
rolls) and start-up and compaction share each partition's lock, file descriptor and segment list;
the pure parts are elsewhere (reading and repair: :mod:`.segments` and :mod:`.recovery`, the
loader: :mod:`.loader`, compaction: :mod:`.cleaner`).

What it offers its user (the groups runtime; this package imports nothing of it):

* ``await append(partition, [(key, value | None), ...])`` writes one record batch and returns
  once it is written and, per ``rallypoint.offsets.flush``, fsynced; it raises
  :class:`~rallypoint.storage.errors.PersistError` otherwise.
* ``start()`` replays every partition before the server listens, moves groups found outside
  their partition (``recovery.plan_moves``), and calls its ``loader(partition, groups,
  offsets)`` (the groups runtime's ``load``) once per partition.

Write path.  Each partition has a queue and a writer task.  The writer takes *everything*
queued (group commit), assigns offsets, and writes the batches with one ``write`` (into the page
cache: microseconds, so in the event loop).  For ``flush=always`` it then joins the next *sync
round*, shared by every partition: one trip to the I/O threads fdatasyncs each partition
written since the last round, and releases all their waiters.  Appends that arrive while a
round is on disk form the next one, so N concurrent committers, on one partition or on many,
cost one trip and one fdatasync per partition per round, not one per commit
(docs/offsets-log-format.md, "Writing and durability").  A round written while no other
partition is syncing or waiting is written and synced in one trip of its own.
``group_commit=False`` (for the benchmark) writes and syncs one append per round, in an I/O
thread.  ``flush=interval`` releases waiters after the write and fsyncs every
``rallypoint.offsets.flush.interval.ms``; ``flush=never`` leaves it to the OS.  In every mode a
segment is fsynced before it is rolled, and all files are fsynced on stop.

A failed write is rolled back (the file truncated to its previous size) and reported to the
round's waiters; a failed fsync poisons the partition (its page-cache state is unknown, as
PostgreSQL learnt): every later append to it raises PersistError until a restart recovers it.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

from msgspec import Struct
from rallypoint.clock import Clock, SystemClock
from rallypoint.config import Config, default
from rallypoint.logger import get as get_logger
from rallypoint.protocol.errors import ErrorCode
from rallypoint.protocol.offsets_schema import (
    GroupMetadataValue,
    Key,
    OffsetCommitKey,
    OffsetCommitValue,
    OffsetsSchemaError,
    Value,
    encode_record,
)
from rallypoint.protocol.records import Record, build_batch, encode_batch, end_txn_marker

from .cleaner import CleanerStopped, CleanResult, clean_partition
from .dirlock import lock_exclusive
from .errors import OffsetsLogStartError, PersistError
from .loader import PartitionState
from .recovery import PartitionReplay, check_partition_dirs, plan_moves, replay_partition
from .segments import Segment, fsync_dir, partition_dir, segment_name

log = get_logger("rallypoint.offsets_log")

_fdatasync: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)


def _replay_live(pdir: Path, partition: int) -> PartitionReplay:
    return replay_partition(pdir, partition, repair=False)


def _write(fd: int, data: memoryview) -> int:
    """The segment writes go through here, so fault tests can fail them
    (tests/crash/test_write_faults.py); ``os.write`` is looked up at call time, so patching it works too."""
    return os.write(fd, data)


LOCK_FILE = "__consumer_offsets.lock"

Loader = Callable[[int, Mapping[str, GroupMetadataValue], Mapping[OffsetCommitKey, OffsetCommitValue]], None]


class _Pending(Struct):
    """One append queued for a partition's writer: its encoded records, time and the future its caller awaits."""

    entries: list[tuple[bytes, bytes | None]]
    timestamp: int
    future: asyncio.Future[None]
    producer: tuple[int, int] | None = None
    marker: bool | None = None


# One batch of a write round: (base offset, records, time, producer, marker) — for a
# transactional batch its (producer id, epoch), for a marker COMMIT (True) or ABORT (False).
# Plain tuples: the commit path builds one per batch.
_Planned = tuple[int, list[tuple[bytes, bytes | None]], int, tuple[int, int] | None, bool | None]


def _encode_planned(p: _Planned) -> bytes:
    base, entries, ts, producer, marker = p
    if producer is None:
        return build_batch(base, entries, ts)
    pid, epoch = producer
    if marker is not None:
        return end_txn_marker(base, ts, pid, epoch, marker)
    records = [Record(base + i, ts, k, v) for i, (k, v) in enumerate(entries)]
    return encode_batch(records, base_offset=base, producer_id=pid, producer_epoch=epoch, transactional=True)


class _Partition:
    def __init__(self, index: int, pdir: Path) -> None:
        self.index = index
        self.dir = pdir
        self.segments: list[Segment] = []  # last = active; guarded by lock
        self.lock = threading.Lock()  # segment list and the active file descriptor
        self.fd: int | None = None
        self.next_offset = 0
        self.queue: deque[_Pending] = deque()
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.failed: str | None = None
        self.unsynced = False
        self.writing = False  # a round is being written (reload waits for it)
        # cleaner bookkeeping
        self.dirty_closed_bytes = 0
        self.next_tombstone_expiry: int | None = None

    @property
    def active(self) -> Segment:
        return self.segments[-1]

    def closed_bytes(self) -> int:
        return sum(s.size for s in self.segments[:-1])


class OffsetsLog:
    def __init__(
        self,
        data_dir: Path | str,
        *,
        num_partitions: int = default("offsets.topic.num.partitions"),
        segment_bytes: int = default("offsets.topic.segment.bytes"),
        flush: str = default("rallypoint.offsets.flush"),
        flush_interval_ms: int = default("rallypoint.offsets.flush.interval.ms"),
        delete_retention_ms: int = default("log.cleaner.delete.retention.ms"),
        clock: Clock | None = None,
        group_commit: bool = True,
        cleaner: bool = True,
        cleaner_backoff_ms: int = 15000,
        min_cleanable_ratio: float = 0.5,
        io_threads: int = 4,
        loader: Loader | None = None,
    ) -> None:
        if flush not in ("always", "interval", "never"):
            raise ValueError(f"flush must be always, interval or never, not {flush!r}")
        self.data_dir = Path(data_dir)
        self.num_partitions = num_partitions
        self.segment_bytes = segment_bytes
        self.flush = flush
        self.flush_interval_ms = flush_interval_ms
        self.delete_retention_ms = delete_retention_ms
        self.clock: Clock = clock or SystemClock()
        self.group_commit = group_commit
        self.cleaner_enabled = cleaner
        self.cleaner_backoff_ms = cleaner_backoff_ms
        self.min_cleanable_ratio = min_cleanable_ratio
        self.io_threads = io_threads
        self.loader = loader
        # consumer-group records (key types 3-8, 16), raw, in log order, per partition
        self.consumer_loader: Callable[[int, list[tuple[bytes, bytes | None]]], None] | None = None
        # takes the offsets of transactions without a marker yet, per producer id
        self.pending_loader: Callable[[int, dict[int, dict[OffsetCommitKey, OffsetCommitValue]]], None] | None = None
        self._parts: list[_Partition] = []
        self._io: ThreadPoolExecutor | None = None
        self._cleaner_io: ThreadPoolExecutor | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._cleaner_wake: asyncio.Event | None = None
        self._clean_lock: asyncio.Lock | None = None
        self._stopping = False
        self._cleaner_stop = threading.Event()
        self._started = False
        self._lock_fd: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # flush=always: the partitions waiting for the next sync round (the partition, the
        # descriptor written, the future its writer waits on), and whether a round is on disk
        self._sync_next: list[tuple[_Partition, int, asyncio.Future[str | None]]] = []
        self._sync_running = False
        self._lone_syncs = 0  # writes synced on their own, in their own trip (none else waiting)
        # counters (tests and benchmarks read them)
        self.fsyncs = 0
        self.appends = 0
        self.rounds = 0
        self.sync_rounds = 0  # flush=always with group commit: trips to the I/O threads to sync
        self.cleanings = 0
        self._counter_lock = threading.Lock()
        # test hook: called by the cleaner at its crash points (see cleaner.py)
        self.cleaner_crash_hook: Callable[[str], None] | None = None

    @classmethod
    def from_config(cls, cfg: Config, data_dir: Path, clock: Clock, loader: Loader | None) -> OffsetsLog:
        return cls(
            data_dir,
            num_partitions=cfg["offsets.topic.num.partitions"],
            segment_bytes=cfg["offsets.topic.segment.bytes"],
            flush=cfg["rallypoint.offsets.flush"],
            flush_interval_ms=cfg["rallypoint.offsets.flush.interval.ms"],
            delete_retention_ms=cfg["log.cleaner.delete.retention.ms"],
            clock=clock,
            loader=loader,
        )

    # ------------------------------------------------------------------ life cycle

    async def start(self) -> None:
        """Replay every partition (verify, repair a torn tail, rebuild) and hand each one's
        groups and offsets to the loader, before the server listens."""
        t0 = time.monotonic()
        self._io = ThreadPoolExecutor(max_workers=self.io_threads, thread_name_prefix="offsets-io")
        self._cleaner_io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="offsets-cleaner")
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._parts = []
        try:
            replays = await loop.run_in_executor(self._io, self._recover_all)
        except OffsetsLogStartError as e:
            log.error("offsets_log.cannot_start", error=str(e))
            self._io.shutdown(wait=False)
            self._cleaner_io.shutdown(wait=False)
            raise
        total_bytes = 0
        total_records = 0
        for rp in replays:
            part = _Partition(rp.partition, partition_dir(self.data_dir, rp.partition))
            part.segments = rp.segments
            part.next_offset = rp.segments[-1].next_offset if rp.segments else 0
            part.dirty_closed_bytes = part.closed_bytes()  # unknown after a restart: clean once
            self._parts.append(part)
            total_bytes += rp.bytes
            total_records += rp.state.records
            for path, position, dropped, why in rp.report.truncated:
                log.warning(
                    "offsets_log.torn_tail_truncated",
                    partition=rp.partition,
                    file=str(path),
                    position=position,
                    bytes_dropped=dropped,
                    reason=why,
                )
            for path in rp.report.swaps_completed:
                log.info("offsets_log.cleaner_swap_completed", partition=rp.partition, file=str(path))
            st = rp.state
            # consumer-group records are not unknown when a consumer-group loader takes them
            unknown = st.unknown_records - (len(st.consumer_records) if self.consumer_loader is not None else 0)
            if unknown:
                log.warning("offsets_log.unknown_records_skipped", partition=rp.partition, count=unknown)
            if st.undecodable_records:
                log.warning(
                    "offsets_log.undecodable_records_skipped",
                    partition=rp.partition,
                    count=st.undecodable_records,
                    first=st.first_error,
                )
            if st.dropped_pending and self.pending_loader is None:
                log.warning(
                    "offsets_log.unfinished_transaction_dropped", partition=rp.partition, count=st.dropped_pending
                )
        self._started = True
        self._stopping = False
        self._cleaner_stop.clear()
        for part in self._parts:
            part.task = asyncio.create_task(self._writer(part), name=f"offsets-writer-{part.index}")
        states = {rp.partition: rp.state for rp in replays}
        await self._move_misplaced_groups(states)
        for rp in replays:
            self.hand_over(rp.partition, rp.state)
        if self.flush == "interval":
            self._tasks.append(asyncio.create_task(self._flusher(), name="offsets-flusher"))
        self._cleaner_wake = asyncio.Event()
        self._clean_lock = asyncio.Lock()
        if self.cleaner_enabled:
            self._tasks.append(asyncio.create_task(self._cleaner_loop(), name="offsets-cleaner"))
        log.info(
            "offsets_log.recovered",
            partitions=self.num_partitions,
            records=total_records,
            bytes=total_bytes,
            seconds=round(time.monotonic() - t0, 3),
        )

    def _lock_data_dir(self) -> None:
        """Hold an exclusive lock on ``<data.dir>/__consumer_offsets.lock`` while running: two
        brokers appending to one log would corrupt it (Kafka locks its log dirs the same way)."""
        path = self.data_dir / LOCK_FILE
        fd = lock_exclusive(path)
        if fd is None:
            raise OffsetsLogStartError(
                f"{path} is locked: another rallypoint process is using the data directory {self.data_dir}"
            ) from None
        self._lock_fd = fd

    def _unlock_data_dir(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the lock
            self._lock_fd = None

    def _recover_all(self) -> list[Any]:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._lock_data_dir()
        try:
            return self._recover_locked()
        except BaseException:
            self._unlock_data_dir()
            raise

    def _recover_locked(self) -> list[Any]:
        existing = check_partition_dirs(self.data_dir, self.num_partitions)
        created = False
        for n in range(self.num_partitions):
            if n not in existing:
                partition_dir(self.data_dir, n).mkdir(exist_ok=True)
                created = True
        if created:
            fsync_dir(self.data_dir)
        return [replay_partition(partition_dir(self.data_dir, n), n) for n in range(self.num_partitions)]

    async def _move_misplaced_groups(self, states: dict[int, PartitionState]) -> None:
        """Rewrite groups found outside their partition where they belong (``plan_moves``):
        copies first, durably, then tombstones where they were."""
        moves = plan_moves(states, self.num_partitions)
        if not moves:
            return
        try:
            await asyncio.gather(*(self.append(p, recs) for p, recs in sorted(moves.copies.items())))
            await asyncio.gather(
                *(self.append(p, [(k, None) for k in keys]) for p, keys in sorted(moves.tombstones.items()))
            )
        except PersistError as e:
            await self.stop()
            raise OffsetsLogStartError(f"cannot move groups to their __consumer_offsets partitions: {e}") from e
        log.warning(
            "offsets_log.groups_moved",
            groups=len(moves.groups),
            records=sum(len(r) for r in moves.copies.values()),
            tombstones=sum(len(k) for k in moves.tombstones.values()),
            reason="found outside partition_for(group): written before Kafka's Utils.abs was followed",
        )

    async def stop(self) -> None:
        if not self._started:
            return
        self._stopping = True
        self._cleaner_stop.set()
        for part in self._parts:
            part.wake.set()
        writers = [p.task for p in self._parts if p.task is not None]
        if writers:
            await asyncio.gather(*writers, return_exceptions=True)
        if self._cleaner_wake is not None:
            self._cleaner_wake.set()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        if self._clean_lock is not None:
            async with self._clean_lock:  # a cleaning pass in its thread finishes its group first
                pass
        loop = asyncio.get_running_loop()
        assert self._io is not None
        await loop.run_in_executor(self._io, self._close_all)
        self._io.shutdown(wait=True)
        if self._cleaner_io is not None:
            # a cleaning pass stops between segment groups (self._cleaner_stop)
            await loop.run_in_executor(None, self._cleaner_io.shutdown, True)
        self._unlock_data_dir()
        self._started = False
        log.info("offsets_log.stopped", fsyncs=self.fsyncs, appends=self.appends)

    def _close_all(self) -> None:
        for part in self._parts:
            with part.lock:
                if part.fd is not None:
                    try:
                        if part.failed is None:
                            os.fsync(part.fd)
                            self._count_fsync()
                    except OSError as e:
                        log.error("offsets_log.final_fsync_failed", partition=part.index, error=str(e))
                    os.close(part.fd)
                    part.fd = None

    # ------------------------------------------------------------------ appends

    async def append(
        self,
        partition: int,
        records: Sequence[tuple[Key, Value | None] | tuple[bytes, bytes | None]],
        *,
        producer: tuple[int, int] | None = None,
        marker: bool | None = None,
    ) -> None:
        """Append ``records`` as one batch to ``__consumer_offsets-<partition>``; returns once
        written (and fsynced when flush=always).  Raises PersistError on failure.

        ``producer`` (producer id, epoch): a transactional batch (TxnOffsetCommit); with
        ``marker`` True/False the batch is that producer's COMMIT/ABORT control batch instead
        (``records`` empty).

        Order: batches reach the log in the order ``append`` was *called* per partition (the
        batch is queued before the first ``await``), so callers need not wait for one append
        before starting the next — and should not, or group commit cannot batch them.
        PersistError.error is KAFKA_STORAGE_ERROR for I/O failures (the log layer's error),
        UNKNOWN_TOPIC_OR_PARTITION for a partition outside the topic, UNKNOWN_SERVER_ERROR for
        records that cannot be encoded.
        """
        if not self._started or self._stopping:
            raise PersistError("the offsets log is not running")
        if not 0 <= partition < self.num_partitions:
            raise PersistError(
                f"no __consumer_offsets partition {partition} (there are {self.num_partitions})",
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            )
        if not records and marker is None:
            return
        part = self._parts[partition]
        if part.failed is not None:
            raise PersistError(f"__consumer_offsets-{partition} failed earlier: {part.failed}")
        try:
            # (bytes, bytes | None) pairs are already encoded (consumer-group records, key types 3+)
            entries = [r if isinstance(r[0], bytes) else encode_record(*r) for r in records]
        except (OffsetsSchemaError, AttributeError, TypeError) as e:
            # Kafka's record serializer throws too (e.g. a string over 32767 bytes): an unknown error
            raise PersistError(f"cannot encode records: {e}", ErrorCode.UNKNOWN_SERVER_ERROR) from e
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        part.queue.append(_Pending(entries, self.clock.now_ms(), fut, producer, marker))
        part.wake.set()
        # shield: a cancelled caller must not cancel a write that may already be on disk
        await asyncio.shield(fut)

    def append_now(
        self, partition: int, records: Sequence[tuple[Key, Value | None] | tuple[bytes, bytes | None]]
    ) -> bool:
        """Write ``records`` as one batch right now when nothing can come between: the log
        runs, ``flush`` is not ``always`` (no fsync to wait for), the partition is healthy and
        has no batch queued before this one.  True: written (acknowledge it); False: nothing
        was done — use :meth:`append`, which keeps every rule (and raises what this skipped).
        Raises PersistError when the write itself fails, as :meth:`append` would.

        This is :meth:`append` minus the hops through the partition's writer task (a commit
        answered without leaving the event-loop iteration that decoded it); the order of
        batches per partition is the same, because a queued batch sends this one to append.
        """
        if self.flush == "always" or not self._started or self._stopping or not 0 <= partition < self.num_partitions:
            return False
        part = self._parts[partition]
        if part.queue or part.failed is not None or not records:
            return False
        try:
            entries = [r if isinstance(r[0], bytes) else encode_record(*r) for r in records]
        except (OffsetsSchemaError, AttributeError, TypeError):
            return False  # append raises the error
        first = part.next_offset
        try:
            self._write_round(part, [(first, entries, self.clock.now_ms(), None, None)], False)
        except Exception as e:
            log.error("offsets_log.append_failed", partition=part.index, error=repr(e))
            raise PersistError(f"append to __consumer_offsets-{part.index} failed: {e}") from e
        part.next_offset = first + len(entries)
        self.appends += 1
        self.rounds += 1
        return True

    async def _writer(self, part: _Partition) -> None:
        loop = asyncio.get_running_loop()
        assert self._io is not None
        while True:
            await part.wake.wait()
            part.wake.clear()
            if not part.queue:
                if self._stopping:
                    return
                continue
            if self.group_commit:
                taken = list(part.queue)
                part.queue.clear()
            else:
                taken = [part.queue.popleft()]
                if part.queue:
                    part.wake.set()
            if part.failed is not None:
                self._fail(taken, PersistError(f"__consumer_offsets-{part.index} failed earlier: {part.failed}"))
                continue
            first = part.next_offset
            plan: list[_Planned] = []
            nxt = first
            for p in taken:
                plan.append((nxt, p.entries, p.timestamp, p.producer, p.marker))
                nxt += 1 if p.marker is not None else len(p.entries)
            sync = self.flush == "always"
            part.writing = True
            try:
                if sync and self.group_commit and (self._sync_running or self._sync_next or self._lone_syncs):
                    # Other partitions are being synced or about to be: join their round.
                    self._write_round(part, plan, False)
                    assert part.fd is not None
                    failed = await self._synced(part, part.fd)
                    if failed is not None:
                        raise OSError(failed)
                    part.unsynced = False
                elif sync:
                    # Alone (or group_commit=False): write and sync in one trip to an I/O thread;
                    # partitions written meanwhile form a sync round.
                    self._lone_syncs += 1
                    try:
                        await loop.run_in_executor(self._io, self._write_round, part, plan, sync)
                    finally:
                        self._lone_syncs -= 1
                else:
                    # No fsync to wait for: a write into the page cache takes microseconds, less
                    # than the hop to an I/O thread and back, so do it here.
                    self._write_round(part, plan, sync)
            except Exception as e:  # OSError, or anything unexpected: never leave waiters hanging
                log.error("offsets_log.append_failed", partition=part.index, error=repr(e))
                self._fail(taken, PersistError(f"append to __consumer_offsets-{part.index} failed: {e}"))
                continue
            finally:
                part.writing = False
            part.next_offset = nxt
            self.appends += len(taken)
            self.rounds += 1
            for p in taken:
                if not p.future.done():
                    p.future.set_result(None)

    async def _synced(self, part: _Partition, fd: int) -> str | None:
        """Wait for the sync round that fdatasyncs ``fd`` (``part``'s active file, just written):
        None once it is on disk, else why not (the partition is then poisoned)."""
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[str | None] = loop.create_future()
        self._sync_next.append((part, fd, waiter))
        if not self._sync_running:
            # Started after this loop iteration: every writer that runs in it joins this round.
            self._sync_running = True
            loop.call_soon(self._start_sync_round)
        return await waiter

    def _start_sync_round(self) -> None:
        members, self._sync_next = self._sync_next, []
        if not members:
            self._sync_running = False
            return
        assert self._io is not None
        self.sync_rounds += 1
        loop = asyncio.get_running_loop()
        # The partitions split over the I/O threads: concurrent fdatasyncs share the file
        # system's journal commits (on ext4, 50 files in about half the time of one by one).
        # Plain callbacks, no task: a round of one partition costs one trip and little more.
        k = min(self.io_threads, len(members))
        left = [k]

        def finished(fut: asyncio.Future[dict[int, str]], chunk: list[tuple[_Partition, int]]) -> None:
            try:
                failed = fut.result()
            except BaseException as e:  # never leave waiters hanging
                failed = {part.index: f"sync round failed: {e!r}" for part, _fd in chunk}
            for part, _fd, waiter in members:
                if part.index in failed and not waiter.done():
                    waiter.set_result(failed[part.index])
            left[0] -= 1
            if left[0]:
                return
            for _part, _fd, waiter in members:
                if not waiter.done():
                    waiter.set_result(None)
            if self._sync_next:
                self._start_sync_round()
            else:
                self._sync_running = False

        for i in range(k):
            chunk = [(part, fd) for part, fd, _waiter in members[i::k]]
            fut = loop.run_in_executor(self._io, self._sync_fds, chunk)
            fut.add_done_callback(partial(finished, chunk=chunk))

    def _sync_fds(self, members: list[tuple[_Partition, int]]) -> dict[int, str]:
        """fdatasync each member's file; runs in an I/O thread.  A failure poisons that partition
        only (its page-cache state is unknown); the others of the round are unaffected."""
        failed: dict[int, str] = {}
        for part, fd in members:
            try:
                _fdatasync(fd)
            except OSError as e:
                part.failed = f"fsync failed: {e}"
                failed[part.index] = part.failed
                continue
            self._count_fsync()
        return failed

    @staticmethod
    def _fail(taken: list[_Pending], err: PersistError) -> None:
        for p in taken:
            if not p.future.done():
                p.future.set_exception(err)
                p.future.exception()  # retrieved here too: a cancelled caller must not warn

    def _count_fsync(self) -> None:
        with self._counter_lock:
            self.fsyncs += 1

    def _open_active(self, part: _Partition, base: int) -> None:
        """Open (creating when needed) the active segment for appending; lock held."""
        if not part.segments:
            part.segments.append(Segment(base, part.dir / segment_name(base), 0, base))
        path = part.active.path
        existed = path.exists()
        part.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0), 0o644)
        if not existed:
            fsync_dir(part.dir)
            self._count_fsync()

    def _roll(self, part: _Partition, base: int) -> None:
        """Close the active segment (fsynced, whatever the flush policy) and start ``base``; lock held."""
        assert part.fd is not None
        os.fsync(part.fd)
        self._count_fsync()
        os.close(part.fd)
        part.fd = None
        part.dirty_closed_bytes += part.active.size
        part.segments.append(Segment(base, part.dir / segment_name(base), 0, base))
        self._open_active(part, base)
        part.unsynced = False

    def _write_round(self, part: _Partition, plan: list[_Planned], sync: bool) -> None:
        """Encode, write and (``sync``) fdatasync one round; runs in an I/O thread."""
        blob = b"".join([_encode_planned(p) for p in plan])
        rolled = False
        with part.lock:
            if part.fd is None:
                self._open_active(part, plan[0][0])
            active = part.active
            if active.size > 0 and active.size + len(blob) > self.segment_bytes:
                try:
                    self._roll(part, plan[0][0])
                except OSError as e:
                    part.failed = f"segment roll failed: {e}"
                    raise
                active = part.active
                rolled = True
            assert part.fd is not None
            before = active.size
            try:
                view = memoryview(blob)
                while view:
                    n = _write(part.fd, view)
                    view = view[n:]
            except OSError:
                try:
                    os.ftruncate(part.fd, before)
                except OSError as e2:
                    part.failed = f"write failed and could not be rolled back: {e2}"
                raise
            active.size = before + len(blob)
            last = plan[-1]
            active.next_offset = last[0] + (1 if last[4] is not None else len(last[1]))
            active.batches += len(plan)
            fd = part.fd
            if not sync:
                part.unsynced = True
        if sync:
            # Outside the lock: only this partition's writer (one round at a time) rolls or
            # closes the descriptor while the broker runs.
            try:
                _fdatasync(fd)
            except OSError as e:
                part.failed = f"fsync failed: {e}"
                raise
            self._count_fsync()
        if rolled and self._cleaner_wake is not None:
            self._cleaner_wake_threadsafe()

    def _cleaner_wake_threadsafe(self) -> None:
        wake = self._cleaner_wake
        loop = self._loop
        if wake is not None and loop is not None:
            loop.call_soon_threadsafe(wake.set)

    # ------------------------------------------------------------------ interval flush

    async def _flusher(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._io is not None
        while True:
            await asyncio.sleep(self.flush_interval_ms / 1000)
            for part in self._parts:
                if part.unsynced and part.failed is None:
                    await loop.run_in_executor(self._io, self._sync_part, part)

    def _sync_part(self, part: _Partition) -> None:
        with part.lock:
            if part.fd is None or not part.unsynced:
                return
            fd = os.dup(part.fd)
            part.unsynced = False
        try:
            os.fsync(fd)
            self._count_fsync()
        except OSError as e:
            part.failed = f"fsync failed: {e}"
            log.error("offsets_log.fsync_failed", partition=part.index, error=str(e))
        finally:
            os.close(fd)

    # ------------------------------------------------------------------ cleaner

    def _needs_cleaning(self, part: _Partition, now_ms: int) -> bool:
        with part.lock:
            if len(part.segments) < 2:
                return False
            closed = part.closed_bytes()
        if part.next_tombstone_expiry is not None and part.next_tombstone_expiry <= now_ms:
            return True
        return part.dirty_closed_bytes > 0 and part.dirty_closed_bytes >= self.min_cleanable_ratio * max(closed, 1)

    async def _cleaner_loop(self) -> None:
        assert self._cleaner_wake is not None
        while not self._stopping:
            try:
                await asyncio.wait_for(self._cleaner_wake.wait(), self.cleaner_backoff_ms / 1000)
            except TimeoutError:
                pass
            self._cleaner_wake.clear()
            for part in self._parts:
                if self._stopping:
                    return
                if part.failed is None and self._needs_cleaning(part, self.clock.now_ms()):
                    try:
                        await self.clean(part.index)
                    except CleanerStopped:
                        return
                    except Exception as e:
                        log.error("offsets_log.cleaning_failed", partition=part.index, error=repr(e))

    async def clean(self, partition: int) -> CleanResult:
        """Compact the closed segments of one partition now (the background cleaner calls this)."""
        assert self._clean_lock is not None and self._cleaner_io is not None
        part = self._parts[partition]
        async with self._clean_lock:
            with part.lock:
                closed = [Segment(s.base_offset, s.path, s.size, s.next_offset, s.batches) for s in part.segments[:-1]]
                if not closed:
                    return CleanResult()
                a = part.active
                active = Segment(a.base_offset, a.path, a.size, a.next_offset, a.batches)
                dirty_at_start = part.dirty_closed_bytes
            t0 = time.monotonic()
            res = await asyncio.get_running_loop().run_in_executor(
                self._cleaner_io,
                lambda: clean_partition(
                    part.dir,
                    closed,
                    active,
                    now_ms=self.clock.now_ms(),
                    delete_retention_ms=self.delete_retention_ms,
                    segment_bytes=self.segment_bytes,
                    should_stop=self._cleaner_stop.is_set,
                    crash_hook=self.cleaner_crash_hook,
                ),
            )
            with part.lock:
                n = len(closed)
                assert [s.base_offset for s in part.segments[:n]] == [s.base_offset for s in closed]
                new = [seg for _bases, seg in res.replaced if seg is not None]
                part.segments[:n] = new
                part.dirty_closed_bytes = max(0, part.dirty_closed_bytes - dirty_at_start)
                part.next_tombstone_expiry = res.next_tombstone_expiry
            self.cleanings += 1
            log.info(
                "offsets_log.cleaned",
                partition=partition,
                segments_before=n,
                segments_after=len(new),
                bytes_before=sum(s.size for s in closed),
                bytes_after=res.bytes_written,
                records_read=res.records_read,
                records_kept=res.records_kept,
                tombstones_dropped=res.tombstones_dropped,
                seconds=round(time.monotonic() - t0, 3),
            )
            return res

    # ------------------------------------------------------------------ introspection

    def hand_over(self, partition: int, state: PartitionState) -> None:
        """Give one partition's replayed state to its loaders (groups and offsets, consumer- and
        share-group records, pending transactional offsets)."""
        if self.loader is not None:
            self.loader(partition, state.groups, state.offsets)
        if self.consumer_loader is not None:
            self.consumer_loader(partition, state.consumer_records)
        if self.pending_loader is not None and state.pending:
            self.pending_loader(partition, state.pending)

    async def drain(self, partition: int, timeout_s: float = 30.0) -> None:
        """Wait until every batch queued for ``partition`` is written (a coordinator move
        replays the partition after this, docs/cluster.md)."""
        part = self._parts[partition]
        deadline = time.monotonic() + timeout_s
        while (part.queue or part.writing) and time.monotonic() < deadline:
            await asyncio.sleep(0.001)

    async def replay(self, partition: int) -> PartitionState:
        """Read ``partition`` back as start-up does (no repair: it is live), for a coordinator
        that takes it over (docs/cluster.md, "Moving a coordinator")."""
        assert self._io is not None
        pdir = self._parts[partition].dir
        if self._clean_lock is None:
            rp = await asyncio.get_running_loop().run_in_executor(self._io, _replay_live, pdir, partition)
        else:
            async with self._clean_lock:  # no segment swap while it is read
                rp = await asyncio.get_running_loop().run_in_executor(self._io, _replay_live, pdir, partition)
        return rp.state

    def next_offset(self, partition: int) -> int:
        return self._parts[partition].next_offset

    def segments(self, partition: int) -> list[Segment]:
        part = self._parts[partition]
        with part.lock:
            return list(part.segments)
