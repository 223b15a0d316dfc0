"""``__consumer_offsets`` records of consumer groups (KIP-848): keys 3-8 and 16.

Byte layouts follow Kafka's ``group-coordinator/src/main/resources/common/message/
ConsumerGroup*{Key,Value}.json`` (see docs/consumer-groups.md, "Records"):

* a key is the int16 record type followed by the key struct (version 0, classic encoding:
  int16-length strings);
* a value is the int16 value version (0) followed by the value struct, which is *flexible*:
  compact strings/arrays (unsigned varint length + 1, 0 = null), 16-byte uuids, and a tagged
  field section at the end of every struct (unknown tags are skipped, as Kafka's readers do);
* a tombstone is a record without a value.

Tagged fields written: ``ConsumerGroupMetadataValue.MetadataHash`` (tag 0, int64),
``ConsumerGroupTargetAssignmentMetadataValue.AssignmentTimestamp`` (tag 0, int64) and
``TopicPartitions.AssignmentEpochs`` in ``ConsumerGroupCurrentMemberAssignmentValue`` (tag 0,
[]int32).  ``ConsumerGroupPartitionMetadata`` (4) is no longer written by Kafka; its value is
kept as opaque bytes (replay only needs to know it exists).
"""

from __future__ import annotations

import struct
import uuid
from typing import Final, TypeAlias

from msgspec import Struct

from .flexible import RecordLayoutError, ValueReader, ValueWriter

GROUP_METADATA: Final = 3
PARTITION_METADATA: Final = 4
MEMBER_METADATA: Final = 5
TARGET_ASSIGNMENT_METADATA: Final = 6
TARGET_ASSIGNMENT_MEMBER: Final = 7
CURRENT_MEMBER_ASSIGNMENT: Final = 8
REGULAR_EXPRESSION: Final = 16

RECORD_TYPES: Final = frozenset(
    {
        GROUP_METADATA,
        PARTITION_METADATA,
        MEMBER_METADATA,
        TARGET_ASSIGNMENT_METADATA,
        TARGET_ASSIGNMENT_MEMBER,
        CURRENT_MEMBER_ASSIGNMENT,
        REGULAR_EXPRESSION,
    }
)
VALUE_VERSION: Final = 0

_I16 = struct.Struct(">h")
_I64 = struct.Struct(">q")


# Bytes that are not a consumer-group record of a layout we know (the primitives' error).
ConsumerRecordError = RecordLayoutError


# ------------------------------------------------------------------------------------- keys


class GroupMetadataKey(Struct, frozen=True):
    """Kafka's ``ConsumerGroupMetadataKey`` (type 3): the group."""

    group_id: str
    record_type: int = GROUP_METADATA


class PartitionMetadataKey(Struct, frozen=True):
    """Kafka's ``ConsumerGroupPartitionMetadataKey`` (type 4, no longer written): the group."""

    group_id: str
    record_type: int = PARTITION_METADATA


class MemberMetadataKey(Struct, frozen=True):
    """Kafka's ``ConsumerGroupMemberMetadataKey`` (type 5): a member of the group."""

    group_id: str
    member_id: str
    record_type: int = MEMBER_METADATA


class TargetAssignmentMetadataKey(Struct, frozen=True):
    """Kafka's ``ConsumerGroupTargetAssignmentMetadataKey`` (type 6): the group."""

    group_id: str
    record_type: int = TARGET_ASSIGNMENT_METADATA


class TargetAssignmentMemberKey(Struct, frozen=True):
    """Kafka's ``ConsumerGroupTargetAssignmentMemberKey`` (type 7): a member of the group."""

    group_id: str
    member_id: str
    record_type: int = TARGET_ASSIGNMENT_MEMBER


class CurrentMemberAssignmentKey(Struct, frozen=True):
    """Kafka's ``ConsumerGroupCurrentMemberAssignmentKey`` (type 8): a member of the group."""

    group_id: str
    member_id: str
    record_type: int = CURRENT_MEMBER_ASSIGNMENT


