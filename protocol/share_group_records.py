"""``__consumer_offsets`` records of share groups (KIP-932): keys 10-14.

Byte layouts follow Kafka's ``group-coordinator/src/main/resources/common/message/
ShareGroup*{Key,Value}.json`` (docs/share-groups.md, "Records"), with the same framing as the
consumer-group records (:mod:`.flexible`): an int16 record type and classic strings in the key,
an int16 value version (0) and a flexible struct in the value; a tombstone has no value.

Written by rallypoint: member metadata (10), group metadata (11: epoch and metadata hash), target
assignment metadata (12), target assignment member (13) and current member assignment (14).
Kafka's older ``ShareGroupPartitionMetadata`` (9) and its share-state bookkeeping record (15) are
not written (the share-partition state lives in its own file).
"""

from __future__ import annotations

import struct
import uuid
from typing import Final, TypeAlias

from msgspec import Struct

from .flexible import RecordLayoutError, ValueReader, ValueWriter

MEMBER_METADATA: Final = 10
GROUP_METADATA: Final = 11
TARGET_ASSIGNMENT_METADATA: Final = 12
TARGET_ASSIGNMENT_MEMBER: Final = 13
CURRENT_MEMBER_ASSIGNMENT: Final = 14

RECORD_TYPES: Final = frozenset(
    {MEMBER_METADATA, GROUP_METADATA, TARGET_ASSIGNMENT_METADATA, TARGET_ASSIGNMENT_MEMBER, CURRENT_MEMBER_ASSIGNMENT}
)
VALUE_VERSION: Final = 0
STABLE: Final = 0  # MemberState.STABLE: share members are always reconciled

_I16 = struct.Struct(">h")
_I64 = struct.Struct(">q")


class ShareKey(Struct, frozen=True):
    """A share-group record key: the group, and the member for the per-member types."""

    record_type: int
    group_id: str
    member_id: str | None = None


class ShareMemberMetadataValue(Struct, frozen=True):
    """Kafka's ``ShareGroupMemberMetadataValue`` (type 10): a member's rack, client and subscription."""

    rack_id: str | None
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]


class ShareGroupMetadataValue(Struct, frozen=True):
    """Kafka's ``ShareGroupMetadataValue`` (type 11): the group epoch and the metadata hash."""

    epoch: int
    metadata_hash: int = 0


class ShareTargetAssignmentMetadataValue(Struct, frozen=True):
    """Kafka's ``ShareGroupTargetAssignmentMetadataValue`` (type 12): the assignment epoch."""

    assignment_epoch: int


class ShareTopicPartitions(Struct, frozen=True):
    """One topic's partitions (by topic id) in a share-group assignment record."""

    topic_id: uuid.UUID
    partitions: tuple[int, ...]


class ShareTargetAssignmentMemberValue(Struct, frozen=True):
    """Kafka's ``ShareGroupTargetAssignmentMemberValue`` (type 13): a member's target partitions."""

    topic_partitions: tuple[ShareTopicPartitions, ...]


class ShareCurrentMemberAssignmentValue(Struct, frozen=True):
    """Kafka's ``ShareGroupCurrentMemberAssignmentValue`` (type 14): a member's epochs, state, partitions."""

    member_epoch: int
    previous_member_epoch: int
    state: int
    assigned_partitions: tuple[ShareTopicPartitions, ...]


ShareValue: TypeAlias = (
    ShareMemberMetadataValue
    | ShareGroupMetadataValue
    | ShareTargetAssignmentMetadataValue
    | ShareTargetAssignmentMemberValue
    | ShareCurrentMemberAssignmentValue
)
ShareRecord: TypeAlias = tuple[ShareKey, ShareValue | None]

_PER_MEMBER: Final = frozenset({MEMBER_METADATA, TARGET_ASSIGNMENT_MEMBER, CURRENT_MEMBER_ASSIGNMENT})
_VALUE_FOR_TYPE: Final[dict[int, type]] = {
    MEMBER_METADATA: ShareMemberMetadataValue,
    GROUP_METADATA: ShareGroupMetadataValue,
    TARGET_ASSIGNMENT_METADATA: ShareTargetAssignmentMetadataValue,
    TARGET_ASSIGNMENT_MEMBER: ShareTargetAssignmentMemberValue,
    CURRENT_MEMBER_ASSIGNMENT: ShareCurrentMemberAssignmentValue,
}
RECORD_NAMES: Final = {
    MEMBER_METADATA: "share_group_member_metadata",
    GROUP_METADATA: "share_group_metadata",
    TARGET_ASSIGNMENT_METADATA: "share_group_target_assignment_metadata",
    TARGET_ASSIGNMENT_MEMBER: "share_group_target_assignment_member",
    CURRENT_MEMBER_ASSIGNMENT: "share_group_current_member_assignment",
}


