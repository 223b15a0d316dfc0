"""What goes into the group coordinator and what comes out of it: plain, immutable data.

Requests are the group APIs' request bodies after the handler normalised them across
versions (the coordinator still sees ``api_version`` where Kafka's semantics depend on it).
Results are what a handler encodes back.  Effects are the coordinator's instructions to the
runtime: respond to a parked request, arm or cancel a timer, persist records, log a state
transition or an internal error.  Nothing here does any I/O.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import NamedTuple, TypeAlias

from msgspec import Struct, field
from rallypoint.protocol.errors import ErrorCode

from .persist import Record

NONE = ErrorCode.NONE

# ------------------------------------------------------------------------------- requests


class Protocol(Struct, frozen=True, gc=False):  # a name and bytes: untracked by the collector
    """One (name, metadata) entry of a JoinGroup request; metadata is relayed byte-exact."""

    name: str
    metadata: bytes


class JoinRequest(Struct, frozen=True):
    """A JoinGroup request: the member, its timeouts and the protocols it supports."""

    group_id: str
    member_id: str
    group_instance_id: str | None
    session_timeout_ms: int
    rebalance_timeout_ms: int  # v0: the handler passes the session timeout (Kafka does the same)
    protocol_type: str
    protocols: tuple[Protocol, ...]
    client_id: str
    client_host: str
    api_version: int
    reason: str | None = None


class SyncRequest(Struct, frozen=True):
    """A SyncGroup request; the leader's carries every member's assignment as (member id, bytes)."""

    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None
    protocol_type: str | None
    protocol_name: str | None
    assignments: tuple[tuple[str, bytes], ...]
    api_version: int


class HeartbeatRequest(Struct, frozen=True):
    """A Heartbeat request: a member at a generation."""

    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None = None


class LeaveMember(Struct, frozen=True):
    """One member of a LeaveGroup request (from v3 a request may name several)."""

    member_id: str
    group_instance_id: str | None = None
    reason: str | None = None


class LeaveRequest(Struct, frozen=True):
    """A LeaveGroup request: the members that leave the group."""

    group_id: str
    members: tuple[LeaveMember, ...]


class CommitPartition(Struct, frozen=True):
    """One partition's offset in an OffsetCommit or TxnOffsetCommit request."""

    partition: int
    offset: int
    leader_epoch: int = -1
    metadata: str | None = ""


class CommitTopic(Struct, frozen=True):
    """One topic of an OffsetCommit or TxnOffsetCommit request, with its partitions."""

    name: str
    partitions: tuple[CommitPartition, ...]
    topic_id: uuid.UUID | None = None  # OffsetCommit v10 names topics by id: stored with the offset


class CommitRequest(Struct, frozen=True):
    """An OffsetCommit request, or a TxnOffsetCommit one when ``producer`` is set."""

    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None
    retention_time_ms: int  # -1 = broker default (always -1 from v5 on)
    topics: tuple[CommitTopic, ...]
    api_version: int
    # TxnOffsetCommit: the transaction's (producer id, epoch); the offsets stay pending until
    # its COMMIT marker (docs/transactions.md, "Transactional offsets")
    producer: tuple[int, int] | None = None


class OffsetFetchGroupRequest(Struct, frozen=True):
    """One group of an OffsetFetch request and the partitions asked for."""

    group_id: str
    topics: tuple[tuple[str, tuple[int, ...]], ...] | None  # None = every committed offset
    # OffsetFetch v10: the id each named topic was asked by; an offset stored under another id
    # is not returned (Kafka's OffsetMetadataManager.fetchOffsets)
    topic_ids: Mapping[str, uuid.UUID] | None = None


class OffsetFetchRequest(Struct, frozen=True):
    """An OffsetFetch request: one group, or several from v8 on."""

    groups: tuple[OffsetFetchGroupRequest, ...]
    require_stable: bool = False


class OffsetDeleteRequest(Struct, frozen=True):
    """An OffsetDelete request: the group and the partitions whose offsets are deleted."""

    group_id: str
    topics: tuple[tuple[str, tuple[int, ...]], ...]


# -------------------------------------------------------------------------------- results


class JoinMember(Struct, frozen=True):
    """One member as a JoinGroup answer to the leader lists it, with its metadata for the chosen protocol."""

    member_id: str
    group_instance_id: str | None
    metadata: bytes


