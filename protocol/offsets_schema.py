"""``__consumer_offsets`` record keys and values (docs/offsets-log-format.md, "Keys (version-prefixed)"
and "Values (version-prefixed)").

Keys and values are "version-prefixed": int16 version, then the struct in Kafka's classic
encoding.  The key version names the record type: 0-1 offset commit, 2 group metadata.
Writers use OffsetCommitKey v1, OffsetCommitValue v3 (v1 when an expire timestamp is set),
GroupMetadataKey v2 and GroupMetadataValue v3, as Kafka does.

This module holds the shapes (shared by the group state machine, the offset store, the log
and the Spark pipeline) and their encoders/decoders.
"""

from __future__ import annotations

import functools
import struct
import uuid
from typing import Final

from msgspec import Struct, field

from .wire import I16 as _I16
from .wire import I32 as _I32
from .wire import I64 as _I64
from .wire import Reader, Writer

# Keys and values hold only strings, numbers, bytes, uuids and tuples of one another, so they
# are never part of a reference cycle and the garbage collector need not track them
# (``gc=False``): 16 bytes less each, and far fewer objects for a collection to walk in a broker
# holding many groups and offsets.


class OffsetCommitKey(Struct, frozen=True, gc=False):
    """Kafka's ``OffsetCommitKey`` (key version 0 or 1): group, topic and partition."""

    group: str
    topic: str
    partition: int


class OffsetCommitValue(Struct, frozen=True, gc=False):
    """Kafka's ``OffsetCommitValue``: a committed offset, its metadata, timestamps and topic id."""

    offset: int
    metadata: str
    commit_timestamp: int
    leader_epoch: int = -1
    expire_timestamp: int | None = None  # only in value v1
    # the committed topic's id (value v4, tagged field 0): set by OffsetCommit v10, which names
    # topics by id; an OffsetFetch v10 naming another id for the topic gets no offset
    topic_id: uuid.UUID | None = None


class GroupMetadataKey(Struct, frozen=True, gc=False):
    """Kafka's ``GroupMetadataKey`` (key version 2): the group."""

    group: str


class MemberMetadata(Struct, frozen=True, gc=False):
    """One member of a classic group in a ``GroupMetadataValue`` (Kafka's ``MemberMetadata``)."""

    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout: int
    session_timeout: int
    subscription: bytes  # member metadata for the selected protocol only
    assignment: bytes


class GroupMetadataValue(Struct, frozen=True, gc=False):
    """Kafka's ``GroupMetadataValue``: a classic group's protocol, generation, leader and members."""

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


_INT32_MIN: Final = -(2**31)


@functools.lru_cache(maxsize=65536)
def partition_for(group_id: str, num_partitions: int) -> int:
    """Kafka's ``Utils.abs(groupId.hashCode()) % offsets.topic.num.partitions``
    (``GroupCoordinatorService.partitionFor``).

    ``Utils.abs`` is ``Math.abs`` except that ``Integer.MIN_VALUE`` (whose absolute value does
    not fit an int) maps to 0: a negative hash -h gives h, not h masked with 0x7fffffff.
    """
    h = java_string_hash(group_id)
    return (0 if h == _INT32_MIN else abs(h)) % num_partitions


# ---------------------------------------------------------------------------------------------
# Encoding and decoding (Kafka's generated *Key/*Value message classes; the primitives are
# protocol/wire.py).
#
# Every key and value is "version-prefixed": int16 version, then the struct.  Non-flexible
# versions use Kafka's classic encoding (STRING int16 length + UTF-8, NULLABLE_STRING length -1
# for null, BYTES int32 length, ARRAY int32 count); flexible versions (values v4) use compact
# lengths (unsigned varint length + 1, 0 = null) and end every struct with tagged fields
# (unsigned varint count, then tag/size/bytes per field; unknown tags are skipped, as Kafka's
# readers keep them aside as ``_unknownTaggedFields``).  Trailing bytes after a struct are
# ignored, as Kafka's readers do.