class RegularExpressionKey(Struct, frozen=True):
    """Kafka's ``ConsumerGroupRegularExpressionKey`` (type 16): a regex the group subscribes to."""

    group_id: str
    regex: str
    record_type: int = REGULAR_EXPRESSION


ConsumerKey: TypeAlias = (
    GroupMetadataKey
    | PartitionMetadataKey
    | MemberMetadataKey
    | TargetAssignmentMetadataKey
    | TargetAssignmentMemberKey
    | CurrentMemberAssignmentKey
    | RegularExpressionKey
)

# ----------------------------------------------------------------------------------- values


class GroupMetadataValue(Struct, frozen=True):
    """Kafka's ``ConsumerGroupMetadataValue``: the group epoch and the metadata hash."""

    epoch: int
    metadata_hash: int = 0


class PartitionMetadataValue(Struct, frozen=True):
    """Deprecated record: its bytes are kept as they are (nothing reads them)."""

    raw: bytes = b""


class ClassicProtocol(Struct, frozen=True):
    """One of a classic member's supported protocols (``ClassicMemberMetadata.SupportedProtocols``)."""

    name: str
    metadata: bytes


class ClassicMemberMetadata(Struct, frozen=True):
    """``ConsumerGroupMemberMetadataValue.ClassicMemberMetadata``: a classic member's session timeout and protocols."""

    session_timeout_ms: int
    supported_protocols: tuple[ClassicProtocol, ...] = ()


class MemberMetadataValue(Struct, frozen=True):
    """Kafka's ``ConsumerGroupMemberMetadataValue``: a member's client, subscription and assignor."""

    instance_id: str | None
    rack_id: str | None
    client_id: str
    client_host: str
    subscribed_topic_names: tuple[str, ...]
    subscribed_topic_regex: str | None
    rebalance_timeout_ms: int = -1
    server_assignor: str | None = None
    classic_member_metadata: ClassicMemberMetadata | None = None


class TargetAssignmentMetadataValue(Struct, frozen=True):
    """Kafka's ``ConsumerGroupTargetAssignmentMetadataValue``: the assignment epoch and timestamp."""

    assignment_epoch: int
    assignment_timestamp: int = 0


class TopicPartitions(Struct, frozen=True):
    """One topic's partitions (by topic id) in a ``ConsumerGroupTargetAssignmentMemberValue``."""

    topic_id: uuid.UUID
    partitions: tuple[int, ...]


class TargetAssignmentMemberValue(Struct, frozen=True):
    """Kafka's ``ConsumerGroupTargetAssignmentMemberValue``: a member's target partitions."""

    topic_partitions: tuple[TopicPartitions, ...]


class EpochTopicPartitions(Struct, frozen=True):
    """``TopicPartitions`` of a current assignment: with the per-partition assignment epochs
    (KIP-1251; None in records written before them)."""

    topic_id: uuid.UUID
    partitions: tuple[int, ...]
    assignment_epochs: tuple[int, ...] | None = None


class CurrentMemberAssignmentValue(Struct, frozen=True):
    """Kafka's ``ConsumerGroupCurrentMemberAssignmentValue``: a member's epochs, state and partitions."""

    member_epoch: int
    previous_member_epoch: int
    state: int
    assigned_partitions: tuple[EpochTopicPartitions, ...]
    partitions_pending_revocation: tuple[EpochTopicPartitions, ...]


class RegularExpressionValue(Struct, frozen=True):
    """Kafka's ``ConsumerGroupRegularExpressionValue``: the topics a regex resolved to, a version and a time."""

    topics: tuple[str, ...]
    version: int
    timestamp: int


