"""The consumer-group (KIP-848) model: configuration, topic metadata view and hashes, regex
subscriptions, members and groups, and the pure helpers the machine uses (request validation,
epoch checks, record <-> assignment conversions).  No transitions happen here: the machine in
:mod:`rallypoint.groups.consumer` owns them (docs/consumer-groups.md).
"""

from __future__ import annotations

import hashlib
import struct
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, Protocol

from msgspec import Struct, field
from msgspec.structs import replace
from rallypoint.protocol.consumer_group_records import (
    CurrentMemberAssignmentValue,
    EpochTopicPartitions,
    MemberMetadataValue,
    RegularExpressionValue,
    TargetAssignmentMemberValue,
    TopicPartitions,
)
from rallypoint.protocol.errors import ErrorCode

from .assignors import BUILTIN
from .consumer_events import (
    ConsumerHeartbeat,
)
from .reconciliation import EpochAssignment, MemberAssignment, MemberState

INT32_MAX: Final = 2**31 - 1
JOIN_EPOCH: Final = 0
LEAVE_EPOCH: Final = -1
STATIC_LEAVE_EPOCH: Final = -2
GROUP_TYPE: Final = "consumer"
PROTOCOL_TYPE: Final = "consumer"

EMPTY: Final = "Empty"
ASSIGNING: Final = "Assigning"
RECONCILING: Final = "Reconciling"
STABLE: Final = "Stable"
DEAD: Final = "Dead"

MIGRATION_POLICIES: Final = ("bidirectional", "upgrade", "downgrade", "disabled")

# ----------------------------------------------------------------------------- configuration


class ConsumerGroupConfig(Struct, frozen=True):
    """The broker's ``group.consumer.*`` settings (docs/consumer-groups.md, "Configuration")."""

    session_timeout_ms: int = 45000
    heartbeat_interval_ms: int = 5000
    max_size: int = INT32_MAX
    classic_max_size: int = INT32_MAX  # group.max.size: bounds a downgrade to a classic group
    assignors: tuple[str, ...] = ("uniform", "range")
    migration_policy: str = "bidirectional"
    assignment_interval_ms: int = 1000
    num_partitions: int = 50  # offsets.topic.num.partitions

    def __post_init__(self) -> None:
        if not self.assignors:
            raise ValueError("group.consumer.assignors must name at least one assignor")
        unknown = [a for a in self.assignors if a not in BUILTIN]
        if unknown:
            raise ValueError(f"unknown assignor(s) {unknown}: rallypoint has {sorted(BUILTIN)}")
        if len(set(self.assignors)) != len(self.assignors):
            raise ValueError("group.consumer.assignors must not name an assignor twice")
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            raise ValueError("group.consumer.heartbeat.interval.ms must be below group.consumer.session.timeout.ms")

    @classmethod
    def from_settings(cls, get: Callable[[str], Any]) -> ConsumerGroupConfig:
        return cls(
            session_timeout_ms=int(get("group.consumer.session.timeout.ms")),
            heartbeat_interval_ms=int(get("group.consumer.heartbeat.interval.ms")),
            max_size=int(get("group.consumer.max.size")),
            classic_max_size=int(get("group.max.size")),
            assignors=tuple(a.strip() for a in str(get("group.consumer.assignors")).split(",") if a.strip()),
            migration_policy=str(get("group.consumer.migration.policy")).lower(),
            assignment_interval_ms=int(get("group.consumer.assignment.interval.ms")),
            num_partitions=int(get("offsets.topic.num.partitions")),
        )

    @property
    def default_assignor(self) -> str:
        return self.assignors[0]


# ------------------------------------------------------------------------------------ topics


class TopicInfo(Struct, frozen=True):
    """A topic as the machine sees it: id, name and partition count."""

    topic_id: uuid.UUID
    name: str
    partitions: int


class TopicsView(Protocol):
    """What the machine may read of the topic metadata (the data plane's topic store)."""

    def get(self, name: str) -> TopicInfo | None: ...

    def by_id(self, topic_id: uuid.UUID) -> TopicInfo | None: ...

    def names(self) -> Iterable[str]: ...