OFFSET_COMMIT_KEY_VERSIONS: Final = (0, 1)
GROUP_METADATA_KEY_VERSION: Final = 2
OFFSET_COMMIT_VALUE_VERSIONS: Final = (0, 1, 2, 3, 4)
GROUP_METADATA_VALUE_VERSIONS: Final = (0, 1, 2, 3, 4)
FLEXIBLE_VALUE_VERSION: Final = 4
_TOPIC_ID_TAG: Final = 0  # OffsetCommitValue v4's tagged topicId

# What Kafka's writers emit (MetadataVersion.offsetCommitValueVersion / groupMetadataValueVersion).
WRITE_OFFSET_COMMIT_KEY_VERSION: Final = 1
WRITE_OFFSET_COMMIT_VALUE_VERSION: Final = 3
WRITE_OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRY: Final = 1
WRITE_GROUP_METADATA_VALUE_VERSION: Final = 3

Key = OffsetCommitKey | GroupMetadataKey
Value = OffsetCommitValue | GroupMetadataValue


class OffsetsSchemaError(ValueError):
    """Bytes that are not a valid key or value of the versions we know."""


class UnknownKey(Struct, frozen=True, gc=False):
    """A key whose version is not an offset commit (0-1) or group metadata (2) key: KIP-848 and
    share-group records (3-15) or newer.  Readers skip these records, as Kafka's Scala loader
    does (``UnknownKey``, GroupMetadataManager.scala)."""

    version: int
    raw: bytes


def _writer(version: int, flexible: bool = False) -> Writer:
    w = Writer(flexible=flexible, error=OffsetsSchemaError)
    w.buf += _I16.pack(version)
    return w


def _reader(data: bytes, flexible: bool) -> Reader:
    return Reader(data, 2, flexible=flexible, error=OffsetsSchemaError)


def record_version(data: bytes) -> int:
    """The int16 version prefix of a key or value."""
    if len(data) < 2:
        raise OffsetsSchemaError(f"{len(data)} bytes: too short for a version prefix")
    return int(_I16.unpack_from(data, 0)[0])


_I64_I32 = struct.Struct(">qi")
_I16_I64_I32 = struct.Struct(">hqi")


# --- keys ------------------------------------------------------------------------------------


def _classic(s: str) -> bytes:
    """A classic STRING (int16 length + UTF-8): the fast path of the hot encoders."""
    raw = s.encode("utf-8")
    if len(raw) > 0x7FFF:
        raise OffsetsSchemaError(f"string of {len(raw)} bytes is longer than 32767")
    return _I16.pack(len(raw)) + raw


def encode_offset_commit_key(key: OffsetCommitKey, version: int = WRITE_OFFSET_COMMIT_KEY_VERSION) -> bytes:
    if version not in OFFSET_COMMIT_KEY_VERSIONS:
        raise OffsetsSchemaError(f"OffsetCommitKey has no version {version}")
    # every commit writes one: built directly (the same bytes as a classic Writer would)
    return _I16.pack(version) + _classic(key.group) + _classic(key.topic) + _I32.pack(key.partition)


def encode_group_metadata_key(key: GroupMetadataKey, version: int = GROUP_METADATA_KEY_VERSION) -> bytes:
    if version != GROUP_METADATA_KEY_VERSION:
        raise OffsetsSchemaError(f"GroupMetadataKey has no version {version}")
    w = _writer(version)
    w.string(key.group)
    return w.done()


def encode_key(key: Key) -> bytes:
    """The key bytes Kafka writes: OffsetCommitKey v1 or GroupMetadataKey v2."""
    if isinstance(key, OffsetCommitKey):
        return encode_offset_commit_key(key)
    return encode_group_metadata_key(key)


def _classic_string(data: bytes, pos: int) -> tuple[str, int]:
    """A non-nullable classic STRING at ``pos`` (the fast path of the hot decoders)."""
    if pos + 2 > len(data):
        raise OffsetsSchemaError(f"truncated: string length at {pos}")
    n = (data[pos] << 8) | data[pos + 1]
    if n & 0x8000:
        raise OffsetsSchemaError("null in a non-nullable string")
    start = pos + 2
    end = start + n
    if end > len(data):
        raise OffsetsSchemaError(f"truncated: need {n} bytes at {start}, have {len(data) - start}")
    try:
        return data[start:end].decode("utf-8"), end
    except UnicodeDecodeError as e:
        raise OffsetsSchemaError(f"invalid UTF-8 in string: {e}") from None


