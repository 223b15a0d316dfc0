"""The share-group runtime (``broker.share_groups``): runs the sans-IO share machines.

It owns the membership machine (:mod:`.membership`), the share sessions (:mod:`.sessions`), one
:class:`~.partition.SharePartition` per (group, topic partition) that was fetched from, their
durable state (:mod:`.state_store`) and the timers (member sessions, acquisition locks) on the
broker clock.  docs/share-groups.md describes the whole; the handlers of ShareGroupHeartbeat,
ShareGroupDescribe, ShareFetch and ShareAcknowledge only decode and encode.

Reading records for acquisition (docs/share-groups.md, "Acquisition"): from the partition's
next fetch offset, whole log batches up to the request's byte budget; read_committed reads stop
at the last stable offset and aborted transactions' records are archived as they enter the
window.  The answer carries the batches that hold acquired offsets (the client keeps only the
acquired ones) and the acquired runs with their delivery counts.
"""

from __future__ import annotations

import asyncio
import heapq
import re
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from msgspec import Struct, field
from rallypoint.protocol import share_group_records as sgr
from rallypoint.protocol.errors import ErrorCode
from rallypoint.protocol.records import BatchHeader, parse_header, split_batches

from ..clock import Clock
from ..cluster import Cluster
from ..groups.consumer_runtime import RawOffsetsLog, StoreTopics
from ..groups.persist import response_error
from ..logger import get as get_logger
from ..slicing import Slicer
from ..storage.errors import PersistError
from ..topics.partition import OffsetOutOfRange, PartitionLog
from .membership import Change, SessionTimer, ShareGroupMachine, ShareHeartbeat, ShareHeartbeatResult
from .partition import AckBatch, Acquired, LogBatch, SharePartition, ack_batches_error
from .sessions import FINAL_EPOCH, INITIAL_EPOCH, SessionError, ShareSession, ShareSessions, TopicIdPartition
from .state_store import SavedState, ShareStateStore, StateKey

log = get_logger("rallypoint.share_groups")

# ISO-8601 durations as java.time.Duration.parse takes them (share.auto.offset.reset=by_duration:...)
_DURATION = re.compile(
    r"^([-+]?)P(?:([-+]?\d+)D)?(?:T(?:([-+]?\d+)H)?(?:([-+]?\d+)M)?(?:([-+]?\d+(?:[.,]\d{0,9})?)S)?)?$",
    re.IGNORECASE,
)
MAX_READS_PER_PARTITION = 4  # log reads one acquisition may take to find something to acquire


def parse_duration_ms(text: str) -> int:
    m = _DURATION.match(text.strip())
    if m is None or not any(m.group(i) for i in range(2, 6)) or text.strip().upper().endswith("T"):
        raise ValueError(f"not an ISO-8601 duration: {text!r}")
    days, hours, minutes = (int(m.group(i) or 0) for i in (2, 3, 4))
    seconds = float((m.group(5) or "0").replace(",", "."))
    total = ((days * 24 + hours) * 60 + minutes) * 60_000 + round(seconds * 1000)
    return -total if m.group(1) == "-" else total


class ShareSettings(Struct, frozen=True):
    """The broker's ``group.share.*`` settings the runtime applies."""

    max_in_flight: int = 2000
    delivery_limit: int = 5
    max_size: int = 200
    max_sessions: int = 2000

    @classmethod
    def from_config(cls, get: Callable[[str], Any]) -> ShareSettings:
        return cls(
            max_in_flight=int(get("group.share.partition.max.record.locks")),
            delivery_limit=int(get("group.share.delivery.count.limit")),
            max_size=int(get("group.share.max.size")),
            max_sessions=int(get("group.share.max.share.sessions")),
        )


class PartitionAnswer(Struct):
    """One partition of a ShareFetch/ShareAcknowledge answer."""

    error: ErrorCode = ErrorCode.NONE
    error_message: str | None = None
    ack_error: ErrorCode | None = None  # None: no acknowledgements were sent for it
    ack_message: str | None = None
    records: bytes = b""
    acquired: list[Acquired] = field(default_factory=list)


