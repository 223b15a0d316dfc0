"""The consumer-group (KIP-848, ``group.protocol=consumer``) coordinator: a sans-IO machine.

Why one ~1,550-line module: every transition of a consumer group - heartbeats, classic-protocol
members inside a consumer group (join/sync/heartbeat/leave), online upgrade from a classic group,
timers, deletion, replay - happens in this one class, as h11 keeps its transitions in one file and
Kafka keeps them in ``GroupMetadataManager``; splitting it would spread one state machine over
several files.  The model and the pure helpers live in :mod:`rallypoint.groups.consumer_model`.

Events in (a heartbeat, a timer, a persisted batch, replayed records) with ``now_ms``; effects
out as data (:mod:`rallypoint.groups.consumer_events`).  See docs/consumer-groups.md for the
semantics; Kafka's ``GroupMetadataManager.java`` (consumer-group part) and
``modern/consumer/ConsumerGroup.java`` are the reference.

State changes only by *replaying records* (:meth:`ConsumerGroupMachine.replay`): a heartbeat
builds the records Kafka would write, replays them at once (later requests see the new state,
as Kafka's uncommitted timeline state) and holds the response until the batch is persisted.
If the append fails, the batch is undone (docs/consumer-groups.md, "Persistence").  Loading
from the log uses the same replay, so live and restored state cannot diverge.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterable, Mapping

from msgspec import Struct, field
from msgspec.structs import replace
from rallypoint.protocol.consumer_group_records import (
    ClassicMemberMetadata,
    ClassicProtocol,
    ConsumerKey,
    ConsumerRecord,
    ConsumerValue,
    CurrentMemberAssignmentKey,
    CurrentMemberAssignmentValue,
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadataKey,
    MemberMetadataValue,
    PartitionMetadataKey,
    PartitionMetadataValue,
    RegularExpressionKey,
    RegularExpressionValue,
    TargetAssignmentMemberKey,
    TargetAssignmentMemberValue,
    TargetAssignmentMetadataKey,
    TargetAssignmentMetadataValue,
)
from rallypoint.protocol.consumer_protocol import Assignment as CPAssignment
from rallypoint.protocol.consumer_protocol import (
    ConsumerProtocolError,
    decode_assignment,
    decode_subscription,
    encode_assignment,
)
from rallypoint.protocol.consumer_protocol import TopicPartitions as CPTopicPartitions
from rallypoint.protocol.errors import ErrorCode
from rallypoint.protocol.offsets_schema import partition_for

from .assignors import BUILTIN, Assignor, AssignorError, GroupSpec, MemberSpec
from .consumer_events import (
    ClassicGroupSnapshot,
    ClassicMemberSnapshot,
    ConsumerEffect,
    ConsumerHeartbeat,
    ConsumerHeartbeatResult,
    ConvertClassic,
    DescribedConsumerGroup,
    DescribedConsumerMember,
    DescribedTopicPartitions,
    DowngradeToClassic,
    PersistConsumer,
)
from .consumer_model import (
    BLANK_META,
    DEAD,
    GROUP_TYPE,
    JOIN_EPOCH,
    LEAVE_EPOCH,
    PROTOCOL_TYPE,
    STATIC_LEAVE_EPOCH,
    ConsumerGroup,
    ConsumerGroupConfig,
    ConsumerMember,
    OwnershipError,
    RegexError,
    StaticTopics,
    TopicInfo,
    TopicsView,
    assignment_from_record,
    assignment_record,
    check_epoch,
    compile_regex,
    group_metadata_hash,
    partition_set,
    resolve_regex,
    target_value,
    updated_meta,
    validate_heartbeat,
)
from .events import (
    ArmTimer,
    CancelTimer,
    ConsumerMemberKey,
    HeartbeatRequest,
    HeartbeatResult,
    JoinRequest,
    JoinResult,
    LeaveMemberResult,
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
from .persist import response_error
from .reconciliation import EpochAssignment, MemberAssignment, MemberState, reconcile

__all__ = [
    "ConsumerGroup",
    "ConsumerGroupConfig",
    "ConsumerGroupMachine",
    "StaticTopics",
    "TopicInfo",
    "TopicsView",
    "validate_heartbeat",
]

# --------------------------------------------------------------------------------- the machine


class _Op(Struct):
    """One request or timer: the records it wrote and how to undo them."""

    group_id: str
    records: list[ConsumerRecord] = field(default_factory=list)
    undo: list[ConsumerRecord] = field(default_factory=list)  # old values, in write order
    created_group: bool = False
    downgrade: ClassicGroupSnapshot | None = None  # the classic group this op turns it into


class _PendingWrite(Struct):
    """An op's records on their way to the log: how to undo them and whom to tell when written."""

    group_id: str
    undo: list[ConsumerRecord]
    created_group: bool
    on_done: Callable[[ErrorCode | None], None]
    failed: bool = False


def _timer(kind: str, group_id: str, member_id: str) -> TimerKey:
    return ConsumerMemberKey(kind, group_id, member_id)