def decode_key(data: bytes) -> Key | UnknownKey:
    """Decode a ``__consumer_offsets`` key; unknown key versions give :class:`UnknownKey`."""
    version = record_version(data)
    if version in OFFSET_COMMIT_KEY_VERSIONS:
        group, pos = _classic_string(data, 2)
        topic, pos = _classic_string(data, pos)
        if pos + 4 > len(data):
            raise OffsetsSchemaError("truncated: partition")
        return OffsetCommitKey(group, topic, _I32.unpack_from(data, pos)[0])
    if version == GROUP_METADATA_KEY_VERSION:
        return GroupMetadataKey(_classic_string(data, 2)[0])
    return UnknownKey(version, bytes(data))


# --- OffsetCommitValue -----------------------------------------------------------------------


def offset_commit_value_version(value: OffsetCommitValue) -> int:
    """v1 when an expire timestamp is set (a v2-v4 OffsetCommit with RetentionTime); v4 (flexible,
    the topic id tagged) for a commit that knows its topic id (OffsetCommit v10), as Kafka 4
    writes them; else v3, as Kafka wrote before."""
    if value.expire_timestamp is not None:
        return WRITE_OFFSET_COMMIT_VALUE_VERSION_WITH_EXPIRY
    if value.topic_id is not None:
        return FLEXIBLE_VALUE_VERSION
    return WRITE_OFFSET_COMMIT_VALUE_VERSION


def encode_offset_commit_value(value: OffsetCommitValue, version: int | None = None) -> bytes:
    """Fields per version (docs/offsets-log-format.md, "Values (version-prefixed)"): v0 offset,
    metadata, commitTimestamp; v1 + expireTimestamp; v2 as v0; v3 offset, leaderEpoch, metadata,
    commitTimestamp; v4 as v3, flexible.

    Fields a version lacks are not written (leaderEpoch before v3, expireTimestamp outside v1).
    """
    v = offset_commit_value_version(value) if version is None else version
    if v == 3:  # what Kafka writes: the fast path
        return (
            _I16_I64_I32.pack(3, value.offset, value.leader_epoch)
            + _classic(value.metadata)
            + _I64.pack(value.commit_timestamp)
        )
    if v not in OFFSET_COMMIT_VALUE_VERSIONS:
        raise OffsetsSchemaError(f"OffsetCommitValue has no version {v}")
    w = _writer(v, flexible=v >= FLEXIBLE_VALUE_VERSION)
    w.int64(value.offset)
    if v >= 3:
        w.int32(value.leader_epoch)
    w.string(value.metadata)
    w.int64(value.commit_timestamp)
    if v == 1:
        w.int64(-1 if value.expire_timestamp is None else value.expire_timestamp)
    if v >= FLEXIBLE_VALUE_VERSION and value.topic_id is not None and value.topic_id.int != 0:
        w.uvarint(1)  # one tagged field: tag 0 (topicId), 16 bytes
        w.uvarint(_TOPIC_ID_TAG)
        w.uvarint(16)
        w.buf += value.topic_id.bytes
    else:
        w.tagged_fields()
    return w.done()


