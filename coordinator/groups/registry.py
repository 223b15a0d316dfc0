"""The groups of this coordinator: lookup, creation, deletion, unloading, rebuilding a group
from its record, and the two read APIs that list them (DescribeGroups, ListGroups).

This is the group map of Kafka's ``GroupMetadataManager.java``.  Creating and deleting a group
are applied when their record is appended and undone if the write fails (docs/groups.md,
"When a write fails"), as Kafka's timeline ``groups`` map is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from rallypoint.protocol.errors import ErrorCode
from rallypoint.protocol.offsets_schema import GroupMetadataValue

from . import checks
from .context import Context
from .events import (
    DescribedGroup,
    DescribedMember,
    DescribeResult,
    HeartbeatKey,
    JoinKey,
    JoinResult,
    ListedGroup,
    ListResult,
    Protocol,
    SessionsKey,
    SyncKey,
    SyncResult,
)
from .model import DEAD, EMPTY, GROUP_TYPE_CLASSIC, PREPARING, STABLE, ClassicGroup, Member

E = ErrorCode


class GroupRegistry:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.groups: dict[str, ClassicGroup] = {}

    def get(self, group_id: str) -> ClassicGroup | None:
        return self.groups.get(group_id)

    def ids(self) -> list[str]:
        return list(self.groups)

    # ----------------------------------------------------------- creation, removal

    def create(self, group_id: str) -> ClassicGroup:
        """A new Empty group (``getOrMaybeCreateClassicGroup``)."""
        g = ClassicGroup(group_id, self.ctx.partition_for(group_id), state_timestamp=self.ctx.now)
        self.groups[group_id] = g
        self.ctx.touched.add(group_id)
        self.ctx.note("group created", group=group_id, partition=g.partition)
        return g

    def install(self, group: ClassicGroup) -> None:
        old = self.groups.get(group.group_id)
        if old is not None:
            self.drop(old)
        self.groups[group.group_id] = group

    def drop(self, group: ClassicGroup) -> None:
        """Forget a (Dead) group and its timers."""
        if self.groups.get(group.group_id) is group:
            del self.groups[group.group_id]
        for mid in group.pending_members:
            self.ctx.cancel(HeartbeatKey(group.group_id, mid))
        self.ctx.cancel(SessionsKey(group.group_id))
        self.ctx.cancel(JoinKey(group.group_id))
        self.ctx.cancel(SyncKey(group.group_id))

    def unload(self, group: ClassicGroup, error: ErrorCode, reason: str, *, keep_member_ids: bool = True) -> None:
        """The group leaves memory (``onUnloaded``): every parked JoinGroup and SyncGroup of
        its members is answered ``error``, the group goes Dead and is forgotten."""
        for m in group.members.values():
            token = group.finish_join(m)
            if token is not None:
                self.ctx.respond(token, JoinResult(error, member_id=m.member_id if keep_member_ids else ""))
            if m.sync_token is not None:
                self.ctx.respond(m.sync_token, SyncResult(error))
                m.sync_token = None
        self.ctx.transition(group, DEAD, reason)
        self.drop(group)

    def revert_creation(self, group: ClassicGroup, error: ErrorCode, what: str) -> None:
        """The write that made ``group`` exist failed: like Kafka's snapshot revert, the group
        is gone again and its parked requests get ``error``.  Kept if offsets were committed
        to it meanwhile (a restart would bring it back from them)."""
        if self.groups.get(group.group_id) is not group or self.ctx.timeline.current_offsets(group.group_id):
            return
        self.unload(group, error, f"creation reverted: {what}", keep_member_ids=False)
        self.ctx.note("group creation reverted", group=group.group_id, error=error.name)

    def delete(self, group: ClassicGroup, reason: str) -> Callable[[], None]:
        """An Empty group goes Dead and is forgotten now, as its tombstone is appended; returns
        what undoes that if the tombstone is not written."""
        saved = group.saved_state()
        self.ctx.transition(group, DEAD, reason)
        self.drop(group)
        group.pending_members.clear()  # their timers went with the group

        def revert() -> None:
            if group.group_id in self.groups:
                return  # a new group took the id meanwhile; a restart merges them the same way
            group.restore_state(saved)
            self.groups[group.group_id] = group
            self.ctx.touched.add(group.group_id)
            self.ctx.note("group deletion reverted", group=group.group_id, state=group.state.value)

        return revert

    # --------------------------------------------------------------------- loading

    def from_record(self, group_id: str, value: GroupMetadataValue) -> ClassicGroup:
        """The group a GroupMetadata record describes (``replay(GroupMetadataKey, ...)``):
        Stable with its members, or Empty."""
        g = ClassicGroup(
            group_id,
            self.ctx.partition_for(group_id),
            state=STABLE if value.members else EMPTY,
            generation=value.generation,
            protocol_type=value.protocol_type or None,
            protocol_name=value.protocol,
            leader_id=value.leader,
            state_timestamp=None if value.current_state_timestamp == -1 else value.current_state_timestamp,
        )
        for mm in value.members:
            member = Member(
                mm.member_id,
                mm.group_instance_id,
                mm.client_id,
                mm.client_host,
                mm.rebalance_timeout if mm.rebalance_timeout >= 0 else mm.session_timeout,
                mm.session_timeout,
                value.protocol_type,
                (Protocol(value.protocol or "", mm.subscription),),
                assignment=mm.assignment,
            )
            g.add(member, None)
        g.protocol_type = value.protocol_type or None
        if g.leader_id not in g.members:
            g.leader_id = next(iter(g.members), None)
        g.subscribed_topics = g.compute_subscribed_topics()
        return g

    def simple(self, group_id: str) -> ClassicGroup:
        """The Empty group that offsets without a group record stand for."""
        return ClassicGroup(group_id, self.ctx.partition_for(group_id), state_timestamp=None)

    # ------------------------------------------------------------------ sessions

    def reschedule_heartbeat(self, group: ClassicGroup, member: Member, timeout_ms: int | None = None) -> None:
        """The member's session (or join timeout) runs from now (docs/groups.md, "Timers")."""
        delay = member.session_timeout_ms if timeout_ms is None else timeout_ms
        member.session_deadline = deadline = self.ctx.now + max(0, delay)
        self.ctx.arm_by(SessionsKey(group.group_id), deadline)

    def rearm_sessions(self, group: ClassicGroup) -> None:
        """The group's sessions timer for its earliest member deadline (none: not armed)."""
        earliest = min((d for m in group.members.values() if (d := m.session_deadline)), default=None)
        key = SessionsKey(group.group_id)
        if earliest is None:
            self.ctx.cancel(key)
        else:
            self.ctx.arm_at(key, earliest)

    def on_offset_commit(self, group: ClassicGroup, member_id: str) -> None:
        """An accepted OffsetCommit keeps the member's session alive in Stable and
        PreparingRebalance (``OffsetMetadataManager.commitOffset``)."""
        if group.state in (STABLE, PREPARING):
            member = group.members.get(member_id)
            if member is not None:
                self.reschedule_heartbeat(group, member)

    # ------------------------------------------------------------- DescribeGroups

    def describe(self, group_ids: Iterable[str], api_version: int) -> DescribeResult:
        return DescribeResult(tuple(self._describe_one(g, api_version) for g in group_ids))

    def _describe_one(self, group_id: str, api_version: int) -> DescribedGroup:
        """``GroupMetadataManager.describeGroups`` (docs/groups.md,
        "DescribeGroups and ListGroups"): outside Stable the members come without metadata but
        with the assignment they last received."""
        err = checks.request(self.ctx, group_id, validate_id=False)
        if err is not None:
            return DescribedGroup(group_id, err)
        group = self.groups.get(group_id)
        if group is None or group.state == DEAD:
            if api_version >= 6:
                # KIP-1043: v6 reports unknown groups as GROUP_ID_NOT_FOUND.
                return DescribedGroup(group_id, E.GROUP_ID_NOT_FOUND, f"Group {group_id} not found.")
            return DescribedGroup(group_id, E.NONE, state=DEAD.value)
        stable = group.state == STABLE
        proto = (group.protocol_name or "") if stable else ""
        members = tuple(
            DescribedMember(
                m.member_id,
                m.group_instance_id,
                m.client_id,
                m.client_host,
                m.metadata(proto) if stable else b"",
                m.assignment,
            )
            for m in group.members.values()
        )
        return DescribedGroup(group_id, E.NONE, None, group.state.value, group.protocol_type or "", proto, members)

    # ----------------------------------------------------------------- ListGroups

    def list_groups(self, states_filter: Iterable[str], types_filter: Iterable[str]) -> ListResult:
        err = checks.any_loading(self.ctx)
        if err is not None:
            return ListResult(err)  # Kafka answers no partial list
        states = {s.strip().lower() for s in states_filter}
        types = {t.lower() for t in types_filter}
        out = []
        for g in self.groups.values():
            if states and g.state.value.lower() not in states:
                continue
            if types and GROUP_TYPE_CLASSIC not in types:
                continue
            out.append(ListedGroup(g.group_id, g.protocol_type or "", g.state.value, GROUP_TYPE_CLASSIC))
        return ListResult(E.NONE, tuple(out))