ConsumerValue: TypeAlias = (
    GroupMetadataValue
    | PartitionMetadataValue
    | MemberMetadataValue
    | TargetAssignmentMetadataValue
    | TargetAssignmentMemberValue
    | CurrentMemberAssignmentValue
    | RegularExpressionValue
)
ConsumerRecord: TypeAlias = tuple[ConsumerKey, ConsumerValue | None]

_VALUE_FOR_KEY: Final[dict[type, type]] = {
    GroupMetadataKey: GroupMetadataValue,
    PartitionMetadataKey: PartitionMetadataValue,
    MemberMetadataKey: MemberMetadataValue,
    TargetAssignmentMetadataKey: TargetAssignmentMetadataValue,
    TargetAssignmentMemberKey: TargetAssignmentMemberValue,
    CurrentMemberAssignmentKey: CurrentMemberAssignmentValue,
    RegularExpressionKey: RegularExpressionValue,
}

# ------------------------------------------------------------------------------------ keys


def encode_key(key: ConsumerKey) -> bytes:
    w = ValueWriter(key.record_type)
    w.classic_string(key.group_id)
    if isinstance(key, MemberMetadataKey | TargetAssignmentMemberKey | CurrentMemberAssignmentKey):
        w.classic_string(key.member_id)
    elif isinstance(key, RegularExpressionKey):
        w.classic_string(key.regex)
    return w.done()


def record_type(data: bytes) -> int:
    if len(data) < 2:
        raise ConsumerRecordError(f"{len(data)} bytes: too short for a record type")
    return int(_I16.unpack_from(data, 0)[0])


def decode_key(data: bytes) -> ConsumerKey:
    """A consumer-group key (types 3-8, 16); ConsumerRecordError for anything else."""
    rtype = record_type(data)
    r = ValueReader(data)
    group = r.classic_string()
    if rtype == GROUP_METADATA:
        return GroupMetadataKey(group)
    if rtype == PARTITION_METADATA:
        return PartitionMetadataKey(group)
    if rtype == TARGET_ASSIGNMENT_METADATA:
        return TargetAssignmentMetadataKey(group)
    if rtype == MEMBER_METADATA:
        return MemberMetadataKey(group, r.classic_string())
    if rtype == TARGET_ASSIGNMENT_MEMBER:
        return TargetAssignmentMemberKey(group, r.classic_string())
    if rtype == CURRENT_MEMBER_ASSIGNMENT:
        return CurrentMemberAssignmentKey(group, r.classic_string())
    if rtype == REGULAR_EXPRESSION:
        return RegularExpressionKey(group, r.classic_string())
    raise ConsumerRecordError(f"record type {rtype} is not a consumer-group record")


# ---------------------------------------------------------------------------------- values


def _topic_partitions(w: ValueWriter, tps: tuple[TopicPartitions, ...]) -> None:
    w.array_len(len(tps))
    for tp in tps:
        w.uuid(tp.topic_id)
        w.i32_array(tp.partitions)
        w.tags()


def _epoch_topic_partitions(w: ValueWriter, tps: tuple[EpochTopicPartitions, ...]) -> None:
    w.array_len(len(tps))
    for tp in tps:
        w.uuid(tp.topic_id)
        w.i32_array(tp.partitions)
        if tp.assignment_epochs is None:
            w.tags()
        else:
            if len(tp.assignment_epochs) != len(tp.partitions):
                raise ConsumerRecordError("AssignmentEpochs must have one entry per partition")
            sub = ValueWriter(0)
            sub.buf.clear()
            sub.i32_array(tp.assignment_epochs)
            w.tags([(0, sub.done())])


def _read_epoch_topic_partitions(r: ValueReader) -> tuple[EpochTopicPartitions, ...]:
    out = []
    for _ in range(r.array_len()):
        tid = r.uuid()
        parts = r.i32_array()
        epochs: tuple[int, ...] | None = None
        tags = r.tags()
        if 0 in tags:
            epochs = ValueReader(tags[0], 0).i32_array()
            if len(epochs) != len(parts):
                raise ConsumerRecordError("AssignmentEpochs and Partitions differ in length")
        out.append(EpochTopicPartitions(tid, parts, epochs))
    return tuple(out)