def decode_offset_commit_value(data: bytes) -> OffsetCommitValue:
    v = record_version(data)
    if v == 3:  # what Kafka writes: the fast path
        if len(data) < 14:
            raise OffsetsSchemaError("truncated OffsetCommitValue v3")
        offset3, epoch3 = _I64_I32.unpack_from(data, 2)
        metadata3, pos = _classic_string(data, 14)
        if pos + 8 > len(data):
            raise OffsetsSchemaError("truncated: commitTimestamp")
        return OffsetCommitValue(offset3, metadata3, _I64.unpack_from(data, pos)[0], epoch3)
    if v not in OFFSET_COMMIT_VALUE_VERSIONS:
        raise OffsetsSchemaError(f"unknown OffsetCommitValue version {v}")
    r = _reader(data, flexible=v >= FLEXIBLE_VALUE_VERSION)
    offset = r.int64()
    leader_epoch = r.int32() if v >= 3 else -1
    metadata = r.string()
    commit_ts = r.int64()
    expire: int | None = None
    if v == 1:
        raw_expire = r.int64()
        # OffsetAndMetadata.fromRecord: -1 (DEFAULT_TIMESTAMP) means "no expire timestamp".
        expire = None if raw_expire == -1 else raw_expire
    topic_id: uuid.UUID | None = None
    if r.flexible:
        for _ in range(r.uvarint()):
            tag, size = r.uvarint(), r.uvarint()
            raw = r.take(size)
            if tag == _TOPIC_ID_TAG and size == 16 and any(raw):
                topic_id = uuid.UUID(bytes=raw)
    return OffsetCommitValue(offset, metadata, commit_ts, leader_epoch, expire, topic_id)


# --- GroupMetadataValue ----------------------------------------------------------------------


def encode_group_metadata_value(value: GroupMetadataValue, version: int = WRITE_GROUP_METADATA_VALUE_VERSION) -> bytes:
    """Fields per version (docs/offsets-log-format.md, "Values (version-prefixed)"):
    currentStateTimestamp from v2, member groupInstanceId from v3, member rebalanceTimeout from
    v1; v4 is v3 flexible.  Kafka's writers use v3."""
    v = version
    if v not in GROUP_METADATA_VALUE_VERSIONS:
        raise OffsetsSchemaError(f"GroupMetadataValue has no version {v}")
    w = _writer(v, flexible=v >= FLEXIBLE_VALUE_VERSION)
    w.string(value.protocol_type)
    w.int32(value.generation)
    w.nullable_string(value.protocol)
    w.nullable_string(value.leader)
    if v >= 2:
        w.int64(value.current_state_timestamp)
    w.array_length(len(value.members))
    for m in value.members:
        w.string(m.member_id)
        if v >= 3:
            w.nullable_string(m.group_instance_id)
        elif m.group_instance_id is not None:
            # Kafka's generated writer refuses a non-default value in a version without the field.
            raise OffsetsSchemaError(f"GroupMetadataValue v{v} cannot carry a group instance id")
        w.string(m.client_id)
        w.string(m.client_host)
        if v >= 1:
            w.int32(m.rebalance_timeout)
        w.int32(m.session_timeout)
        w.bytes_(m.subscription)
        w.bytes_(m.assignment)
        w.tagged_fields()
    w.tagged_fields()
    return w.done()


_I32_I32_I32 = struct.Struct(">iii")
_GROUP_V3_PREFIX: Final = _I16.pack(WRITE_GROUP_METADATA_VALUE_VERSION)


def _classic_nullable_string(data: bytes, pos: int) -> tuple[str | None, int]:
    """A nullable classic STRING at ``pos`` (any negative length is null); IndexError,
    ValueError when it is not there whole."""
    n = (data[pos] << 8) | data[pos + 1]
    if n & 0x8000:
        return None, pos + 2
    end = pos + 2 + n
    if end > len(data):
        raise OffsetsSchemaError("truncated")
    return data[pos + 2 : end].decode("utf-8"), end


