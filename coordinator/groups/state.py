"""The classic consumer-group coordinator as a sans-IO state machine (after h11's ``_state.py``).

This one module owns every group state transition.  It never touches sockets, asyncio, files
or the clock: every event method takes ``now_ms`` from its caller and returns a list of
effects (``coordinator/groups/events.py``) that the runtime turns into I/O.

Semantics follow Apache Kafka's classic group coordinator; where Kafka's two coordinators
differ we follow the newer Java one (``group-coordinator/.../GroupMetadataManager.java``,
"Java GMM", and ``classic/ClassicGroup.java``) and say so.  The reference is
``spec/group-coordinator.md`` §A; comments cite its sections and Kafka's files.

States and legal transitions (§A.1, ``ClassicGroupState.java``), enforced by
:func:`assert_transition` and nowhere else::

    to                    allowed from
    PreparingRebalance    Stable, CompletingRebalance, Empty
    CompletingRebalance   PreparingRebalance
    Stable                CompletingRebalance
    Empty                 PreparingRebalance
    Dead                  any (Dead included)

A new group starts Empty (previous state Dead) and a loaded one Stable or Empty; neither is a
transition.  What triggers each transition:

* Empty → PreparingRebalance: a member is added.  This is the *initial* rebalance: it uses
  ``group.initial.rebalance.delay.ms`` windows and never completes early (§A.3).
* PreparingRebalance → CompletingRebalance: the join phase completes with members left; the
  generation is incremented and the protocol chosen by vote.
* PreparingRebalance → Empty: the join phase completes with no member; the generation is
  still incremented and a GroupMetadata record with no members is written.
* CompletingRebalance → Stable: the leader's assignment was persisted.
* CompletingRebalance/Stable → PreparingRebalance: a member joins (new, changed metadata, the
  leader in Stable, a static member in CompletingRebalance), leaves, or its session expires;
  or members did not send SyncGroup within the rebalance timeout (KAFKA-12890).
* Empty → Dead: DeleteGroups, or offsets retention removed the last offset.  Any → Dead on
  shutdown (partition unloading).

Events (public methods): ``join``, ``sync``, ``heartbeat``, ``leave``, ``commit_offsets``,
``fetch_offsets``, ``delete_offsets``, ``describe``, ``list_groups``, ``delete_groups``,
``timer_fired``, ``persist_done``, ``load``/``begin_load``, ``start``/``shutdown``.  Request
events carry a ``token`` naming the parked request; its answer is a ``Respond(token, ...)``
effect, possibly much later (JoinGroup waits for the join phase, SyncGroup for the leader).

Timers are data: ``ArmTimer((kind, group, member?), deadline_ms)`` / ``CancelTimer(key)``, at
most one per key (arming replaces).  Kinds: ``heartbeat`` (one per member or pending member:
session timeout, or the 5-minute new-member join timeout), ``join`` (the join phase / initial
delay), ``sync`` (pending-sync expiry), ``retention`` (offsets expiry).  The machine keeps its
own table of armed deadlines and ignores a timer that fires early or was replaced.

Persistence: ``Persist(persist_id, partition, records)``; the runtime appends the batch and
then calls ``persist_done(persist_id, error, now_ms)``.  Responses that depend on records
(leader SyncGroup, static replacement, OffsetCommit, DeleteGroups, OffsetDelete, a
RequireStable OffsetFetch behind pending commits) are released only then.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Final

from rallypoint.protocol.errors import ErrorCode
from rallypoint.protocol.offsets_schema import (
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadata,
    OffsetCommitKey,
    OffsetCommitValue,
    partition_for,
)

from ..config import default
from .events import (
    ArmTimer,
    CancelTimer,
    CommitRequest,
    CommitResult,
    DeleteGroupsResult,
    DescribedGroup,
    DescribedMember,
    DescribeResult,
    Effect,
    FetchGroupRequest,
    FetchGroupResult,
    FetchPartition,
    FetchRequest,
    FetchResult,
    FetchTopic,
    HeartbeatRequest,
    HeartbeatResult,
    JoinMember,
    JoinRequest,
    JoinResult,
    LeaveMemberResult,
    LeaveRequest,
    LeaveResult,
    ListedGroup,
    ListResult,
    Note,
    OffsetDeleteRequest,
    OffsetDeleteResult,
    Persist,
    Protocol,
    Respond,
    SyncRequest,
    SyncResult,
    TimerKey,
    TopicErrors,
    Transition,
)
from .persist import Record, response_error

E = ErrorCode

CONSUMER_PROTOCOL_TYPE: Final = "consumer"
GROUP_TYPE_CLASSIC: Final = "classic"
# GroupCoordinatorConfig.java:254 / GroupCoordinator.scala:1758 (NewMemberJoinTimeoutMs).
NEW_MEMBER_JOIN_TIMEOUT_MS: Final = 5 * 60 * 1000
RETENTION_KEY: Final[TimerKey] = ("retention",)


class GroupState(Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


EMPTY, PREPARING, COMPLETING, STABLE, DEAD = (
    GroupState.EMPTY,
    GroupState.PREPARING_REBALANCE,
    GroupState.COMPLETING_REBALANCE,
    GroupState.STABLE,
    GroupState.DEAD,
)

# §A.1: the legal previous states of each state (GroupMetadata.scala:52-123, ClassicGroupState.java).
VALID_PREVIOUS_STATES: Final[Mapping[GroupState, frozenset[GroupState]]] = {
    PREPARING: frozenset({STABLE, COMPLETING, EMPTY}),
    COMPLETING: frozenset({PREPARING}),
    STABLE: frozenset({COMPLETING}),
    EMPTY: frozenset({PREPARING}),
    DEAD: frozenset(GroupState),
}


class IllegalTransition(RuntimeError):
    """A transition the table above forbids: always a bug in this module."""


def assert_transition(group_id: str, from_state: GroupState, to_state: GroupState) -> None:
    if from_state not in VALID_PREVIOUS_STATES[to_state]:
        raise IllegalTransition(f"group {group_id}: {from_state.value} -> {to_state.value} is not a legal transition")


@dataclass(frozen=True, slots=True)
class GroupConfig:
    """The coordinator settings; defaults from the settings table (coordinator/config.py)."""

    initial_rebalance_delay_ms: int = default("group.initial.rebalance.delay.ms")
    min_session_timeout_ms: int = default("group.min.session.timeout.ms")
    max_session_timeout_ms: int = default("group.max.session.timeout.ms")
    max_size: int = default("group.max.size")
    num_partitions: int = default("offsets.topic.num.partitions")
    metadata_max_bytes: int = default("offset.metadata.max.bytes")
    retention_ms: int = default("offsets.retention.minutes") * 60 * 1000
    retention_check_interval_ms: int = default("offsets.retention.check.interval.ms")
    new_member_join_timeout_ms: int = NEW_MEMBER_JOIN_TIMEOUT_MS

    @classmethod
    def from_settings(cls, get: Callable[[str], object]) -> GroupConfig:
        def i(key: str) -> int:
            v = get(key)
            assert isinstance(v, int), key
            return v

        return cls(
            initial_rebalance_delay_ms=i("group.initial.rebalance.delay.ms"),
            min_session_timeout_ms=i("group.min.session.timeout.ms"),
            max_session_timeout_ms=i("group.max.session.timeout.ms"),
            max_size=i("group.max.size"),
            num_partitions=i("offsets.topic.num.partitions"),
            metadata_max_bytes=i("offset.metadata.max.bytes"),
            retention_ms=i("offsets.retention.minutes") * 60 * 1000,
            retention_check_interval_ms=i("offsets.retention.check.interval.ms"),
        )


# ------------------------------------------------------------------------------ the model


@dataclass(slots=True, eq=False)
class Member:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: tuple[Protocol, ...]
    assignment: bytes = b""
    join_token: int | None = None  # a parked JoinGroup ("awaiting join")
    sync_token: int | None = None  # a parked SyncGroup ("awaiting sync")
    is_new: bool = False

    @property
    def is_static(self) -> bool:
        return self.group_instance_id is not None

    def metadata(self, protocol: str | None) -> bytes:
        for p in self.protocols:
            if p.name == protocol:
                return p.metadata
        return b""

    def matches(self, protocols: tuple[Protocol, ...]) -> bool:
        """Same names, same order, byte-equal metadata (``ClassicGroupMember.matches``)."""
        return self.protocols == protocols

    def vote(self, candidates: set[str]) -> str | None:
        """The member's most preferred protocol among ``candidates`` (``MemberMetadata.vote``)."""
        for p in self.protocols:
            if p.name in candidates:
                return p.name
        return None

    def has_satisfied_heartbeat(self) -> bool:
        """Java ``ClassicGroupMember.hasSatisfiedHeartbeat`` (§A.5): a new member must be
        re-armed explicitly; one awaiting join or sync is alive; otherwise it missed its
        heartbeat."""
        if self.is_new:
            return False
        return self.join_token is not None or self.sync_token is not None