class StaticTopics:
    """A TopicsView over a dict (unit tests, tools)."""

    def __init__(self, topics: Iterable[TopicInfo] = ()) -> None:
        self._by_name: dict[str, TopicInfo] = {}
        self._by_id: dict[uuid.UUID, TopicInfo] = {}
        for t in topics:
            self.put(t)

    def put(self, t: TopicInfo) -> None:
        old = self._by_name.pop(t.name, None)
        if old is not None:
            self._by_id.pop(old.topic_id, None)
        self._by_name[t.name] = t
        self._by_id[t.topic_id] = t

    def create(self, name: str, partitions: int) -> TopicInfo:
        t = TopicInfo(uuid.uuid5(uuid.NAMESPACE_OID, f"rallypoint-test/{name}/{len(self._by_id)}"), name, partitions)
        self.put(t)
        return t

    def delete(self, name: str) -> None:
        t = self._by_name.pop(name)
        del self._by_id[t.topic_id]

    def get(self, name: str) -> TopicInfo | None:
        return self._by_name.get(name)

    def by_id(self, topic_id: uuid.UUID) -> TopicInfo | None:
        return self._by_id.get(topic_id)

    def names(self) -> Iterable[str]:
        return self._by_name.keys()


def topic_hash(t: TopicInfo) -> int:
    """A stable 64-bit hash of one topic's metadata (id, name, partition count).

    Kafka (KIP-1101) uses xxh3 over the same fields plus racks; rallypoint has no racks and
    uses BLAKE2b (docs/consumer-groups.md, "Metadata hash").
    """
    h = hashlib.blake2b(digest_size=8)
    h.update(t.topic_id.bytes)
    h.update(t.name.encode())
    h.update(struct.pack(">i", t.partitions))
    return int.from_bytes(h.digest(), "big", signed=True)


def group_metadata_hash(topics: Iterable[TopicInfo]) -> int:
    """The group's metadata hash: over its subscribed topics that exist, in name order."""
    ts = sorted(topics, key=lambda t: t.name)
    if not ts:
        return 0
    h = hashlib.blake2b(digest_size=8)
    for t in ts:
        h.update(struct.pack(">q", topic_hash(t)))
    return int.from_bytes(h.digest(), "big", signed=True)


# ----------------------------------------------------------------------------------- regexes


class RegexError(ValueError):
    pass


def compile_regex(pattern: str) -> Any:
    """RE2 syntax (Kafka uses RE2/J); matched against whole topic names."""
    import re2  # google-re2: the maintained RE2 binding (docs/consumer-groups.md, "Regex subscriptions")

    try:
        return re2.compile(pattern)
    except re2.error as e:
        raise RegexError(str(e)) from None


def resolve_regex(pattern: str, names: Iterable[str]) -> frozenset[str]:
    rx = compile_regex(pattern)
    return frozenset(n for n in names if rx.fullmatch(n) is not None)


# -------------------------------------------------------------------------------------- model

BLANK_META: Final = MemberMetadataValue(None, None, "", "", (), None, -1, None, None)


class ConsumerMember(Struct):
    """One member of a consumer group: its member-metadata record value and its current assignment."""

    member_id: str
    meta: MemberMetadataValue = BLANK_META
    assignment: MemberAssignment = field(default_factory=lambda: MemberAssignment(0, 0, MemberState.STABLE))

    @property
    def epoch(self) -> int:
        return self.assignment.epoch

    @property
    def instance_id(self) -> str | None:
        return self.meta.instance_id

    @property
    def uses_consumer_protocol(self) -> bool:
        return self.meta.classic_member_metadata is None