def _group_metadata_value_v3(data: bytes) -> GroupMetadataValue:
    """Version 3, what Kafka writes, read directly (the generic reader below is the reference:
    the same fields, no check of trailing bytes).  Raises IndexError, ValueError or struct.error
    for anything it does not read whole; the caller then reads the bytes with the reference,
    which words the error."""
    protocol_type, pos = _classic_string(data, 2)
    generation = _I32.unpack_from(data, pos)[0]
    protocol, pos = _classic_nullable_string(data, pos + 4)
    leader, pos = _classic_nullable_string(data, pos)
    current_state_ts, count = _I64_I32.unpack_from(data, pos)
    pos += 12
    if count < 0 or count > len(data) - pos:
        raise OffsetsSchemaError("bad member count")
    members = []
    for _ in range(count):
        member_id, pos = _classic_string(data, pos)
        instance_id, pos = _classic_nullable_string(data, pos)
        client_id, pos = _classic_string(data, pos)
        client_host, pos = _classic_string(data, pos)
        rebalance_timeout, session_timeout, size = _I32_I32_I32.unpack_from(data, pos)
        pos += 12
        if size < 0 or pos + size > len(data):
            raise OffsetsSchemaError("bad subscription")
        subscription = data[pos : pos + size]
        pos += size
        size = _I32.unpack_from(data, pos)[0]
        pos += 4
        if size < 0 or pos + size > len(data):
            raise OffsetsSchemaError("bad assignment")
        members.append(
            MemberMetadata(
                member_id,
                instance_id,
                client_id,
                client_host,
                rebalance_timeout,
                session_timeout,
                subscription,
                data[pos : pos + size],
            )
        )
        pos += size
    return GroupMetadataValue(protocol_type, generation, protocol, leader, current_state_ts, tuple(members))


def decode_group_metadata_value(data: bytes) -> GroupMetadataValue:
    if data[:2] == _GROUP_V3_PREFIX:
        try:
            return _group_metadata_value_v3(data)
        except (IndexError, ValueError, struct.error):
            pass  # the reference reads it again and words the error
    return _group_metadata_value_reference(data)


def _group_metadata_value_reference(data: bytes) -> GroupMetadataValue:
    v = record_version(data)
    if v not in GROUP_METADATA_VALUE_VERSIONS:
        raise OffsetsSchemaError(f"unknown GroupMetadataValue version {v}")
    r = _reader(data, flexible=v >= FLEXIBLE_VALUE_VERSION)
    protocol_type = r.string()
    generation = r.int32()
    protocol = r.nullable_string()
    leader = r.nullable_string()
    current_state_ts = r.int64() if v >= 2 else -1
    members: list[MemberMetadata] = []
    for _ in range(r.array_length()):
        member_id = r.string()
        instance_id = r.nullable_string() if v >= 3 else None
        client_id = r.string()
        client_host = r.string()
        rebalance_timeout = r.int32() if v >= 1 else None
        session_timeout = r.int32()
        subscription = r.bytes_()
        assignment = r.bytes_()
        r.skip_tagged_fields()
        # GroupMetadataManager.readGroupMessageValue: a v0 member's rebalance timeout is its
        # session timeout.
        members.append(
            MemberMetadata(
                member_id,
                instance_id,
                client_id,
                client_host,
                session_timeout if rebalance_timeout is None else rebalance_timeout,
                session_timeout,
                subscription,
                assignment,
            )
        )
    r.skip_tagged_fields()
    return GroupMetadataValue(protocol_type, generation, protocol, leader, current_state_ts, tuple(members))


# --- values by key ---------------------------------------------------------------------------


def encode_value(value: Value) -> bytes:
    """The value bytes Kafka writes: OffsetCommitValue v3 (v1 with an expire timestamp) or
    GroupMetadataValue v3."""
    if isinstance(value, OffsetCommitValue):
        return encode_offset_commit_value(value)
    return encode_group_metadata_value(value)


def decode_value(key: Key, data: bytes | None) -> Value | None:
    """Decode the value of a record whose key decoded to ``key``; None (a tombstone) stays None."""
    if data is None:
        return None
    if isinstance(key, OffsetCommitKey):
        return decode_offset_commit_value(data)
    return decode_group_metadata_value(data)


def encode_record(key: Key, value: Value | None) -> tuple[bytes, bytes | None]:
    """(key bytes, value bytes or None for a tombstone) for one ``__consumer_offsets`` record."""
    if value is not None and isinstance(key, OffsetCommitKey) != isinstance(value, OffsetCommitValue):
        raise OffsetsSchemaError(f"{type(value).__name__} cannot be the value of a {type(key).__name__}")
    return encode_key(key), (None if value is None else encode_value(value))