@dataclass(slots=True, eq=False)
class Group:
    group_id: str
    partition: int  # its __consumer_offsets partition (partition_for, §A.12)
    state: GroupState = EMPTY
    previous_state: GroupState = DEAD
    state_timestamp: int | None = None
    generation: int = 0
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader_id: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    static_members: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    pending_members: set[str] = field(default_factory=set)  # MEMBER_ID_REQUIRED ids not yet joined
    pending_sync: set[str] = field(default_factory=set)
    supported_protocols: dict[str, int] = field(default_factory=dict)  # protocol -> members offering it
    num_awaiting_join: int = 0
    new_member_added: bool = False  # extends the initial delayed join (§A.3)
    initial_join: tuple[int, int] | None = None  # (delay, remaining) of an armed InitialDelayedJoin
    sync_generation: int = -1  # generation the pending-sync timer was armed for
    subscribed_topics: frozenset[str] | None = None
    offsets: dict[tuple[str, int], OffsetCommitValue] = field(default_factory=dict)
    pending_commits: dict[int, tuple[tuple[str, int], ...]] = field(default_factory=dict)

    # --- queries (ClassicGroup.java)

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id is not None and self.leader_id == member_id

    def has_all_members_joined(self) -> bool:
        return len(self.members) == self.num_awaiting_join and not self.pending_members

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def can_rebalance(self) -> bool:
        return self.state in VALID_PREVIOUS_STATES[PREPARING]

    def uses_consumer_protocol(self) -> bool:
        return self.protocol_type == CONSUMER_PROTOCOL_TYPE

    def is_subscribed_to(self, topic: str) -> bool:
        """``ClassicGroup.isSubscribedToTopic``: unknown subscriptions count as subscribed
        only for the consumer protocol."""
        if self.subscribed_topics is not None:
            return topic in self.subscribed_topics
        return self.uses_consumer_protocol()

    def supports_protocols(self, protocol_type: str, names: Iterable[str]) -> bool:
        """``ClassicGroup.supportsProtocols`` (GroupMetadata.scala:461-466)."""
        names = list(names)
        if self.state == EMPTY:
            return bool(protocol_type) and bool(names)
        n = len(self.members)
        return self.protocol_type == protocol_type and any(self.supported_protocols.get(p, 0) == n for p in names)

    def select_protocol(self) -> str:
        """Vote among the protocols every member supports (§A.3, ``ClassicGroup.selectProtocol``).

        Kafka breaks ties by hash-map order (unspecified); we break them by the order in
        which the protocols first received a vote, which is deterministic.
        """
        n = len(self.members)
        candidates = {p for p, c in self.supported_protocols.items() if c == n}
        votes: dict[str, int] = {}
        for m in self.members.values():
            choice = m.vote(candidates)
            if choice is not None:
                votes[choice] = votes.get(choice, 0) + 1
        if not votes:
            raise RuntimeError(f"group {self.group_id}: no protocol supported by every member")
        best = max(votes.values())
        return next(p for p, c in votes.items() if c == best)

    def compute_subscribed_topics(self) -> frozenset[str] | None:
        """``ClassicGroup.computeSubscribedTopics``: parse each member's ConsumerProtocol
        subscription (its v0 prefix) when the group uses the consumer protocol."""
        if self.protocol_type is None or self.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return None
        if not self.members:
            return frozenset()
        if self.protocol_name is None:
            return None
        topics: set[str] = set()
        for m in self.members.values():
            parsed = parse_subscription_topics(m.metadata(self.protocol_name))
            if parsed is None:
                return None
            topics.update(parsed)
        return frozenset(topics)


def parse_subscription_topics(data: bytes) -> list[str] | None:
    """Topics of a ConsumerProtocolSubscription (read with its v0 schema, as Kafka does:
    int16 version, topics: [string], user_data: nullable bytes; later fields ignored)."""
    try:
        (version,) = struct.unpack_from(">h", data, 0)
        if version < 0:
            return None
        pos = 2
        (count,) = struct.unpack_from(">i", data, pos)
        pos += 4
        if count < 0:
            return None
        topics = []
        for _ in range(count):
            (n,) = struct.unpack_from(">h", data, pos)
            pos += 2
            if n < 0 or pos + n > len(data):
                return None
            topics.append(data[pos : pos + n].decode("utf-8"))
            pos += n
        (ud,) = struct.unpack_from(">i", data, pos)
        pos += 4
        if ud > 0 and pos + ud > len(data):
            return None
        return topics
    except (struct.error, UnicodeDecodeError):
        return None


def _inconsistent(requested: str | None, current: str | None) -> bool:
    """``isProtocolInconsistent``: both known and different."""
    return requested is not None and current is not None and requested != current


def java_string_length(s: str) -> int:
    """Java ``String.length()``: UTF-16 code units (offset.metadata.max.bytes is checked so)."""
    return len(s.encode("utf-16-le")) // 2


@dataclass(slots=True)
class _StableFetch:
    """A RequireStable OffsetFetch waiting for the commits that were pending when it came."""

    token: int
    request: FetchRequest
    waiting_for: set[int]


# ----------------------------------------------------------------------------- the machine