class ConsumerGroup(Struct):
    """One consumer group: epochs, members, target assignment, partition owners, regexes, member indexes."""

    group_id: str
    partition: int
    epoch: int = 1
    metadata_hash: int = 0
    assignment_epoch: int = 1
    assignment_timestamp: int = 0
    members: dict[str, ConsumerMember] = field(default_factory=dict)
    static: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    target: dict[str, dict[uuid.UUID, frozenset[int]]] = field(default_factory=dict)
    # (topic id, partition) -> (member id, member epoch) of the member owning or revoking it
    owners: dict[tuple[uuid.UUID, int], tuple[str, int]] = field(default_factory=dict)
    regexes: dict[str, RegularExpressionValue] = field(default_factory=dict)
    regex_names_seen: frozenset[str] | None = None  # topic names when regexes were last resolved
    has_partition_metadata: bool = False  # a legacy type-4 record to tombstone
    # indexes over the members, kept by add()/drop() so a heartbeat costs O(topics), not O(members)
    names: Counter[str] = field(default_factory=Counter)  # subscribed topic name -> members
    regex_users: Counter[str] = field(default_factory=Counter)  # regex -> members
    assignors: Counter[str] = field(default_factory=Counter)  # ServerAssignor -> members
    stable_at: Counter[int] = field(default_factory=Counter)  # epoch -> members STABLE at it

    def add(self, m: ConsumerMember) -> None:
        self.names.update(m.meta.subscribed_topic_names)
        if m.meta.subscribed_topic_regex:
            self.regex_users[m.meta.subscribed_topic_regex] += 1
        if m.meta.server_assignor:
            self.assignors[m.meta.server_assignor] += 1
        if m.assignment.state == MemberState.STABLE:
            self.stable_at[m.epoch] += 1

    def drop(self, m: ConsumerMember) -> None:
        self.names.subtract(m.meta.subscribed_topic_names)
        if m.meta.subscribed_topic_regex:
            self.regex_users[m.meta.subscribed_topic_regex] -= 1
        if m.meta.server_assignor:
            self.assignors[m.meta.server_assignor] -= 1
        if m.assignment.state == MemberState.STABLE:
            self.stable_at[m.epoch] -= 1
        for c in (self.names, self.regex_users, self.assignors, self.stable_at):
            for k in [k for k, v in c.items() if v <= 0]:
                del c[k]

    def state(self) -> str:
        if not self.members:
            return EMPTY
        if self.epoch > self.assignment_epoch:
            return ASSIGNING
        if self.stable_at.get(self.assignment_epoch, 0) != len(self.members):
            return RECONCILING
        return STABLE

    def partition_epoch(self, topic_id: uuid.UUID, partition: int) -> int:
        o = self.owners.get((topic_id, partition))
        return -1 if o is None else o[1]

    def regex_subscribers(self, regex: str) -> int:
        return self.regex_users.get(regex, 0)


class OwnershipError(RuntimeError):
    """A replayed assignment would give a partition two owners (Kafka throws here too)."""


# ---------------------------------------------------------------------------------- helpers


def validate_heartbeat(req: ConsumerHeartbeat, config: ConsumerGroupConfig) -> tuple[ErrorCode, str] | None:
    """Kafka's request validation, in its order (docs/consumer-groups.md, "Heartbeat validation")."""
    inv = ErrorCode.INVALID_REQUEST
    epoch = req.member_epoch
    if (req.api_version >= 1 or epoch > 0 or epoch == LEAVE_EPOCH) and not req.member_id.strip():
        return inv, "MemberId can't be empty."
    if not req.group_id.strip():
        return inv, "GroupId can't be empty."
    if req.instance_id is not None and not req.instance_id.strip():
        return inv, "InstanceId can't be empty."
    if req.rack_id is not None and not req.rack_id.strip():
        return inv, "RackId can't be empty."
    if epoch == JOIN_EPOCH:
        if req.rebalance_timeout_ms == -1:
            return inv, "RebalanceTimeoutMs must be provided in first request."
        if req.topic_partitions is None or any(req.topic_partitions.values()):
            return inv, "TopicPartitions must be empty when (re-)joining."
        if req.subscribed_topic_names is None and req.subscribed_topic_regex is None:
            return inv, "SubscribedTopicNames or SubscribedTopicRegex must be set in first request."
    elif epoch == STATIC_LEAVE_EPOCH:
        if req.instance_id is None:
            return inv, "InstanceId can't be null."
    elif epoch < STATIC_LEAVE_EPOCH:
        return inv, f"MemberEpoch is invalid: {epoch}."
    if req.server_assignor is not None and req.server_assignor not in config.assignors:
        return (
            ErrorCode.UNSUPPORTED_ASSIGNOR,
            f"ServerAssignor {req.server_assignor} is not supported. "
            f"Supported assignors: {', '.join(config.assignors)}.",
        )
    return None