class ConsumerGroupMachine:
    def __init__(
        self,
        config: ConsumerGroupConfig,
        topics: TopicsView,
        *,
        classic_members: Callable[[str], int | None] | None = None,
        new_member_id: Callable[[], str] | None = None,
        group_setting: Callable[[str, str], str] | None = None,
    ) -> None:
        self.config = config
        self.topics = topics
        self.groups: dict[str, ConsumerGroup] = {}
        # How many members a *classic* group of this id has (None: no classic group).  Wired by
        # the runtime to the classic coordinator (docs/consumer-groups.md, "Classic groups").
        self.classic_members = classic_members or (lambda _gid: None)
        # the live classic group of an id, for an online upgrade (None: none, or not upgradable)
        self.classic_snapshot: Callable[[str], ClassicGroupSnapshot | None] = lambda _gid: None
        # A group's effective dynamic config (group id, name) -> value: its override set with
        # IncrementalAlterConfigs on GROUP, else the broker's default (docs/configs.md).
        self.group_setting = group_setting
        self._new_member_id = new_member_id or (lambda: str(uuid.uuid4()))
        self._effects: list[ConsumerEffect] = []
        self._persist_ids = itertools.count(1)
        self._pending: dict[int, _PendingWrite] = {}
        self._pending_by_group: dict[str, list[int]] = {}
        self._rebalance_armed: dict[tuple[str, str], int] = {}  # (group, member) -> epoch
        self._join_armed: set[TimerKey] = set()  # classic members told to rejoin
        self._now = 0
        self._states: dict[str, str] = {}

    # ------------------------------------------------------------------ effect plumbing

    def session_timeout_ms(self, group_id: str) -> int:
        """``consumer.session.timeout.ms`` of the group (Kafka's ``consumerGroupSessionTimeoutMs``)."""
        if self.group_setting is None:
            return self.config.session_timeout_ms
        return int(self.group_setting(group_id, "consumer.session.timeout.ms"))

    def heartbeat_interval_ms(self, group_id: str) -> int:
        """``consumer.heartbeat.interval.ms`` of the group (``consumerGroupHeartbeatIntervalMs``)."""
        if self.group_setting is None:
            return self.config.heartbeat_interval_ms
        return int(self.group_setting(group_id, "consumer.heartbeat.interval.ms"))

    def _begin(self, now_ms: int) -> None:
        self._now = now_ms
        self._effects = []

    def _end(self) -> list[ConsumerEffect]:
        out, self._effects = self._effects, []
        return out

    def _arm(self, key: TimerKey, delay_ms: int) -> None:
        self._effects.append(ArmTimer(key, self._now + delay_ms))

    def _cancel(self, key: TimerKey) -> None:
        self._effects.append(CancelTimer(key))

    def _note(self, event: str, **fields: object) -> None:
        self._effects.append(Note(event, dict(fields)))

    def partition_for(self, group_id: str) -> int:
        return partition_for(group_id, self.config.num_partitions)

    # ------------------------------------------------------------------------- replay

    def replay(self, key: ConsumerKey, value: ConsumerValue | None) -> None:
        """Apply one record (``GroupMetadataManager.replay``).  The only way state changes."""
        gid = key.group_id
        group = self.groups.get(gid)
        if group is None:
            if value is None:
                return
            group = self.groups[gid] = ConsumerGroup(gid, self.partition_for(gid))
        if isinstance(key, GroupMetadataKey):
            if value is None:
                del self.groups[gid]
                self._states.pop(gid, None)
            else:
                assert isinstance(value, GroupMetadataValue)
                group.epoch = value.epoch
                group.metadata_hash = value.metadata_hash
        elif isinstance(key, PartitionMetadataKey):
            group.has_partition_metadata = value is not None
        elif isinstance(key, TargetAssignmentMetadataKey):
            if value is None:
                group.assignment_epoch = -1
                group.assignment_timestamp = 0
            else:
                assert isinstance(value, TargetAssignmentMetadataValue)
                group.assignment_epoch = value.assignment_epoch
                group.assignment_timestamp = value.assignment_timestamp
        elif isinstance(key, TargetAssignmentMemberKey):
            if value is None:
                group.target.pop(key.member_id, None)
            else:
                assert isinstance(value, TargetAssignmentMemberValue)
                group.target[key.member_id] = {
                    tp.topic_id: frozenset(tp.partitions) for tp in value.topic_partitions if tp.partitions
                }
        elif isinstance(key, MemberMetadataKey):
            if value is None:
                m = group.members.pop(key.member_id, None)
                if m is not None:
                    group.drop(m)
                    self._release(group, m)
                    if m.instance_id is not None and group.static.get(m.instance_id) == key.member_id:
                        del group.static[m.instance_id]
            else:
                assert isinstance(value, MemberMetadataValue)
                m = group.members.get(key.member_id)
                if m is None:
                    m = group.members[key.member_id] = ConsumerMember(key.member_id)
                else:
                    group.drop(m)
                old_instance = m.meta.instance_id
                if old_instance is not None and old_instance != value.instance_id:
                    if group.static.get(old_instance) == key.member_id:
                        del group.static[old_instance]
                m.meta = value
                group.add(m)
                if value.instance_id is not None:
                    group.static[value.instance_id] = key.member_id
        elif isinstance(key, CurrentMemberAssignmentKey):
            m = group.members.get(key.member_id)
            if m is None and value is None:
                return
            if value is None:
                new = MemberAssignment(LEAVE_EPOCH, LEAVE_EPOCH, MemberState.STABLE)
            else:
                assert isinstance(value, CurrentMemberAssignmentValue)
                new = assignment_from_record(value)
                self._check_claim(group, key.member_id, new)  # refuses before changing anything
            if m is None:
                m = group.members[key.member_id] = ConsumerMember(key.member_id)
            else:
                group.drop(m)
            self._release(group, m)
            m.assignment = new
            self._claim(group, m)
            group.add(m)
        elif isinstance(key, RegularExpressionKey):
            if value is None:
                group.regexes.pop(key.regex, None)
            else:
                assert isinstance(value, RegularExpressionValue)
                group.regexes[key.regex] = value

    @staticmethod
    def _release(group: ConsumerGroup, m: ConsumerMember) -> None:
        for part in (m.assignment.assigned, m.assignment.pending_revocation):
            for t, ps in part.items():
                for p in ps:
                    o = group.owners.get((t, p))
                    if o is not None and o[0] == m.member_id:
                        del group.owners[(t, p)]

    @staticmethod
    def _check_claim(group: ConsumerGroup, member_id: str, a: MemberAssignment) -> None:
        for part in (a.assigned, a.pending_revocation):
            for t, ps in part.items():
                for p in ps:
                    o = group.owners.get((t, p))
                    if o is not None and o[0] != member_id:
                        raise OwnershipError(
                            f"partition {t}-{p} of group {group.group_id} is still owned by {o[0]} at epoch {o[1]}; "
                            f"cannot give it to {member_id} at epoch {a.epoch}"
                        )

    @staticmethod
    def _claim(group: ConsumerGroup, m: ConsumerMember) -> None:
        for part in (m.assignment.assigned, m.assignment.pending_revocation):
            for t, ps in part.items():
                for p in ps:
                    group.owners[(t, p)] = (m.member_id, m.epoch)

    def _current_value(self, key: ConsumerKey) -> ConsumerValue | None:
        """What the state holds for ``key`` now (the value that undoes a write to it)."""
        group = self.groups.get(key.group_id)
        if group is None:
            return None
        if isinstance(key, GroupMetadataKey):
            return GroupMetadataValue(group.epoch, group.metadata_hash)
        if isinstance(key, PartitionMetadataKey):
            return PartitionMetadataValue() if group.has_partition_metadata else None
        if isinstance(key, TargetAssignmentMetadataKey):
            return TargetAssignmentMetadataValue(group.assignment_epoch, group.assignment_timestamp)
        if isinstance(key, TargetAssignmentMemberKey):
            t = group.target.get(key.member_id)
            return None if t is None else target_value(t)
        if isinstance(key, MemberMetadataKey):
            m = group.members.get(key.member_id)
            return None if m is None else m.meta
        if isinstance(key, CurrentMemberAssignmentKey):
            m = group.members.get(key.member_id)
            return None if m is None else assignment_record(m.assignment)
        return group.regexes.get(key.regex)

    def _write(self, op: _Op, key: ConsumerKey, value: ConsumerValue | None) -> None:
        op.undo.append((key, self._current_value(key)))
        op.records.append((key, value))
        self.replay(key, value)

    def _undo(self, group_id: str, undo: list[ConsumerRecord], created: bool) -> None:
        for key, value in reversed(undo):
            try:
                self.replay(key, value)
            except OwnershipError:  # pragma: no cover - undo restores a consistent earlier state
                pass
        if created:
            self.groups.pop(group_id, None)
        group = self.groups.get(group_id)
        if group is not None:
            group.regex_names_seen = None  # resolve again: an undone write may have held a resolution

    def _commit(self, op: _Op, on_done: Callable[[ErrorCode | None], None]) -> None:
        """Persist the op's records (if any) and call ``on_done`` once they are written."""
        self._transitions(op.group_id)
        if not op.records:
            on_done(None)
            return
        pid = next(self._persist_ids)
        group = self.groups.get(op.group_id)
        partition = group.partition if group is not None else self.partition_for(op.group_id)
        self._pending[pid] = _PendingWrite(op.group_id, op.undo, op.created_group, on_done)
        self._pending_by_group.setdefault(op.group_id, []).append(pid)
        self._effects.append(PersistConsumer(pid, partition, tuple(op.records)))
        if op.downgrade is not None:
            self._effects.append(DowngradeToClassic(op.downgrade))

    def persist_done(self, persist_id: int, error: ErrorCode | None, now_ms: int) -> list[ConsumerEffect]:
        self._begin(now_ms)
        w = self._pending.pop(persist_id, None)
        if w is None or w.failed:
            return self._end()  # unknown, or already failed with an earlier write of its group
        ids = self._pending_by_group.setdefault(w.group_id, [])
        idx = ids.index(persist_id) if persist_id in ids else len(ids)
        if error is None:
            if persist_id in ids:
                ids.remove(persist_id)
            w.on_done(None)
        else:
            # undo this write and every later one of the group (they were built on it), newest first
            later = [w] + [self._pending[p] for p in ids[idx + 1 :] if p in self._pending]
            for lw in reversed(later):
                self._undo(lw.group_id, lw.undo, lw.created_group)
            for lw in later:
                lw.failed = True  # a later write's own completion is then ignored
                lw.on_done(response_error(error))
            del ids[idx:]
            self._note("consumer_group.write_failed", group=w.group_id, error=error.name)
            self._transitions(w.group_id)
        if not ids:
            self._pending_by_group.pop(w.group_id, None)
        return self._end()

    def _transitions(self, group_id: str) -> None:
        group = self.groups.get(group_id)
        new = group.state() if group is not None else DEAD
        old = self._states.get(group_id, DEAD)
        if new != old:
            if group is None:
                self._states.pop(group_id, None)
            else:
                self._states[group_id] = new
            self._effects.append(
                Transition(
                    group_id,
                    group.partition if group is not None else self.partition_for(group_id),
                    old,
                    new,
                    group.epoch if group is not None else -1,
                    None,
                    len(group.members) if group is not None else 0,
                    "consumer group",
                )
            )

    # ---------------------------------------------------------------------- loading

    def load(self, partition: int, records: Iterable[ConsumerRecord], now_ms: int) -> list[ConsumerEffect]:
        """Install the replayed consumer groups of one ``__consumer_offsets`` partition: replay
        the records in log order, then give every member a fresh session timer (and members
        revoking partitions a rebalance timer), as Kafka's ``onLoaded``."""
        self._begin(now_ms)
        refused = 0
        for key, value in records:
            try:
                self.replay(key, value)
            except OwnershipError as e:  # a log no coordinator could have written: keep the rest
                refused += 1
                if refused == 1:
                    self._note("consumer_group.record_refused", partition=partition, error=str(e))
        for group in self.groups.values():
            if group.partition != partition:
                continue
            self._states[group.group_id] = group.state()
            for m in group.members.values():
                classic = m.meta.classic_member_metadata
                timeout = classic.session_timeout_ms if classic is not None else self.session_timeout_ms(group.group_id)
                self._arm(_timer("session", group.group_id, m.member_id), timeout)
                if m.assignment.state == MemberState.UNREVOKED_PARTITIONS:
                    self._arm_rebalance(group, m)
            self._note(
                "consumer_group.loaded",
                group=group.group_id,
                partition=partition,
                epoch=group.epoch,
                assignment_epoch=group.assignment_epoch,
                members=len(group.members),
                state=group.state(),
            )
        return self._end()

    # -------------------------------------------------------------------- heartbeat

    def heartbeat(self, token: int, req: ConsumerHeartbeat, now_ms: int) -> list[ConsumerEffect]:
        self._begin(now_ms)

        def respond(result: ConsumerHeartbeatResult) -> None:
            self._effects.append(Respond(token, result))

        err = validate_heartbeat(req, self.config)
        if err is not None:
            respond(ConsumerHeartbeatResult(err[0], err[1]))
        elif req.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            self._leave(req, respond)
        else:
            self._regular_heartbeat(req, respond)
        return self._end()

    def _error(self, code: ErrorCode, message: str | None = None) -> ConsumerHeartbeatResult:
        return ConsumerHeartbeatResult(code, message)

    def _regular_heartbeat(self, req: ConsumerHeartbeat, respond: Callable[[ConsumerHeartbeatResult], None]) -> None:
        gid = req.group_id
        group = self.groups.get(gid)
        op = _Op(gid)
        if group is None:
            if req.member_epoch != JOIN_EPOCH:
                respond(self._error(ErrorCode.GROUP_ID_NOT_FOUND, f"Group {gid} not found."))
                return
            classic = self.classic_members(gid)
            if classic is not None and classic > 0:
                upgraded = self._upgrade(op, gid)
                if upgraded is None:
                    respond(self._error(ErrorCode.GROUP_ID_NOT_FOUND, f"Group {gid} is not a consumer group."))
                    return
                group = upgraded
            else:
                group = ConsumerGroup(gid, self.partition_for(gid))
            op.created_group = True
        member_id = req.member_id or self._new_member_id()

        # --- member lookup (dynamic by id; static by instance id)
        existing: ConsumerMember | None
        replaced: ConsumerMember | None = None
        if req.instance_id is None:
            existing = group.members.get(member_id)
            if existing is None and req.member_epoch != JOIN_EPOCH:
                respond(self._error(ErrorCode.UNKNOWN_MEMBER_ID, f"Member {member_id} is not a member of group {gid}."))
                return
        else:
            holder = group.static.get(req.instance_id)
            existing = group.members.get(member_id)
            if req.member_epoch == JOIN_EPOCH:
                if holder is not None and holder != member_id:
                    old = group.members[holder]
                    if old.epoch != STATIC_LEAVE_EPOCH and old.uses_consumer_protocol:
                        respond(
                            self._error(
                                ErrorCode.UNRELEASED_INSTANCE_ID,
                                f"Static member {holder} with instance id {req.instance_id} cannot be replaced "
                                "because it has not left the group.",
                            )
                        )
                        return
                    replaced = old
            else:
                if holder is None:
                    respond(
                        self._error(
                            ErrorCode.UNKNOWN_MEMBER_ID, f"Instance id {req.instance_id} is unknown in group {gid}."
                        )
                    )
                    return
                if holder != member_id:
                    respond(
                        self._error(
                            ErrorCode.FENCED_INSTANCE_ID,
                            f"Static member {member_id} with instance id {req.instance_id} was fenced by {holder}.",
                        )
                    )
                    return
        # --- size check (skipped for a known instance id)
        if member_id not in group.members and replaced is None and len(group.members) >= self.config.max_size:
            respond(
                self._error(
                    ErrorCode.GROUP_MAX_SIZE_REACHED,
                    f"The consumer group has reached its maximum capacity of {self.config.max_size} members.",
                )
            )
            return
        # --- epoch check
        if existing is not None and req.member_epoch != JOIN_EPOCH:
            err = check_epoch(existing, req)
            if err is not None:
                respond(self._error(ErrorCode.FENCED_MEMBER_EPOCH, err))
                return

        # --- regex validation (only when the regex is new to the group)
        new_regex = req.subscribed_topic_regex
        if new_regex and new_regex not in group.regexes and group.regex_subscribers(new_regex) == 0:
            try:
                compile_regex(new_regex)
            except RegexError as e:
                respond(
                    self._error(
                        ErrorCode.INVALID_REGULAR_EXPRESSION,
                        f"SubscribedTopicRegex `{new_regex}` is not a valid regular expression: {e}.",
                    )
                )
                return

        # From here on the request is accepted: build and replay its records.
        if op.created_group:
            self.groups[gid] = group
        old_member = existing
        if replaced is not None:
            self._replace_static(op, group, replaced, member_id)
            old_member = group.members[member_id]
        old_meta = old_member.meta if old_member is not None else BLANK_META
        new_meta = updated_meta(old_meta, req)
        try:
            before, after = self._update_member(op, group, member_id, old_member, new_meta, req.topic_partitions)
        except AssignorError as e:
            respond(self._error(ErrorCode.UNKNOWN_SERVER_ERROR, f"Failed to compute a new target assignment: {e}"))
            return
        self._arm(_timer("session", gid, member_id), self.session_timeout_ms(gid))

        full = (
            req.rebalance_timeout_ms != -1
            and (req.subscribed_topic_names is not None or req.subscribed_topic_regex is not None)
            and req.topic_partitions is not None
        )
        send_assignment = (
            req.member_epoch == JOIN_EPOCH or full or partition_set(after.assigned) != partition_set(before.assigned)
        )
        result = ConsumerHeartbeatResult(
            ErrorCode.NONE,
            None,
            member_id,
            after.epoch,
            self.heartbeat_interval_ms(gid),
            {t: tuple(sorted(ps)) for t, ps in after.assigned.items() if ps} if send_assignment else None,
        )

        def done(error: ErrorCode | None) -> None:
            respond(result if error is None else self._error(error))

        self._commit(op, done)

    def _update_member(
        self,
        op: _Op,
        group: ConsumerGroup,
        member_id: str,
        old_member: ConsumerMember | None,
        new_meta: MemberMetadataValue,
        owned: Mapping[uuid.UUID, frozenset[int]] | None,
    ) -> tuple[MemberAssignment, MemberAssignment]:
        """Steps shared by a heartbeat and a classic member's JoinGroup: member metadata record,
        regexes, metadata hash, epoch bump, target assignment, reconciliation of this member.
        (assignment before, after).  Raises AssignorError after undoing the op's records."""
        gid = group.group_id
        old_meta = old_member.meta if old_member is not None else BLANK_META
        old_assignor = self._preferred_assignor(group)
        subscription_changed = set(new_meta.subscribed_topic_names) != set(old_meta.subscribed_topic_names)
        regex_changed = (new_meta.subscribed_topic_regex or None) != (old_meta.subscribed_topic_regex or None)
        if old_member is None or new_meta != old_meta:
            self._write(op, MemberMetadataKey(gid, member_id), new_meta)
            if old_member is None:
                self._note(
                    "consumer_group.member_added",
                    group=gid,
                    member=member_id,
                    instance=new_meta.instance_id,
                    protocol="consumer" if new_meta.classic_member_metadata is None else "classic",
                )
        member = group.members[member_id]
        bump = subscription_changed or regex_changed or self._preferred_assignor(group) != old_assignor
        # --- regexes: drop unused ones, (re)resolve new ones and ones whose topics may have changed
        old_regex = old_meta.subscribed_topic_regex
        if regex_changed and old_regex and old_regex in group.regexes and group.regex_subscribers(old_regex) == 0:
            self._write(op, RegularExpressionKey(gid, old_regex), None)
        if self._refresh_regexes(op, group):
            bump = True
        # --- metadata hash
        new_hash = group_metadata_hash(self._subscribed_topics(group))
        if new_hash != group.metadata_hash:
            bump = True
        if bump:
            self._write(op, GroupMetadataKey(gid), GroupMetadataValue(group.epoch + 1, new_hash))
            if group.has_partition_metadata:
                self._write(op, PartitionMetadataKey(gid), None)
        # --- target assignment
        try:
            self._maybe_compute_target(op, group)
        except AssignorError:
            self._undo(gid, op.undo, op.created_group)
            op.records.clear()
            op.undo.clear()
            raise
        # --- reconciliation
        before = member.assignment
        after = reconcile(
            before,
            group.assignment_epoch,
            group.target.get(member_id, {}),
            self._member_topic_ids(group, member),
            owned,
            group.partition_epoch,
            subscription_changed or regex_changed,
        )
        if after != before:
            self._write(op, CurrentMemberAssignmentKey(gid, member_id), assignment_record(after))
            if after.state == MemberState.UNREVOKED_PARTITIONS:
                self._arm_rebalance(group, member)
            else:
                self._cancel_rebalance(gid, member_id)
        return before, after

    def _upgrade(self, op: _Op, gid: str) -> ConsumerGroup | None:
        """Kafka's online upgrade (``convertToConsumerGroup``) when a consumer-protocol member
        joins a live classic group: the classic coordinator hands the group over
        (:class:`ConvertClassic`), the consumer group's records are written and applied, every
        classic member gets a session timer with its classic session timeout; the join then
        proceeds in the new group.  None when the group cannot be upgraded (the caller answers
        GROUP_ID_NOT_FOUND, as Kafka)."""
        snap = self.classic_snapshot(gid)
        if snap is None:
            return None
        recs = self.upgrade_records(snap)
        if isinstance(recs, ErrorCode):
            self._note("consumer_group.upgrade_refused", group=gid, error=recs.name)
            return None
        self._effects.append(ConvertClassic(gid))
        for key, value in recs:
            self._write(op, key, value)
        group = self.groups[gid]
        for m in group.members.values():
            classic = m.meta.classic_member_metadata
            timeout = classic.session_timeout_ms if classic is not None else self.session_timeout_ms(gid)
            self._arm(_timer("session", gid, m.member_id), timeout)
        self._note("consumer_group.upgraded", group=gid, epoch=group.epoch, members=len(group.members))
        return group

    def upgrade_records(self, snap: ClassicGroupSnapshot) -> list[ConsumerRecord] | ErrorCode:
        """The records that turn a live classic group into a consumer group (Kafka's online
        upgrade, ``ConsumerGroup.fromClassicGroup``): group epoch = assignment epoch = the
        generation; every member STABLE at that epoch with its last classic assignment as both
        current and target assignment, and its session timeout and protocols kept as classic
        metadata.  An ErrorCode (GROUP_ID_NOT_FOUND, as Kafka answers) when the policy, the
        protocol type, the size or a member's assignment user data does not allow it.

        Used by :meth:`_upgrade` (docs/consumer-groups.md, "Classic groups")."""
        if self.config.migration_policy not in ("bidirectional", "upgrade"):
            return ErrorCode.GROUP_ID_NOT_FOUND
        if snap.protocol_type != PROTOCOL_TYPE or len(snap.members) > self.config.max_size:
            return ErrorCode.GROUP_ID_NOT_FOUND
        gid, gen = snap.group_id, snap.generation
        metas: list[ConsumerRecord] = []
        targets: list[ConsumerRecord] = []
        currents: list[ConsumerRecord] = []
        topics: dict[str, TopicInfo] = {}
        for m in snap.members:
            chosen = next((meta for name, meta in m.protocols if name == snap.protocol_name), None)
            try:
                sub = decode_subscription(chosen if chosen is not None else m.protocols[0][1])
                assignment = decode_assignment(m.assignment) if m.assignment else None
            except (ConsumerProtocolError, ValueError, IndexError):
                return ErrorCode.GROUP_ID_NOT_FOUND
            if assignment is not None and assignment.user_data:
                return ErrorCode.GROUP_ID_NOT_FOUND  # a custom assignor's state cannot be carried over
            assigned: EpochAssignment = {}
            for tp in assignment.partitions if assignment is not None else ():
                t = self.topics.get(tp.topic)
                if t is not None:
                    topics[t.name] = t
                    assigned.setdefault(t.topic_id, {}).update(dict.fromkeys(tp.partitions, gen))
            for name in sub.topics:
                t = self.topics.get(name)
                if t is not None:
                    topics[name] = t
            metas.append(
                (
                    MemberMetadataKey(gid, m.member_id),
                    MemberMetadataValue(
                        m.instance_id,
                        sub.rack_id,
                        m.client_id,
                        m.client_host,
                        tuple(sorted(set(sub.topics))),
                        None,
                        m.rebalance_timeout_ms,
                        None,
                        ClassicMemberMetadata(
                            m.session_timeout_ms, tuple(ClassicProtocol(n, meta) for n, meta in m.protocols)
                        ),
                    ),
                )
            )
            targets.append((TargetAssignmentMemberKey(gid, m.member_id), target_value(assigned)))
            currents.append(
                (
                    CurrentMemberAssignmentKey(gid, m.member_id),
                    assignment_record(MemberAssignment(gen, gen, MemberState.STABLE, assigned, {})),
                )
            )
        return [
            (GroupMetadataKey(gid), GroupMetadataValue(gen, group_metadata_hash(topics.values()))),
            *metas,
            *targets,
            (TargetAssignmentMetadataKey(gid), TargetAssignmentMetadataValue(gen, 0)),
            *currents,
        ]

    def _refresh_regexes(self, op: _Op, group: ConsumerGroup) -> bool:
        """Resolve the regexes members use that are unresolved, or all of them when the set of
        topic names changed since the last resolution.  True if a regex's topics changed."""
        used = set(group.regex_users)
        if not used:
            return False
        names = frozenset(self.topics.names())
        stale = names != group.regex_names_seen
        changed = False
        for rx in sorted(used):
            old = group.regexes.get(rx)
            if old is not None and not stale:
                continue
            topics = tuple(sorted(resolve_regex(rx, names)))
            if old is None or old.topics != topics:
                version = (old.version + 1) if old is not None else 1
                self._write(
                    op, RegularExpressionKey(group.group_id, rx), RegularExpressionValue(topics, version, self._now)
                )
                changed = True
        group.regex_names_seen = names
        return changed

    def _member_topic_names(self, group: ConsumerGroup, m: ConsumerMember) -> set[str]:
        names = set(m.meta.subscribed_topic_names)
        rx = m.meta.subscribed_topic_regex
        if rx:
            resolved = group.regexes.get(rx)
            if resolved is not None:
                names.update(resolved.topics)
        return names

    def _member_topic_ids(self, group: ConsumerGroup, m: ConsumerMember) -> frozenset[uuid.UUID]:
        out = set()
        for n in self._member_topic_names(group, m):
            t = self.topics.get(n)
            if t is not None:
                out.add(t.topic_id)
        return frozenset(out)

    def _subscribed_topics(self, group: ConsumerGroup) -> list[TopicInfo]:
        names = set(group.names)
        for rx in group.regex_users:
            resolved = group.regexes.get(rx)
            if resolved is not None:
                names.update(resolved.topics)
        return [t for t in (self.topics.get(n) for n in names) if t is not None]

    def _preferred_assignor(self, group: ConsumerGroup) -> str:
        """The ServerAssignor most members name (ties: the one listed first in
        group.consumer.assignors), else the default assignor."""
        counts = group.assignors
        if not counts:
            return self.config.default_assignor
        best = max(counts.values())
        for name in self.config.assignors:
            if counts.get(name) == best:
                return name
        return self.config.default_assignor

    def _maybe_compute_target(self, op: _Op, group: ConsumerGroup) -> None:
        if group.assignment_epoch >= group.epoch:
            return
        ts, interval = group.assignment_timestamp, self.config.assignment_interval_ms
        if not (ts == 0 or interval == 0 or self._now >= ts + interval):
            return  # members keep reconciling towards the previous target (group stays Assigning)
        specs: dict[str, MemberSpec] = {}
        partitions: dict[uuid.UUID, int] = {}
        by_subscription: dict[tuple[tuple[str, ...], str | None], frozenset[uuid.UUID]] = {}
        for mid, m in group.members.items():
            sub = (m.meta.subscribed_topic_names, m.meta.subscribed_topic_regex)
            ids = by_subscription.get(sub)
            if ids is None:
                ids = by_subscription[sub] = self._member_topic_ids(group, m)
                for tid in ids:
                    t = self.topics.by_id(tid)
                    if t is not None:
                        partitions[tid] = t.partitions
            specs[mid] = MemberSpec(mid, m.meta.instance_id, m.meta.rack_id, ids, group.target.get(mid, {}))
        subs = {s.subscribed for s in specs.values()}
        spec = GroupSpec(specs, len(subs) <= 1, partitions)
        assignor: Assignor = BUILTIN[self._preferred_assignor(group)]
        new_target = assignor.assign(spec)
        for mid in sorted(specs):
            tgt = new_target.get(mid, {})
            if mid not in group.target or group.target[mid] != tgt:
                self._write(op, TargetAssignmentMemberKey(group.group_id, mid), target_value(tgt))
        self._write(
            op,
            TargetAssignmentMetadataKey(group.group_id),
            TargetAssignmentMetadataValue(group.epoch, self._now),
        )
        self._note(
            "consumer_group.target_assignment",
            group=group.group_id,
            epoch=group.epoch,
            assignor=assignor.name,
            members=len(specs),
            partitions=sum(partitions.values()),
        )

    # ------------------------------------------------------- classic members (JoinGroup ...)

    def classic_join(self, token: int, req: JoinRequest, now_ms: int) -> list[ConsumerEffect]:
        """A classic JoinGroup for a consumer group (``classicGroupJoinToConsumerGroup``;
        docs/consumer-groups.md, "Classic members").  Answers a JoinResult, or ``None`` when the
        group is empty: it is then deleted here and the classic coordinator takes the join (the
        group changes type)."""
        self._begin(now_ms)
        self._classic_join(token, req)
        return self._end()

    def _classic_join(self, token: int, req: JoinRequest) -> None:
        def respond(result: JoinResult | None) -> None:
            self._effects.append(Respond(token, result))

        def fail(code: ErrorCode, member_id: str = "") -> None:
            respond(JoinResult(code, member_id=member_id))

        gid = req.group_id
        group = self.groups.get(gid)
        if group is None:
            respond(None)
            return
        if not group.members:
            # an empty consumer group becomes a classic group: drop it, the classic side joins
            op = _Op(gid)
            self._delete_records(op, group)
            self._note("consumer_group.converted_to_classic", group=gid)
            self._commit(op, lambda e: respond(None) if e is None else fail(e))
            return
        if self.config.migration_policy == "disabled":
            fail(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
            return
        if req.protocol_type != PROTOCOL_TYPE or not req.protocols or not self._supports(group, req):
            fail(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
            return
        try:
            subscription = decode_subscription(req.protocols[0].metadata)
        except (ConsumerProtocolError, ValueError):
            fail(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
            return
        member_id = req.member_id
        replaced: ConsumerMember | None = None
        existing: ConsumerMember | None = None
        if req.group_instance_id is None:
            if not member_id:
                if req.api_version >= 4:
                    # the id comes back with MEMBER_ID_REQUIRED; nothing is kept until it rejoins
                    fail(ErrorCode.MEMBER_ID_REQUIRED, self._new_member_id())
                    return
                member_id = self._new_member_id()
            existing = group.members.get(member_id)
            if existing is not None and existing.uses_consumer_protocol:
                fail(ErrorCode.UNKNOWN_MEMBER_ID, member_id)
                return
        else:
            holder = group.static.get(req.group_instance_id)
            if not member_id:
                member_id = self._new_member_id()
            if holder is not None and holder != member_id:
                replaced = group.members[holder]
            elif holder == member_id:
                existing = group.members[holder]
        if existing is None and replaced is None and len(group.members) >= self.config.max_size:
            fail(ErrorCode.GROUP_MAX_SIZE_REACHED, member_id)
            return
        op = _Op(gid)
        if replaced is not None:
            self._replace_static(op, group, replaced, member_id)
            existing = group.members[member_id]
        owned: dict[uuid.UUID, frozenset[int]] = {}
        for tp in subscription.owned_partitions:
            t = self.topics.get(tp.topic)
            if t is not None:
                owned[t.topic_id] = frozenset(tp.partitions)
        old_meta = existing.meta if existing is not None else BLANK_META
        new_meta = replace(
            old_meta,
            instance_id=req.group_instance_id,
            rack_id=subscription.rack_id,
            client_id=req.client_id,
            client_host=req.client_host,
            subscribed_topic_names=tuple(sorted(set(subscription.topics))),
            subscribed_topic_regex=None,
            rebalance_timeout_ms=req.rebalance_timeout_ms,
            server_assignor=None,
            classic_member_metadata=ClassicMemberMetadata(
                req.session_timeout_ms, tuple(ClassicProtocol(p.name, p.metadata) for p in req.protocols)
            ),
        )
        try:
            _before, after = self._update_member(op, group, member_id, existing, new_meta, owned)
        except AssignorError:
            fail(ErrorCode.UNKNOWN_SERVER_ERROR, member_id)
            return
        self._join_armed.discard(_timer("join", gid, member_id))
        self._cancel(_timer("join", gid, member_id))
        self._arm(_timer("session", gid, member_id), req.session_timeout_ms)
        self._arm(_timer("sync", gid, member_id), req.rebalance_timeout_ms)
        result = JoinResult(
            ErrorCode.NONE,
            member_id=member_id,
            generation_id=after.epoch,
            protocol_type=PROTOCOL_TYPE,
            protocol_name=req.protocols[0].name,
            leader="",
            members=(),
        )
        self._commit(op, lambda e: respond(result) if e is None else fail(e, member_id))

    @staticmethod
    def _supports(group: ConsumerGroup, req: JoinRequest) -> bool:
        """At least one of the joining member's protocols is supported by every classic member."""
        names = {p.name for p in req.protocols}
        for m in group.members.values():
            c = m.meta.classic_member_metadata
            if c is not None and m.member_id != req.member_id:
                names &= {p.name for p in c.supported_protocols}
        return bool(names)

    def _classic_member(
        self, group: ConsumerGroup | None, member_id: str, instance_id: str | None
    ) -> tuple[ConsumerMember | None, ErrorCode]:
        if group is None:
            return None, ErrorCode.UNKNOWN_MEMBER_ID
        m = group.members.get(member_id)
        if instance_id is not None:
            holder = group.static.get(instance_id)
            if holder is None:
                return None, ErrorCode.UNKNOWN_MEMBER_ID
            if holder != member_id:
                return None, ErrorCode.FENCED_INSTANCE_ID
        if m is None or m.uses_consumer_protocol:
            return None, ErrorCode.UNKNOWN_MEMBER_ID
        return m, ErrorCode.NONE

    def classic_sync(self, token: int, req: SyncRequest, now_ms: int) -> list[ConsumerEffect]:
        """A classic member's SyncGroup: its current partitions, or REBALANCE_IN_PROGRESS."""
        self._begin(now_ms)
        group = self.groups.get(req.group_id)
        m, err = self._classic_member(group, req.member_id, req.group_instance_id)
        if m is None or group is None:
            result = SyncResult(err)
        elif req.generation_id != m.epoch:
            result = SyncResult(ErrorCode.ILLEGAL_GENERATION)
        elif not self._protocol_matches(m, req.protocol_type, req.protocol_name):
            result = SyncResult(ErrorCode.INCONSISTENT_GROUP_PROTOCOL)
        elif m.assignment.state != MemberState.UNREVOKED_PARTITIONS and group.assignment_epoch > m.epoch:
            result = SyncResult(ErrorCode.REBALANCE_IN_PROGRESS)
        else:
            classic = m.meta.classic_member_metadata
            assert classic is not None
            self._cancel(_timer("sync", group.group_id, m.member_id))
            self._arm(_timer("session", group.group_id, m.member_id), classic.session_timeout_ms)
            protocol = classic.supported_protocols[0] if classic.supported_protocols else None
            result = SyncResult(
                ErrorCode.NONE,
                PROTOCOL_TYPE,
                protocol.name if protocol is not None else None,
                self._classic_assignment(m, protocol.metadata if protocol is not None else b""),
            )
        self._effects.append(Respond(token, result))
        return self._end()

    @staticmethod
    def _protocol_matches(m: ConsumerMember, protocol_type: str | None, protocol_name: str | None) -> bool:
        c = m.meta.classic_member_metadata
        if protocol_type is not None and protocol_type != PROTOCOL_TYPE:
            return False
        if protocol_name is not None and c is not None and c.supported_protocols:
            return protocol_name == c.supported_protocols[0].name
        return True

    def _classic_assignment(self, m: ConsumerMember, subscription_metadata: bytes) -> bytes:
        """The member's assigned partitions as a ConsumerProtocolAssignment of its subscription's
        version."""
        try:
            version = min(decode_subscription(subscription_metadata).version, 3)
        except (ConsumerProtocolError, ValueError):
            version = 0
        parts = []
        for tid, ps in sorted(m.assignment.assigned.items(), key=lambda kv: str(kv[0])):
            t = self.topics.by_id(tid)
            if t is not None and ps:
                parts.append(CPTopicPartitions(t.name, tuple(sorted(ps))))
        return encode_assignment(CPAssignment(version, tuple(sorted(parts, key=lambda x: x.topic))))

    def classic_heartbeat(self, token: int, req: HeartbeatRequest, now_ms: int) -> list[ConsumerEffect]:
        """A classic member's Heartbeat: keeps its session; REBALANCE_IN_PROGRESS when it must
        rejoin to make progress towards its target."""
        self._begin(now_ms)
        group = self.groups.get(req.group_id)
        m, err = self._classic_member(group, req.member_id, req.group_instance_id)
        if m is None or group is None:
            result = HeartbeatResult(err)
        elif req.generation_id != m.epoch:
            result = HeartbeatResult(ErrorCode.ILLEGAL_GENERATION)
        else:
            classic = m.meta.classic_member_metadata
            assert classic is not None
            self._arm(_timer("session", group.group_id, m.member_id), classic.session_timeout_ms)
            a = m.assignment
            rejoin = (
                m.epoch < group.assignment_epoch
                or group.epoch > group.assignment_epoch
                or a.state == MemberState.UNREVOKED_PARTITIONS
                or (a.state == MemberState.UNRELEASED_PARTITIONS and not self._still_held(group, m))
            )
            if rejoin:
                key = _timer("join", group.group_id, m.member_id)
                if key not in self._join_armed:
                    self._join_armed.add(key)
                    self._arm(key, max(m.meta.rebalance_timeout_ms, 0))
                result = HeartbeatResult(ErrorCode.REBALANCE_IN_PROGRESS)
            else:
                result = HeartbeatResult(ErrorCode.NONE)
        self._effects.append(Respond(token, result))
        return self._end()

    @staticmethod
    def _still_held(group: ConsumerGroup, m: ConsumerMember) -> bool:
        """Is any partition of the member's target it does not have yet held by another member?"""
        for t, ps in group.target.get(m.member_id, {}).items():
            have = m.assignment.assigned.get(t, {})
            for p in ps:
                if p not in have:
                    o = group.owners.get((t, p))
                    if o is not None and o[0] != m.member_id:
                        return True
        return False

    def classic_leave(self, token: int, req: LeaveRequest, now_ms: int) -> list[ConsumerEffect]:
        """LeaveGroup for a consumer group: members by id, static members by instance id (an
        empty member id is an admin removal); the valid ones are removed together."""
        self._begin(now_ms)
        group = self.groups.get(req.group_id)
        results: list[LeaveMemberResult] = []
        leaving: list[str] = []
        for lm in req.members:
            if group is None:
                results.append(LeaveMemberResult(lm.member_id, lm.group_instance_id, ErrorCode.UNKNOWN_MEMBER_ID))
                continue
            if lm.group_instance_id is None:
                m = group.members.get(lm.member_id)
                err = ErrorCode.NONE if m is not None else ErrorCode.UNKNOWN_MEMBER_ID
                mid = lm.member_id
            else:
                holder = group.static.get(lm.group_instance_id)
                if holder is None:
                    err, mid = ErrorCode.UNKNOWN_MEMBER_ID, lm.member_id
                elif lm.member_id and lm.member_id != holder:
                    err, mid = ErrorCode.FENCED_INSTANCE_ID, lm.member_id
                else:
                    err, mid = ErrorCode.NONE, holder
            results.append(LeaveMemberResult(lm.member_id, lm.group_instance_id, err))
            if err == ErrorCode.NONE and mid not in leaving:
                leaving.append(mid)
        result = LeaveResult(ErrorCode.NONE, tuple(results))
        if group is None or not leaving:
            self._effects.append(Respond(token, result))
            return self._end()
        op = _Op(group.group_id)
        if not self._downgrade(op, group, leaving):
            self._fence(op, group, leaving, "left the group (LeaveGroup)")
        self._commit(op, lambda e: self._effects.append(Respond(token, result if e is None else LeaveResult(e))))
        return self._end()

    def _replace_static(self, op: _Op, group: ConsumerGroup, replaced: ConsumerMember, member_id: str) -> None:
        """The new member id takes over the old static member's metadata, target and partitions
        (at epoch 0); the old id is removed (docs/consumer-groups.md, "Static membership")."""
        gid = group.group_id
        old_target = group.target.get(replaced.member_id)
        old_assigned = replaced.assignment.assigned
        self._write(op, CurrentMemberAssignmentKey(gid, replaced.member_id), None)
        self._write(op, TargetAssignmentMemberKey(gid, replaced.member_id), None)
        self._write(op, MemberMetadataKey(gid, replaced.member_id), None)
        self._write(op, MemberMetadataKey(gid, member_id), replaced.meta)
        if old_target is not None:
            self._write(op, TargetAssignmentMemberKey(gid, member_id), target_value(old_target))
        self._write(
            op,
            CurrentMemberAssignmentKey(gid, member_id),
            assignment_record(
                MemberAssignment(0, 0, MemberState.STABLE, {t: dict(ps) for t, ps in old_assigned.items()})
            ),
        )
        for kind in ("session", "rebalance", "join", "sync"):
            self._cancel(_timer(kind, gid, replaced.member_id))
        self._note("consumer_group.static_member_replaced", group=gid, old=replaced.member_id, new=member_id)

    # ------------------------------------------------------------------------ leaving

    def _leave(self, req: ConsumerHeartbeat, respond: Callable[[ConsumerHeartbeatResult], None]) -> None:
        gid = req.group_id
        group = self.groups.get(gid)
        if group is None:
            respond(self._error(ErrorCode.GROUP_ID_NOT_FOUND, f"Group {gid} not found."))
            return
        if req.instance_id is None:
            member = group.members.get(req.member_id)
            if member is None:
                respond(
                    self._error(ErrorCode.UNKNOWN_MEMBER_ID, f"Member {req.member_id} is not a member of group {gid}.")
                )
                return
        else:
            holder = group.static.get(req.instance_id)
            if holder is None:
                respond(self._error(ErrorCode.UNKNOWN_MEMBER_ID, f"Instance id {req.instance_id} is unknown."))
                return
            if holder != req.member_id:
                respond(
                    self._error(
                        ErrorCode.FENCED_INSTANCE_ID,
                        f"Static member {req.member_id} with instance id {req.instance_id} was fenced by {holder}.",
                    )
                )
                return
            member = group.members[holder]
        op = _Op(gid)
        if req.member_epoch == STATIC_LEAVE_EPOCH and req.instance_id is not None:
            # temporary leave: keep the partitions (assignment epochs reset), no pending revocation;
            # the session timer keeps running
            a = member.assignment
            left = MemberAssignment(
                STATIC_LEAVE_EPOCH,
                a.epoch if a.epoch != STATIC_LEAVE_EPOCH else a.previous_epoch,
                a.state,
                {t: dict.fromkeys(ps, 0) for t, ps in a.assigned.items()},
                {},
            )
            self._write(op, CurrentMemberAssignmentKey(gid, member.member_id), assignment_record(left))
            self._cancel_rebalance(gid, member.member_id)
            self._note(
                "consumer_group.static_member_left", group=gid, member=member.member_id, instance=req.instance_id
            )
            result = ConsumerHeartbeatResult(ErrorCode.NONE, None, member.member_id, STATIC_LEAVE_EPOCH, 0)
        else:
            if not self._downgrade(op, group, [member.member_id]):
                self._fence(op, group, [member.member_id], "left the group")
            result = ConsumerHeartbeatResult(ErrorCode.NONE, None, req.member_id, LEAVE_EPOCH, 0)

        def done(error: ErrorCode | None) -> None:
            respond(result if error is None else self._error(error))

        self._commit(op, done)

    def _fence(self, op: _Op, group: ConsumerGroup, member_ids: list[str], reason: str) -> None:
        """Remove members: tombstones 8, 7, 5 each, orphaned regexes, then an epoch bump (and
        the target's timestamp reset if the group is now empty).  The target is not recomputed."""
        gid = group.group_id
        for mid in member_ids:
            m = group.members.get(mid)
            if m is None:
                continue
            self._write(op, CurrentMemberAssignmentKey(gid, mid), None)
            self._write(op, TargetAssignmentMemberKey(gid, mid), None)
            self._write(op, MemberMetadataKey(gid, mid), None)
            for kind in ("session", "join", "sync"):
                self._cancel(_timer(kind, gid, mid))
            self._join_armed.discard(_timer("join", gid, mid))
            self._cancel_rebalance(gid, mid)
            self._note("consumer_group.member_removed", group=gid, member=mid, reason=reason)
        used = set(group.regex_users)
        for rx in sorted(group.regexes):
            if rx not in used:
                self._write(op, RegularExpressionKey(gid, rx), None)
        new_hash = group_metadata_hash(self._subscribed_topics(group))
        self._write(op, GroupMetadataKey(gid), GroupMetadataValue(group.epoch + 1, new_hash))
        if not group.members:
            self._write(op, TargetAssignmentMetadataKey(gid), TargetAssignmentMetadataValue(group.assignment_epoch, 0))

    # ------------------------------------------------------------------------- timers

    def _arm_rebalance(self, group: ConsumerGroup, m: ConsumerMember) -> None:
        self._rebalance_armed[(group.group_id, m.member_id)] = m.epoch
        timeout = (
            m.meta.rebalance_timeout_ms if m.meta.rebalance_timeout_ms > 0 else self.session_timeout_ms(group.group_id)
        )
        self._arm(_timer("rebalance", group.group_id, m.member_id), timeout)

    def _cancel_rebalance(self, group_id: str, member_id: str) -> None:
        if self._rebalance_armed.pop((group_id, member_id), None) is not None:
            self._cancel(_timer("rebalance", group_id, member_id))

    def timer_fired(self, key: TimerKey, now_ms: int) -> list[ConsumerEffect]:
        self._begin(now_ms)
        if isinstance(key, ConsumerMemberKey):
            kind, gid, mid = key.timer, key.group_id, key.member_id
            group = self.groups.get(gid)
            member = group.members.get(mid) if group is not None else None
            if group is not None and member is not None:
                if kind == "session":
                    self._expire(group, mid, "session timeout expired")
                elif kind == "join":
                    self._join_armed.discard(key)
                    self._expire(group, mid, "did not rejoin within the rebalance timeout")
                elif kind == "sync":
                    self._expire(group, mid, "did not sync within the rebalance timeout")
                elif kind == "rebalance":
                    armed = self._rebalance_armed.pop((gid, mid), None)
                    if armed is not None and armed == member.epoch:
                        self._expire(group, mid, "did not revoke its partitions within the rebalance timeout")
        return self._end()

    def _expire(self, group: ConsumerGroup, member_id: str, reason: str) -> None:
        op = _Op(group.group_id)
        if not self._downgrade(op, group, [member_id]):
            self._fence(op, group, [member_id], reason)
        self._commit(op, lambda _e: None)

    def _downgrade(self, op: _Op, group: ConsumerGroup, leaving: list[str]) -> bool:
        """Kafka's online downgrade (``convertToClassicGroup``, docs/consumer-groups.md,
        "Classic groups"): when the members leaving (or fenced) are the last ones using the
        consumer protocol and classic members remain, the consumer group's tombstones are
        written and the classic coordinator gets the group (:class:`DowngradeToClassic`) at
        generation = the group epoch, each remaining member with its supported protocols,
        session timeout and its target assignment; it then rebalances.  False (nothing done)
        when that does not apply or ``group.consumer.migration.policy`` or ``group.max.size``
        forbid it (the members are then simply removed)."""
        gid = group.group_id
        remaining = [m for mid, m in group.members.items() if mid not in leaving]
        if not remaining or any(m.uses_consumer_protocol for m in remaining):
            return False
        if self.config.migration_policy not in ("bidirectional", "downgrade"):
            self._note("consumer_group.downgrade_refused", group=gid, reason="migration policy")
            return False
        if len(remaining) > self.config.classic_max_size:
            self._note("consumer_group.downgrade_refused", group=gid, reason="group.max.size")
            return False
        members = []
        for m in remaining:
            classic = m.meta.classic_member_metadata
            assert classic is not None  # a member not using the consumer protocol has it
            target = group.target.get(m.member_id, {})
            parts = []
            for tid, ps in sorted(target.items(), key=lambda kv: str(kv[0])):
                t = self.topics.by_id(tid)
                if t is not None and ps:
                    parts.append(CPTopicPartitions(t.name, tuple(sorted(ps))))
            members.append(
                ClassicMemberSnapshot(
                    m.member_id,
                    m.meta.instance_id,
                    m.meta.client_id,
                    m.meta.client_host,
                    classic.session_timeout_ms,
                    m.meta.rebalance_timeout_ms if m.meta.rebalance_timeout_ms > 0 else classic.session_timeout_ms,
                    tuple((p.name, p.metadata) for p in classic.supported_protocols),
                    encode_assignment(CPAssignment(0, tuple(parts))),
                )
            )
        for mid in group.members:
            for kind in ("session", "join", "sync"):
                self._cancel(_timer(kind, gid, mid))
            self._join_armed.discard(_timer("join", gid, mid))
            self._cancel_rebalance(gid, mid)
        op.downgrade = ClassicGroupSnapshot(gid, group.epoch, PROTOCOL_TYPE, None, tuple(members))
        self._delete_records(op, group)
        self._note("consumer_group.downgraded", group=gid, generation=op.downgrade.generation, members=len(members))
        return True

    # ---------------------------------------------------------------- admin & offsets

    def is_consumer_group(self, group_id: str) -> bool:
        return group_id in self.groups

    def describe(self, group_ids: Iterable[str]) -> list[DescribedConsumerGroup]:
        out = []
        for gid in group_ids:
            group = self.groups.get(gid)
            if group is None:
                out.append(DescribedConsumerGroup(gid, ErrorCode.GROUP_ID_NOT_FOUND, f"Group {gid} not found."))
                continue
            members = []
            for m in sorted(group.members.values(), key=lambda x: x.member_id):
                current: dict[uuid.UUID, set[int]] = {}
                for part in (m.assignment.assigned, m.assignment.pending_revocation):
                    for t, ps in part.items():
                        current.setdefault(t, set()).update(ps)
                members.append(
                    DescribedConsumerMember(
                        m.member_id,
                        m.meta.instance_id,
                        m.meta.rack_id,
                        m.epoch,
                        m.meta.client_id,
                        m.meta.client_host,
                        m.meta.subscribed_topic_names,
                        m.meta.subscribed_topic_regex,
                        self._described(current),
                        self._described(group.target.get(m.member_id, {})),
                        1 if m.uses_consumer_protocol else 0,
                    )
                )
            out.append(
                DescribedConsumerGroup(
                    gid,
                    ErrorCode.NONE,
                    None,
                    group.state(),
                    group.epoch,
                    group.assignment_epoch,
                    self._preferred_assignor(group),
                    tuple(members),
                )
            )
        return out

    def _described(self, a: Mapping[uuid.UUID, Iterable[int]]) -> tuple[DescribedTopicPartitions, ...]:
        out = []
        for t, ps in a.items():
            info = self.topics.by_id(t)
            parts = tuple(sorted(ps))
            if parts:
                out.append(DescribedTopicPartitions(t, info.name if info is not None else "", parts))
        return tuple(sorted(out, key=lambda d: (d.topic_name, str(d.topic_id))))

    def list_groups(self, states: Iterable[str], types: Iterable[str]) -> list[ListedGroup]:
        """Consumer groups for ListGroups: protocol type ``consumer``, type ``consumer``."""
        st = {s.strip().lower() for s in states}
        ty = {t.strip().lower() for t in types}
        if ty and GROUP_TYPE not in ty:
            return []
        out = []
        for gid in sorted(self.groups):
            state = self.groups[gid].state()
            if st and state.lower() not in st:
                continue
            out.append(ListedGroup(gid, PROTOCOL_TYPE, state, GROUP_TYPE))
        return out

    def validate_offset_commit(
        self,
        group_id: str,
        member_id: str,
        member_epoch: int,
        api_version: int,
        partitions: Iterable[tuple[uuid.UUID | None, int]] = (),
        *,
        transactional: bool = False,
        instance_id: str | None = None,
    ) -> ErrorCode | None:
        """May this commit go ahead on consumer group ``group_id``?  None when the group is not a
        consumer group (the caller applies the classic rules); else NONE or the error for every
        partition of the request (docs/consumer-groups.md, "Offsets";
        ``ConsumerGroup.validateOffsetCommit``)."""
        group = self.groups.get(group_id)
        if group is None:
            return None
        if member_epoch < 0 and not group.members:
            return ErrorCode.NONE
        if transactional and member_epoch == -1 and member_id == "" and instance_id is None:
            return ErrorCode.NONE
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        classic = not member.uses_consumer_protocol
        if not transactional and not classic and api_version < 9:
            return ErrorCode.UNSUPPORTED_VERSION
        stale = ErrorCode.ILLEGAL_GENERATION if classic else ErrorCode.STALE_MEMBER_EPOCH
        if member_epoch == member.epoch:
            return ErrorCode.NONE
        if member_epoch > member.epoch:
            return stale
        a = member.assignment
        for tid, p in partitions:
            if tid is None:
                return stale
            e = a.assigned.get(tid, {}).get(p)
            if e is None:
                e = a.pending_revocation.get(tid, {}).get(p)
            if e is None or member_epoch < e:
                return stale
        return ErrorCode.NONE

    def validate_offset_fetch(self, group_id: str, member_id: str | None, member_epoch: int) -> ErrorCode | None:
        """OffsetFetch v9+ member check on a consumer group (None: not a consumer group)."""
        group = self.groups.get(group_id)
        if group is None:
            return None
        if member_id is None and member_epoch < 0:
            return ErrorCode.NONE
        member = group.members.get(member_id or "")
        if member is None:
            return ErrorCode.UNKNOWN_MEMBER_ID
        if member_epoch != member.epoch:
            return ErrorCode.STALE_MEMBER_EPOCH if member.uses_consumer_protocol else ErrorCode.ILLEGAL_GENERATION
        return ErrorCode.NONE

    def validate_delete(self, group_id: str) -> ErrorCode | None:
        """DeleteGroups / OffsetDelete precondition (None: not a consumer group)."""
        group = self.groups.get(group_id)
        if group is None:
            return None
        return ErrorCode.NONE if not group.members else ErrorCode.NON_EMPTY_GROUP

    def delete_group(self, token: int, group_id: str, now_ms: int) -> list[ConsumerEffect]:
        """Delete an empty consumer group: tombstones in Kafka's order (8s, 7s, 6, 5s, 16s, 4, 3).
        Responds with an ErrorCode."""
        self._begin(now_ms)
        group = self.groups.get(group_id)
        err = self.validate_delete(group_id)
        if group is None or err != ErrorCode.NONE:
            self._effects.append(Respond(token, err if err is not None else ErrorCode.GROUP_ID_NOT_FOUND))
            return self._end()
        op = _Op(group_id)
        self._delete_records(op, group)
        self._note("consumer_group.deleted", group=group_id)
        self._commit(op, lambda e: self._effects.append(Respond(token, e if e is not None else ErrorCode.NONE)))
        return self._end()

    def _delete_records(self, op: _Op, group: ConsumerGroup) -> None:
        """Tombstones for the whole group in Kafka's order (8s, 7s, 6, 5s, 16s, 4, 3)."""
        gid = group.group_id
        members = sorted(set(group.members) | set(group.target))
        for mid in members:
            self._write(op, CurrentMemberAssignmentKey(gid, mid), None)
        for mid in members:
            self._write(op, TargetAssignmentMemberKey(gid, mid), None)
        self._write(op, TargetAssignmentMetadataKey(gid), None)
        for mid in members:
            self._write(op, MemberMetadataKey(gid, mid), None)
        for rx in sorted(group.regexes):
            self._write(op, RegularExpressionKey(gid, rx), None)
        if group.has_partition_metadata:
            self._write(op, PartitionMetadataKey(gid), None)
        self._write(op, GroupMetadataKey(gid), None)

    def unload_partition(self, partition: int, now_ms: int) -> list[ConsumerEffect]:
        """The ``__consumer_offsets`` partition's coordinator moved (docs/cluster.md, "Moving a
        coordinator"): its groups leave memory with their timers; a request still waiting for a
        write of one gets NOT_COORDINATOR.  :meth:`load` brings them back from the log."""
        self._begin(now_ms)
        for gid in [g for g, grp in self.groups.items() if grp.partition == partition]:
            group = self.groups.pop(gid)
            for pid in self._pending_by_group.pop(gid, []):
                w = self._pending.pop(pid, None)
                if w is not None and not w.failed:
                    w.failed = True
                    w.on_done(ErrorCode.NOT_COORDINATOR)
            for mid in group.members:
                for kind in ("session", "rebalance", "join", "sync"):
                    key = _timer(kind, gid, mid)
                    self._join_armed.discard(key)
                    self._cancel(key)
                self._rebalance_armed.pop((gid, mid), None)
            self._states.pop(gid, None)
            self._note("consumer_group.unloaded", group=gid, partition=partition, epoch=group.epoch)
        return self._end()

    def shutdown(self, now_ms: int) -> list[ConsumerEffect]:
        """Answer every request still waiting for a write with NOT_COORDINATOR."""
        self._begin(now_ms)
        for pid, w in list(self._pending.items()):
            if not w.failed:
                w.failed = True
                w.on_done(ErrorCode.NOT_COORDINATOR)
            del self._pending[pid]
        self._pending_by_group.clear()
        return self._end()