class GroupMachine:
    """Every classic group of this coordinator, their offsets, and all transitions."""

    def __init__(self, config: GroupConfig, new_uuid: Callable[[], str] | None = None) -> None:
        self.config = config
        self.groups: dict[str, Group] = {}
        self._new_uuid = new_uuid or (lambda: str(uuid.uuid4()))
        self._timers: dict[TimerKey, int] = {}
        self._continuations: dict[int, Callable[[ErrorCode | None], None]] = {}
        self._persist_ids = 0
        self._loading: set[int] = set()
        self._active = False
        self._stable_fetches: list[_StableFetch] = []
        self._fx: list[Effect] = []
        self._now = 0

    # ------------------------------------------------------------------ event plumbing

    def _begin(self, now_ms: int) -> None:
        self._now = now_ms
        self._fx = []

    def _end(self) -> list[Effect]:
        fx, self._fx = self._fx, []
        return fx

    def _respond(self, token: int, result: object) -> None:
        self._fx.append(Respond(token, result))

    def _note(self, event: str, **fields: object) -> None:
        self._fx.append(Note(event, fields))

    def _arm(self, key: TimerKey, delay_ms: int) -> None:
        deadline = self._now + max(0, delay_ms)
        self._timers[key] = deadline
        self._fx.append(ArmTimer(key, deadline))

    def _cancel(self, key: TimerKey) -> None:
        if self._timers.pop(key, None) is not None:
            self._fx.append(CancelTimer(key))

    def _persist(self, partition: int, records: list[Record], done: Callable[[ErrorCode | None], None]) -> int:
        self._persist_ids += 1
        pid = self._persist_ids
        self._continuations[pid] = done
        self._fx.append(Persist(pid, partition, tuple(records)))
        return pid

    def _transition(self, group: Group, to: GroupState, reason: str) -> None:
        """The only place a group's state changes (§A.1 table)."""
        assert_transition(group.group_id, group.state, to)
        frm = group.state
        group.previous_state = frm
        group.state = to
        group.state_timestamp = self._now
        self._fx.append(
            Transition(
                group.group_id,
                group.partition,
                frm.value,
                to.value,
                group.generation,
                group.leader_id,
                len(group.members),
                reason,
            )
        )

    def partition_for(self, group_id: str) -> int:
        return partition_for(group_id, self.config.num_partitions)

    def next_deadline(self) -> int | None:
        return min(self._timers.values(), default=None)

    def armed_timers(self) -> dict[TimerKey, int]:
        return dict(self._timers)

    # -------------------------------------------------------------- life cycle, loading

    def start(self, now_ms: int) -> list[Effect]:
        """The coordinator becomes active; the offsets-retention job is scheduled."""
        self._begin(now_ms)
        self._active = True
        self._arm(RETENTION_KEY, self.config.retention_check_interval_ms)
        return self._end()

    def shutdown(self, now_ms: int) -> list[Effect]:
        """Unload everything (``onUnloaded``, §A.13): groups → Dead, parked JoinGroups (in
        PreparingRebalance) and SyncGroups (CompletingRebalance/Stable) get NOT_COORDINATOR."""
        self._begin(now_ms)
        self._active = False
        for group in list(self.groups.values()):
            prev = group.state
            self._transition(group, DEAD, "coordinator shutting down")
            for m in list(group.members.values()):
                if prev == PREPARING:
                    self._complete_join(group, m, JoinResult(E.NOT_COORDINATOR, member_id=m.member_id))
                elif prev in (COMPLETING, STABLE):
                    self._complete_sync(m, SyncResult(E.NOT_COORDINATOR))
            self._drop_group(group)
        for waiter in self._stable_fetches:
            self._respond(waiter.token, self._fetch_now(waiter.request))
        self._stable_fetches.clear()
        for key in list(self._timers):
            self._cancel(key)
        return self._end()

    def begin_load(self, partition: int) -> None:
        """Mark a ``__consumer_offsets`` partition as loading (requests for its groups get
        COORDINATOR_LOAD_IN_PROGRESS, Heartbeat gets NONE: §A.2 item 3) until :meth:`load`."""
        self._loading.add(partition)

    def load(
        self,
        partition: int,
        groups: Mapping[str, GroupMetadataValue],
        offsets: Mapping[OffsetCommitKey, OffsetCommitValue],
        now_ms: int,
    ) -> list[Effect]:
        """Install what the offsets log replayed for ``partition`` (§A.13, §B.3).

        Groups with members come up Stable, others Empty; every member gets a fresh session
        timer; offsets without a group record make an Empty "simple" group.  A group over
        ``group.max.size`` rebalances at once (Java GMM ``onLoaded``).
        """
        self._begin(now_ms)
        loaded: list[Group] = []
        for gid, value in groups.items():
            g = Group(
                gid,
                self.partition_for(gid),
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
                self._add_member_raw(g, member, None)
            g.protocol_type = value.protocol_type or None
            if g.leader_id not in g.members:
                g.leader_id = next(iter(g.members), None)
            g.subscribed_topics = g.compute_subscribed_topics()
            self._install(g)
            loaded.append(g)
        for key, val in offsets.items():
            og = self.groups.get(key.group)
            if og is None:
                og = Group(key.group, self.partition_for(key.group), state_timestamp=None)
                self._install(og)
                loaded.append(og)
            og.offsets[(key.topic, key.partition)] = val
        for g in loaded:
            self._note(
                "group loaded",
                group=g.group_id,
                partition=g.partition,
                state=g.state.value,
                generation=g.generation,
                members=len(g.members),
                offsets=len(g.offsets),
            )
            for m in g.members.values():
                self._reschedule_heartbeat(g, m)
            if len(g.members) > self.config.max_size:
                self._prepare_rebalance(
                    g, f"freshly loaded group is over capacity ({len(g.members)} > {self.config.max_size})"
                )
        self._loading.discard(partition)
        return self._end()

    def _install(self, group: Group) -> None:
        old = self.groups.get(group.group_id)
        if old is not None:
            self._drop_group(old)
        self.groups[group.group_id] = group

    def _drop_group(self, group: Group) -> None:
        """Forget a (Dead) group and its timers."""
        if self.groups.get(group.group_id) is group:
            del self.groups[group.group_id]
        for mid in list(group.members) + list(group.pending_members):
            self._cancel(("heartbeat", group.group_id, mid))
        self._cancel(("join", group.group_id))
        self._cancel(("sync", group.group_id))

    def _unavailable(self, partition: int) -> ErrorCode | None:
        if not self._active:
            return E.COORDINATOR_NOT_AVAILABLE
        if partition in self._loading:
            return E.COORDINATOR_LOAD_IN_PROGRESS
        return None

    def _new_group(self, group_id: str) -> Group:
        g = Group(group_id, self.partition_for(group_id), state_timestamp=self._now)
        self.groups[group_id] = g
        self._note("group created", group=group_id, partition=g.partition)
        return g

    # ------------------------------------------------------------------ member bookkeeping

    def _add_member_raw(self, group: Group, member: Member, token: int | None) -> None:
        """``ClassicGroup.add``."""
        if member.group_instance_id is not None:
            group.static_members[member.group_instance_id] = member.member_id
        if not group.members:
            group.protocol_type = member.protocol_type
        if group.leader_id is None:
            group.leader_id = member.member_id
        group.members[member.member_id] = member
        for p in member.protocols:
            group.supported_protocols[p.name] = group.supported_protocols.get(p.name, 0) + 1
        member.join_token = token
        if token is not None:
            group.num_awaiting_join += 1
        group.pending_members.discard(member.member_id)

    def _remove_member_raw(self, group: Group, member_id: str) -> None:
        """``ClassicGroup.remove``: the leader passes to the first remaining member."""
        member = group.members.pop(member_id, None)
        if member is not None:
            for p in member.protocols:
                group.supported_protocols[p.name] = group.supported_protocols.get(p.name, 0) - 1
            if member.join_token is not None:
                # Kafka completes a parked join before removing (callers do); this is a safety
                # net so that no request stays parked forever.
                self._complete_join(group, member, JoinResult(E.UNKNOWN_MEMBER_ID))
            if member.sync_token is not None:
                # Kafka leaves such a SyncGroup to time out on the client; we answer it rather
                # than keep it parked forever.
                self._complete_sync(member, SyncResult(E.UNKNOWN_MEMBER_ID))
            if member.group_instance_id is not None and group.static_members.get(member.group_instance_id) == member_id:
                del group.static_members[member.group_instance_id]
        if group.is_leader(member_id):
            group.leader_id = next(iter(group.members), None)
        group.pending_members.discard(member_id)
        group.pending_sync.discard(member_id)
        self._cancel(("heartbeat", group.group_id, member_id))

    def _update_member(
        self,
        group: Group,
        member: Member,
        protocols: tuple[Protocol, ...],
        rebalance_timeout_ms: int,
        session_timeout_ms: int,
        token: int | None,
    ) -> None:
        """``ClassicGroup.updateMember``."""
        for p in member.protocols:
            group.supported_protocols[p.name] = group.supported_protocols.get(p.name, 0) - 1
        member.protocols = protocols
        for p in protocols:
            group.supported_protocols[p.name] = group.supported_protocols.get(p.name, 0) + 1
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms
        if token is not None and member.join_token is not None:
            # The same member joined again while its JoinGroup is parked (a client retrying on a
            # new connection).  Kafka silently replaces the callback and never answers the old
            # request; we answer it so that it does not stay parked forever.
            self._respond(member.join_token, JoinResult(E.REBALANCE_IN_PROGRESS, member_id=member.member_id))
            member.join_token = token
            return
        if token is not None and member.join_token is None:
            group.num_awaiting_join += 1
        elif token is None and member.join_token is not None:
            group.num_awaiting_join -= 1
        member.join_token = token

    def _complete_join(self, group: Group, member: Member, result: JoinResult) -> bool:
        if member.join_token is None:
            return False
        self._respond(member.join_token, result)
        member.join_token = None
        group.num_awaiting_join -= 1
        return True

    def _complete_sync(self, member: Member, result: SyncResult) -> bool:
        if member.sync_token is None:
            return False
        self._respond(member.sync_token, result)
        member.sync_token = None
        return True

    def _reschedule_heartbeat(self, group: Group, member: Member, timeout_ms: int | None = None) -> None:
        self._arm(
            ("heartbeat", group.group_id, member.member_id),
            member.session_timeout_ms if timeout_ms is None else timeout_ms,
        )

    def _validate_member(self, group: Group, member_id: str, instance_id: str | None) -> ErrorCode | None:
        """``ClassicGroup.validateMember`` (§A.8 fencing)."""
        if instance_id is not None:
            existing = group.static_members.get(instance_id)
            if existing is None:
                return E.UNKNOWN_MEMBER_ID
            if existing != member_id:
                return E.FENCED_INSTANCE_ID
        if member_id not in group.members:
            return E.UNKNOWN_MEMBER_ID
        return None

    def _current_members(self, group: Group) -> tuple[JoinMember, ...]:
        """The leader's member list: every member with its metadata for the chosen protocol."""
        return tuple(
            JoinMember(m.member_id, m.group_instance_id, m.metadata(group.protocol_name))
            for m in group.members.values()
        )

    def _group_record(self, group: Group, assignment: Mapping[str, bytes]) -> Record:
        """``GroupCoordinatorRecordHelpers.newGroupMetadataRecord``."""
        members = tuple(
            MemberMetadata(
                m.member_id,
                m.group_instance_id,
                m.client_id,
                m.client_host,
                m.rebalance_timeout_ms,
                m.session_timeout_ms,
                m.metadata(group.protocol_name),
                assignment[m.member_id],
            )
            for m in group.members.values()
        )
        value = GroupMetadataValue(
            protocol_type=group.protocol_type or "",
            generation=group.generation,
            protocol=group.protocol_name,
            leader=group.leader_id,
            current_state_timestamp=-1 if group.state_timestamp is None else group.state_timestamp,
            members=members,
        )
        return (GroupMetadataKey(group.group_id), value)

    # =================================================================== JoinGroup (§A.3)

    def join(self, token: int, req: JoinRequest, now_ms: int) -> list[Effect]:
        self._begin(now_ms)
        self._join(token, req)
        return self._end()

    def _join(self, token: int, req: JoinRequest) -> None:
        # GroupCoordinatorService.joinGroup: activity, group id, session timeout, then the
        # partition's state (loading) inside the runtime.
        if not self._active:
            self._respond(token, JoinResult(E.COORDINATOR_NOT_AVAILABLE, member_id=req.member_id))
            return
        if not req.group_id:
            self._respond(token, JoinResult(E.INVALID_GROUP_ID, member_id=req.member_id))
            return
        cfg = self.config
        if not cfg.min_session_timeout_ms <= req.session_timeout_ms <= cfg.max_session_timeout_ms:
            self._respond(token, JoinResult(E.INVALID_SESSION_TIMEOUT, member_id=req.member_id))
            return
        if self.partition_for(req.group_id) in self._loading:
            self._respond(token, JoinResult(E.COORDINATOR_LOAD_IN_PROGRESS))
            return

        unknown_member = req.member_id == ""
        group = self.groups.get(req.group_id)
        is_new_group = group is None
        if group is None:
            if not unknown_member:
                # Java GMM ~4045: UNKNOWN_MEMBER_ID although the comment says GROUP_ID_NOT_FOUND.
                self._respond(token, JoinResult(E.UNKNOWN_MEMBER_ID, member_id=req.member_id))
                return
            group = self._new_group(req.group_id)
        persisted_before = self._persist_ids

        if not self._accept_joining_member(group, req.member_id):
            self._remove_member_raw(group, req.member_id)
            self._respond(token, JoinResult(E.GROUP_MAX_SIZE_REACHED))
        elif unknown_member:
            self._join_new_member(token, req, group)
        else:
            self._join_existing_member(token, req, group)

        if is_new_group and self._persist_ids == persisted_before:
            # The new Java coordinator writes an empty GroupMetadata record when JoinGroup
            # creates a group (Java GMM ~4076-4096; spec §B.2).  The response does not wait
            # for it.  Kafka reverts the group's creation if this write fails; we only log.
            record = (
                GroupMetadataKey(group.group_id),
                GroupMetadataValue(
                    protocol_type="",
                    generation=0,
                    protocol=None,
                    leader=None,
                    current_state_timestamp=group.state_timestamp if group.state_timestamp is not None else -1,
                    members=(),
                ),
            )
            gid = group.group_id

            def created(error: ErrorCode | None) -> None:
                if error is not None:
                    self._note("failed to write empty metadata for new group", group=gid, error=error.name)

            self._persist(group.partition, [record], created)

    def _accept_joining_member(self, group: Group, member_id: str) -> bool:
        """group.max.size (§A.3 step 3, Java GMM ``acceptJoiningMember``)."""
        if group.state in (EMPTY, DEAD):
            return True
        if group.state == PREPARING:
            m = group.members.get(member_id)
            return (m is not None and m.join_token is not None) or group.num_awaiting_join < self.config.max_size
        return member_id in group.members or len(group.members) < self.config.max_size

    def _join_new_member(self, token: int, req: JoinRequest, group: Group) -> None:
        if group.state == DEAD:
            self._respond(token, JoinResult(E.COORDINATOR_NOT_AVAILABLE))
            return
        if not group.supports_protocols(req.protocol_type, (p.name for p in req.protocols)):
            self._respond(token, JoinResult(E.INCONSISTENT_GROUP_PROTOCOL))
            return
        # ClassicGroup.generateMemberId: "<instance id or client id>-<uuid>".
        new_id = f"{req.group_instance_id if req.group_instance_id is not None else req.client_id}-{self._new_uuid()}"
        if req.group_instance_id is not None:
            existing = group.static_members.get(req.group_instance_id)
            if existing is not None:
                self._update_static_member(token, req, group, existing, new_id)
            else:
                self._add_member_and_rebalance(token, req, group, new_id)
        elif req.api_version >= 4:
            # KIP-394: dynamic v4+ members must rejoin with the id we hand out; it stays
            # pending for the session timeout of this request (§A.3, §A.5).
            group.pending_members.add(new_id)
            self._arm(("heartbeat", group.group_id, new_id), req.session_timeout_ms)
            self._respond(token, JoinResult(E.MEMBER_ID_REQUIRED, member_id=new_id))
        else:
            self._add_member_and_rebalance(token, req, group, new_id)

    def _join_existing_member(self, token: int, req: JoinRequest, group: Group) -> None:
        mid = req.member_id
        if group.state == DEAD:
            self._respond(token, JoinResult(E.COORDINATOR_NOT_AVAILABLE, member_id=mid))
            return
        if not group.supports_protocols(req.protocol_type, (p.name for p in req.protocols)):
            self._respond(token, JoinResult(E.INCONSISTENT_GROUP_PROTOCOL, member_id=mid))
            return
        if mid in group.pending_members:
            # A pending member is never static (Kafka throws on an instance id here; we
            # treat the id as the pending one, which is what the client means).
            self._add_member_and_rebalance(token, req, group, mid)
            return
        err = self._validate_member(group, mid, req.group_instance_id)
        if err is not None:
            self._respond(token, JoinResult(err, member_id=mid))
            return
        member = group.members[mid]
        if group.state == PREPARING:
            self._update_member_and_rebalance(token, req, group, member, "member rejoins during PreparingRebalance")
        elif group.state == COMPLETING:
            if member.matches(req.protocols):
                # Lost its JoinGroup response: answer with the current generation.
                self._respond(
                    token,
                    JoinResult(
                        E.NONE,
                        member_id=mid,
                        generation_id=group.generation,
                        protocol_type=group.protocol_type,
                        protocol_name=group.protocol_name,
                        leader=group.leader_id or "",
                        members=self._current_members(group) if group.is_leader(mid) else (),
                    ),
                )
            else:
                self._update_member_and_rebalance(
                    token, req, group, member, "member rejoins with new metadata during CompletingRebalance"
                )
        elif group.state == STABLE:
            if group.is_leader(mid):
                # The leader's JoinGroup always rebalances (lets it react to topic changes).
                self._update_member_and_rebalance(token, req, group, member, "leader rejoins during Stable")
            elif not member.matches(req.protocols):
                self._update_member_and_rebalance(token, req, group, member, "member rejoins with new metadata")
            else:
                self._respond(
                    token,
                    JoinResult(
                        E.NONE,
                        member_id=mid,
                        generation_id=group.generation,
                        protocol_type=group.protocol_type,
                        protocol_name=group.protocol_name,
                        leader=group.leader_id or "",
                    ),
                )
        else:  # Empty: a member of an old generation; make it reset and rejoin
            self._respond(token, JoinResult(E.UNKNOWN_MEMBER_ID, member_id=mid))

    def _add_member_and_rebalance(self, token: int, req: JoinRequest, group: Group, member_id: str) -> None:
        """``addMemberThenRebalanceOrCompleteJoin``."""
        member = Member(
            member_id,
            req.group_instance_id,
            req.client_id,
            req.client_host,
            req.rebalance_timeout_ms,
            req.session_timeout_ms,
            req.protocol_type,
            req.protocols,
            is_new=True,
        )
        # The initial delayed join is extended while new members arrive.  We use the Java
        # coordinator's rule `previousState == EMPTY` (Java GMM ~4740), not Scala's
        # `generation == 0`, so every rebalance that starts from Empty is extended.
        if group.state == PREPARING and group.previous_state == EMPTY:
            group.new_member_added = True
        self._add_member_raw(group, member, token)
        self._note(
            "member added",
            group=group.group_id,
            member=member_id,
            instance=req.group_instance_id,
            client=req.client_id,
            reason=req.reason,
        )
        # New members cannot heartbeat while their JoinGroup is parked, so they get the
        # 5-minute new-member timeout instead of the session timeout (§A.3).
        self._reschedule_heartbeat(group, member, self.config.new_member_join_timeout_ms)
        self._maybe_prepare_rebalance_or_complete_join(group, f"adding new member {member_id}")

    def _update_member_and_rebalance(
        self, token: int, req: JoinRequest, group: Group, member: Member, reason: str
    ) -> None:
        self._update_member(group, member, req.protocols, req.rebalance_timeout_ms, req.session_timeout_ms, token)
        self._maybe_prepare_rebalance_or_complete_join(group, f"{reason} ({member.member_id})")

    def _update_static_member(self, token: int, req: JoinRequest, group: Group, old_id: str, new_id: str) -> None:
        """A known group.instance.id rejoins with an empty member id (§A.8,
        ``updateStaticMemberThenRebalanceOrCompleteJoin``)."""
        instance_id = req.group_instance_id
        assert instance_id is not None
        old_leader = group.leader_id
        member = self._replace_static_member(group, instance_id, old_id, new_id)
        self._reschedule_heartbeat(group, member)
        old_protocols = member.protocols
        old_rebalance, old_session = member.rebalance_timeout_ms, member.session_timeout_ms
        self._update_member(group, member, req.protocols, req.rebalance_timeout_ms, req.session_timeout_ms, token)
        self._note("static member replaced", group=group.group_id, instance=instance_id, old=old_id, new=new_id)

        if group.state == STABLE:
            if (group.protocol_name or "") == group.select_protocol():
                # The selected protocol does not change: no rebalance.  Persist the group
                # with the new member id, then answer (KIP-345; KIP-814 for v9).
                assignment = {m.member_id: m.assignment for m in group.members.values()}
                record = self._group_record(group, assignment)
                version = req.api_version

                def done(error: ErrorCode | None) -> None:
                    if error is not None:
                        # Revert to the old member id, protocols and timeouts.
                        if group.members.get(new_id) is member:
                            self._update_member(group, member, old_protocols, old_rebalance, old_session, None)
                            old = self._replace_static_member(group, instance_id, new_id, old_id)
                            self._reschedule_heartbeat(group, old)
                        self._respond(
                            token,
                            JoinResult(
                                response_error(error),
                                member_id="",
                                generation_id=group.generation,
                                protocol_type=group.protocol_type,
                                protocol_name=group.protocol_name,
                                leader=old_leader or "",
                            ),
                        )
                        return
                    if group.members.get(new_id) is not member:
                        return  # removed meanwhile; its parked join was answered then
                    if version >= 9:
                        is_leader = group.is_leader(new_id)
                        result = JoinResult(
                            E.NONE,
                            member_id=new_id,
                            generation_id=group.generation,
                            protocol_type=group.protocol_type,
                            protocol_name=group.protocol_name,
                            leader=group.leader_id or "",
                            members=self._current_members(group) if is_leader else (),
                            skip_assignment=is_leader,
                        )
                    else:
                        # Before v9 the response names the OLD leader id, so that a rejoining
                        # leader does not think it must compute an assignment.
                        result = JoinResult(
                            E.NONE,
                            member_id=new_id,
                            generation_id=group.generation,
                            protocol_type=group.protocol_type,
                            protocol_name=group.protocol_name,
                            leader=old_leader or "",
                        )
                    self._complete_join(group, member, result)

                self._persist(group.partition, [record], done)
            else:
                self._maybe_prepare_rebalance_or_complete_join(
                    group, f"static member {new_id} rejoined with a change of the selected protocol"
                )
        elif group.state == COMPLETING:
            # The leader may already hold the old member id: force a new rebalance.
            self._prepare_rebalance(group, f"static member {instance_id} rejoined during CompletingRebalance")
        else:  # PreparingRebalance: the join completes normally
            self._maybe_complete_join_phase(group)

    def _replace_static_member(self, group: Group, instance_id: str, old_id: str, new_id: str) -> Member:
        """``ClassicGroup.replaceStaticMember``: fence the old id's parked requests."""
        old = group.members.pop(old_id)
        if old.join_token is not None:
            self._respond(
                old.join_token,
                JoinResult(E.FENCED_INSTANCE_ID, member_id=old_id, protocol_type=None, protocol_name=None, leader=""),
            )
            old.join_token = None
            group.num_awaiting_join -= 1
        self._complete_sync(old, SyncResult(E.FENCED_INSTANCE_ID))
        self._cancel(("heartbeat", group.group_id, old_id))
        new = Member(
            new_id,
            old.group_instance_id,
            old.client_id,
            old.client_host,
            old.rebalance_timeout_ms,
            old.session_timeout_ms,
            old.protocol_type,
            old.protocols,
            assignment=old.assignment,
        )
        group.members[new_id] = new
        # Like Kafka (ClassicGroup.replaceStaticMember), the pending-sync set keeps the old id.
        if group.is_leader(old_id):
            group.leader_id = new_id
        group.static_members[instance_id] = new_id
        return new

    # ----------------------------------------------------------- rebalance orchestration

    def _maybe_prepare_rebalance_or_complete_join(self, group: Group, reason: str) -> None:
        if group.can_rebalance():
            self._prepare_rebalance(group, reason)
        else:
            self._maybe_complete_join_phase(group)

    def _prepare_rebalance(self, group: Group, reason: str) -> None:
        """Java GMM ``prepareRebalance``."""
        if group.state == COMPLETING:
            # Parked SyncGroups are told to rejoin.
            self._reset_and_propagate_assignment_with_error(group, E.REBALANCE_IN_PROGRESS)
        self._remove_sync_expiration(group)
        initial = group.state == EMPTY
        if initial:
            # InitialDelayedJoin (§A.3): a first window of D, then more windows of D while new
            # members keep arriving, capped by remaining = rebalance timeout - D.
            delay = self.config.initial_rebalance_delay_ms
            remaining = max(group.rebalance_timeout_ms() - delay, 0)
            group.initial_join = (delay, remaining)
            self._arm(("join", group.group_id), delay)
        self._transition(group, PREPARING, reason)
        if not initial:
            self._maybe_complete_join_else_schedule(group)

    def _maybe_complete_join_else_schedule(self, group: Group) -> None:
        if group.has_all_members_joined():
            self._complete_join_phase(group)
        else:
            group.initial_join = None
            self._arm(("join", group.group_id), group.rebalance_timeout_ms())

    def _maybe_complete_join_phase(self, group: Group) -> None:
        if group.state != PREPARING:
            return
        if group.previous_state == EMPTY:
            # The initial rebalance is never completed early (§A.3, Java GMM
            # maybeCompleteJoinPhase: `previousState == EMPTY`; Scala: InitialDelayedJoin.tryComplete
            # is always false).
            return
        if not group.has_all_members_joined():
            return
        self._complete_join_phase(group)

    def _join_timer_fired(self, group: Group) -> None:
        if group.initial_join is not None:
            # tryCompleteInitialRebalanceElseSchedule (Java GMM ~4856).
            delay, remaining = group.initial_join
            if group.new_member_added and remaining != 0:
                group.new_member_added = False
                new_delay = min(self.config.initial_rebalance_delay_ms, remaining)
                # Kafka subtracts the *previous* delay from remaining.
                new_remaining = max(remaining - delay, 0)
                group.initial_join = (new_delay, new_remaining)
                self._arm(("join", group.group_id), new_delay)
                return
        self._complete_join_phase(group)

    def _complete_join_phase(self, group: Group) -> None:
        """``completeClassicGroupJoin`` (§A.3 "Join completion")."""
        self._cancel(("join", group.group_id))
        group.initial_join = None
        for m in [m for m in group.members.values() if m.join_token is None and not m.is_static]:
            self._remove_member_raw(group, m.member_id)
            self._note("member removed", group=group.group_id, member=m.member_id, reason="did not rejoin in time")
        if group.state == DEAD:
            return
        if not self._maybe_elect_new_joined_leader(group) and group.members:
            # Nobody rejoined but (static) members remain: wait another rebalance timeout
            # for their sessions to expire.
            self._arm(("join", group.group_id), group.rebalance_timeout_ms())
            return
        # initNextGeneration
        group.generation += 1
        group.pending_sync.clear()
        if group.members:
            group.protocol_name = group.select_protocol()
            group.subscribed_topics = group.compute_subscribed_topics()
            self._transition(group, COMPLETING, "join phase completed")
        else:
            group.protocol_name = None
            group.subscribed_topics = group.compute_subscribed_topics()
            self._transition(group, EMPTY, "join phase completed with no members")
            gid = group.group_id

            def written(error: ErrorCode | None) -> None:
                if error is not None:
                    self._note("failed to write empty group metadata", group=gid, error=error.name)

            self._persist(group.partition, [self._group_record(group, {})], written)
            return
        members = self._current_members(group)
        for m in list(group.members.values()):
            self._complete_join(
                group,
                m,
                JoinResult(
                    E.NONE,
                    member_id=m.member_id,
                    generation_id=group.generation,
                    protocol_type=group.protocol_type,
                    protocol_name=group.protocol_name,
                    leader=group.leader_id or "",
                    members=members if group.is_leader(m.member_id) else (),
                ),
            )
            self._reschedule_heartbeat(group, m)
            m.is_new = False
            group.pending_sync.add(m.member_id)
        # DelayedSync / pending-sync expiry (KAFKA-12890).
        group.sync_generation = group.generation
        self._arm(("sync", group.group_id), group.rebalance_timeout_ms())

    def _maybe_elect_new_joined_leader(self, group: Group) -> bool:
        """``ClassicGroup.maybeElectNewJoinedLeader``: keep a leader that rejoined, else
        promote any member that did; False when nobody rejoined or the group is empty."""
        if group.leader_id is None:
            return False
        leader = group.members.get(group.leader_id)
        if leader is not None and leader.join_token is not None:
            return True
        for m in group.members.values():
            if m.join_token is not None:
                group.leader_id = m.member_id
                return True
        return False

    def _reset_and_propagate_assignment_with_error(self, group: Group, error: ErrorCode) -> None:
        for m in group.members.values():
            m.assignment = b""
        self._propagate_assignment(group, error)

    def _propagate_assignment(self, group: Group, error: ErrorCode) -> None:
        ok = error == E.NONE
        for m in group.members.values():
            if self._complete_sync(
                m,
                SyncResult(
                    error,
                    protocol_type=group.protocol_type if ok else None,
                    protocol_name=group.protocol_name if ok else None,
                    assignment=m.assignment,
                ),
            ):
                # A session that expired while the member waited is re-armed here.
                self._reschedule_heartbeat(group, m)

    def _remove_sync_expiration(self, group: Group) -> None:
        group.pending_sync.clear()
        self._cancel(("sync", group.group_id))

    def _remove_pending_sync_member(self, group: Group, member_id: str) -> None:
        group.pending_sync.discard(member_id)
        if group.state in (DEAD, EMPTY, PREPARING) or not group.pending_sync:
            self._cancel(("sync", group.group_id))

    def _remove_member_and_update_group(self, group: Group, member: Member, reason: str) -> None:
        """Session expiry (§A.5 "Removal")."""
        self._complete_join(group, member, JoinResult(E.UNKNOWN_MEMBER_ID))
        self._remove_member_raw(group, member.member_id)
        self._note("member removed", group=group.group_id, member=member.member_id, reason=reason)
        if group.state in (STABLE, COMPLETING):
            self._maybe_prepare_rebalance_or_complete_join(group, f"{reason} ({member.member_id})")
        elif group.state == PREPARING and group.has_all_members_joined():
            self._complete_join_phase(group)

    # =================================================================== SyncGroup (§A.4)

    def sync(self, token: int, req: SyncRequest, now_ms: int) -> list[Effect]:
        self._begin(now_ms)
        self._sync(token, req)
        return self._end()

    def _sync(self, token: int, req: SyncRequest) -> None:
        # KafkaApis: SyncGroup v5+ must carry ProtocolType and ProtocolName.
        if req.api_version >= 5 and (req.protocol_type is None or req.protocol_name is None):
            self._respond(token, SyncResult(E.INCONSISTENT_GROUP_PROTOCOL))
            return
        if not self._active:
            self._respond(token, SyncResult(E.COORDINATOR_NOT_AVAILABLE))
            return
        if not req.group_id:
            self._respond(token, SyncResult(E.INVALID_GROUP_ID))
            return
        if self.partition_for(req.group_id) in self._loading:
            # The Java coordinator passes COORDINATOR_LOAD_IN_PROGRESS through (§A.2 item 3;
            # Scala answered REBALANCE_IN_PROGRESS).
            self._respond(token, SyncResult(E.COORDINATOR_LOAD_IN_PROGRESS))
            return
        group = self.groups.get(req.group_id)
        if group is None or group.state == EMPTY:
            self._respond(token, SyncResult(E.UNKNOWN_MEMBER_ID))
            return
        err = self._validate_sync(group, req)
        if err is not None:
            self._respond(token, SyncResult(err))
        elif group.state == PREPARING:
            self._respond(token, SyncResult(E.REBALANCE_IN_PROGRESS))
        elif group.state == COMPLETING:
            member = group.members[req.member_id]
            if member.sync_token is not None:  # a duplicate on another connection: replace it
                self._complete_sync(member, SyncResult(E.REBALANCE_IN_PROGRESS))
            member.sync_token = token
            self._remove_pending_sync_member(group, req.member_id)
            if group.is_leader(req.member_id):
                self._leader_sync(group, req)
        elif group.state == STABLE:
            # Late SyncGroup (or a replaced static member): the stored assignment.  Java does not
            # reset the session here (Scala did).
            self._remove_pending_sync_member(group, req.member_id)
            member = group.members[req.member_id]
            self._respond(
                token,
                SyncResult(E.NONE, group.protocol_type, group.protocol_name, member.assignment),
            )

    def _validate_sync(self, group: Group, req: SyncRequest) -> ErrorCode | None:
        if group.state == DEAD:
            return E.COORDINATOR_NOT_AVAILABLE
        err = self._validate_member(group, req.member_id, req.group_instance_id)
        if err is not None:
            return err
        if req.generation_id != group.generation:
            return E.ILLEGAL_GENERATION
        if _inconsistent(req.protocol_type, group.protocol_type):
            return E.INCONSISTENT_GROUP_PROTOCOL
        if _inconsistent(req.protocol_name, group.protocol_name):
            return E.INCONSISTENT_GROUP_PROTOCOL
        return None

    def _leader_sync(self, group: Group, req: SyncRequest) -> None:
        assignment: dict[str, bytes] = {}
        for mid, data in req.assignments:
            assignment[mid] = data
        missing = [mid for mid in group.members if mid not in assignment]
        for mid in missing:
            assignment[mid] = b""  # members the leader left out get an empty assignment
        if missing:
            self._note("empty assignments set", group=group.group_id, generation=group.generation, members=missing)
        generation = req.generation_id
        record = self._group_record(group, assignment)

        def stored(error: ErrorCode | None) -> None:
            # Another member may have joined meanwhile: act only if still CompletingRebalance
            # in the same generation (and the same group object).
            if self.groups.get(group.group_id) is not group:
                return
            if group.state != COMPLETING or group.generation != generation:
                return
            if error is not None:
                mapped = response_error(error)
                self._reset_and_propagate_assignment_with_error(group, mapped)
                self._maybe_prepare_rebalance_or_complete_join(group, f"error {mapped.name} storing the assignment")
                return
            for m in group.members.values():
                m.assignment = assignment.get(m.member_id, b"")
            self._propagate_assignment(group, E.NONE)
            self._transition(group, STABLE, "leader's assignment persisted")

        self._persist(group.partition, [record], stored)

    # =================================================================== Heartbeat (§A.5)

    def heartbeat(self, token: int, req: HeartbeatRequest, now_ms: int) -> list[Effect]:
        self._begin(now_ms)
        self._respond(token, HeartbeatResult(self._heartbeat(req)))
        return self._end()

    def _heartbeat(self, req: HeartbeatRequest) -> ErrorCode:
        if not self._active:
            return E.COORDINATOR_NOT_AVAILABLE
        if not req.group_id:
            return E.INVALID_GROUP_ID
        if self.partition_for(req.group_id) in self._loading:
            return E.NONE  # §A.2 item 3: blindly NONE while loading
        group = self.groups.get(req.group_id)
        if group is None:
            return E.UNKNOWN_MEMBER_ID
        if group.state == DEAD:
            return E.COORDINATOR_NOT_AVAILABLE
        err = self._validate_member(group, req.member_id, req.group_instance_id)
        if err is not None:
            return err
        if req.generation_id != group.generation:
            return E.ILLEGAL_GENERATION
        if group.state == EMPTY:
            return E.UNKNOWN_MEMBER_ID
        self._reschedule_heartbeat(group, group.members[req.member_id])
        if group.state == PREPARING:
            return E.REBALANCE_IN_PROGRESS  # the session was still refreshed
        return E.NONE

    # ================================================================== LeaveGroup (§A.6)

    def leave(self, token: int, req: LeaveRequest, now_ms: int) -> list[Effect]:
        self._begin(now_ms)
        self._respond(token, self._leave(req))
        return self._end()

    def _leave(self, req: LeaveRequest) -> LeaveResult:
        if not self._active:
            return LeaveResult(E.COORDINATOR_NOT_AVAILABLE)
        if not req.group_id:
            return LeaveResult(E.INVALID_GROUP_ID)
        if self.partition_for(req.group_id) in self._loading:
            return LeaveResult(E.COORDINATOR_LOAD_IN_PROGRESS)
        group = self.groups.get(req.group_id)
        if group is None:
            return LeaveResult(
                E.NONE,
                tuple(LeaveMemberResult(m.member_id, m.group_instance_id, E.UNKNOWN_MEMBER_ID) for m in req.members),
            )
        if group.state == DEAD:
            return LeaveResult(E.COORDINATOR_NOT_AVAILABLE)
        results: list[LeaveMemberResult] = []
        removed: list[str] = []
        for lm in req.members:
            reason = lm.reason or "not provided"
            if lm.member_id == "":
                # Admin removal by group.instance.id (v3+).
                mid = group.static_members.get(lm.group_instance_id) if lm.group_instance_id is not None else None
                if mid is not None:
                    self._remove_current_member(group, mid, reason)
                    results.append(LeaveMemberResult(lm.member_id, lm.group_instance_id, E.NONE))
                    removed.append(mid)
                else:
                    results.append(LeaveMemberResult(lm.member_id, lm.group_instance_id, E.UNKNOWN_MEMBER_ID))
            elif lm.member_id in group.pending_members:
                self._remove_member_raw(group, lm.member_id)
                self._note("pending member left", group=group.group_id, member=lm.member_id, reason=reason)
                results.append(LeaveMemberResult(lm.member_id, lm.group_instance_id, E.NONE))
                removed.append(lm.member_id)
            else:
                err = self._validate_member(group, lm.member_id, lm.group_instance_id)
                if err is None:
                    self._remove_current_member(group, lm.member_id, reason)
                    removed.append(lm.member_id)
                results.append(LeaveMemberResult(lm.member_id, lm.group_instance_id, err or E.NONE))
        if removed:
            why = f"members left the group ({', '.join(removed)})"
            if group.state in (STABLE, COMPLETING):
                self._maybe_prepare_rebalance_or_complete_join(group, why)
            elif group.state == PREPARING:
                self._maybe_complete_join_phase(group)
        return LeaveResult(E.NONE, tuple(results))

    def _remove_current_member(self, group: Group, member_id: str, reason: str) -> None:
        member = group.members[member_id]
        self._complete_join(group, member, JoinResult(E.UNKNOWN_MEMBER_ID))
        self._remove_member_raw(group, member_id)
        self._note("member left", group=group.group_id, member=member_id, reason=reason)

    # ========================================================================== timers

    def timer_fired(self, key: TimerKey, now_ms: int) -> list[Effect]:
        self._begin(now_ms)
        deadline = self._timers.get(key)
        if deadline is not None and deadline <= now_ms:
            del self._timers[key]
            self._dispatch_timer(key)
        return self._end()

    def advance(self, now_ms: int) -> list[Effect]:
        """Fire every timer due at ``now_ms``, earliest first (for tests and fake clocks)."""
        out: list[Effect] = []
        while True:
            due = [(d, k) for k, d in self._timers.items() if d <= now_ms]
            if not due:
                return out
            deadline, key = min(due)
            out.extend(self.timer_fired(key, deadline))

    def _dispatch_timer(self, key: TimerKey) -> None:
        kind = key[0]
        if kind == "retention":
            self._expire_offsets()
            return
        group = self.groups.get(key[1])
        if group is None:
            return
        if kind == "heartbeat":
            self._heartbeat_expired(group, key[2])
        elif kind == "join":
            if group.state == PREPARING:
                self._join_timer_fired(group)
        elif kind == "sync":
            self._sync_expired(group)

    def _heartbeat_expired(self, group: Group, member_id: str) -> None:
        """``expireClassicGroupMemberHeartbeat``."""
        if group.state == DEAD:
            return
        if member_id in group.pending_members:
            group.pending_members.discard(member_id)
            self._note("pending member expired", group=group.group_id, member=member_id)
            if group.state == PREPARING and group.has_all_members_joined():
                self._complete_join_phase(group)
            return
        member = group.members.get(member_id)
        if member is None:
            return
        if not member.has_satisfied_heartbeat():
            self._remove_member_and_update_group(group, member, "session timeout expired")

    def _sync_expired(self, group: Group) -> None:
        """``expirePendingSync`` (KAFKA-12890): members that did not send SyncGroup within the
        rebalance timeout are removed, static ones included, and the group rebalances."""
        if group.sync_generation != group.generation:
            return
        if group.state not in (COMPLETING, STABLE):
            return
        if group.pending_sync:
            pending = sorted(group.pending_sync)
            for mid in pending:
                self._remove_member_raw(group, mid)
                self._note("member removed", group=group.group_id, member=mid, reason="no SyncGroup in time")
            self._prepare_rebalance(group, f"members {pending} did not send SyncGroup in time")

    # ======================================================== OffsetCommit (§A.9)

    def commit_offsets(self, token: int, req: CommitRequest, now_ms: int) -> list[Effect]:
        self._begin(now_ms)
        self._commit(token, req)
        return self._end()

    @staticmethod
    def _all_partitions(req: CommitRequest, error: ErrorCode) -> CommitResult:
        return CommitResult(
            tuple(TopicErrors(t.name, tuple((p.partition, error) for p in t.partitions)) for t in req.topics)
        )

    def _commit(self, token: int, req: CommitRequest) -> None:
        err = self._unavailable(self.partition_for(req.group_id))
        if err is not None:
            self._respond(token, self._all_partitions(req, err))
            return
        group = self.groups.get(req.group_id)
        if group is None:
            if req.generation_id < 0:
                # Admin clients and manual assignment: a "simple" group is created.
                group = self._new_group(req.group_id)
            else:
                # OffsetMetadataManager.validateOffsetCommit: GROUP_ID_NOT_FOUND from v9.
                code = E.GROUP_ID_NOT_FOUND if req.api_version >= 9 else E.ILLEGAL_GENERATION
                self._respond(token, self._all_partitions(req, code))
                return
        err = self._validate_offset_commit(group, req)
        if err is not None:
            self._respond(token, self._all_partitions(req, err))
            return
        if group.state in (STABLE, PREPARING):
            member = group.members.get(req.member_id)
            if member is not None:
                self._reschedule_heartbeat(group, member)  # commits keep the session alive

        expire = None if req.retention_time_ms == -1 else self._now + req.retention_time_ms
        topics: list[TopicErrors] = []
        records: list[Record] = []
        entries: list[tuple[tuple[str, int], OffsetCommitValue]] = []
        for t in req.topics:
            parts: list[tuple[int, ErrorCode]] = []
            for p in t.partitions:
                meta = p.metadata if p.metadata is not None else ""
                if java_string_length(meta) > self.config.metadata_max_bytes:
                    parts.append((p.partition, E.OFFSET_METADATA_TOO_LARGE))
                    continue
                parts.append((p.partition, E.NONE))
                value = OffsetCommitValue(
                    offset=p.offset,
                    metadata=meta,
                    commit_timestamp=self._now,
                    leader_epoch=p.leader_epoch,
                    expire_timestamp=expire,
                )
                records.append((OffsetCommitKey(group.group_id, t.name, p.partition), value))
                entries.append(((t.name, p.partition), value))
            topics.append(TopicErrors(t.name, tuple(parts)))
        result = CommitResult(tuple(topics))
        if not records:
            self._respond(token, result)
            return

        def appended(error: ErrorCode | None) -> None:
            group.pending_commits.pop(pid, None)
            if error is not None:
                self._respond(token, self._all_partitions(req, response_error(error)))
            else:
                if self.groups.get(group.group_id) is group:
                    for tp, value in entries:
                        group.offsets[tp] = value
                self._respond(token, result)
            self._release_stable_fetches(pid)

        pid = self._persist(group.partition, records, appended)
        group.pending_commits[pid] = tuple(tp for tp, _ in entries)

    def _validate_offset_commit(self, group: Group, req: CommitRequest) -> ErrorCode | None:
        """``ClassicGroup.validateOffsetCommit`` (non-transactional)."""
        if group.state == DEAD:
            return E.COORDINATOR_NOT_AVAILABLE
        if req.generation_id < 0 and group.state == EMPTY:
            return None  # admin client / manual assignment
        if req.generation_id >= 0 or req.member_id != "" or req.group_instance_id is not None:
            err = self._validate_member(group, req.member_id, req.group_instance_id)
            if err is not None:
                return err
            if req.generation_id != group.generation:
                return E.ILLEGAL_GENERATION
        elif group.state != EMPTY:
            return E.UNKNOWN_MEMBER_ID
        if group.state == COMPLETING:
            return E.REBALANCE_IN_PROGRESS
        return None

    # ========================================================= OffsetFetch (§A.10)

    def fetch_offsets(self, token: int, req: FetchRequest, now_ms: int) -> list[Effect]:
        self._begin(now_ms)
        if req.require_stable:
            # Java coordinator: a RequireStable fetch is a write operation, answered once the
            # commits pending before it are written (GroupCoordinatorService.fetchOffsets);
            # it never needs UNSTABLE_OFFSET_COMMIT without transactions.
            waiting: set[int] = set()
            for g in req.groups:
                group = self.groups.get(g.group_id)
                if group is not None and self._unavailable(group.partition) is None:
                    waiting.update(group.pending_commits)
            if waiting:
                self._stable_fetches.append(_StableFetch(token, req, waiting))
                return self._end()
        self._respond(token, self._fetch_now(req))
        return self._end()

    def _release_stable_fetches(self, persist_id: int) -> None:
        still: list[_StableFetch] = []
        for w in self._stable_fetches:
            w.waiting_for.discard(persist_id)
            if w.waiting_for:
                still.append(w)
            else:
                self._respond(w.token, self._fetch_now(w.request))
        self._stable_fetches = still

    def _fetch_now(self, req: FetchRequest) -> FetchResult:
        return FetchResult(tuple(self._fetch_group(g) for g in req.groups))

    def _fetch_group(self, req: FetchGroupRequest) -> FetchGroupResult:
        err = self._unavailable(self.partition_for(req.group_id))
        if err is not None:
            return FetchGroupResult(req.group_id, err)
        group = self.groups.get(req.group_id)
        known = group is not None and group.state != DEAD
        offsets = group.offsets if group is not None and known else {}
        if req.topics is None:
            by_topic: dict[str, list[FetchPartition]] = {}
            for (topic, part), v in offsets.items():
                by_topic.setdefault(topic, []).append(FetchPartition(part, v.offset, v.leader_epoch, v.metadata))
            return FetchGroupResult(req.group_id, E.NONE, tuple(FetchTopic(t, tuple(ps)) for t, ps in by_topic.items()))
        topics = []
        for name, parts in req.topics:
            out = []
            for p in parts:
                c = offsets.get((name, p))
                out.append(FetchPartition(p) if c is None else FetchPartition(p, c.offset, c.leader_epoch, c.metadata))
            topics.append(FetchTopic(name, tuple(out)))
        return FetchGroupResult(req.group_id, E.NONE, tuple(topics))

    # ========================================================= OffsetDelete (§A.11)

    def delete_offsets(self, token: int, req: OffsetDeleteRequest, now_ms: int) -> list[Effect]:
        self._begin(now_ms)
        self._delete_offsets(token, req)
        return self._end()

    def _delete_offsets(self, token: int, req: OffsetDeleteRequest) -> None:
        if not self._active:
            self._respond(token, OffsetDeleteResult(E.COORDINATOR_NOT_AVAILABLE))
            return
        if not req.group_id:
            self._respond(token, OffsetDeleteResult(E.INVALID_GROUP_ID))
            return
        if self.partition_for(req.group_id) in self._loading:
            self._respond(token, OffsetDeleteResult(E.COORDINATOR_LOAD_IN_PROGRESS))
            return
        group = self.groups.get(req.group_id)
        if group is None or group.state == DEAD:
            self._respond(token, OffsetDeleteResult(E.GROUP_ID_NOT_FOUND))
            return
        if group.state in (STABLE, PREPARING, COMPLETING) and not group.uses_consumer_protocol():
            self._respond(token, OffsetDeleteResult(E.NON_EMPTY_GROUP))
            return
        topics: list[TopicErrors] = []
        records: list[Record] = []
        for name, parts in req.topics:
            if group.is_subscribed_to(name):
                topics.append(TopicErrors(name, tuple((p, E.GROUP_SUBSCRIBED_TO_TOPIC) for p in parts)))
                continue
            for p in parts:
                if group.offsets.pop((name, p), None) is not None:
                    records.append((OffsetCommitKey(group.group_id, name, p), None))
            topics.append(TopicErrors(name, tuple((p, E.NONE) for p in parts)))
        result = OffsetDeleteResult(E.NONE, tuple(topics))
        if not records:
            self._respond(token, result)
            return

        def written(error: ErrorCode | None) -> None:
            self._respond(token, result if error is None else OffsetDeleteResult(response_error(error)))

        self._persist(group.partition, records, written)

    # ======================================================= DescribeGroups (§A.11)

    def describe(self, token: int, group_ids: Iterable[str], api_version: int, now_ms: int) -> list[Effect]:
        self._begin(now_ms)
        self._respond(token, DescribeResult(tuple(self._describe_one(g, api_version) for g in group_ids)))
        return self._end()

    def _describe_one(self, group_id: str, api_version: int) -> DescribedGroup:
        err = self._unavailable(self.partition_for(group_id))
        if err is not None:
            return DescribedGroup(group_id, err)
        group = self.groups.get(group_id)
        if group is None or group.state == DEAD:
            if api_version >= 6:
                # KIP-1043 (apache/kafka#17706): v6 reports unknown groups as GROUP_ID_NOT_FOUND.
                return DescribedGroup(group_id, E.GROUP_ID_NOT_FOUND, f"Group {group_id} not found.")
            return DescribedGroup(group_id, E.NONE, state=DEAD.value)
        if group.state == STABLE:
            proto = group.protocol_name or ""
            members = tuple(
                DescribedMember(
                    m.member_id, m.group_instance_id, m.client_id, m.client_host, m.metadata(proto), m.assignment
                )
                for m in group.members.values()
            )
            return DescribedGroup(group_id, E.NONE, None, group.state.value, group.protocol_type or "", proto, members)
        members = tuple(
            DescribedMember(m.member_id, m.group_instance_id, m.client_id, m.client_host)
            for m in group.members.values()
        )
        return DescribedGroup(group_id, E.NONE, None, group.state.value, group.protocol_type or "", "", members)

    # ========================================================== ListGroups (§A.11)

    def list_groups(
        self, token: int, states_filter: Iterable[str], types_filter: Iterable[str], now_ms: int
    ) -> list[Effect]:
        self._begin(now_ms)
        self._respond(token, self._list(states_filter, types_filter))
        return self._end()

    def _list(self, states_filter: Iterable[str], types_filter: Iterable[str]) -> ListResult:
        if not self._active:
            return ListResult(E.COORDINATOR_NOT_AVAILABLE)
        if self._loading:
            return ListResult(E.COORDINATOR_LOAD_IN_PROGRESS)  # Java: no partial list
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

    # ======================================================== DeleteGroups (§A.11)

    def delete_groups(self, token: int, group_ids: Iterable[str], now_ms: int) -> list[Effect]:
        self._begin(now_ms)
        self._delete_groups(token, group_ids)
        return self._end()

    def _delete_groups(self, token: int, group_ids: Iterable[str]) -> None:
        ids = list(dict.fromkeys(group_ids))  # KafkaApis: .distinct
        results: dict[str, ErrorCode] = {}
        by_partition: dict[int, tuple[list[str], list[Record]]] = {}
        for gid in ids:
            err = self._unavailable(self.partition_for(gid))
            group = self.groups.get(gid)
            if err is None and (group is None or group.state == DEAD):
                err = E.GROUP_ID_NOT_FOUND
            if err is None and group is not None and group.state != EMPTY:
                err = E.NON_EMPTY_GROUP
            if err is not None or group is None:
                results[gid] = err or E.GROUP_ID_NOT_FOUND
                continue
            names, records = by_partition.setdefault(group.partition, ([], []))
            names.append(gid)
            records.extend((OffsetCommitKey(gid, t, p), None) for (t, p) in group.offsets)
            records.append((GroupMetadataKey(gid), None))
            self._transition(group, DEAD, "deleted by DeleteGroups")
            self._drop_group(group)
            results[gid] = E.NONE
        outstanding = [len(by_partition)]

        def finish() -> None:
            self._respond(token, DeleteGroupsResult(tuple((gid, results[gid]) for gid in ids)))

        if not by_partition:
            finish()
            return
        for partition, (names, records) in by_partition.items():

            def written(error: ErrorCode | None, names: list[str] = names) -> None:
                if error is not None:
                    for n in names:
                        results[n] = response_error(error)
                outstanding[0] -= 1
                if outstanding[0] == 0:
                    finish()

            self._persist(partition, records, written)

    # ===================================================== offsets retention (§A.9)

    def _expire_offsets(self) -> None:
        """``GroupCoordinatorShard.cleanupGroupMetadata`` (Java): expire offsets per group;
        an Empty group left without offsets becomes Dead and gets a tombstone."""
        by_partition: dict[int, list[Record]] = {}
        expired_count = 0
        dead: list[str] = []
        for group in list(self.groups.values()):
            records = by_partition.setdefault(group.partition, [])
            before = len(records)
            had_offsets = bool(group.offsets)
            if self._cleanup_expired_offsets(group, records):
                if group.state == EMPTY:
                    records.append((GroupMetadataKey(group.group_id), None))
                    self._transition(group, DEAD, "all offsets expired" if had_offsets else "empty group expired")
                    self._drop_group(group)
                    dead.append(group.group_id)
            expired_count += len(records) - before
        self._arm(RETENTION_KEY, self.config.retention_check_interval_ms)
        if expired_count:
            self._note("offsets expired", tombstones=expired_count, dead_groups=dead)
        for partition, records in by_partition.items():
            if records:

                def written(error: ErrorCode | None, partition: int = partition) -> None:
                    if error is not None:
                        # Kafka appends these with acks=0: a lost tombstone is retried by the
                        # next purge only if the entry still exists; we just log.
                        self._note("failed to write expiry tombstones", partition=partition, error=error.name)

                self._persist(partition, records, written)

    def _cleanup_expired_offsets(self, group: Group, records: list[Record]) -> bool:
        """``OffsetMetadataManager.cleanupExpiredOffsets``: True when the group has no
        offsets left."""
        if not group.offsets:
            return True
        base: Callable[[OffsetCommitValue], int] | None
        if group.protocol_type is not None:
            if group.state == EMPTY:
                ts = group.state_timestamp
                base = (lambda v: ts) if ts is not None else (lambda v: v.commit_timestamp)
            elif group.uses_consumer_protocol() and group.subscribed_topics is not None and group.state == STABLE:
                base = lambda v: v.commit_timestamp  # noqa: E731
            else:
                base = None
        else:
            base = lambda v: v.commit_timestamp  # noqa: E731  simple group
        if base is None:
            return False
        pending = {tp for tps in group.pending_commits.values() for tp in tps}
        all_expired = True
        for (topic, part), v in list(group.offsets.items()):
            if group.is_subscribed_to(topic):
                all_expired = False
                continue
            if v.expire_timestamp is not None:
                expired = self._now >= v.expire_timestamp
            else:
                expired = self._now - base(v) >= self.config.retention_ms
            # Scala: an offset with a commit still being written never expires.
            if expired and (topic, part) not in pending:
                del group.offsets[(topic, part)]
                records.append((OffsetCommitKey(group.group_id, topic, part), None))
            else:
                all_expired = False
        return all_expired

    # ======================================================= topic deletion (§B.2)

    def topics_deleted(self, topics: Iterable[str], now_ms: int) -> list[Effect]:
        """Topics were deleted: their committed offsets go, with tombstones
        (``OffsetMetadataManager.onPartitionsDeleted``)."""
        self._begin(now_ms)
        names = set(topics)
        by_partition: dict[int, list[Record]] = {}
        for group in self.groups.values():
            for topic, part in [tp for tp in group.offsets if tp[0] in names]:
                del group.offsets[(topic, part)]
                by_partition.setdefault(group.partition, []).append(
                    (OffsetCommitKey(group.group_id, topic, part), None)
                )
        for partition, records in by_partition.items():

            def written(error: ErrorCode | None, partition: int = partition) -> None:
                if error is not None:
                    self._note("failed to write deleted-topic tombstones", partition=partition, error=error.name)

            self._persist(partition, records, written)
        if by_partition:
            self._note("offsets of deleted topics removed", topics=sorted(names))
        return self._end()

    # ========================================================= persistence results

    def persist_done(self, persist_id: int, error: ErrorCode | None, now_ms: int) -> list[Effect]:
        """The batch of ``Persist(persist_id, ...)`` was appended (``error`` None) or failed."""
        self._begin(now_ms)
        done = self._continuations.pop(persist_id, None)
        if done is not None:
            done(error)
        return self._end()

    def pending_persists(self) -> int:
        return len(self._continuations)