def encode_value(value: ConsumerValue) -> bytes:
    if isinstance(value, PartitionMetadataValue):
        return _I16.pack(VALUE_VERSION) + value.raw
    w = ValueWriter(VALUE_VERSION)
    if isinstance(value, GroupMetadataValue):
        w.i32(value.epoch)
        w.tags([(0, _I64.pack(value.metadata_hash))] if value.metadata_hash else None)
    elif isinstance(value, MemberMetadataValue):
        w.string(value.instance_id)
        w.string(value.rack_id)
        w.string(value.client_id)
        w.string(value.client_host)
        w.string_array(value.subscribed_topic_names)
        w.string(value.subscribed_topic_regex)
        w.i32(value.rebalance_timeout_ms)
        w.string(value.server_assignor)
        classic = value.classic_member_metadata
        if classic is None:
            w.tags()
        else:
            sub = ValueWriter(0)
            sub.buf.clear()
            sub.i32(classic.session_timeout_ms)
            sub.array_len(len(classic.supported_protocols))
            for p in classic.supported_protocols:
                sub.string(p.name)
                sub.bytes_(p.metadata)
                sub.tags()
            sub.tags()
            w.tags([(0, sub.done())])
        return w.done()
    elif isinstance(value, TargetAssignmentMetadataValue):
        w.i32(value.assignment_epoch)
        w.tags([(0, _I64.pack(value.assignment_timestamp))] if value.assignment_timestamp else None)
    elif isinstance(value, TargetAssignmentMemberValue):
        _topic_partitions(w, value.topic_partitions)
        w.tags()
    elif isinstance(value, CurrentMemberAssignmentValue):
        w.i32(value.member_epoch)
        w.i32(value.previous_member_epoch)
        w.i8(value.state)
        _epoch_topic_partitions(w, value.assigned_partitions)
        _epoch_topic_partitions(w, value.partitions_pending_revocation)
        w.tags()
    else:
        w.string_array(value.topics)
        w.i64(value.version)
        w.i64(value.timestamp)
        w.tags()
    return w.done()


def decode_value(key: ConsumerKey, data: bytes | None) -> ConsumerValue | None:
    """The value of a record whose key is ``key``; None (a tombstone) stays None."""
    if data is None:
        return None
    if len(data) < 2:
        raise ConsumerRecordError("value too short for a version")
    version = int(_I16.unpack_from(data, 0)[0])
    if isinstance(key, PartitionMetadataKey):
        return PartitionMetadataValue(bytes(data[2:]))
    if version != VALUE_VERSION:
        raise ConsumerRecordError(f"{type(key).__name__} value version {version} is unknown")
    r = ValueReader(bytes(data))
    try:
        return _decode_value(key, r)
    except (struct.error, ValueError) as e:
        if isinstance(e, ConsumerRecordError):
            raise
        raise ConsumerRecordError(str(e)) from e