def check_epoch(member: ConsumerMember, req: ConsumerHeartbeat) -> str | None:
    """None if the heartbeat's epoch is acceptable for ``member`` (``throwIfMemberEpochIsInvalid``)."""
    got, have = req.member_epoch, member.epoch
    if got > have:
        return (
            f"The consumer group member has a greater member epoch ({got}) than the one known by the group "
            f"coordinator ({have}). The member must abandon all its partitions and rejoin."
        )
    if got < have:
        owned = req.topic_partitions
        if got == member.assignment.previous_epoch and owned is not None:
            assigned = member.assignment.assigned
            if all(p in assigned.get(t, {}) for t, ps in owned.items() for p in ps):
                return None  # the response carrying the bump was lost
        return (
            f"The consumer group member has a smaller member epoch ({got}) than the one known by the group "
            f"coordinator ({have}). The member must abandon all its partitions and rejoin."
        )
    return None


def updated_meta(old: MemberMetadataValue, req: ConsumerHeartbeat) -> MemberMetadataValue:
    regex = old.subscribed_topic_regex
    if req.subscribed_topic_regex is not None:
        regex = req.subscribed_topic_regex or None  # "" removes the regex
    return replace(
        old,
        instance_id=req.instance_id if req.instance_id is not None else old.instance_id,
        rack_id=req.rack_id if req.rack_id is not None else old.rack_id,
        client_id=req.client_id,
        client_host=req.client_host,
        subscribed_topic_names=tuple(sorted(set(req.subscribed_topic_names)))
        if req.subscribed_topic_names is not None
        else old.subscribed_topic_names,
        subscribed_topic_regex=regex,
        rebalance_timeout_ms=req.rebalance_timeout_ms if req.rebalance_timeout_ms != -1 else old.rebalance_timeout_ms,
        server_assignor=req.server_assignor if req.server_assignor is not None else old.server_assignor,
        classic_member_metadata=None,
    )


def partition_set(a: EpochAssignment) -> set[tuple[uuid.UUID, int]]:
    return {(t, p) for t, ps in a.items() for p in ps}


def target_value(t: Mapping[uuid.UUID, Iterable[int]]) -> TargetAssignmentMemberValue:
    return TargetAssignmentMemberValue(
        tuple(TopicPartitions(tid, tuple(sorted(ps))) for tid, ps in sorted(t.items(), key=lambda kv: str(kv[0])) if ps)
    )


def epoch_tps(a: EpochAssignment) -> tuple[EpochTopicPartitions, ...]:
    out = []
    for tid in sorted(a, key=str):
        ps = sorted(a[tid])
        if ps:
            out.append(EpochTopicPartitions(tid, tuple(ps), tuple(a[tid][p] for p in ps)))
    return tuple(out)


def assignment_record(a: MemberAssignment) -> CurrentMemberAssignmentValue:
    return CurrentMemberAssignmentValue(
        a.epoch, a.previous_epoch, int(a.state), epoch_tps(a.assigned), epoch_tps(a.pending_revocation)
    )


def assignment_from_record(v: CurrentMemberAssignmentValue) -> MemberAssignment:
    def parts(tps: tuple[EpochTopicPartitions, ...]) -> EpochAssignment:
        out: EpochAssignment = {}
        for tp in tps:
            if tp.assignment_epochs is not None:
                epochs = tp.assignment_epochs
            else:  # records written before KIP-1251: the member epoch (0 for a static leave)
                e = 0 if v.member_epoch == STATIC_LEAVE_EPOCH else v.member_epoch
                epochs = tuple(e for _ in tp.partitions)
            out.setdefault(tp.topic_id, {}).update(zip(tp.partitions, epochs, strict=True))
        return out

    try:
        state = MemberState(v.state)
    except ValueError:
        state = MemberState.UNKNOWN
    return MemberAssignment(
        v.member_epoch,
        v.previous_member_epoch,
        state,
        parts(v.assigned_partitions),
        parts(v.partitions_pending_revocation),
    )