class ShareAnswer(Struct):
    """A ShareFetch or ShareAcknowledge answer: its error, the acquisition lock timeout, each partition's answer."""

    error: ErrorCode = ErrorCode.NONE
    error_message: str | None = None
    lock_timeout_ms: int = 0
    partitions: dict[TopicIdPartition, PartitionAnswer] = field(default_factory=dict)


class _Aborted:
    """Which batches of a read belong to aborted transactions (read_committed)."""

    def __init__(self, aborted: Iterable[tuple[int, int]]) -> None:
        self.pending = sorted((first, pid) for pid, first in aborted)
        self.active: set[int] = set()

    def __call__(self, h: BatchHeader) -> bool:
        while self.pending and self.pending[0][0] <= h.base_offset:
            self.active.add(heapq.heappop(self.pending)[1])
        if h.is_control:
            self.active.discard(h.producer_id)
            return False
        return h.is_transactional and h.producer_id in self.active


class ShareGroupsRuntime:
    def __init__(
        self,
        settings: ShareSettings,
        clock: Clock,
        topic_store: Any,
        group_setting: Callable[[str, str], str],
        *,
        data_dir: Path | None = None,
        fsync: bool = False,
        other_group: Callable[[str], bool] = lambda g: False,
        offsets_log: RawOffsetsLog | None = None,
        partition_for: Callable[[str], int] = lambda g: 0,
    ) -> None:
        self.settings = settings
        self.clock = clock
        self.topic_store = topic_store
        self.group_setting = group_setting
        self.machine = ShareGroupMachine(
            StoreTopics(topic_store), setting=group_setting, max_size=settings.max_size, other_group=other_group
        )
        self.sessions = ShareSessions(settings.max_sessions)
        self.partitions: dict[StateKey, SharePartition] = {}
        self.store = ShareStateStore(data_dir, fsync=fsync)
        self._saved: dict[StateKey, SavedState] = {}
        self._member_deadlines: dict[SessionTimer, int] = {}
        self._member_timers: dict[SessionTimer, asyncio.TimerHandle] = {}
        self._lock_timers: dict[StateKey, tuple[int, asyncio.TimerHandle]] = {}
        self._waiters: dict[StateKey, set[asyncio.Event]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        self.offsets_log = offsets_log  # share-group records go to __consumer_offsets
        self.partition_for = partition_for  # Kafka's group -> __consumer_offsets partition hash
        self._tasks: set[asyncio.Task[ErrorCode | None]] = set()
        self.cluster: Cluster | None = None  # several nodes: fetch only from partitions this one leads

    # ------------------------------------------------------------------ life cycle

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        for key in self._member_deadlines:  # armed by load_raw() before the loop was known
            self._schedule_member(key)
        self._saved = self.store.load()
        log.info("share_group_coordinator.started", share_partitions=len(self._saved))

    def begin_shutdown(self) -> None:
        self._closing = True
        for evs in self._waiters.values():
            for ev in evs:
                ev.set()

    async def stop(self) -> None:
        self.begin_shutdown()
        for h in self._member_timers.values():
            h.cancel()
        for _, h in self._lock_timers.values():
            h.cancel()
        self._member_timers.clear()
        self._lock_timers.clear()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5.0)
        await self.store.close()

    # ------------------------------------------------------------------ membership

    async def heartbeat(self, req: ShareHeartbeat) -> ShareHeartbeatResult:
        """ShareGroupHeartbeat: answered once the records of the change are written."""
        if self._closing:
            return ShareHeartbeatResult(ErrorCode.NOT_COORDINATOR)
        now = self.clock.now_ms()
        result, timers = self.machine.heartbeat(req, now)
        for key, deadline in timers.arm:
            self._arm_member(key, deadline)
        for key in timers.cancel:
            self._member_deadlines.pop(key, None)
            h = self._member_timers.pop(key, None)
            if h is not None:
                h.cancel()
        self._log_changes()
        error = await self._write_records()
        if error is not None and result.error == ErrorCode.NONE:
            return ShareHeartbeatResult(error, "The coordinator could not write the group's records")
        return result

    async def _write_records(self) -> ErrorCode | None:
        """Append the machine's pending records, per ``__consumer_offsets`` partition, in order;
        the error a client sees if an append failed (``persist.response_error``)."""
        pending, self.machine.pending = self.machine.pending, []
        if not pending or self.offsets_log is None:
            return None
        by_partition: dict[int, list[tuple[bytes, bytes | None]]] = {}
        for gid, (key, value) in pending:
            by_partition.setdefault(self.partition_for(gid), []).append(sgr.encode_record(key, value))
        for partition, records in by_partition.items():
            try:
                await self.offsets_log.append(partition, records)
            except PersistError as e:
                log.warning("share_group.append_failed", partition=partition, error=e.error.name, detail=str(e))
                return response_error(e.error)
        return None

    def _write_later(self) -> None:
        if self.machine.pending and self._loop is not None:
            task = self._loop.create_task(self._write_records())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def load_raw(self, partition: int, records: Iterable[tuple[bytes, bytes | None]]) -> None:
        """Replay one ``__consumer_offsets`` partition's share-group records (log order)."""
        decoded: list[sgr.ShareRecord] = []
        for key, value in records:
            try:
                decoded.append(sgr.decode_record(key, value))
            except ValueError as e:
                log.warning("share_group.undecodable_record", partition=partition, error=str(e))
        deadline_of = self.clock.now_ms()
        for gid, mid in self.machine.load(decoded):
            timeout = int(self.group_setting(gid, "share.session.timeout.ms"))
            self._arm_member((gid, mid), deadline_of + timeout)

    def unload_partition(self, partition: int) -> None:
        """The ``__consumer_offsets`` partition's coordinator moved (docs/cluster.md, "Moving a
        coordinator"): its share groups leave memory; :meth:`load_raw` brings them back.  The
        share-partition record states are not group coordinator state and stay."""
        gone = [g for g in self.machine.groups if self.partition_for(g) == partition]
        for key in self.machine.unload(gone):
            self._member_deadlines.pop(key, None)
            h = self._member_timers.pop(key, None)
            if h is not None:
                h.cancel()

    async def delete_group(self, group_id: str) -> ErrorCode:
        """DeleteGroups of a share group: only an Empty one; its records and share-partition
        state go too."""
        code = self.machine.delete(group_id)
        if code != ErrorCode.NONE:
            return code
        error = await self._write_records()
        for skey in [k for k in (*self.partitions, *self._saved) if k[0] == group_id]:
            self.partitions.pop(skey, None)
            self._saved.pop(skey, None)
            self.store.save_later(skey, None)
        log.info("share_group.deleted", group=group_id)
        return error or ErrorCode.NONE

    def _log_changes(self) -> None:
        for c in self.machine.changes:
            log.info(c.event, group=c.group_id, member=c.member_id, epoch=c.epoch, members=c.members)
            for listener in self._listeners:
                try:
                    listener(c)
                except Exception:  # a listener must never break the coordinator
                    log.exception("share_group.listener_failed")
        self.machine.changes.clear()

    def _arm_member(self, key: SessionTimer, deadline: int) -> None:
        self._member_deadlines[key] = deadline
        if key not in self._member_timers and self._loop is not None:
            self._schedule_member(key)

    def _schedule_member(self, key: SessionTimer) -> None:
        assert self._loop is not None
        delay = max(0, self._member_deadlines[key] - self.clock.now_ms()) / 1000.0
        self._member_timers[key] = self._loop.call_later(delay, self._member_fired, key)

    def _member_fired(self, key: SessionTimer) -> None:
        self._member_timers.pop(key, None)
        deadline = self._member_deadlines.get(key)
        if deadline is None:
            return
        if deadline > self.clock.now_ms():
            self._schedule_member(key)
            return
        del self._member_deadlines[key]
        if self.machine.session_expired(key, self.clock.now_ms()):
            self._log_changes()
            self._write_later()

    def poke(self) -> None:
        """The broker clock jumped (the control plane's time travel): every member session and
        acquisition lock now due fires at once, earliest deadline first; the others are
        re-scheduled against the moved clock."""
        if self._loop is None:
            return
        now = self.clock.now_ms()
        due: list[tuple[int, int, Callable[[], None]]] = []
        for key in list(self._member_deadlines):
            h = self._member_timers.pop(key, None)
            if h is not None:
                h.cancel()
            if self._member_deadlines[key] <= now:
                due.append((self._member_deadlines[key], len(due), partial(self._member_fired, key)))
            else:
                self._schedule_member(key)
        for skey in list(self._lock_timers):
            self._lock_timers.pop(skey)[1].cancel()
            sp = self.partitions.get(skey)
            deadline = sp.next_deadline() if sp is not None else None
            if deadline is not None and deadline <= now:
                due.append((deadline, len(due), partial(self._locks_fired, skey)))
            else:
                self._arm_locks(skey)
        for _, _, fire in sorted(due, key=lambda d: (d[0], d[1])):
            fire()

    # the control plane (coordinator/control/groupview.py): a listener for membership changes,
    # and ``expire`` for one member (docs/control.md, "Share groups")
    _listeners: tuple[Callable[[Change], None], ...] = ()

    def add_listener(self, listener: Callable[[Change], None]) -> None:
        """Call ``listener`` with every membership change as it is logged (on the event loop; it
        must not raise or block)."""
        self._listeners = (*self._listeners, listener)

    def expire_member(self, group: str, member: str) -> bool:
        """The member's session ends now, through the same path as missed heartbeats.  False
        when it has no session timer (unknown group or member)."""
        key = (group, member)
        if key not in self._member_deadlines:
            return False
        self._member_deadlines[key] = self.clock.now_ms()
        h = self._member_timers.pop(key, None)
        if h is not None:
            h.cancel()
        self._member_fired(key)
        return True

    # ------------------------------------------------------------------ connections

    def connection_closed(self, connection_id: int) -> None:
        """The connection's share sessions close and their members' records are released
        (docs/share-groups.md, "Share sessions")."""
        for s in self.sessions.of_connection(connection_id):
            self._session_closed(s, "connection closed")

    def _session_closed(self, session: ShareSession, reason: str) -> None:
        """A share session ended: its member's acquired records in its partitions are released."""
        group, member = session.key
        released = 0
        for tid, p in session.partitions:
            skey = (group, tid, p)
            sp = self.partitions.get(skey)
            if sp is not None:
                n = sp.release_member(member)
                if n:
                    released += n
                    self._changed(skey, sp)
        log.info("share_session.closed", group=group, member=member, reason=reason, released=released)

    # ------------------------------------------------------------------ share partitions

    def _log(self, tid: uuid.UUID, p: int) -> tuple[PartitionLog | None, ErrorCode]:
        topic = self.topic_store.by_id(tid)
        if topic is None or topic.is_internal:
            return None, ErrorCode.UNKNOWN_TOPIC_ID
        plog = topic.partition(p)
        if plog is None:
            return None, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if self.cluster is not None and not self.cluster.leads(topic.name, p):
            return None, ErrorCode.NOT_LEADER_OR_FOLLOWER  # another node leads it (docs/cluster.md)
        return plog, ErrorCode.NONE

    def _read_committed(self, group: str) -> bool:
        return self.group_setting(group, "share.isolation.level").strip().lower() == "read_committed"

    def _initial_offset(self, group: str, plog: PartitionLog) -> int:
        """Where a share partition with no saved state starts (``share.auto.offset.reset``)."""
        reset = self.group_setting(group, "share.auto.offset.reset").strip().lower()
        if reset == "earliest":
            return plog.log_start_offset
        if reset.startswith("by_duration:"):
            try:
                ts = self.clock.now_ms() - parse_duration_ms(reset.split(":", 1)[1])
            except ValueError:
                ts = -1
            found = plog.offset_for_timestamp(ts) if ts >= 0 else None
            if found is not None:
                return max(found[0], plog.log_start_offset)
        return plog.last_stable_offset if self._read_committed(group) else plog.next_offset

    def _share_partition(self, group: str, tid: uuid.UUID, p: int, plog: PartitionLog) -> SharePartition:
        skey = (group, tid, p)
        sp = self.partitions.get(skey)
        if sp is None:
            saved = self._saved.pop(skey, None)
            if saved is not None:
                sp = SharePartition(
                    saved.start_offset,
                    max_in_flight=self.settings.max_in_flight,
                    delivery_limit=self.settings.delivery_limit,
                    state=saved.batches,
                )
            else:
                start = self._initial_offset(group, plog)
                sp = SharePartition(
                    start, max_in_flight=self.settings.max_in_flight, delivery_limit=self.settings.delivery_limit
                )
                log.info("share_partition.initialized", group=group, topic_id=str(tid), partition=p, start_offset=start)
                self._changed(skey, sp)
            self.partitions[skey] = sp
        if sp.truncate_to(plog.log_start_offset):
            self._changed(skey, sp)
        return sp

    def _changed(self, skey: StateKey, sp: SharePartition) -> asyncio.Future[None] | None:
        """Persist the partition's state (the returned future resolves once it is written) and
        wake fetches waiting for records to become available."""
        for ev in self._waiters.get(skey, ()):
            ev.set()
        self._arm_locks(skey)
        if self._loop is None:
            return None
        return self.store.save_later(skey, SavedState(sp.start_offset, tuple(sp.snapshot())))

    def _arm_locks(self, skey: StateKey) -> None:
        sp = self.partitions.get(skey)
        if sp is None or self._loop is None:
            return
        deadline = sp.next_deadline()
        current = self._lock_timers.get(skey)
        if deadline is None:
            if current is not None:
                current[1].cancel()
                del self._lock_timers[skey]
            return
        if current is not None and current[0] <= deadline:
            return
        if current is not None:
            current[1].cancel()
        delay = max(0, deadline - self.clock.now_ms()) / 1000.0
        self._lock_timers[skey] = (deadline, self._loop.call_later(delay, self._locks_fired, skey))

    def _locks_fired(self, skey: StateKey) -> None:
        self._lock_timers.pop(skey, None)
        sp = self.partitions.get(skey)
        if sp is None:
            return
        n = sp.expire_locks(self.clock.now_ms())
        if n:
            log.info(
                "share_partition.locks_expired",
                group=skey[0],
                topic_id=str(skey[1]),
                partition=skey[2],
                released=n,
            )
            self._changed(skey, sp)
        else:
            self._arm_locks(skey)

    def lock_ms(self, group: str) -> int:
        return int(self.group_setting(group, "share.record.lock.duration.ms"))

    # ------------------------------------------------------------------ acknowledgements

    async def _acknowledge(
        self,
        group: str,
        member: str,
        acks: Mapping[TopicIdPartition, Sequence[AckBatch]],
        answer: ShareAnswer,
    ) -> list[asyncio.Future[None]]:
        """Apply each partition's acknowledgements (each partition's atomic; the work per
        partition is bounded by its window, and other connections run between partitions)."""
        writes: list[asyncio.Future[None]] = []
        slicer = Slicer()
        for (tid, p), batches in acks.items():
            await slicer.tick()
            pa = answer.partitions.setdefault((tid, p), PartitionAnswer())
            problem = ack_batches_error(batches)
            if problem is not None:
                pa.ack_error, pa.ack_message = ErrorCode.INVALID_REQUEST, problem
                continue
            plog, err = self._log(tid, p)
            skey = (group, tid, p)
            sp = self.partitions.get(skey)
            if plog is None:
                pa.ack_error = err
                continue
            if sp is None:
                pa.ack_error = ErrorCode.INVALID_RECORD_STATE
                pa.ack_message = "No records were acquired from this partition"
                continue
            code = sp.acknowledge(member, batches)
            pa.ack_error = code
            if code == ErrorCode.NONE:
                fut = self._changed(skey, sp)
                if fut is not None:
                    writes.append(fut)
            else:
                pa.ack_message = "The record state is invalid. The acknowledgement of delivery could not be completed."
        return writes

    @staticmethod
    async def _written(writes: Sequence[asyncio.Future[None]], answer: ShareAnswer) -> None:
        """Acknowledgements are answered once their state is on disk; a failed write is
        reported for every acknowledged partition."""
        if not writes:
            return
        results = await asyncio.gather(*writes, return_exceptions=True)
        if any(isinstance(r, BaseException) for r in results):
            for pa in answer.partitions.values():
                if pa.ack_error == ErrorCode.NONE:
                    pa.ack_error = ErrorCode.KAFKA_STORAGE_ERROR

    async def acknowledge(
        self,
        group: str,
        member: str,
        epoch: int,
        connection_id: int,
        acks: Mapping[TopicIdPartition, Sequence[AckBatch]],
    ) -> ShareAnswer:
        """ShareAcknowledge (docs/share-groups.md, "Share sessions")."""
        answer = ShareAnswer(lock_timeout_ms=self.lock_ms(group))
        key = (group, member)
        now = self.clock.now_ms()
        try:
            if epoch == INITIAL_EPOCH:
                raise SessionError(ErrorCode.INVALID_SHARE_SESSION_EPOCH, "Acknowledge requests cannot open a session")
            if epoch == FINAL_EPOCH:
                session = self.sessions.close(key)
            else:
                session = self.sessions.use(key, epoch, connection_id, now)
        except SessionError as e:
            answer.error, answer.error_message = e.code, str(e)
            return answer
        writes = await self._acknowledge(group, member, acks, answer)
        if epoch == FINAL_EPOCH:
            self._session_closed(session, "final epoch")
        await self._written(writes, answer)
        return answer

    # ------------------------------------------------------------------ fetch

    async def fetch(
        self,
        group: str,
        member: str,
        epoch: int,
        connection_id: int,
        *,
        partitions: Sequence[TopicIdPartition],
        forgotten: Sequence[TopicIdPartition],
        acks: Mapping[TopicIdPartition, Sequence[AckBatch]],
        max_wait_ms: int,
        min_bytes: int,
        max_bytes: int,
        max_records: int,
    ) -> ShareAnswer:
        """ShareFetch: session rules, acknowledgements, then acquisition (long-polled)."""
        answer = ShareAnswer(lock_timeout_ms=self.lock_ms(group))
        key = (group, member)
        now = self.clock.now_ms()
        try:
            if epoch == INITIAL_EPOCH:
                if acks:
                    raise SessionError(
                        ErrorCode.INVALID_REQUEST, "Acknowledge data present in the initial fetch request"
                    )
                session = self.sessions.open(key, connection_id, partitions, now)
                log.info("share_session.opened", group=group, member=member, partitions=len(partitions))
            elif epoch == FINAL_EPOCH:
                if partitions:
                    raise SessionError(ErrorCode.INVALID_REQUEST, "A final share fetch cannot fetch partitions")
                session = self.sessions.close(key)
            else:
                session = self.sessions.use(key, epoch, connection_id, now, add=partitions, forget=forgotten)
        except SessionError as e:
            answer.error, answer.error_message = e.code, str(e)
            return answer
        writes = await self._acknowledge(group, member, acks, answer)
        if epoch == FINAL_EPOCH:
            self._session_closed(session, "final epoch")
        else:
            targets = list(session.partitions)
            budget = [max(1, max_bytes), max(1, max_records)]
            got = await self._acquire_all(group, member, targets, answer, budget)
            if not got and max_wait_ms > 0 and not self._closing:
                await self._wait_and_acquire(group, member, targets, answer, budget, max_wait_ms)
        await self._written(writes, answer)
        return answer

    async def _wait_and_acquire(
        self,
        group: str,
        member: str,
        targets: list[TopicIdPartition],
        answer: ShareAnswer,
        budget: list[int],
        max_wait_ms: int,
    ) -> bool:
        assert self._loop is not None
        ev = asyncio.Event()
        logs: list[PartitionLog] = []
        skeys = [(group, tid, p) for tid, p in targets]
        for tid, p in targets:
            plog, _ = self._log(tid, p)
            if plog is not None:
                plog.add_waiter(ev)
                logs.append(plog)
        for skey in skeys:
            self._waiters.setdefault(skey, set()).add(ev)
        deadline = self._loop.time() + max_wait_ms / 1000.0
        try:
            while not self._closing:
                left = deadline - self._loop.time()
                if left <= 0:
                    return False
                ev.clear()
                try:
                    async with asyncio.timeout(left):
                        await ev.wait()
                except TimeoutError:
                    return False
                if await self._acquire_all(group, member, targets, answer, budget):
                    return True
            return False
        finally:
            for plog in logs:
                plog.remove_waiter(ev)
            for skey in skeys:
                evs = self._waiters.get(skey)
                if evs is not None:
                    evs.discard(ev)
                    if not evs:
                        del self._waiters[skey]

    async def _acquire_all(
        self,
        group: str,
        member: str,
        targets: Sequence[TopicIdPartition],
        answer: ShareAnswer,
        budget: list[int],
    ) -> bool:
        """Acquire from each partition in turn (one partition's acquisition is atomic; other
        connections are served between partitions when the request is long, docs/reliability.md,
        "Limits")."""
        got = False
        lock_ms = self.lock_ms(group)
        read_committed = self._read_committed(group)
        slicer = Slicer()
        for tid, p in targets:
            await slicer.tick()
            now = self.clock.now_ms()
            if budget[0] <= 0 or budget[1] <= 0:
                break
            plog, err = self._log(tid, p)
            if plog is None:
                pa = answer.partitions.setdefault((tid, p), PartitionAnswer())
                pa.error = err
                continue
            skey = (group, tid, p)
            sp = self._share_partition(group, tid, p, plog)
            records, acquired, changed = self._acquire_one(sp, plog, member, budget, now, lock_ms, read_committed)
            if changed or acquired:
                self._arm_locks(skey)
            if changed:
                self._changed(skey, sp)
            if acquired:
                pa = answer.partitions.setdefault((tid, p), PartitionAnswer())
                pa.records += records
                pa.acquired.extend(acquired)
                got = True
        return got

    @staticmethod
    def _acquire_one(
        sp: SharePartition,
        plog: PartitionLog,
        member: str,
        budget: list[int],
        now: int,
        lock_ms: int,
        read_committed: bool,
    ) -> tuple[bytes, list[Acquired], bool]:
        upper = plog.last_stable_offset if read_committed else None
        out = bytearray()
        acquired: list[Acquired] = []
        changed = False
        offset = sp.next_fetch_offset()
        for _ in range(MAX_READS_PER_PARTITION):
            if budget[1] <= 0 or budget[0] <= 0:
                break
            if offset < sp.end_offset and offset < sp.start_offset:
                offset = sp.start_offset
            if offset >= sp.end_offset and sp.window_full():
                break
            try:
                res = plog.read(max(offset, plog.log_start_offset), budget[0], True, upper)
            except OffsetOutOfRange:
                break
            data = res.records
            if not data:
                break
            aborted = (
                _Aborted(plog.aborted_between(offset, upper if upper is not None else plog.next_offset))
                if read_committed
                else None
            )
            headers = [parse_header(data, pos) for pos, _ in split_batches(data)]
            batches = [
                LogBatch(h.base_offset, h.last_offset, aborted(h) if aborted is not None else False) for h in headers
            ]
            runs, ch = sp.acquire(member, batches, max_records=budget[1], now_ms=now, lock_ms=lock_ms)
            changed = changed or ch
            if runs:
                n = sum(r.last_offset - r.first_offset + 1 for r in runs)
                budget[1] -= n
                first, last = runs[0].first_offset, runs[-1].last_offset
                for h in headers:
                    if h.last_offset >= first and h.base_offset <= last:
                        out += data[h.position : h.end]
                acquired.extend(runs)
                budget[0] -= len(out)
                break
            offset = headers[-1].last_offset + 1 if headers else sp.end_offset
            if offset >= plog.next_offset:
                break
        return bytes(out), acquired, changed

    def on_topics_deleted(self, topic_ids: Iterable[uuid.UUID]) -> None:
        """Deleted topics take their share-partition state with them (Kafka deletes it through
        the share coordinator); a topic created again under the name starts afresh."""
        gone = set(topic_ids)
        for skey in [k for k in (*self.partitions, *self._saved) if k[1] in gone]:
            self.partitions.pop(skey, None)
            self._saved.pop(skey, None)
            timer = self._lock_timers.pop(skey, None)
            if timer is not None:
                timer[1].cancel()
            if self._loop is not None:
                self.store.save_later(skey, None)

    # ------------------------------------------------------------------ reads

    def describe_partitions(self, group: str) -> list[tuple[StateKey, SharePartition]]:
        return [(k, sp) for k, sp in self.partitions.items() if k[0] == group]