def _decode_value(key: ConsumerKey, r: ValueReader) -> ConsumerValue:
    if isinstance(key, GroupMetadataKey):
        epoch = r.i32()
        tags = r.tags()
        return GroupMetadataValue(epoch, ValueReader(tags[0], 0).i64() if 0 in tags else 0)
    if isinstance(key, MemberMetadataKey):
        instance_id = r.nullable_string()
        rack_id = r.nullable_string()
        client_id = r.string()
        client_host = r.string()
        names = r.string_array()
        regex = r.nullable_string()
        rebalance_timeout = r.i32()
        assignor = r.nullable_string()
        tags = r.tags()
        classic = None
        if 0 in tags:
            c = ValueReader(tags[0], 0)
            session_timeout = c.i32()
            protocols = []
            for _ in range(c.array_len()):
                name = c.string()
                meta = c.bytes_()
                c.tags()
                protocols.append(ClassicProtocol(name, meta))
            c.tags()
            classic = ClassicMemberMetadata(session_timeout, tuple(protocols))
        return MemberMetadataValue(
            instance_id, rack_id, client_id, client_host, names, regex, rebalance_timeout, assignor, classic
        )
    if isinstance(key, TargetAssignmentMetadataKey):
        epoch = r.i32()
        tags = r.tags()
        return TargetAssignmentMetadataValue(epoch, ValueReader(tags[0], 0).i64() if 0 in tags else 0)
    if isinstance(key, TargetAssignmentMemberKey):
        tps = []
        for _ in range(r.array_len()):
            tid = r.uuid()
            parts = r.i32_array()
            r.tags()
            tps.append(TopicPartitions(tid, parts))
        r.tags()
        return TargetAssignmentMemberValue(tuple(tps))
    if isinstance(key, CurrentMemberAssignmentKey):
        epoch = r.i32()
        previous = r.i32()
        state = r.i8()
        assigned = _read_epoch_topic_partitions(r)
        pending = _read_epoch_topic_partitions(r)
        r.tags()
        return CurrentMemberAssignmentValue(epoch, previous, state, assigned, pending)
    if isinstance(key, RegularExpressionKey):
        topics = r.string_array()
        version = r.i64()
        ts = r.i64()
        r.tags()
        return RegularExpressionValue(topics, version, ts)
    raise ConsumerRecordError(f"no value layout for {type(key).__name__}")


def encode_record(key: ConsumerKey, value: ConsumerValue | None) -> tuple[bytes, bytes | None]:
    """(key bytes, value bytes or None for a tombstone)."""
    if value is not None and not isinstance(value, _VALUE_FOR_KEY[type(key)]):
        raise ConsumerRecordError(f"{type(value).__name__} cannot be the value of a {type(key).__name__}")
    return encode_key(key), (None if value is None else encode_value(value))


def decode_record(key: bytes, value: bytes | None) -> ConsumerRecord:
    k = decode_key(key)
    return k, decode_value(k, value)


def is_consumer_record_type(rtype: int) -> bool:
    return rtype in RECORD_TYPES


RECORD_NAMES: Final = {
    GROUP_METADATA: "consumer_group_metadata",
    PARTITION_METADATA: "consumer_group_partition_metadata",
    MEMBER_METADATA: "consumer_group_member_metadata",
    TARGET_ASSIGNMENT_METADATA: "consumer_group_target_assignment_metadata",
    TARGET_ASSIGNMENT_MEMBER: "consumer_group_target_assignment_member",
    CURRENT_MEMBER_ASSIGNMENT: "consumer_group_current_member_assignment",
    REGULAR_EXPRESSION: "consumer_group_regular_expression",
}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.title() for w in rest)


def to_json(obj: object) -> object:
    """A key or value as JSON-able data (camelCase field names, as Kafka's JSON converters;
    uuids as strings, bytes as their length) for dump tools and the pipeline."""
    if obj is None or isinstance(obj, str | int | bool):
        return obj
    if isinstance(obj, uuid.UUID):
        return str(obj)
    if isinstance(obj, bytes):
        return {"size": len(obj)}
    if isinstance(obj, tuple):
        return [to_json(x) for x in obj]
    if isinstance(obj, Struct):
        return {_camel(f): to_json(getattr(obj, f)) for f in obj.__struct_fields__ if f != "record_type"}
    raise TypeError(f"cannot describe {type(obj).__name__}")


def describe(key: bytes, value: bytes | None) -> dict[str, object]:
    """``{"type", "key", "value"}`` of one consumer-group record (value None for a tombstone);
    raises ConsumerRecordError for bytes that do not decode."""
    k, v = decode_record(key, value)
    return {"type": RECORD_NAMES[k.record_type], "key": to_json(k), "value": to_json(v)}
