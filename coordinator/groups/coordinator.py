"""The group coordinator the runtime drives: every event in, effects out.

Kafka's counterpart is ``GroupCoordinatorShard.java``: it routes each request to the manager
that handles it (``classic.py`` for membership, ``offsets.py`` for offsets, ``registry.py`` for
the group map and the read APIs) and does the two jobs that span both (DeleteGroups, the
retention pass).  It is sans-IO (after h11): every event method takes ``now_ms`` and returns
the effects of ``events.py``; it never touches sockets, asyncio, files or the clock.

Events: ``join``, ``sync``, ``heartbeat``, ``leave``, ``commit_offsets``, ``fetch_offsets``,
``delete_offsets``, ``describe``, ``list_groups``, ``delete_groups``, ``topics_deleted``,
``timer_fired``, ``persist_done``, ``load``/``begin_load``, ``start``/``shutdown``.  A request
event carries a ``token`` naming the parked request; its answer is a ``Respond(token, ...)``
effect, possibly much later (JoinGroup waits for the join phase, SyncGroup for the leader,
anything that writes for its write).

An event that raises does not leave a group half-changed: the writes it appended are taken
back, the groups it touched are rebuilt from their records, the request is answered
UNKNOWN_SERVER_ERROR and an :class:`~.events.InternalError` effect tells the runtime to log
it (docs/groups.md, "Internal errors").
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping

from rallypoint.protocol.errors import ErrorCode
from rallypoint.protocol.offsets_schema import GroupMetadataValue, OffsetCommitKey, OffsetCommitValue

from . import checks, records
from .classic import ClassicGroups
from .consumer_events import ClassicGroupSnapshot, ClassicMemberSnapshot
from .context import Context
from .events import (
    CommitRequest,
    CommitResult,
    ConsumerMemberKey,
    DeleteGroupsResult,
    DescribedGroup,
    DescribeResult,
    Effect,
    HeartbeatKey,
    HeartbeatRequest,
    HeartbeatResult,
    InternalError,
    JoinRequest,
    JoinResult,
    LeaveRequest,
    LeaveResult,
    ListResult,
    OffsetDeleteRequest,
    OffsetDeleteResult,
    OffsetFetchGroupResult,
    OffsetFetchRequest,
    OffsetFetchResult,
    Protocol,
    RetentionKey,
    SessionsKey,
    SyncRequest,
    SyncResult,
    TimerKey,
    TopicErrors,
)
from .model import DEAD, EMPTY, STABLE, ClassicGroup, GroupConfig, Member, NoCommonProtocol
from .offsets import OffsetsManager
from .persist import Record, response_error
from .registry import GroupRegistry

E = ErrorCode
RETENTION_KEY = RetentionKey()


class _Failed:
    """The answer to a request whose event failed, made only then (:meth:`GroupCoordinator._run`)."""

    __slots__ = ("make",)

    def __init__(self, make: Callable[[], object]) -> None:
        self.make = make


class GroupCoordinator:
    """Every classic group of this coordinator and their offsets."""

    def __init__(self, config: GroupConfig, new_uuid: Callable[[], str] | None = None) -> None:
        self.config = config
        self.ctx = Context(config)
        self.registry = GroupRegistry(self.ctx)
        self.classic = ClassicGroups(self.ctx, self.registry, new_uuid or (lambda: str(uuid.uuid4())))
        self.offsets = OffsetsManager(self.ctx, self.registry)

    @property
    def groups(self) -> dict[str, ClassicGroup]:
        return self.registry.groups

    def partition_for(self, group_id: str) -> int:
        return self.ctx.partition_for(group_id)

    # --------------------------------------------------------------- running events

    def _run(
        self,
        now_ms: int,
        event: str,
        body: Callable[[], None],
        *,
        token: int | None = None,
        failed: object = None,
        groups: Iterable[str] = (),
    ) -> list[Effect]:
        """Run one event; ``failed`` answers ``token`` if the event fails (docs/groups.md,
        "Internal errors"): the answer itself, or a :class:`_Failed` that makes it then."""
        ctx = self.ctx
        ctx.begin(now_ms)
        try:
            body()
        except Exception as exc:
            self._recover(event, exc, token, failed, groups)
        return ctx.end()

    def _recover(self, event: str, exc: Exception, token: int | None, failed: object, groups: Iterable[str]) -> None:
        """docs/groups.md, "Internal errors"."""
        ctx = self.ctx
        ctx.drop_event_writes()
        involved = tuple(sorted(set(groups) | ctx.touched))
        for gid in involved:
            self._reload(gid)
        if token is not None and failed is not None and not ctx.answered(token):
            ctx.respond(token, failed.make() if isinstance(failed, _Failed) else failed)
        ctx.emit(InternalError(event, involved, exc))

    def _reload(self, group_id: str) -> None:
        """Rebuild a group from its last record, as a restart would (parked requests of the
        old one are answered NOT_COORDINATOR, as when a partition moves away)."""
        ctx = self.ctx
        old = self.registry.get(group_id)
        if old is not None:
            self.registry.unload(old, E.NOT_COORDINATOR, "reloaded after an internal error")
        value = ctx.timeline.current_group(group_id)
        if value is not None:
            group = self.registry.from_record(group_id, value)
        elif ctx.timeline.current_offsets(group_id):
            group = self.registry.simple(group_id)
        else:
            return
        self.registry.install(group)
        self.classic.on_loaded(group)
        ctx.note("group reloaded", group=group_id, state=group.state.value, generation=group.generation)

    # ----------------------------------------------------------------- requests

    def join(self, token: int, req: JoinRequest, now_ms: int) -> list[Effect]:
        return self._run(
            now_ms,
            "join",
            lambda: self.classic.join(token, req),
            token=token,
            failed=JoinResult(E.UNKNOWN_SERVER_ERROR),
            groups=(req.group_id,),
        )

    def sync(self, token: int, req: SyncRequest, now_ms: int) -> list[Effect]:
        return self._run(
            now_ms,
            "sync",
            lambda: self.classic.sync(token, req),
            token=token,
            failed=SyncResult(E.UNKNOWN_SERVER_ERROR),
            groups=(req.group_id,),
        )

    def heartbeat(self, token: int, req: HeartbeatRequest, now_ms: int) -> list[Effect]:
        return self._run(
            now_ms,
            "heartbeat",
            lambda: self.classic.heartbeat(token, req),
            token=token,
            failed=HeartbeatResult(E.UNKNOWN_SERVER_ERROR),
            groups=(req.group_id,),
        )

    def leave(self, token: int, req: LeaveRequest, now_ms: int) -> list[Effect]:
        return self._run(
            now_ms,
            "leave",
            lambda: self.classic.leave(token, req),
            token=token,
            failed=LeaveResult(E.UNKNOWN_SERVER_ERROR),
            groups=(req.group_id,),
        )

    def commit_offsets(self, token: int, req: CommitRequest, now_ms: int) -> list[Effect]:
        def failed() -> CommitResult:
            return CommitResult(
                tuple(
                    TopicErrors(t.name, tuple((p.partition, E.UNKNOWN_SERVER_ERROR) for p in t.partitions))
                    for t in req.topics
                )
            )

        return self._run(
            now_ms,
            "commit_offsets",
            lambda: self.offsets.commit(token, req),
            token=token,
            failed=_Failed(failed),  # made only if needed: every commit comes here
            groups=(req.group_id,),
        )

    def complete_transaction(
        self, token: int, partition: int, producer_id: int, epoch: int, commit: bool, now_ms: int
    ) -> list[Effect]:
        """A transaction marker for ``__consumer_offsets-<partition>`` (docs/transactions.md)."""
        return self._run(
            now_ms,
            "complete_transaction",
            lambda: self.offsets.complete_transaction(token, partition, producer_id, epoch, commit),
            token=token,
            failed=E.UNKNOWN_SERVER_ERROR,
        )

    def fetch_offsets(self, token: int, req: OffsetFetchRequest, now_ms: int) -> list[Effect]:
        def failed() -> OffsetFetchResult:
            return OffsetFetchResult(
                tuple(OffsetFetchGroupResult(g.group_id, E.UNKNOWN_SERVER_ERROR) for g in req.groups)
            )

        return self._run(
            now_ms, "fetch_offsets", lambda: self.offsets.fetch(token, req), token=token, failed=_Failed(failed)
        )

    def delete_offsets(self, token: int, req: OffsetDeleteRequest, now_ms: int) -> list[Effect]:
        return self._run(
            now_ms,
            "delete_offsets",
            lambda: self.offsets.delete(token, req),
            token=token,
            failed=OffsetDeleteResult(E.UNKNOWN_SERVER_ERROR),
            groups=(req.group_id,),
        )

    def describe(self, token: int, group_ids: Iterable[str], api_version: int, now_ms: int) -> list[Effect]:
        ids = list(group_ids)
        failed = DescribeResult(tuple(DescribedGroup(g, E.UNKNOWN_SERVER_ERROR) for g in ids))
        return self._run(
            now_ms,
            "describe",
            lambda: self.ctx.respond(token, self.registry.describe(ids, api_version)),
            token=token,
            failed=failed,
        )

    def list_groups(
        self, token: int, states_filter: Iterable[str], types_filter: Iterable[str], now_ms: int
    ) -> list[Effect]:
        return self._run(
            now_ms,
            "list_groups",
            lambda: self.ctx.respond(token, self.registry.list_groups(states_filter, types_filter)),
            token=token,
            failed=ListResult(E.UNKNOWN_SERVER_ERROR),
        )

    def delete_groups(self, token: int, group_ids: Iterable[str], now_ms: int) -> list[Effect]:
        ids = list(dict.fromkeys(group_ids))  # KafkaApis: .distinct
        failed = DeleteGroupsResult(tuple((g, E.UNKNOWN_SERVER_ERROR) for g in ids))
        return self._run(
            now_ms, "delete_groups", lambda: self._delete_groups(token, ids), token=token, failed=failed, groups=ids
        )

    def _delete_groups(self, token: int, ids: list[str]) -> None:
        """``GroupCoordinatorShard.deleteGroups`` (docs/groups.md, "DeleteGroups"): only
        Empty groups; every offset (those still being written included) and the group get
        tombstones; the answer waits for them."""
        ctx = self.ctx
        results: dict[str, ErrorCode] = {}
        by_partition: dict[int, tuple[list[str], list[Record], list[Callable[[], None]]]] = {}
        for gid in ids:
            err = checks.request(ctx, gid, validate_id=False)
            group = self.registry.get(gid)
            if err is None and (group is None or group.state == DEAD):
                err = E.GROUP_ID_NOT_FOUND
            if err is None and group is not None and group.state != EMPTY:
                err = E.NON_EMPTY_GROUP
            if err is not None or group is None:
                results[gid] = err or E.GROUP_ID_NOT_FOUND
                continue
            names, batch, reverts = by_partition.setdefault(group.partition, ([], [], []))
            names.append(gid)
            batch.extend(self.offsets.delete_all(gid))
            batch.append(records.group_tombstone(gid))
            reverts.append(self.registry.delete(group, "deleted by DeleteGroups"))
            results[gid] = E.NONE

        def finish() -> None:
            ctx.respond(token, DeleteGroupsResult(tuple((gid, results[gid]) for gid in ids)))

        if not by_partition:
            finish()
            return
        outstanding = [len(by_partition)]
        for partition, (names, batch, reverts) in by_partition.items():

            def written(
                error: ErrorCode | None, names: list[str] = names, reverts: list[Callable[[], None]] = reverts
            ) -> None:
                if error is not None:
                    for n in names:
                        results[n] = response_error(error)
                    for revert in reverts:
                        revert()
                outstanding[0] -= 1
                if outstanding[0] == 0:
                    finish()

            ctx.append(partition, batch, written, groups=names)

    # ------------------------------------------------------- online upgrade (KIP-848)

    def upgrade_snapshot(self, group_id: str) -> ClassicGroupSnapshot | None:
        """What a consumer-protocol join needs to turn this live classic group into a consumer
        group (docs/consumer-groups.md, "Classic groups"); None when there is no such group
        with members (Kafka's ``validateOnlineUpgrade`` needs a live, non-empty group)."""
        group = self.registry.get(group_id)
        if group is None or group.state == DEAD or not group.members:
            return None
        return ClassicGroupSnapshot(
            group_id,
            group.generation,
            group.protocol_type or "",
            group.protocol_name,
            tuple(
                ClassicMemberSnapshot(
                    m.member_id,
                    m.group_instance_id,
                    m.client_id,
                    m.client_host,
                    m.session_timeout_ms,
                    m.rebalance_timeout_ms,
                    tuple((p.name, p.metadata) for p in m.protocols),
                    m.assignment,
                )
                for m in group.members.values()
            ),
        )

    def convert_to_consumer(self, group_id: str, now_ms: int) -> list[Effect]:
        """The classic half of Kafka's ``convertToConsumerGroup``: every parked JoinGroup and
        SyncGroup is answered REBALANCE_IN_PROGRESS, the group leaves this coordinator (its
        offsets stay) and its GroupMetadata tombstone is written, ahead of the consumer group's
        records."""

        def body() -> None:
            group = self.registry.get(group_id)
            if group is None:
                return
            self.registry.unload(group, E.REBALANCE_IN_PROGRESS, "converted to a consumer group")

            def written(error: ErrorCode | None) -> None:
                if error is not None:
                    self.ctx.note("classic group tombstone not written", group=group_id, error=error.name)

            self.ctx.append(group.partition, [records.group_tombstone(group_id)], written, groups=[group_id])
            self.ctx.note("classic group converted to a consumer group", group=group_id)

        return self._run(now_ms, "convert_to_consumer", body, groups=[group_id])

    def install_downgraded(self, snap: ClassicGroupSnapshot, now_ms: int) -> list[Effect]:
        """The classic half of Kafka's ``convertToClassicGroup`` (``ClassicGroup.fromConsumerGroup``):
        the consumer group's last consumer-protocol member left, its tombstones are written;
        the group comes back here Stable at generation = its epoch, with every remaining
        member, its supported protocols, session and rebalance timeouts, and its target
        assignment encoded at the version of its subscription for the selected protocol; the
        first member leads.  Its GroupMetadata record is written, sessions start and a
        rebalance begins ("Downgrade group G from consumer to classic.")."""

        def body() -> None:
            gid = snap.group_id
            group = ClassicGroup(
                gid,
                self.ctx.partition_for(gid),
                state=STABLE,
                generation=snap.generation,
                protocol_type=snap.protocol_type,
                state_timestamp=now_ms,
            )
            for ms in snap.members:
                group.add(
                    Member(
                        ms.member_id,
                        ms.instance_id,
                        ms.client_id,
                        ms.client_host,
                        ms.rebalance_timeout_ms,
                        ms.session_timeout_ms,
                        snap.protocol_type,
                        tuple(Protocol(name, meta) for name, meta in ms.protocols),
                    ),
                    None,
                )
            try:
                group.protocol_name = group.select_protocol()
            except NoCommonProtocol as e:  # cannot happen for members a consumer group accepted
                self.ctx.note("downgrade refused", group=gid, error=str(e))
                return
            group.subscribed_topics = group.compute_subscribed_topics()
            assignment: dict[str, bytes] = {}
            for ms in snap.members:
                m = group.members[ms.member_id]
                m.assignment = _at_subscription_version(ms.assignment, m.metadata(group.protocol_name))
                assignment[m.member_id] = m.assignment
            self.registry.install(group)  # replaces an offsets-only Empty group of the same id

            def written(error: ErrorCode | None) -> None:
                if error is not None:
                    self.ctx.note("downgraded group record not written", group=gid, error=error.name)

            self.ctx.append(group.partition, [records.group_metadata(group, assignment)], written, groups=[gid])
            self.ctx.note("group downgraded from a consumer group", group=gid, generation=group.generation)
            self.classic.on_loaded(group)
            self.classic.prepare_rebalance(group, f"Downgrade group {gid} from consumer to classic.")

        return self._run(now_ms, "install_downgraded", body, groups=[snap.group_id])

    # ------------------------------------------------------------- data plane hooks

    def topics_deleted(self, topics: Iterable[str], now_ms: int) -> list[Effect]:
        names = list(topics)
        return self._run(now_ms, "topics_deleted", lambda: self.offsets.topics_deleted(names))

    # ---------------------------------------------------------------------- timers

    def timer_fired(self, key: TimerKey, now_ms: int) -> list[Effect]:
        def fire() -> None:
            deadline = self.ctx.timers.get(key)
            if deadline is None or deadline > now_ms:
                return  # cancelled or re-armed for later meanwhile
            del self.ctx.timers[key]
            if isinstance(key, RetentionKey):
                self.ctx.arm(RETENTION_KEY, self.config.retention_check_interval_ms)
                self.offsets.expire()
            elif isinstance(key, ConsumerMemberKey):
                raise AssertionError(f"a consumer-group timer reached the classic coordinator: {key}")
            else:
                self.classic.timer_fired(key)

        groups = () if isinstance(key, RetentionKey) else (key.group_id,)
        return self._run(now_ms, f"timer {key.kind}", fire, groups=groups)

    def advance(self, now_ms: int) -> list[Effect]:
        """Fire every timer due at ``now_ms``, earliest first (for tests and fake clocks)."""
        out: list[Effect] = []
        while True:
            due = [(d, k.sort_key(), k) for k, d in self.ctx.timers.items() if d <= now_ms]
            if not due:
                return out
            deadline, _, key = min(due, key=lambda t: (t[0], t[1]))
            out.extend(self.timer_fired(key, deadline))

    def make_session_due(self, group_id: str, member_id: str, now_ms: int) -> bool:
        """The member's (or pending member's) session deadline becomes ``now_ms`` and its timer
        due, so the next :meth:`advance` expires it exactly as if it had stopped heartbeating
        (the control plane's member expiry).  False, and nothing changes, when it has no
        session deadline (unknown group or member, or its expiry already fired)."""
        pending = HeartbeatKey(group_id, member_id)
        if pending in self.ctx.timers:
            self.ctx.timers[pending] = now_ms
            return True
        group = self.registry.get(group_id)
        member = group.members.get(member_id) if group is not None else None
        if member is None or not member.session_deadline:
            return False
        member.session_deadline = now_ms
        self.ctx.timers[SessionsKey(group_id)] = now_ms
        return True

    def next_deadline(self) -> int | None:
        return min(self.ctx.timers.values(), default=None)

    @property
    def deadlines(self) -> Mapping[TimerKey, int]:
        """The armed timers' deadlines, live and read-only: the runtime schedules by them (it
        keeps no copy: a Stable group's members each hold a session timer)."""
        return self.ctx.timers

    # ---------------------------------------------------------------------- writes

    def persist_done(self, persist_id: int, error: ErrorCode | None, now_ms: int) -> list[Effect]:
        """The batch of ``Persist(persist_id, ...)`` was appended (``error`` None) or failed."""
        return self._run(now_ms, "persist_done", lambda: self.ctx.write_answered(persist_id, error))

    def pending_persists(self) -> int:
        return self.ctx.writes_in_flight()

    # ------------------------------------------------------- life cycle, loading

    def start(self, now_ms: int) -> list[Effect]:
        """The coordinator becomes active; the offsets-retention pass is scheduled."""

        def body() -> None:
            self.ctx.active = True
            self.ctx.arm(RETENTION_KEY, self.config.retention_check_interval_ms)

        return self._run(now_ms, "start", body)

    def shutdown(self, now_ms: int) -> list[Effect]:
        """Unload everything (``onUnloaded``): groups go Dead, their parked JoinGroups and
        SyncGroups get NOT_COORDINATOR, waiting RequireStable fetches are answered."""

        def body() -> None:
            self.ctx.active = False
            for group in list(self.registry.groups.values()):
                self.registry.unload(group, E.NOT_COORDINATOR, "coordinator shutting down")
            self.offsets.shutdown()
            for key in list(self.ctx.timers):
                self.ctx.cancel(key)

        return self._run(now_ms, "shutdown", body)

    def unload_partition(self, partition: int, now_ms: int) -> list[Effect]:
        """The ``__consumer_offsets`` partition's coordinator moved (docs/cluster.md, "Moving a
        coordinator"): as Kafka's ``onUnloaded``, each of its groups goes Dead and leaves memory,
        parked JoinGroups and SyncGroups get NOT_COORDINATOR; the partition then counts as
        loading until :meth:`load` installs what the log replays."""

        def body() -> None:
            self.ctx.loading.add(partition)
            for group in [g for g in self.registry.groups.values() if g.partition == partition]:
                self.registry.unload(group, E.NOT_COORDINATOR, "coordinator moved")
            for gid in [g for g in self.ctx.timeline.group_ids() if self.ctx.partition_for(g) == partition]:
                self.ctx.timeline.forget(gid)
            self.offsets.forget_partition(partition)

        return self._run(now_ms, "unload", body)

    def load_pending(
        self, partition: int, pending: Mapping[int, Mapping[OffsetCommitKey, OffsetCommitValue]], now_ms: int
    ) -> list[Effect]:
        """Offsets of transactions the log holds no marker for yet: pending again."""

        def body() -> None:
            for pid, offsets in pending.items():
                by_group: dict[str, dict[tuple[str, int], OffsetCommitValue]] = {}
                for key, value in offsets.items():
                    by_group.setdefault(key.group, {})[(key.topic, key.partition)] = value
                for gid, tps in by_group.items():
                    self.offsets.load_pending(pid, gid, tps)
            self.ctx.note("pending transactional offsets loaded", partition=partition, producers=sorted(pending))

        return self._run(now_ms, "load_pending", body)

    def begin_load(self, partition: int) -> None:
        """Mark a ``__consumer_offsets`` partition as loading until :meth:`load` (requests for
        its groups get COORDINATOR_LOAD_IN_PROGRESS, Heartbeat gets NONE)."""
        self.ctx.loading.add(partition)

    def load(
        self,
        partition: int,
        groups: Mapping[str, GroupMetadataValue],
        offsets: Mapping[OffsetCommitKey, OffsetCommitValue],
        now_ms: int,
    ) -> list[Effect]:
        """Install what the offsets log replayed for ``partition`` (docs/groups.md, "Loading and unloading").

        Groups with members come up Stable, others Empty; every member gets a fresh session
        timer; offsets without a group record make an Empty "simple" group.  A group over
        ``group.max.size`` rebalances at once.
        """

        def body() -> None:
            ctx = self.ctx
            loaded: list[ClassicGroup] = []
            by_group: dict[str, dict[tuple[str, int], OffsetCommitValue]] = {}
            for key, val in offsets.items():
                by_group.setdefault(key.group, {})[(key.topic, key.partition)] = val
            for gid, value in groups.items():
                g = self.registry.from_record(gid, value)
                self.registry.install(g)
                loaded.append(g)
            for gid in by_group:
                if gid not in groups and self.registry.get(gid) is None:
                    og = self.registry.simple(gid)
                    self.registry.install(og)
                    loaded.append(og)
            for gid in dict.fromkeys([*groups, *by_group]):
                ctx.timeline.load(gid, groups.get(gid), by_group.get(gid, {}))
            for g in loaded:
                ctx.note(
                    "group loaded",
                    group=g.group_id,
                    partition=g.partition,
                    state=g.state.value,
                    generation=g.generation,
                    members=len(g.members),
                    offsets=len(by_group.get(g.group_id, {})),
                )
                self.classic.on_loaded(g)

        try:
            return self._run(now_ms, "load", body, groups=list(groups))
        finally:
            self.ctx.loading.discard(partition)


def _at_subscription_version(assignment: bytes, subscription: bytes) -> bytes:
    """A ConsumerProtocol assignment re-encoded at the version of the member's subscription
    (Kafka serialises the downgraded assignment at the version the member will join with)."""
    from rallypoint.protocol.consumer_protocol import (
        Assignment,
        ConsumerProtocolError,
        decode_assignment,
        decode_subscription,
        encode_assignment,
    )

    try:
        version = decode_subscription(subscription).version
        a = decode_assignment(assignment)
        return encode_assignment(Assignment(min(version, 3), a.partitions, a.user_data))
    except (ConsumerProtocolError, ValueError):
        return assignment
