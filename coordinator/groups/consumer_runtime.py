"""The consumer-group coordinator's runtime: turns the machine's effects into I/O.

A separate component from the classic :class:`~rallypoint.groups.runtime.GroupsRuntime` (the
broker holds it as ``broker.consumer_groups``) so that the two coordinators share only what
they must (docs/consumer-groups.md, "Runtime"):

* the ``__consumer_offsets`` log (``broker.offsets_log``): records are appended as
  already-encoded (key bytes, value bytes) pairs, per partition, in the order the machine
  emitted them; the machine hears back through ``persist_done`` and only then answers;
* at start-up the log hands each partition's consumer-group records to :meth:`load_raw`;
* the classic coordinator is asked, through one callable, whether a classic group holds an id.

Timers are ``loop.call_later`` handles, keyed like the machine's timer keys.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, TypeVar

from rallypoint.protocol.consumer_group_records import (
    ConsumerRecord,
    ConsumerRecordError,
    decode_record,
    encode_record,
)
from rallypoint.protocol.errors import ErrorCode

from ..clock import Clock
from ..config import Config
from ..logger import get as get_logger
from ..storage.errors import PersistError
from .consumer import ConsumerGroupConfig, ConsumerGroupMachine, TopicInfo, TopicsView
from .consumer_events import (
    ClassicGroupSnapshot,
    ConsumerEffect,
    ConsumerHeartbeat,
    ConsumerHeartbeatResult,
    ConvertClassic,
    DescribedConsumerGroup,
    DowngradeToClassic,
    PersistConsumer,
)
from .events import (
    ArmTimer,
    CancelTimer,
    ConsumerMemberKey,
    HeartbeatRequest,
    HeartbeatResult,
    JoinRequest,
    JoinResult,
    LeaveRequest,
    LeaveResult,
    ListedGroup,
    Note,
    Respond,
    SyncRequest,
    SyncResult,
    TimerKey,
    Transition,
)

log = get_logger("rallypoint.consumer_groups")

T = TypeVar("T")
STOP_GRACE_S = 5.0

RawRecord = tuple[bytes, bytes | None]


class RawOffsetsLog(Protocol):
    """The offsets log's append, fed with encoded records."""

    async def append(self, partition: int, records: Sequence[Any]) -> None: ...


class StoreTopics:
    """A :class:`TopicsView` over the data plane's topic store (internal topics left out)."""

    def __init__(self, store: Any) -> None:
        self.store = store

    @staticmethod
    def _info(t: Any) -> TopicInfo | None:
        if t is None or t.is_internal:
            return None
        return TopicInfo(t.topic_id, t.name, t.num_partitions)

    def get(self, name: str) -> TopicInfo | None:
        return self._info(self.store.get(name))

    def by_id(self, topic_id: Any) -> TopicInfo | None:
        return self._info(self.store.by_id(topic_id))

    def names(self) -> Iterable[str]:
        return [t.name for t in self.store.all() if not t.is_internal]