def encode_key(key: ShareKey) -> bytes:
    w = ValueWriter(key.record_type)
    w.classic_string(key.group_id)
    if key.record_type in _PER_MEMBER:
        if key.member_id is None:
            raise RecordLayoutError(f"record type {key.record_type} needs a member id")
        w.classic_string(key.member_id)
    return w.done()


def decode_key(data: bytes) -> ShareKey:
    if len(data) < 2:
        raise RecordLayoutError("key shorter than its type")
    rtype = int(_I16.unpack_from(data, 0)[0])
    if rtype not in RECORD_TYPES:
        raise RecordLayoutError(f"not a share-group record type: {rtype}")
    r = ValueReader(data)
    group = r.classic_string()
    member = r.classic_string() if rtype in _PER_MEMBER else None
    if r.pos != len(data):
        raise RecordLayoutError(f"{len(data) - r.pos} bytes after the key")
    return ShareKey(rtype, group, member)


def _write_tps(w: ValueWriter, tps: tuple[ShareTopicPartitions, ...]) -> None:
    w.array_len(len(tps))
    for tp in tps:
        w.uuid(tp.topic_id)
        w.i32_array(tp.partitions)
        w.tags()


def _read_tps(r: ValueReader) -> tuple[ShareTopicPartitions, ...]:
    out = []
    for _ in range(r.array_len()):
        tid = r.uuid()
        parts = r.i32_array()
        r.tags()
        out.append(ShareTopicPartitions(tid, parts))
    return tuple(out)


def encode_value(value: ShareValue) -> bytes:
    w = ValueWriter(VALUE_VERSION)
    if isinstance(value, ShareMemberMetadataValue):
        w.string(value.rack_id)
        w.string(value.client_id)
        w.string(value.client_host)
        w.string_array(value.subscribed_topic_names)
    elif isinstance(value, ShareGroupMetadataValue):
        w.i32(value.epoch)
        w.i64(value.metadata_hash)
    elif isinstance(value, ShareTargetAssignmentMetadataValue):
        w.i32(value.assignment_epoch)
    elif isinstance(value, ShareTargetAssignmentMemberValue):
        _write_tps(w, value.topic_partitions)
    else:
        w.i32(value.member_epoch)
        w.i32(value.previous_member_epoch)
        w.i8(value.state)
        _write_tps(w, value.assigned_partitions)
    w.tags()
    return w.done()


def decode_value(key: ShareKey, data: bytes | None) -> ShareValue | None:
    if data is None:
        return None
    if len(data) < 2:
        raise RecordLayoutError("value shorter than its version")
    version = int(_I16.unpack_from(data, 0)[0])
    if version != VALUE_VERSION:
        raise RecordLayoutError(f"unknown value version {version} for record type {key.record_type}")
    r = ValueReader(data)
    t = key.record_type
    value: ShareValue
    if t == MEMBER_METADATA:
        value = ShareMemberMetadataValue(r.nullable_string(), r.string(), r.string(), r.string_array())
    elif t == GROUP_METADATA:
        epoch = r.i32()
        # an older layout (epoch only) ends here; Kafka 4.1+ adds the metadata hash
        metadata_hash = r.i64() if len(data) - r.pos > 1 else 0
        value = ShareGroupMetadataValue(epoch, metadata_hash)
    elif t == TARGET_ASSIGNMENT_METADATA:
        value = ShareTargetAssignmentMetadataValue(r.i32())
    elif t == TARGET_ASSIGNMENT_MEMBER:
        value = ShareTargetAssignmentMemberValue(_read_tps(r))
    else:
        value = ShareCurrentMemberAssignmentValue(r.i32(), r.i32(), r.i8(), _read_tps(r))
    r.tags()
    if r.pos != len(data):
        raise RecordLayoutError(f"{len(data) - r.pos} bytes after the value")
    return value


def encode_record(key: ShareKey, value: ShareValue | None) -> tuple[bytes, bytes | None]:
    """(key bytes, value bytes or None for a tombstone)."""
    if value is not None and not isinstance(value, _VALUE_FOR_TYPE[key.record_type]):
        raise RecordLayoutError(f"{type(value).__name__} cannot be the value of record type {key.record_type}")
    return encode_key(key), (None if value is None else encode_value(value))


def decode_record(key: bytes, value: bytes | None) -> ShareRecord:
    k = decode_key(key)
    return k, decode_value(k, value)


def is_share_record_type(rtype: int) -> bool:
    return rtype in RECORD_TYPES