class JoinResult(Struct, frozen=True):
    """The answer to a JoinGroup request (the leader's lists the members)."""

    error: ErrorCode
    member_id: str = ""
    generation_id: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    members: tuple[JoinMember, ...] = ()
    skip_assignment: bool = False


class SyncResult(Struct, frozen=True):
    """The answer to a SyncGroup request: the member's assignment."""

    error: ErrorCode
    protocol_type: str | None = None
    protocol_name: str | None = None
    assignment: bytes = b""


class HeartbeatResult(Struct, frozen=True):
    """The answer to a Heartbeat request."""

    error: ErrorCode


class LeaveMemberResult(Struct, frozen=True):
    """One member's outcome in a LeaveGroup answer."""

    member_id: str
    group_instance_id: str | None
    error: ErrorCode


class LeaveResult(Struct, frozen=True):
    """The answer to a LeaveGroup request: its error and each member's."""

    error: ErrorCode
    members: tuple[LeaveMemberResult, ...] = ()


class TopicErrors(Struct, frozen=True):
    """One topic's partition errors in an OffsetCommit or OffsetDelete answer."""

    name: str
    partitions: tuple[tuple[int, ErrorCode], ...]


class CommitResult(Struct, frozen=True):
    """The answer to an OffsetCommit or TxnOffsetCommit request."""

    topics: tuple[TopicErrors, ...]


class OffsetFetchPartition(Struct, frozen=True):
    """One partition of an OffsetFetch answer: its committed offset, or its error."""

    partition: int
    offset: int = -1
    leader_epoch: int = -1
    metadata: str = ""
    error: ErrorCode = NONE


class OffsetFetchTopic(Struct, frozen=True):
    """One topic of an OffsetFetch answer."""

    name: str
    partitions: tuple[OffsetFetchPartition, ...]


class OffsetFetchGroupResult(Struct, frozen=True):
    """One group of an OffsetFetch answer: its error or its topics."""

    group_id: str
    error: ErrorCode = NONE
    topics: tuple[OffsetFetchTopic, ...] = ()


class OffsetFetchResult(Struct, frozen=True):
    """The answer to an OffsetFetch request: one entry per group asked for."""

    groups: tuple[OffsetFetchGroupResult, ...]


class OffsetDeleteResult(Struct, frozen=True):
    """The answer to an OffsetDelete request: the group's error and each partition's."""

    error: ErrorCode
    topics: tuple[TopicErrors, ...] = ()


class DescribedMember(Struct, frozen=True):
    """One member of a DescribeGroups answer, with its metadata and assignment bytes."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes = b""
    assignment: bytes = b""


class DescribedGroup(Struct, frozen=True):
    """One group of a DescribeGroups answer; ``protocol_data`` is the chosen protocol's name (when Stable)."""

    group_id: str
    error: ErrorCode = NONE
    error_message: str | None = None
    state: str = ""
    protocol_type: str = ""
    protocol_data: str = ""
    members: tuple[DescribedMember, ...] = ()


class DescribeResult(Struct, frozen=True):
    """The answer to a DescribeGroups request: one entry per group asked for."""

    groups: tuple[DescribedGroup, ...]


class ListedGroup(Struct, frozen=True):
    """One group of a ListGroups answer, with its group type (classic, consumer or share)."""

    group_id: str
    protocol_type: str
    state: str
    group_type: str = "classic"


class ListResult(Struct, frozen=True):
    """The answer to a ListGroups request."""

    error: ErrorCode
    groups: tuple[ListedGroup, ...] = ()


class DeleteGroupsResult(Struct, frozen=True):
    """The answer to a DeleteGroups request: each group id with its error."""

    results: tuple[tuple[str, ErrorCode], ...]


# ---------------------------------------------------------------------------- timer keys
# One small named tuple per kind of timer; at most one timer is armed per key (arming
# replaces).  ``sort_key`` orders timers that fall due at the same millisecond (the fake
# clock's ``advance`` fires them in that order).  Named tuples: keys are hashed on every
# heartbeat, and a tuple hashes and compares in C.  The trailing ``kind`` field (leave it at
# its default) keeps keys of different kinds with equal fields apart (a JoinKey and a SyncKey
# of one group).


