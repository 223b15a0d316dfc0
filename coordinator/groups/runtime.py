"""The group coordinator's runtime: turns the sans-IO coordinator's effects into I/O.

* a parked request is an asyncio future keyed by the token the machine answers with;
* a timer is a ``loop.call_later`` handle.  Re-arming a key to a *later* deadline (every
  heartbeat does) only records the new deadline: when the handle fires early it re-schedules
  itself, so a heartbeat costs no timer-handle churn (one handle per member);
* records go to the ``offsets_log`` component's ``append`` (if there is one) in order, per
  ``__consumer_offsets`` partition; the coordinator hears back through ``persist_done`` and
  only then releases the responses that depend on them;
* state transitions are logged as one structured event each;
* an event that raised inside the coordinator comes back as an ``InternalError`` effect and is
  logged as one error event; should the coordinator itself raise, the runtime logs that too
  and carries on (docs/groups.md, "Internal errors").

The broker holds it as ``broker.groups``.  The offsets-log component calls
:meth:`GroupsRuntime.load` (and optionally :meth:`GroupsRuntime.begin_load`) at start-up.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any, Final, TypeVar

from rallypoint.protocol.errors import ErrorCode
from rallypoint.protocol.offsets_schema import GroupMetadataValue, OffsetCommitKey, OffsetCommitValue

from ..clock import Clock
from ..config import Config
from ..logger import get as get_logger
from ..storage.errors import PersistError
from .consumer_events import ClassicGroupSnapshot
from .coordinator import GroupCoordinator
from .events import (
    ArmTimer,
    CancelTimer,
    CommitRequest,
    CommitResult,
    DeleteGroupsResult,
    DescribeResult,
    Effect,
    HeartbeatRequest,
    HeartbeatResult,
    InternalError,
    JoinRequest,
    JoinResult,
    LeaveRequest,
    LeaveResult,
    ListResult,
    Note,
    OffsetDeleteRequest,
    OffsetDeleteResult,
    OffsetFetchRequest,
    OffsetFetchResult,
    Persist,
    Respond,
    SyncRequest,
    SyncResult,
    TimerKey,
    Transition,
)
from .model import GroupConfig
from .persist import OffsetsLog

log = get_logger("rallypoint.groups")

T = TypeVar("T")

# How long stop() waits for in-flight appends.
STOP_GRACE_S = 5.0


_NO_ANSWER: Final = object()


class GroupsRuntime:
    def __init__(
        self,
        config: GroupConfig,
        clock: Clock,
        machine: GroupCoordinator | None = None,
        offsets_log: OffsetsLog | None = None,
    ) -> None:
        self.clock = clock
        self.config = config
        # The sans-IO coordinator (coordinator/groups/coordinator.py).
        self.machine = machine or GroupCoordinator(self.config)
        # Where records go; None (unit tests, an in-memory broker): every write succeeds at once.
        self.offsets_log = offsets_log
        self._tokens = itertools.count(1)
        self._futures: dict[int, asyncio.Future[Any]] = {}
        self._appending: Counter[int] = Counter()  # append tasks in flight per partition
        # The request being handed to the machine and its answer when the machine answers at
        # once (most do): no future is made for it (the heartbeat path, docs/BENCHMARKS.md).
        self._calling: int | None = None
        self._answer: Any = _NO_ANSWER
        # Timers (docs/groups.md, "Timers"): a heap of (deadline, key) with one event-loop
        # handle for its earliest entry -- not one handle per timer: a loop handle costs some
        # 400 bytes, and there are timers per group and per pending member.  The machine's
        # armed deadlines (``machine.deadlines``, wall-clock ms) are the truth: an entry whose key
        # was re-armed later, or cancelled, is dealt with when it comes due.  Every armed key
        # has an entry at or before its deadline.
        # keys are named tuples of strings: entries with equal deadlines order by key
        self._heap: list[tuple[int, TimerKey]] = []
        self._wake: asyncio.TimerHandle | None = None
        self._wake_at = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._shut_down = False

    @classmethod
    def from_config(cls, cfg: Config, clock: Clock) -> GroupsRuntime:
        return cls(GroupConfig.from_settings(cfg.get), clock)

    # ----------------------------------------------------------------- life cycle

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._rewake()  # timers armed by load() before the loop was known
        self._guarded("start", lambda: self.machine.start(self.clock.now_ms()))
        log.info(
            "group coordinator started",
            offsets_partitions=self.config.num_partitions,
            initial_rebalance_delay_ms=self.config.initial_rebalance_delay_ms,
        )

    async def begin_shutdown(self) -> None:
        """Shutdown started: unload every group so parked JoinGroups/SyncGroups are answered
        NOT_COORDINATOR now (docs/groups.md, "Loading and unloading"), instead of holding
        their connections open."""
        if not self._shut_down:
            self._shut_down = True
            self._guarded("shutdown", lambda: self.machine.shutdown(self.clock.now_ms()))

    async def stop(self) -> None:
        await self.begin_shutdown()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=STOP_GRACE_S)
        if self._wake is not None:
            self._wake.cancel()
            self._wake = None
        self._heap.clear()

    # --------------------------------------------------- loading (offsets-log side)

    def begin_load(self, partition: int) -> None:
        """Optional: mark ``partition`` as loading until :meth:`load` is called for it."""
        self.machine.begin_load(partition)

    def load(
        self,
        partition: int,
        groups: Mapping[str, GroupMetadataValue],
        offsets: Mapping[OffsetCommitKey, OffsetCommitValue],
    ) -> None:
        """Install the replayed state of one ``__consumer_offsets`` partition (the loader
        contract of ``rallypoint.storage.OffsetsLog``)."""
        self._guarded("load", lambda: self.machine.load(partition, groups, offsets, self.clock.now_ms()))

    def unload_partition(self, partition: int) -> None:
        """The partition's coordinator moved away (docs/cluster.md, "Moving a coordinator")."""
        self._guarded("unload", lambda: self.machine.unload_partition(partition, self.clock.now_ms()))

    def load_pending(self, partition: int, pending: Mapping[int, Mapping[OffsetCommitKey, OffsetCommitValue]]) -> None:
        """The offsets log's ``pending_loader``: transactional offsets still waiting for a marker."""
        self._guarded("load_pending", lambda: self.machine.load_pending(partition, pending, self.clock.now_ms()))

    def partition_for(self, group_id: str) -> int:
        return self.machine.partition_for(group_id)

    def on_topics_deleted(self, topics: Iterable[str]) -> None:
        """The data plane deleted ``topics``: drop their committed offsets (with tombstones)."""
        names = list(topics)
        self._guarded("topics_deleted", lambda: self.machine.topics_deleted(names, self.clock.now_ms()))

    # -------------------------------------------------------------------- requests

    async def _request(self, call: Callable[[int, int], list[Effect]], kind: type[T]) -> T:
        token = next(self._tokens)
        self._calling = token
        try:
            try:
                effects = call(token, self.clock.now_ms())
            except Exception:
                # The coordinator recovers from errors inside an event itself; this is a bug in
                # that recovery.  The request fails (its connection handler answers or closes).
                log.exception("group coordinator failed", request=kind.__name__)
                raise
            self._apply(effects)
        finally:
            self._calling = None
        result, self._answer = self._answer, _NO_ANSWER
        if result is _NO_ANSWER:  # answered later (after a write, a join phase ...)
            fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
            self._futures[token] = fut
            result = await fut
        assert isinstance(result, kind), result
        return result

    # online upgrade to a consumer group (docs/consumer-groups.md, "Classic groups")

    def upgrade_snapshot(self, group_id: str) -> ClassicGroupSnapshot | None:
        return self.machine.upgrade_snapshot(group_id)

    def convert_to_consumer(self, group_id: str) -> None:
        """Hand the group over: answers its parked requests and writes its tombstone now, so
        the tombstone reaches the log before the consumer group's records."""
        self._guarded("convert_to_consumer", lambda: self.machine.convert_to_consumer(group_id, self.clock.now_ms()))

    def install_downgraded(self, snap: ClassicGroupSnapshot) -> None:
        """A consumer group downgraded to this classic coordinator (its tombstones already
        queued for the log): install it, write its record, rebalance."""
        self._guarded("install_downgraded", lambda: self.machine.install_downgraded(snap, self.clock.now_ms()))

    async def join(self, req: JoinRequest) -> JoinResult:
        return await self._request(lambda t, now: self.machine.join(t, req, now), JoinResult)

    async def sync(self, req: SyncRequest) -> SyncResult:
        return await self._request(lambda t, now: self.machine.sync(t, req, now), SyncResult)

    async def heartbeat(self, req: HeartbeatRequest) -> HeartbeatResult:
        return await self._request(lambda t, now: self.machine.heartbeat(t, req, now), HeartbeatResult)

    async def leave(self, req: LeaveRequest) -> LeaveResult:
        return await self._request(lambda t, now: self.machine.leave(t, req, now), LeaveResult)

    async def commit_offsets(self, req: CommitRequest) -> CommitResult:
        return await self._request(lambda t, now: self.machine.commit_offsets(t, req, now), CommitResult)

    async def complete_transaction(self, partition: int, producer_id: int, epoch: int, commit: bool) -> ErrorCode:
        """Write a transaction's marker to ``__consumer_offsets-<partition>`` and apply it to the
        producer's pending offsets there; the error a marker write gets (NONE when written)."""
        result = await self._request(
            lambda t, now: self.machine.complete_transaction(t, partition, producer_id, epoch, commit, now),
            ErrorCode,
        )
        return ErrorCode(result)

    async def fetch_offsets(self, req: OffsetFetchRequest) -> OffsetFetchResult:
        return await self._request(lambda t, now: self.machine.fetch_offsets(t, req, now), OffsetFetchResult)

    async def delete_offsets(self, req: OffsetDeleteRequest) -> OffsetDeleteResult:
        return await self._request(lambda t, now: self.machine.delete_offsets(t, req, now), OffsetDeleteResult)

    async def describe(self, group_ids: Iterable[str], api_version: int) -> DescribeResult:
        ids = list(group_ids)
        return await self._request(lambda t, now: self.machine.describe(t, ids, api_version, now), DescribeResult)

    async def list_groups(self, states: Iterable[str], types: Iterable[str]) -> ListResult:
        s, ty = list(states), list(types)
        return await self._request(lambda t, now: self.machine.list_groups(t, s, ty, now), ListResult)

    async def delete_groups(self, group_ids: Iterable[str]) -> DeleteGroupsResult:
        ids = list(group_ids)
        return await self._request(lambda t, now: self.machine.delete_groups(t, ids, now), DeleteGroupsResult)

    # --------------------------------------------------------------------- effects

    def _apply(self, effects: list[Effect]) -> None:
        if len(effects) == 1:
            only = effects[0]
            if type(only) is Respond and only.token == self._calling:
                self._answer = only.result  # the common case: an answer to the request being made
                return
        queue: deque[Effect] = deque(effects)
        while queue:
            e = queue.popleft()
            if isinstance(e, Respond):
                if e.token == self._calling:
                    self._answer = e.result
                    continue
                fut = self._futures.pop(e.token, None)
                if fut is not None and not fut.done():
                    fut.set_result(e.result)
            elif isinstance(e, ArmTimer):
                self._arm(e.key, e.deadline_ms, e.previous_ms)
            elif isinstance(e, CancelTimer):
                pass  # its heap entry is skipped when it comes due
            elif isinstance(e, Persist):
                offsets_log = self.offsets_log
                if offsets_log is None or self._loop is None:
                    # No log (unit tests, in-memory broker): the write "succeeds" at once.
                    queue.extend(self._call("persist_done", self._persisted(e.persist_id, None)))
                elif not self._appending[e.partition] and self._append_now(offsets_log, e, queue):
                    pass  # written and answered within this event (no fsync to wait for)
                else:
                    self._appending[e.partition] += 1
                    task = self._loop.create_task(self._append(offsets_log, e))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
            elif isinstance(e, Transition):
                self._tell_listeners(e)  # control plane (block at the end of this file)
                log.info(
                    "group state transition",
                    group=e.group_id,
                    partition=e.partition,
                    generation=e.generation,
                    leader=e.leader,
                    members=e.members,
                    reason=e.reason,
                    **{"from": e.from_state, "to": e.to_state},
                )
            elif isinstance(e, Note):
                self._tell_listeners(e)  # control plane (block at the end of this file)
                log.info(e.event, **e.fields)
            elif isinstance(e, InternalError):
                log.error(
                    "group coordinator event failed",
                    event_name=e.event,
                    groups=list(e.groups),
                    error=repr(e.error),
                    exc_info=e.error,
                )

    async def _append(self, offsets_log: OffsetsLog, e: Persist) -> None:
        # No lock: the offsets log queues a batch before its first await, and these tasks start
        # in creation order (the event loop runs callbacks FIFO), so batches reach the log in the
        # order the machine emitted them while concurrent appends still share one fsync (group
        # commit).  A per-partition lock here serialised commits to one fsync each (~8x slower).
        error: ErrorCode | None = None
        try:
            await offsets_log.append(e.partition, e.records, producer=e.producer, marker=e.marker)
        except PersistError as exc:
            error = exc.error
            log.warning("offsets append failed", partition=e.partition, error=error.name, detail=str(exc))
        except Exception:
            error = ErrorCode.UNKNOWN_SERVER_ERROR
            log.exception("offsets append failed", partition=e.partition)
        finally:
            self._appending[e.partition] -= 1
        self._guarded("persist_done", self._persisted(e.persist_id, error))

    def _append_now(self, offsets_log: OffsetsLog, e: Persist, queue: deque[Effect]) -> bool:
        """The write without a task when the log can take it at once (``OffsetsLog.append_now``:
        not with flush=always); only while no task of this runtime is appending to the same
        partition, so batches still reach the log in the order the machine emitted them."""
        error: ErrorCode | None = None
        if e.producer is not None:
            return False  # transactional batches and markers take the queued path
        try:
            if not offsets_log.append_now(e.partition, e.records):
                return False
        except PersistError as exc:
            error = exc.error
            log.warning("offsets append failed", partition=e.partition, error=error.name, detail=str(exc))
        queue.extend(self._call("persist_done", self._persisted(e.persist_id, error)))
        return True

    def _persisted(self, persist_id: int, error: ErrorCode | None) -> Callable[[], list[Effect]]:
        return lambda: self.machine.persist_done(persist_id, error, self.clock.now_ms())

    # ---------------------------------------------------------------------- timers

    def _arm(self, key: TimerKey, deadline: int, previous: int | None) -> None:
        if previous is not None and deadline >= previous:
            return  # a later deadline (a heartbeat): the entry due first finds it and moves on
        heapq.heappush(self._heap, (deadline, key))
        if len(self._heap) > 2 * len(self.machine.deadlines) + 64:
            self._rebuild_heap()  # mostly entries of cancelled timers
        self._rewake()

    def _rebuild_heap(self) -> None:
        self._heap = [(d, k) for k, d in self.machine.deadlines.items()]
        heapq.heapify(self._heap)

    def _rewake(self) -> None:
        """The loop handle set for the heap's earliest entry."""
        if self._loop is None:
            return
        if not self._heap:
            if self._wake is not None:
                self._wake.cancel()
                self._wake = None
            return
        first = self._heap[0][0]
        if self._wake is not None:
            if self._wake_at <= first:
                return
            self._wake.cancel()
        self._wake_at = first
        self._wake = self._loop.call_later(max(0, first - self.clock.now_ms()) / 1000.0, self._on_wake)

    def _on_wake(self) -> None:
        self._wake = None
        now = self.clock.now_ms()
        heap, timers = self._heap, self.machine.deadlines
        due: list[TimerKey] = []
        seen: set[TimerKey] = set()
        while heap and heap[0][0] <= now:
            at, key = heapq.heappop(heap)
            deadline = timers.get(key)
            if deadline is None or deadline < at:
                continue  # cancelled, or fired (then maybe armed again: it has its own entry)
            if deadline > at:
                heapq.heappush(heap, (deadline, key))  # moved on meanwhile
            elif key not in seen:
                seen.add(key)
                due.append(key)
        if due:
            # Kafka's coordinator queues a timer's expiry behind the requests already received
            # (one event queue per partition).  One more loop turn gives the requests read
            # before the timers came due the same precedence (uvloop runs due timers first).
            assert self._loop is not None
            self._loop.call_soon(self._expire, due)
        self._rewake()

    def _expire(self, keys: list[TimerKey]) -> None:
        for key in keys:
            deadline = self.machine.deadlines.get(key)
            if deadline is None:
                continue  # cancelled meanwhile
            now = self.clock.now_ms()
            if deadline > now:  # armed later meanwhile
                heapq.heappush(self._heap, (deadline, key))
                self._rewake()
                continue
            self._guarded(f"timer {key.kind}", partial(self.machine.timer_fired, key, now))

    # ------------------------------------------------------------------ guards

    def _call(self, what: str, call: Callable[[], list[Effect]]) -> list[Effect]:
        """Run a coordinator event outside any request; an exception escaping it (a bug in the
        coordinator's own recovery) is logged as one error event and the runtime carries on."""
        try:
            return call()
        except Exception:
            log.exception("group coordinator failed", event_name=what)
            return []

    def _guarded(self, what: str, call: Callable[[], list[Effect]]) -> None:
        self._apply(self._call(what, call))

    # ==================================================================== control plane
    # Two methods for the HTTP control plane (coordinator/control/, docs/control.md), plus the
    # listener call in _apply's Transition and Note branches.  Kept together so they move as one
    # block when this module changes shape.

    _listeners: tuple[Callable[[Transition | Note], None], ...] = ()

    def add_listener(self, listener: Callable[[Transition | Note], None]) -> None:
        """Call ``listener`` with every state transition and note, as the runtime applies them
        (on the event loop; it must not raise or block)."""
        self._listeners = (*self._listeners, listener)

    def _tell_listeners(self, e: Transition | Note) -> None:
        for listener in self._listeners:
            try:
                listener(e)
            except Exception:
                log.exception("group listener failed")

    def fire_timers(self, expire_member: tuple[str, str] | None = None) -> bool:
        """Fire now every timer that the clock says is due, earliest deadline first, each as if
        at its deadline (the control plane calls this after moving the clock forward: a timer
        armed for "in 30 s" must not wait 30 s of real time); the others are re-scheduled
        against the moved clock.

        ``expire_member=(group_id, member_id)``: that member's session deadline is made due
        now first, so its session expires exactly as if it had stopped heartbeating (the
        machine's own heartbeat-expiry path).  False, and nothing changes, when it has no
        session deadline (unknown group or member, or its expiry already fired).
        """
        now = self.clock.now_ms()
        if expire_member is not None and not self.machine.make_session_due(*expire_member, now):
            return False
        self._guarded("advance", lambda: self.machine.advance(now))
        self._rebuild_heap()  # the machine fired what was due and may have armed new timers
        if self._wake is not None:
            self._wake.cancel()
            self._wake = None
        self._rewake()
        return True
