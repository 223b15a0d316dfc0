"""The classic group model: states, the transition table, members and the group itself.

Kafka's counterparts are ``classic/ClassicGroupState.java``, ``classic/ClassicGroupMember.java``
and ``classic/ClassicGroup.java``.  Everything here is plain data and queries on it: nothing
answers a request, arms a timer or writes a record (``classic.py``, ``registry.py`` and
``offsets.py`` do, through ``context.py``).

States and legal transitions (docs/groups.md, "States and transitions"), enforced by
:func:`assert_transition`, which :meth:`ClassicGroup.transition_to` calls; the coordinator
changes a group's state only through ``Context.transition``::

    to                    allowed from
    PreparingRebalance    Stable, CompletingRebalance, Empty
    CompletingRebalance   PreparingRebalance
    Stable                CompletingRebalance
    Empty                 PreparingRebalance
    Dead                  any (Dead included)

A new group starts Empty (previous state Dead) and a loaded one Stable or Empty; neither is a
transition.  Nor is :meth:`ClassicGroup.restore_state`, which undoes a move to Dead whose
tombstone could not be written (docs/groups.md, "When a write fails").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from enum import Enum
from typing import Final

from msgspec import Struct, field
from rallypoint.protocol.consumer_protocol import ConsumerProtocolError, decode_subscription_topics
from rallypoint.protocol.errors import ErrorCode
from rallypoint.protocol.offsets_schema import OffsetCommitValue

from ..config import default
from .events import JoinMember, Protocol

E = ErrorCode

CONSUMER_PROTOCOL_TYPE: Final = "consumer"
GROUP_TYPE_CLASSIC: Final = "classic"
# GroupCoordinatorConfig.java (CLASSIC_GROUP_NEW_MEMBER_JOIN_TIMEOUT_MS).
NEW_MEMBER_JOIN_TIMEOUT_MS: Final = 5 * 60 * 1000


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

# The legal previous states of each state (ClassicGroupState.java).
VALID_PREVIOUS_STATES: Final[Mapping[GroupState, frozenset[GroupState]]] = {
    PREPARING: frozenset({STABLE, COMPLETING, EMPTY}),
    COMPLETING: frozenset({PREPARING}),
    STABLE: frozenset({COMPLETING}),
    EMPTY: frozenset({PREPARING}),
    DEAD: frozenset(GroupState),
}


class IllegalTransition(RuntimeError):
    """A transition the table above forbids: always a bug in the coordinator."""


def assert_transition(group_id: str, from_state: GroupState, to_state: GroupState) -> None:
    if from_state not in VALID_PREVIOUS_STATES[to_state]:
        raise IllegalTransition(f"group {group_id}: {from_state.value} -> {to_state.value} is not a legal transition")


class NoCommonProtocol(RuntimeError):
    """The vote found no protocol every member supports (Kafka's ``vote`` throws too)."""


class GroupConfig(Struct, frozen=True):
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


# ---------------------------------------------------------------------- Java hash-map order


def java_string_hash(s: str) -> int:
    """Java's ``String.hashCode`` (over UTF-16 code units), as an unsigned 32-bit int."""
    b = s.encode("utf-16-be")
    h = 0
    for i in range(0, len(b), 2):
        h = (31 * h + ((b[i] << 8) | b[i + 1])) & 0xFFFFFFFF
    return h


def java_hash_map_order(keys: Iterable[str]) -> list[str]:
    """The iteration order of a fresh ``java.util.HashMap<String, ?>`` into which ``keys`` were
    put in this order: by bucket (the spread hash masked by the table size, which starts at 16
    and doubles past a 0.75 load), insertion order within a bucket."""
    ordered = list(keys)
    capacity = 16
    while len(ordered) > capacity * 3 // 4:
        capacity *= 2

    def bucket(k: str) -> int:
        h = java_string_hash(k)
        return (h ^ (h >> 16)) & (capacity - 1)

    return sorted(ordered, key=bucket)  # sorted() is stable: insertion order within a bucket


# ------------------------------------------------------------------------------- members


class Member(Struct, eq=False, gc=False):  # untracked by the collector: no field refers back
    """A classic group member (``ClassicGroupMember``)."""

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
    # When the session (or the new-member join timeout) expires, wall-clock ms; 0: no
    # deadline (its expiry already fired).  The group's SessionsKey timer watches it.
    session_deadline: int = 0

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
        """The member's most preferred protocol among ``candidates`` (``ClassicGroupMember.vote``)."""
        for p in self.protocols:
            if p.name in candidates:
                return p.name
        return None

    def has_satisfied_heartbeat(self) -> bool:
        """``ClassicGroupMember.hasSatisfiedHeartbeat`` (docs/groups.md,
        "Heartbeat and sessions"): a new member must be re-armed explicitly; one awaiting join
        or sync is alive; otherwise it missed its heartbeat."""
        if self.is_new:
            return False
        return self.join_token is not None or self.sync_token is not None


# --------------------------------------------------------------------------------- group


def discard(ids: set[str], member_id: str) -> None:
    """``ids.discard(member_id)``, and the set's table given back once it is empty: a set keeps
    the table it grew to (some 500 bytes for a group of ten) until it is cleared."""
    ids.discard(member_id)
    if not ids:
        ids.clear()


_NO_TOPICS: frozenset[str] = frozenset()
_SUBSCRIBED: dict[frozenset[str], frozenset[str]] = {}  # one object per distinct set of topics
_SUBSCRIBED_MAX = 4096


def _shared(topics: frozenset[str]) -> frozenset[str]:
    """An equal set already held by another group, if any: groups of one application subscribe
    to the same topics, and each frozenset is some 200 bytes."""
    if not topics:
        return _NO_TOPICS
    held = _SUBSCRIBED.get(topics)
    if held is None:
        if len(_SUBSCRIBED) >= _SUBSCRIBED_MAX:
            _SUBSCRIBED.clear()  # bounded: only sharing is lost
        held = _SUBSCRIBED[topics] = topics
    return held


class ClassicGroup(Struct, eq=False):
    """One classic group (``ClassicGroup``).  Its committed offsets live in ``offsets.py``,
    which asks the group the questions below (``validate_offset_commit`` ...) and nothing else
    about it: any group type that answers them can use the offsets manager."""

    group_id: str
    partition: int  # its __consumer_offsets partition
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
    new_member_added: bool = False  # extends the initial delayed join
    initial_join: tuple[int, int] | None = None  # (delay, remaining) of an armed initial delayed join
    sync_generation: int = -1  # generation the pending-sync timer was armed for
    subscribed_topics: frozenset[str] | None = None

    # ------------------------------------------------------------------ state changes

    def transition_to(self, to: GroupState, now_ms: int) -> GroupState:
        """Move to ``to`` if the table allows it; returns the state left."""
        assert_transition(self.group_id, self.state, to)
        frm = self.state
        self.previous_state = frm
        self.state = to
        self.state_timestamp = now_ms
        return frm

    def saved_state(self) -> tuple[GroupState, GroupState, int | None]:
        return (self.state, self.previous_state, self.state_timestamp)

    def restore_state(self, saved: tuple[GroupState, GroupState, int | None]) -> None:
        """Undo a move to Dead whose tombstone was not written (a reverted write, not a
        transition: docs/groups.md, "When a write fails")."""
        self.state, self.previous_state, self.state_timestamp = saved

    # ----------------------------------------------------------- member bookkeeping
    # Parked requests of a member are answered by the caller (classic.py) before it removes or
    # replaces the member: these methods only keep the group's own books straight.

    def count_protocols(self, member: Member, delta: int) -> None:
        for p in member.protocols:
            self.supported_protocols[p.name] = self.supported_protocols.get(p.name, 0) + delta

    def add(self, member: Member, join_token: int | None) -> None:
        """``ClassicGroup.add``: the first member sets the protocol type and leads."""
        if member.group_instance_id is not None:
            self.static_members[member.group_instance_id] = member.member_id
        if not self.members:
            self.protocol_type = member.protocol_type
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        self.count_protocols(member, +1)
        member.join_token = join_token
        if join_token is not None:
            self.num_awaiting_join += 1
        discard(self.pending_members, member.member_id)

    def remove(self, member_id: str) -> None:
        """``ClassicGroup.remove``: the leader passes to the first remaining member.  The
        member must have no parked request left."""
        member = self.members.pop(member_id, None)
        if member is not None:
            assert member.join_token is None and member.sync_token is None, member_id
            self.count_protocols(member, -1)
            if member.group_instance_id is not None and self.static_members.get(member.group_instance_id) == member_id:
                del self.static_members[member.group_instance_id]
        if self.is_leader(member_id):
            self.leader_id = next(iter(self.members), None)
        discard(self.pending_members, member_id)
        discard(self.pending_sync, member_id)

    def update_member(
        self,
        member: Member,
        protocols: tuple[Protocol, ...],
        rebalance_timeout_ms: int,
        session_timeout_ms: int,
        join_token: int | None,
    ) -> int | None:
        """``ClassicGroup.updateMember``.  Returns the member's previous parked JoinGroup when a
        new one replaces it (the caller answers it)."""
        self.count_protocols(member, -1)
        member.protocols = protocols
        self.count_protocols(member, +1)
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms
        if join_token is not None and member.join_token is not None:
            replaced = member.join_token
            member.join_token = join_token
            return replaced
        if join_token is not None and member.join_token is None:
            self.num_awaiting_join += 1
        elif join_token is None and member.join_token is not None:
            self.num_awaiting_join -= 1
        member.join_token = join_token
        return None

    def finish_join(self, member: Member) -> int | None:
        """The member's parked JoinGroup is being answered: returns its token (None if none)."""
        token = member.join_token
        if token is not None:
            member.join_token = None
            self.num_awaiting_join -= 1
        return token

    def replace_static_member(self, instance_id: str, old_id: str, new_id: str) -> Member:
        """``ClassicGroup.replaceStaticMember``: the member under a new id, with the old one's
        protocols, timeouts and assignment.  The old member's parked requests must have been
        answered already."""
        old = self.members.pop(old_id)
        assert old.join_token is None and old.sync_token is None, old_id
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
        self.members[new_id] = new
        # Like Kafka, the pending-sync set keeps the old id.
        if self.is_leader(old_id):
            self.leader_id = new_id
        self.static_members[instance_id] = new_id
        return new

    # -------------------------------------------------------------------------- queries

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id is not None and self.leader_id == member_id

    def is_empty(self) -> bool:
        return self.state == EMPTY

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
        """``ClassicGroup.supportsProtocols``."""
        names = list(names)
        if self.state == EMPTY:
            return bool(protocol_type) and bool(names)
        n = len(self.members)
        return self.protocol_type == protocol_type and any(self.supported_protocols.get(p, 0) == n for p in names)

    def select_protocol(self) -> str:
        """The protocol every member supports that gets the most votes
        (``ClassicGroup.selectProtocol``; docs/groups.md, "Choosing the protocol").

        Ties go as in Kafka: its votes are counted in a ``java.util.HashMap`` and the first
        protocol of that map's iteration order with the most votes wins, so e.g. ``range``
        beats ``roundrobin`` and ``cooperative-sticky``.
        """
        if not self.members:
            raise NoCommonProtocol(f"group {self.group_id}: cannot select a protocol for an empty group")
        n = len(self.members)
        candidates = {p for p, c in self.supported_protocols.items() if c == n}
        votes: dict[str, int] = {}
        for m in self.members.values():
            choice = m.vote(candidates)
            if choice is None:
                raise NoCommonProtocol(f"group {self.group_id}: member {m.member_id} supports no candidate protocol")
            votes[choice] = votes.get(choice, 0) + 1
        order = java_hash_map_order(votes)
        best = order[0]
        for p in order[1:]:
            if votes[p] > votes[best]:
                best = p
        return best

    def compute_subscribed_topics(self) -> frozenset[str] | None:
        """``ClassicGroup.computeSubscribedTopics``: each member's ConsumerProtocol
        subscription read with its v0 schema, when the group uses the consumer protocol."""
        if self.protocol_type is None or self.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return None
        if not self.members:
            return _NO_TOPICS
        if self.protocol_name is None:
            return None
        topics: set[str] = set()
        for m in self.members.values():
            try:
                topics.update(decode_subscription_topics(m.metadata(self.protocol_name)))
            except ConsumerProtocolError:
                return None
        return _shared(frozenset(topics))

    def current_members(self) -> tuple[JoinMember, ...]:
        """The leader's member list: every member with its metadata for the chosen protocol."""
        return tuple(
            JoinMember(m.member_id, m.group_instance_id, m.metadata(self.protocol_name)) for m in self.members.values()
        )

    def validate_member(self, member_id: str, instance_id: str | None) -> ErrorCode | None:
        """``ClassicGroup.validateMember`` (docs/groups.md, "Static membership": fencing)."""
        if instance_id is not None:
            existing = self.static_members.get(instance_id)
            if existing is None:
                return E.UNKNOWN_MEMBER_ID
            if existing != member_id:
                return E.FENCED_INSTANCE_ID
        if member_id not in self.members:
            return E.UNKNOWN_MEMBER_ID
        return None

    # ------------------------------------------------- what the offsets manager asks

    def validate_offset_commit(
        self, member_id: str, instance_id: str | None, generation_id: int, *, transactional: bool = False
    ) -> ErrorCode | None:
        """May this member, in this generation, commit?  (``ClassicGroup.validateOffsetCommit``.)
        A transactional commit without an identity is accepted on any group, and is never
        refused with REBALANCE_IN_PROGRESS."""
        if self.state == DEAD:
            return E.COORDINATOR_NOT_AVAILABLE
        if generation_id < 0 and self.state == EMPTY:
            return None  # admin client / manual assignment
        if generation_id >= 0 or member_id != "" or instance_id is not None:
            err = self.validate_member(member_id, instance_id)
            if err is not None:
                return err
            if generation_id != self.generation:
                return E.ILLEGAL_GENERATION
        elif self.state != EMPTY and not transactional:
            return E.UNKNOWN_MEMBER_ID
        if self.state == COMPLETING and not transactional:
            return E.REBALANCE_IN_PROGRESS
        return None

    def validate_offset_delete(self) -> ErrorCode | None:
        """``ClassicGroup.validateOffsetDelete``."""
        if self.state == DEAD:
            return E.GROUP_ID_NOT_FOUND
        if self.state in (STABLE, PREPARING, COMPLETING) and not self.uses_consumer_protocol():
            return E.NON_EMPTY_GROUP
        return None

    def offset_expiration_base(self) -> Callable[[OffsetCommitValue], int] | None:
        """From when an offset's retention counts, or None when offsets may not expire now
        (``ClassicGroup.offsetExpirationCondition``; docs/groups.md, "Offsets retention")."""
        if self.protocol_type is None:
            return lambda v: v.commit_timestamp  # a simple group
        if self.state == EMPTY:
            ts = self.state_timestamp
            if ts is not None:
                return lambda v: ts
            return lambda v: v.commit_timestamp
        if self.uses_consumer_protocol() and self.subscribed_topics is not None and self.state == STABLE:
            return lambda v: v.commit_timestamp
        return None