class HeartbeatKey(NamedTuple):
    """A pending member's session (KIP-394: the member id handed out with MEMBER_ID_REQUIRED
    must come back within the session timeout).  A joined member's session is not a timer of
    its own: see :class:`SessionsKey`."""

    group_id: str
    member_id: str
    kind: str = "heartbeat"

    def sort_key(self) -> tuple[str, ...]:
        return (self.kind, self.group_id, self.member_id)


class SessionsKey(NamedTuple):
    """The sessions of a group's members (docs/groups.md, "Timers"): each member keeps its own
    deadline (``Member.session_deadline``, the new-member join timeout included) and the group
    has one timer, armed at or before the earliest of them; when it fires, every member whose
    deadline has passed expires, in deadline order, and the timer is armed again for the
    next.  A heartbeat moves its member's deadline only (a later one): no timer effect.

    Its ``sort_key`` is that of a heartbeat key with an empty member id, so at one millisecond
    the group's member sessions fire before its join and sync timers, as before."""

    group_id: str
    kind: str = "heartbeat"

    def sort_key(self) -> tuple[str, ...]:
        return (self.kind, self.group_id, "")


class JoinKey(NamedTuple):
    """The join phase of a rebalance (the initial delayed join included)."""

    group_id: str
    kind: str = "join"

    def sort_key(self) -> tuple[str, ...]:
        return (self.kind, self.group_id)


class SyncKey(NamedTuple):
    """Members that must send SyncGroup after a join phase (pending-sync expiry)."""

    group_id: str
    kind: str = "sync"

    def sort_key(self) -> tuple[str, ...]:
        return (self.kind, self.group_id)


class RetentionKey(NamedTuple):
    """The periodic offsets-retention pass (one for the whole coordinator)."""

    kind: str = "retention"

    def sort_key(self) -> tuple[str, ...]:
        return (self.kind,)


class ConsumerMemberKey(NamedTuple):
    """A timer of a member of a consumer (KIP-848) group: ``timer`` is ``session``,
    ``rebalance`` (revocation), or a classic member's ``join`` / ``sync`` deadline
    (docs/consumer-groups.md)."""

    timer: str
    group_id: str
    member_id: str
    kind: str = "consumer"

    def sort_key(self) -> tuple[str, ...]:
        return (self.kind, self.timer, self.group_id, self.member_id)


TimerKey: TypeAlias = HeartbeatKey | SessionsKey | JoinKey | SyncKey | RetentionKey | ConsumerMemberKey


# -------------------------------------------------------------------------------- effects


class Respond(Struct, frozen=True):
    """Release the request parked under ``token`` with ``result``."""

    token: int
    result: object


class ArmTimer(Struct, frozen=True):
    """(Re)arm the timer ``key`` to fire at ``deadline_ms`` (replaces an armed one).  The classic
    coordinator also says the deadline it replaces (``previous_ms``; None: none was armed), which
    its runtime schedules by; the consumer-group machine leaves it None (its runtime keeps its
    own deadlines)."""

    key: TimerKey
    deadline_ms: int
    previous_ms: int | None = None


class CancelTimer(Struct, frozen=True):
    """Cancel the timer ``key`` (nothing to do when it is not armed)."""

    key: TimerKey


class Persist(Struct, frozen=True):
    """Append ``records`` as one batch to ``__consumer_offsets`` partition ``partition``, then
    report back with ``GroupCoordinator.persist_done(persist_id, error, now_ms)``."""

    persist_id: int
    partition: int
    records: tuple[Record, ...]
    producer: tuple[int, int] | None = None  # a transactional batch of this (producer id, epoch)
    marker: bool | None = None  # a COMMIT (True) or ABORT (False) control batch of ``producer``


class Transition(Struct, frozen=True):
    """A group changed state (the runtime logs one structured event per transition)."""

    group_id: str
    partition: int
    from_state: str
    to_state: str
    generation: int
    leader: str | None
    members: int
    reason: str


class Note(Struct, frozen=True):
    """Something worth a log line (member added/removed, group created/loaded, ...)."""

    event: str
    fields: dict[str, object] = field(default_factory=dict)


class InternalError(Struct, frozen=True):
    """Handling an event raised: the coordinator answered what it had to and reloaded the
    groups involved (docs/groups.md, "Internal errors"); the runtime logs one error event."""

    event: str
    groups: tuple[str, ...]
    error: BaseException


Effect: TypeAlias = Respond | ArmTimer | CancelTimer | Persist | Transition | Note | InternalError
