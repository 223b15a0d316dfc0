"""Requests, results and the one extra effect of the consumer-group (KIP-848) machine.

The other effects (Respond, ArmTimer, CancelTimer, Transition, Note) are the classic machine's
(:mod:`rallypoint.groups.events`); consumer-group records are not classic records, so their
persistence has its own effect, :class:`PersistConsumer`.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import TypeAlias

from msgspec import Struct, field
from rallypoint.protocol.consumer_group_records import ConsumerRecord
from rallypoint.protocol.errors import ErrorCode

from .events import ArmTimer, CancelTimer, Note, Respond, Transition

# ---------------------------------------------------------------------------------- requests


class ConsumerHeartbeat(Struct, frozen=True):
    """A ConsumerGroupHeartbeat request (API 68) as the machine sees it.

    ``None`` (or -1 for the rebalance timeout) means "unchanged since the last heartbeat".
    """

    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: tuple[str, ...] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    topic_partitions: Mapping[uuid.UUID, frozenset[int]] | None = None
    client_id: str = ""
    client_host: str = ""
    api_version: int = 1


class ClassicMemberSnapshot(Struct, frozen=True):
    """One member of a live classic group, as the classic coordinator describes it for an
    online upgrade (docs/consumer-groups.md, "Classic groups")."""

    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]  # (name, ConsumerProtocolSubscription) in preference order
    assignment: bytes  # its ConsumerProtocolAssignment of the current generation


class ClassicGroupSnapshot(Struct, frozen=True):
    """A classic group and its members: what an online upgrade takes over and a downgrade installs."""

    group_id: str
    generation: int
    protocol_type: str
    protocol_name: str | None
    members: tuple[ClassicMemberSnapshot, ...]


# ----------------------------------------------------------------------------------- results


class ConsumerHeartbeatResult(Struct, frozen=True):
    """The answer to a ConsumerGroupHeartbeat; ``assignment`` None: not sent (unchanged)."""

    error: ErrorCode
    error_message: str | None = None
    member_id: str | None = None
    member_epoch: int = 0
    heartbeat_interval_ms: int = 0
    assignment: Mapping[uuid.UUID, tuple[int, ...]] | None = None


class DescribedTopicPartitions(Struct, frozen=True):
    """One topic of a described assignment: its id, name and partitions."""

    topic_id: uuid.UUID
    topic_name: str
    partitions: tuple[int, ...]


class DescribedConsumerMember(Struct, frozen=True):
    """One member of a ConsumerGroupDescribe answer: its ids, client, subscription and assignments."""

    member_id: str
    instance_id: str | None
    rack_id: str | None
    member_epoch: int
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    subscribed_topic_regex: str | None
    assignment: tuple[DescribedTopicPartitions, ...]
    target_assignment: tuple[DescribedTopicPartitions, ...]
    member_type: int = 1  # 0 classic, 1 consumer


class DescribedConsumerGroup(Struct, frozen=True):
    """One group of a ConsumerGroupDescribe answer (API 69): its state, epochs and members, or its error."""

    group_id: str
    error: ErrorCode = ErrorCode.NONE
    error_message: str | None = None
    state: str = "Dead"
    group_epoch: int = -1
    assignment_epoch: int = -1
    assignor_name: str = ""
    members: tuple[DescribedConsumerMember, ...] = ()


# ----------------------------------------------------------------------------------- effects


class PersistConsumer(Struct, frozen=True):
    """Append ``records`` as one batch to ``__consumer_offsets`` partition ``partition``, then
    report back with ``ConsumerGroupMachine.persist_done(persist_id, error, now_ms)``."""

    persist_id: int
    partition: int
    records: tuple[ConsumerRecord, ...] = field(default_factory=tuple)


class ConvertClassic(Struct, frozen=True):
    """Online upgrade: the classic coordinator must hand over its group ``group_id`` now (answer
    its parked requests, forget it, write its tombstone) — before the PersistConsumer that
    follows this effect, so the tombstone comes first in the log."""

    group_id: str


class DowngradeToClassic(Struct, frozen=True):
    """Online downgrade: the consumer group's tombstones were just persisted (the effect
    before this one); the classic coordinator must now install ``snapshot`` as a classic group,
    write its GroupMetadata record and start a rebalance."""

    snapshot: ClassicGroupSnapshot


ConsumerEffect: TypeAlias = (
    Respond | ArmTimer | CancelTimer | PersistConsumer | ConvertClassic | DowngradeToClassic | Transition | Note
)