class ConsumerGroupsRuntime:
    def __init__(
        self,
        config: ConsumerGroupConfig,
        clock: Clock,
        topics: TopicsView,
        offsets_log: RawOffsetsLog | None = None,
        classic_members: Callable[[str], int | None] | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.machine = ConsumerGroupMachine(config, topics, classic_members=classic_members)
        self.offsets_log = offsets_log
        # online upgrade: hands a classic group over (GroupsRuntime.convert_to_consumer)
        self.convert_classic: Callable[[str], None] | None = None
        # online downgrade: installs a classic group (GroupsRuntime.install_downgraded)
        self.downgrade_classic: Callable[[ClassicGroupSnapshot], None] | None = None
        self._tokens = itertools.count(1)
        self._futures: dict[int, asyncio.Future[Any]] = {}
        self._timers: dict[TimerKey, asyncio.TimerHandle | None] = {}
        self._deadlines: dict[TimerKey, int] = {}
        self._handle_at: dict[TimerKey, int] = {}  # deadline each live handle was scheduled for
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._shut_down = False

    @classmethod
    def from_config(cls, cfg: Config, clock: Clock, topic_store: Any) -> ConsumerGroupsRuntime:
        return cls(ConsumerGroupConfig.from_settings(cfg.get), clock, StoreTopics(topic_store))

    # -------------------------------------------------------------------- life cycle

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        for key in list(self._deadlines):  # armed by load_raw() before the loop was known
            self._schedule(key)
        log.info(
            "consumer_group_coordinator.started",
            session_timeout_ms=self.config.session_timeout_ms,
            heartbeat_interval_ms=self.config.heartbeat_interval_ms,
            assignors=list(self.config.assignors),
        )

    async def begin_shutdown(self) -> None:
        if not self._shut_down:
            self._shut_down = True
            self._apply(self.machine.shutdown(self.clock.now_ms()))

    async def stop(self) -> None:
        await self.begin_shutdown()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=STOP_GRACE_S)
        for h in self._timers.values():
            if h is not None:
                h.cancel()
        self._timers.clear()
        self._deadlines.clear()

    # ------------------------------------------------------------------------ loading

    def load_raw(self, partition: int, records: Iterable[RawRecord]) -> None:
        """Replay one ``__consumer_offsets`` partition's consumer-group records (log order)."""
        decoded: list[ConsumerRecord] = []
        bad = 0
        for key, value in records:
            try:
                decoded.append(decode_record(key, value))
            except ConsumerRecordError as e:
                bad += 1
                if bad == 1:
                    log.warning("consumer_group.undecodable_record", partition=partition, error=str(e))
        self._apply(self.machine.load(partition, decoded, self.clock.now_ms()))

    def unload_partition(self, partition: int) -> None:
        """The partition's coordinator moved away (docs/cluster.md, "Moving a coordinator")."""
        self._apply(self.machine.unload_partition(partition, self.clock.now_ms()))

    # ----------------------------------------------------------------------- requests

    async def heartbeat(self, req: ConsumerHeartbeat) -> ConsumerHeartbeatResult:
        if self._shut_down:
            return ConsumerHeartbeatResult(ErrorCode.NOT_COORDINATOR)
        token = next(self._tokens)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._futures[token] = fut
        self._apply(self.machine.heartbeat(token, req, self.clock.now_ms()))
        result = await fut
        assert isinstance(result, ConsumerHeartbeatResult)
        return result

    async def _call(self, call: Callable[[int, int], list[ConsumerEffect]]) -> Any:
        token = next(self._tokens)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._futures[token] = fut
        self._apply(call(token, self.clock.now_ms()))
        return await fut

    # classic members of consumer groups (docs/consumer-groups.md, "Classic members")

    async def join(self, req: JoinRequest) -> JoinResult | None:
        """None: not (or no longer) a consumer group; the classic coordinator takes the join."""
        result = await self._call(lambda t, now: self.machine.classic_join(t, req, now))
        assert result is None or isinstance(result, JoinResult)
        return result

    async def sync(self, req: SyncRequest) -> SyncResult:
        result = await self._call(lambda t, now: self.machine.classic_sync(t, req, now))
        assert isinstance(result, SyncResult)
        return result

    async def classic_heartbeat(self, req: HeartbeatRequest) -> HeartbeatResult:
        result = await self._call(lambda t, now: self.machine.classic_heartbeat(t, req, now))
        assert isinstance(result, HeartbeatResult)
        return result

    async def leave(self, req: LeaveRequest) -> LeaveResult:
        result = await self._call(lambda t, now: self.machine.classic_leave(t, req, now))
        assert isinstance(result, LeaveResult)
        return result

    async def delete_group(self, group_id: str) -> ErrorCode:
        token = next(self._tokens)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._futures[token] = fut
        self._apply(self.machine.delete_group(token, group_id, self.clock.now_ms()))
        result = await fut
        assert isinstance(result, ErrorCode)
        return result

    def describe(self, group_ids: Iterable[str]) -> list[DescribedConsumerGroup]:
        return self.machine.describe(group_ids)

    def list_groups(self, states: Iterable[str], types: Iterable[str]) -> list[ListedGroup]:
        return self.machine.list_groups(states, types)

    def is_consumer_group(self, group_id: str) -> bool:
        return self.machine.is_consumer_group(group_id)

    # ------------------------------------------------------------------------ effects

    def _apply(self, effects: list[ConsumerEffect]) -> None:
        queue = list(effects)
        while queue:
            e = queue.pop(0)
            if isinstance(e, Respond):
                fut = self._futures.pop(e.token, None)
                if fut is not None and not fut.done():
                    fut.set_result(e.result)
            elif isinstance(e, ArmTimer):
                # a later deadline (every heartbeat) only records it: the handle re-schedules
                # itself when it fires early, so a heartbeat costs no handle churn
                self._deadlines[e.key] = e.deadline_ms
                if e.key not in self._timers or e.deadline_ms < self._handle_at.get(e.key, 0):
                    self._schedule(e.key)
            elif isinstance(e, CancelTimer):
                self._deadlines.pop(e.key, None)
                h = self._timers.pop(e.key, None)
                self._handle_at.pop(e.key, None)
                if h is not None:
                    h.cancel()
            elif isinstance(e, ConvertClassic):
                if self.convert_classic is not None:
                    self.convert_classic(e.group_id)
            elif isinstance(e, DowngradeToClassic):
                if self.downgrade_classic is not None:
                    self.downgrade_classic(e.snapshot)
            elif isinstance(e, PersistConsumer):
                if self.offsets_log is None or self._loop is None:
                    queue.extend(self.machine.persist_done(e.persist_id, None, self.clock.now_ms()))
                else:
                    task = self._loop.create_task(self._append(self.offsets_log, e))
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
            elif isinstance(e, Transition):
                self._tell_listeners(e)
                log.info(
                    "consumer_group.state_transition",
                    group=e.group_id,
                    partition=e.partition,
                    epoch=e.generation,
                    members=e.members,
                    **{"from": e.from_state, "to": e.to_state},
                )
            elif isinstance(e, Note):
                self._tell_listeners(e)
                log.info(e.event, **e.fields)

    # the control plane's listener (coordinator/control/groupview.py), as on the classic runtime
    _listeners: tuple[Callable[[Transition | Note], None], ...] = ()

    def add_listener(self, listener: Callable[[Transition | Note], None]) -> None:
        self._listeners = (*self._listeners, listener)

    def _tell_listeners(self, e: Transition | Note) -> None:
        for listener in self._listeners:
            try:
                listener(e)
            except Exception:  # a listener must never break the coordinator
                log.exception("consumer_group.listener_failed")

    async def _append(self, offsets_log: RawOffsetsLog, e: PersistConsumer) -> None:
        error: ErrorCode | None = None
        try:
            await offsets_log.append(e.partition, [encode_record(k, v) for k, v in e.records])
        except PersistError as exc:
            error = exc.error
            log.warning("consumer_group.append_failed", partition=e.partition, error=error.name, detail=str(exc))
        except Exception:
            error = ErrorCode.UNKNOWN_SERVER_ERROR
            log.exception("consumer_group.append_failed", partition=e.partition)
        self._apply(self.machine.persist_done(e.persist_id, error, self.clock.now_ms()))

    # ------------------------------------------------------------------------- timers

    def _schedule(self, key: TimerKey) -> None:
        if self._loop is None:
            return
        old = self._timers.get(key)
        if old is not None:
            old.cancel()
        deadline = self._deadlines[key]
        delay_ms = max(0, deadline - self.clock.now_ms())
        self._timers[key] = self._loop.call_later(delay_ms / 1000.0, self._fire, key)
        self._handle_at[key] = deadline

    def fire_timers(self, expire_member: tuple[str, str] | None = None) -> bool:
        """The broker clock jumped (the control plane's time travel): every timer now due fires
        at once, earliest deadline first, the others are re-scheduled against the moved clock.

        ``expire_member=(group_id, member_id)``: that member's session deadline is made now
        first, so it expires exactly as if it had stopped heartbeating.  False, and nothing
        changes, when it has no session timer."""
        now = self.clock.now_ms()
        if expire_member is not None:
            session: TimerKey = ConsumerMemberKey("session", expire_member[0], expire_member[1])
            if session not in self._deadlines:
                return False
            self._deadlines[session] = now
        due = sorted(((d, k) for k, d in self._deadlines.items() if d <= now), key=lambda dk: (dk[0], dk[1].sort_key()))
        for _, key in due:
            h = self._timers.pop(key, None)
            self._handle_at.pop(key, None)
            if h is not None:
                h.cancel()
            if self._deadlines.pop(key, None) is not None:
                self._apply(self.machine.timer_fired(key, now))
        for key in list(self._deadlines):
            if key in self._timers:
                self._schedule(key)
        return True

    def _fire(self, key: TimerKey) -> None:
        self._timers.pop(key, None)
        self._handle_at.pop(key, None)
        deadline = self._deadlines.get(key)
        if deadline is None:
            return
        if deadline > self.clock.now_ms():
            self._schedule(key)
            return
        del self._deadlines[key]
        self._apply(self.machine.timer_fired(key, self.clock.now_ms()))
