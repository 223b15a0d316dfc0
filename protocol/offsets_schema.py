"""``__consumer_offsets`` record keys and values (spec/group-coordinator.md §B).

Keys and values are "version-prefixed": int16 version, then the struct in Kafka's classic
encoding.  The key version names the record type: 0-1 offset commit, 2 group metadata.
Writers use OffsetCommitKey v1, OffsetCommitValue v3 (v1 when an expire timestamp is set),
GroupMetadataKey v2 and GroupMetadataValue v3, as Kafka does.

This module holds the shapes (shared by the group state machine, the offset store, the log
and the Spark pipeline) and their encoders/decoders.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class OffsetCommitKey:
    group: str
    topic: str
    partition: int


@dataclass(frozen=True, slots=True)
class OffsetCommitValue:
    offset: int
    metadata: str
    commit_timestamp: int
    leader_epoch: int = -1
    expire_timestamp: int | None = None  # only in value v1


@dataclass(frozen=True, slots=True)
class GroupMetadataKey:
    group: str


@dataclass(frozen=True, slots=True)
class MemberMetadata:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout: int
    session_timeout: int
    subscription: bytes  # member metadata for the selected protocol only
    assignment: bytes


@dataclass(frozen=True, slots=True)
class GroupMetadataValue:
    protocol_type: str  # "" for a simple / empty group
    generation: int
    protocol: str | None  # selected protocol, None when Empty
    leader: str | None
    current_state_timestamp: int = -1
    members: tuple[MemberMetadata, ...] = field(default_factory=tuple)


def java_string_hash(s: str) -> int:
    """Java's ``String.hashCode``: h = 31*h + c over UTF-16 code units, int32 wraparound."""
    h = 0
    data = s.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h & 0x80000000 else h


def partition_for(group_id: str, num_partitions: int) -> int:
    """Kafka's ``Utils.abs(groupId.hashCode) % offsets.topic.num.partitions``.

    ``Utils.abs(Integer.MIN_VALUE)`` is 0 (it masks with 0x7fffffff), unlike ``Math.abs``.
    """
    h = java_string_hash(group_id)
    return (h & 0x7FFFFFFF if h != -(1 << 31) else 0) % num_partitions
