"""Share-group membership (KIP-932; Kafka's ``GroupMetadataManager.shareGroupHeartbeat``): sans-IO.

docs/share-groups.md, "Membership".  The rules:

* ShareGroupHeartbeat v1: the client makes its member id.  Epoch 0 joins (and must carry
  subscribed topic names), -1 leaves, anything else must be the member's current epoch (or the
  one before, whose answer may have been lost), else FENCED_MEMBER_EPOCH; an unknown member is
  UNKNOWN_MEMBER_ID; a group id held by a classic or consumer group is GROUP_ID_NOT_FOUND; a full
  group (``group.share.max.size``) is GROUP_MAX_SIZE_REACHED.
* The group epoch moves on when a member joins, leaves, is expired or changes its
  subscription, and when a subscribed topic appears, disappears or grows; the target
  assignment is then recomputed (the ``simple`` assignor).  Share members take their target at
  once (no revocation step: partitions are shared), so a member's epoch jumps to the
  assignment epoch at its next heartbeat.
* The assignment is in the answer on a join and whenever it changed.
* A member not heard from for ``share.session.timeout.ms`` is removed.
* States: Empty (no members) and Stable.
* Every change is also a list of ``__consumer_offsets`` records (Kafka's share-group record
  types 10-14, docs/share-groups.md, "Records"), drained from :attr:`ShareGroupMachine.pending`
  by the runtime, which writes them before it answers; :meth:`ShareGroupMachine.load` replays
  them at start-up.

Nothing here does I/O: each call takes ``now_ms`` and returns its answer plus the timers to arm
or cancel; :mod:`rallypoint.share.runtime` runs them.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable

from msgspec import Struct, field
from rallypoint.protocol import share_group_records as sgr
from rallypoint.protocol.errors import ErrorCode

from ..groups.consumer_model import TopicInfo, TopicsView, group_metadata_hash
from ..groups.events import ListedGroup
from . import assignor

SessionTimer = tuple[str, str]  # (group id, member id)


class ShareHeartbeat(Struct, frozen=True):
    """A ShareGroupHeartbeat request (API 76) as the machine sees it; ``None`` means unchanged."""

    group_id: str
    member_id: str
    member_epoch: int
    rack_id: str | None = None
    subscribed_topic_names: tuple[str, ...] | None = None
    client_id: str = ""
    client_host: str = ""


class ShareHeartbeatResult(Struct, frozen=True):
    """The answer to a ShareGroupHeartbeat; ``assignment`` None: not sent (unchanged)."""

    error: ErrorCode
    error_message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    assignment: dict[uuid.UUID, frozenset[int]] | None = None


class Timers(Struct, frozen=True):
    """Session timers to (re)arm at a deadline, and to cancel."""

    arm: tuple[tuple[SessionTimer, int], ...] = ()
    cancel: tuple[SessionTimer, ...] = ()


class ShareMember(Struct):
    """One member of a share group: its epochs, client, subscribed topic names and assignment."""

    member_id: str
    epoch: int = 0
    previous_epoch: int = -1
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed: tuple[str, ...] = ()
    assignment: dict[uuid.UUID, frozenset[int]] = field(default_factory=dict)


class ShareGroup(Struct):
    """One share group: its epochs, members, target assignment and subscribed topics as last seen."""

    group_id: str
    epoch: int = 0
    assignment_epoch: int = 0
    members: dict[str, ShareMember] = field(default_factory=dict)
    target: dict[str, dict[uuid.UUID, frozenset[int]]] = field(default_factory=dict)
    topics: dict[str, tuple[uuid.UUID, int]] = field(default_factory=dict)  # subscribed, as last seen

    @property
    def state(self) -> str:
        return "Stable" if self.members else "Empty"


class Change(Struct, frozen=True):
    """One membership change the runtime logs (and the control plane shows)."""

    event: str
    group_id: str
    member_id: str
    epoch: int
    members: int


class ShareGroupMachine:
    def __init__(
        self,
        topics: TopicsView,
        *,
        setting: Callable[[str, str], str],
        max_size: int = 200,
        other_group: Callable[[str], bool] = lambda g: False,
    ) -> None:
        self.topics = topics
        self.setting = setting  # (group id, group config name) -> effective value
        self.max_size = max_size
        self.other_group = other_group  # whether a classic or consumer group holds the id
        self.groups: dict[str, ShareGroup] = {}
        self.changes: list[Change] = []  # drained by the runtime
        self.pending: list[tuple[str, sgr.ShareRecord]] = []  # (group id, record), drained by the runtime

    # ------------------------------------------------------------------ heartbeat

    def heartbeat(self, req: ShareHeartbeat, now_ms: int) -> tuple[ShareHeartbeatResult, Timers]:
        problem = self._invalid(req)
        if problem is not None:
            return ShareHeartbeatResult(ErrorCode.INVALID_REQUEST, problem), Timers()
        group = self.groups.get(req.group_id)
        if group is None and self.other_group(req.group_id):
            return self._error(ErrorCode.GROUP_ID_NOT_FOUND, f"Group {req.group_id} is not a share group.")
        if req.member_epoch == -1:
            return self._leave(group, req, now_ms)
        if group is None:
            if req.member_epoch != 0:
                return self._error(ErrorCode.GROUP_ID_NOT_FOUND, f"Group {req.group_id} not found.")
            group = ShareGroup(req.group_id)
            self.groups[req.group_id] = group
        member = group.members.get(req.member_id)
        if member is None:
            if req.member_epoch != 0:
                return self._error(
                    ErrorCode.UNKNOWN_MEMBER_ID,
                    f"Member {req.member_id} is not a member of group {req.group_id}.",
                )
            if len(group.members) >= self.max_size:
                if not group.members and group.epoch == 0:
                    del self.groups[req.group_id]
                return self._error(
                    ErrorCode.GROUP_MAX_SIZE_REACHED,
                    f"The share group has reached its maximum capacity of {self.max_size} members.",
                )
            member = ShareMember(req.member_id)
        elif req.member_epoch != 0 and req.member_epoch != member.epoch:
            if req.member_epoch > member.epoch or req.member_epoch != member.previous_epoch:
                return self._error(
                    ErrorCode.FENCED_MEMBER_EPOCH,
                    f"The share group member has a {'greater' if req.member_epoch > member.epoch else 'smaller'} "
                    f"member epoch ({req.member_epoch}) than the one known by the group coordinator "
                    f"({member.epoch}). The member must abandon all its partitions and rejoin.",
                )
        joining = req.member_id not in group.members
        old_assignment = member.assignment
        old_metadata = (member.rack_id, member.client_id, member.client_host, member.subscribed)
        bump = joining
        if req.subscribed_topic_names is not None:
            names = tuple(dict.fromkeys(req.subscribed_topic_names))
            if names != member.subscribed:
                member.subscribed = names
                bump = True
        if req.rack_id is not None:
            member.rack_id = req.rack_id
        member.client_id = req.client_id
        member.client_host = req.client_host
        if joining:
            group.members[member.member_id] = member
            self.changes.append(
                Change("share_group.member_joined", group.group_id, member.member_id, 0, len(group.members))
            )
        if joining or old_metadata != (member.rack_id, member.client_id, member.client_host, member.subscribed):
            self._record_member(group, member)
        if self._refresh_topics(group) or bump:
            group.epoch += 1
            self._record_epoch(group)
        if group.epoch > group.assignment_epoch:
            self._assign(group)
        if member.epoch != group.assignment_epoch or joining:
            member.previous_epoch = member.epoch
            member.epoch = group.assignment_epoch
            member.assignment = group.target.get(member.member_id, {})
            self._record_current(group, member)
        member.assignment = group.target.get(member.member_id, {})
        result = ShareHeartbeatResult(
            ErrorCode.NONE,
            member_id=member.member_id,
            member_epoch=member.epoch,
            heartbeat_interval_ms=int(self.setting(group.group_id, "share.heartbeat.interval.ms")),
            assignment=dict(member.assignment)
            if req.member_epoch == 0 or member.assignment != old_assignment
            else None,
        )
        deadline = now_ms + int(self.setting(group.group_id, "share.session.timeout.ms"))
        return result, Timers(arm=(((group.group_id, member.member_id), deadline),))

    def session_expired(self, key: SessionTimer, now_ms: int) -> bool:
        """The member's session timer fired: remove it.  True if it was a member."""
        group = self.groups.get(key[0])
        if group is None or key[1] not in group.members:
            return False
        self._remove(group, key[1], "share_group.member_expired")
        return True

    # ------------------------------------------------------------------ reads

    def is_share_group(self, group_id: str) -> bool:
        return group_id in self.groups

    def member_of(self, group_id: str, member_id: str) -> ShareMember | None:
        g = self.groups.get(group_id)
        return None if g is None else g.members.get(member_id)

    def all(self) -> Iterable[ShareGroup]:
        return self.groups.values()

    def unload(self, group_ids: Iterable[str]) -> list[tuple[str, str]]:
        """Groups whose coordinator moved leave memory; their (group, member) session timers
        are returned for the runtime to cancel."""
        out: list[tuple[str, str]] = []
        for gid in group_ids:
            g = self.groups.pop(gid, None)
            if g is not None:
                out.extend((gid, mid) for mid in g.members)
        return out

    def list_groups(self, states: Iterable[str], types: Iterable[str]) -> list[ListedGroup]:
        """Share groups for ListGroups: protocol type ``share``, type ``share``."""
        st = {s.strip().lower() for s in states}
        ty = {t.strip().lower() for t in types}
        if ty and "share" not in ty:
            return []
        return [
            ListedGroup(gid, "share", g.state, "share")
            for gid, g in sorted(self.groups.items())
            if not st or g.state.lower() in st
        ]

    def delete(self, group_id: str) -> ErrorCode:
        """DeleteGroups: only an Empty share group goes (NON_EMPTY_GROUP otherwise)."""
        g = self.groups.get(group_id)
        if g is None:
            return ErrorCode.GROUP_ID_NOT_FOUND
        if g.members:
            return ErrorCode.NON_EMPTY_GROUP
        del self.groups[group_id]
        for rtype in (sgr.TARGET_ASSIGNMENT_METADATA, sgr.GROUP_METADATA):
            self.pending.append((group_id, (sgr.ShareKey(rtype, group_id), None)))
        return ErrorCode.NONE

    # ------------------------------------------------------------------ internals

    @staticmethod
    def _invalid(req: ShareHeartbeat) -> str | None:
        if not req.group_id:
            return "GroupId can't be empty."
        if req.rack_id is not None and not req.rack_id:
            return "RackId can't be empty."
        if not req.member_id:
            return "MemberId can't be empty."
        if req.member_epoch == 0:
            if not req.subscribed_topic_names:
                return "SubscribedTopicNames must be set in first request."
        elif req.member_epoch < -1:
            return "MemberEpoch is invalid."
        return None

    @staticmethod
    def _error(code: ErrorCode, message: str) -> tuple[ShareHeartbeatResult, Timers]:
        return ShareHeartbeatResult(code, message), Timers()

    def _leave(self, group: ShareGroup | None, req: ShareHeartbeat, now_ms: int) -> tuple[ShareHeartbeatResult, Timers]:
        if group is None:
            return self._error(ErrorCode.GROUP_ID_NOT_FOUND, f"Group {req.group_id} not found.")
        if req.member_id not in group.members:
            return self._error(
                ErrorCode.UNKNOWN_MEMBER_ID,
                f"Member {req.member_id} is not a member of group {req.group_id}.",
            )
        self._remove(group, req.member_id, "share_group.member_left")
        return (
            ShareHeartbeatResult(ErrorCode.NONE, member_id=req.member_id, member_epoch=-1),
            Timers(cancel=((group.group_id, req.member_id),)),
        )

    def _remove(self, group: ShareGroup, member_id: str, event: str) -> None:
        del group.members[member_id]
        group.target.pop(member_id, None)
        gid = group.group_id
        for rtype in (sgr.CURRENT_MEMBER_ASSIGNMENT, sgr.TARGET_ASSIGNMENT_MEMBER, sgr.MEMBER_METADATA):
            self.pending.append((gid, (sgr.ShareKey(rtype, gid, member_id), None)))
        group.epoch += 1
        self._refresh_topics(group)
        self._record_epoch(group)
        self._assign(group)
        self.changes.append(Change(event, group.group_id, member_id, group.epoch, len(group.members)))

    def _refresh_topics(self, group: ShareGroup) -> bool:
        """The subscribed topics as they are now; True when that differs from last time."""
        now: dict[str, tuple[uuid.UUID, int]] = {}
        for m in group.members.values():
            for name in m.subscribed:
                if name not in now:
                    t: TopicInfo | None = self.topics.get(name)
                    if t is not None:
                        now[name] = (t.topic_id, t.partitions)
        if now == group.topics:
            return False
        group.topics = now
        return True

    def _assign(self, group: ShareGroup) -> None:
        subs = {
            m.member_id: [group.topics[n][0] for n in m.subscribed if n in group.topics] for m in group.members.values()
        }
        counts = {tid: n for tid, n in group.topics.values()}
        current = {mid: group.target.get(mid, {}) for mid in group.members}
        old = group.target
        group.target = assignor.assign(subs, counts, current)
        group.assignment_epoch = group.epoch
        gid = group.group_id
        for mid, target in group.target.items():
            if old.get(mid) != target or mid not in old:
                value = sgr.ShareTargetAssignmentMemberValue(_tps(target))
                self.pending.append((gid, (sgr.ShareKey(sgr.TARGET_ASSIGNMENT_MEMBER, gid, mid), value)))
        self.pending.append(
            (
                gid,
                (
                    sgr.ShareKey(sgr.TARGET_ASSIGNMENT_METADATA, gid),
                    sgr.ShareTargetAssignmentMetadataValue(group.assignment_epoch),
                ),
            )
        )

    # ------------------------------------------------------------------ records

    def _record_member(self, group: ShareGroup, m: ShareMember) -> None:
        value = sgr.ShareMemberMetadataValue(m.rack_id, m.client_id, m.client_host, m.subscribed)
        self.pending.append((group.group_id, (sgr.ShareKey(sgr.MEMBER_METADATA, group.group_id, m.member_id), value)))

    def _record_epoch(self, group: ShareGroup) -> None:
        topics = [TopicInfo(tid, name, n) for name, (tid, n) in group.topics.items()]
        value = sgr.ShareGroupMetadataValue(group.epoch, group_metadata_hash(topics))
        self.pending.append((group.group_id, (sgr.ShareKey(sgr.GROUP_METADATA, group.group_id), value)))

    def _record_current(self, group: ShareGroup, m: ShareMember) -> None:
        value = sgr.ShareCurrentMemberAssignmentValue(m.epoch, m.previous_epoch, sgr.STABLE, _tps(m.assignment))
        key = sgr.ShareKey(sgr.CURRENT_MEMBER_ASSIGNMENT, group.group_id, m.member_id)
        self.pending.append((group.group_id, (key, value)))

    def load(self, records: Iterable[sgr.ShareRecord]) -> list[tuple[str, str]]:
        """Replay share-group records (log order) of one ``__consumer_offsets`` partition.
        Returns the (group, member) pairs loaded, whose sessions the runtime must time."""
        for key, value in records:
            gid = key.group_id
            group = self.groups.get(gid)
            if group is None:
                if value is None:
                    continue
                group = self.groups[gid] = ShareGroup(gid)
            mid = key.member_id or ""
            if isinstance(value, sgr.ShareMemberMetadataValue):
                m = group.members.setdefault(mid, ShareMember(mid))
                m.rack_id, m.client_id, m.client_host = value.rack_id, value.client_id, value.client_host
                m.subscribed = value.subscribed_topic_names
            elif isinstance(value, sgr.ShareGroupMetadataValue):
                group.epoch = value.epoch
            elif isinstance(value, sgr.ShareTargetAssignmentMetadataValue):
                group.assignment_epoch = value.assignment_epoch
            elif isinstance(value, sgr.ShareTargetAssignmentMemberValue):
                group.target[mid] = _assignment(value.topic_partitions)
            elif isinstance(value, sgr.ShareCurrentMemberAssignmentValue):
                m = group.members.setdefault(mid, ShareMember(mid))
                m.epoch, m.previous_epoch = value.member_epoch, value.previous_member_epoch
                m.assignment = _assignment(value.assigned_partitions)
            elif key.record_type == sgr.MEMBER_METADATA:
                group.members.pop(mid, None)
            elif key.record_type == sgr.TARGET_ASSIGNMENT_MEMBER:
                group.target.pop(mid, None)
            elif key.record_type == sgr.GROUP_METADATA:
                del self.groups[gid]  # the group was deleted
        loaded: list[tuple[str, str]] = []
        for group in self.groups.values():
            self._refresh_topics(group)
            loaded.extend((group.group_id, mid) for mid in group.members)
        return loaded


def _tps(assignment: dict[uuid.UUID, frozenset[int]]) -> tuple[sgr.ShareTopicPartitions, ...]:
    return tuple(
        sgr.ShareTopicPartitions(t, tuple(sorted(ps)))
        for t, ps in sorted(assignment.items(), key=lambda kv: str(kv[0]))
    )


def _assignment(tps: tuple[sgr.ShareTopicPartitions, ...]) -> dict[uuid.UUID, frozenset[int]]:
    return {tp.topic_id: frozenset(tp.partitions) for tp in tps if tp.partitions}
