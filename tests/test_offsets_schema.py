"""``__consumer_offsets`` keys and values: every version round-trips; hand-built bytes from the
layouts of docs/offsets-log-format.md ("Keys", "Values") decode to the expected values; a group's
partition is Kafka's."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rallypoint.protocol.offsets_schema import (
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadata,
    OffsetCommitKey,
    OffsetCommitValue,
    OffsetsSchemaError,
    UnknownKey,
    decode_group_metadata_value,
    decode_key,
    decode_offset_commit_value,
    decode_value,
    encode_group_metadata_key,
    encode_group_metadata_value,
    encode_key,
    encode_offset_commit_key,
    encode_offset_commit_value,
    encode_record,
    encode_value,
    partition_for,
    record_version,
)

from tests.support.offsets_synth import java_hash_code

pytestmark = pytest.mark.unit


def s16(s: str) -> bytes:
    raw = s.encode()
    return struct.pack(">h", len(raw)) + raw


def cstr(s: str) -> bytes:  # compact string, length < 127
    raw = s.encode()
    return bytes([len(raw) + 1]) + raw


MEMBER = MemberMetadata("m-1", "inst-1", "client", "/10.0.0.1", 300000, 45000, b"\x00\x01sub", b"\x00\x01asg")
GROUP = GroupMetadataValue("consumer", 7, "range", "m-1", 1700000000123, (MEMBER,))


# --- keys --------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [0, 1])
def test_offset_commit_key_round_trip(version: int) -> None:
    key = OffsetCommitKey("grp", "topic-ü", 42)
    data = encode_offset_commit_key(key, version)
    assert record_version(data) == version
    assert decode_key(data) == key


def test_offset_commit_key_v1_bytes() -> None:
    data = struct.pack(">h", 1) + s16("g") + s16("t") + struct.pack(">i", 3)
    assert decode_key(data) == OffsetCommitKey("g", "t", 3)
    assert encode_key(OffsetCommitKey("g", "t", 3)) == data  # writers use v1


def test_group_metadata_key_bytes() -> None:
    data = struct.pack(">h", 2) + s16("my-group")
    assert decode_key(data) == GroupMetadataKey("my-group")
    assert encode_key(GroupMetadataKey("my-group")) == data
    assert encode_group_metadata_key(GroupMetadataKey("my-group")) == data


@pytest.mark.parametrize("version", [3, 4, 5, 8, 9, 15, 100])
def test_unknown_key_versions_are_a_distinct_result(version: int) -> None:
    data = struct.pack(">h", version) + s16("whatever")
    got = decode_key(data)
    assert isinstance(got, UnknownKey)
    assert got.version == version and got.raw == data


def test_bad_keys_raise() -> None:
    with pytest.raises(OffsetsSchemaError):
        decode_key(b"\x00")
    with pytest.raises(OffsetsSchemaError):
        decode_key(struct.pack(">h", 1) + s16("g") + b"\x00\x05ab")  # truncated topic
    with pytest.raises(OffsetsSchemaError):
        decode_key(struct.pack(">h", 2) + b"\x00\x02\xff\xfe")  # not UTF-8
    with pytest.raises(OffsetsSchemaError):
        decode_key(struct.pack(">h", 2) + b"\xff\xff")  # null in a non-nullable string
    with pytest.raises(OffsetsSchemaError):
        encode_offset_commit_key(OffsetCommitKey("g", "t", 0), 2)


# --- OffsetCommitValue -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "value"),
    [
        (0, OffsetCommitValue(5, "meta", 1000)),
        (1, OffsetCommitValue(5, "meta", 1000, expire_timestamp=2000)),
        (1, OffsetCommitValue(5, "meta", 1000)),  # expire -1 reads back as None
        (2, OffsetCommitValue(5, "", 1000)),
        (3, OffsetCommitValue(5, "m", 1000, leader_epoch=9)),
        (4, OffsetCommitValue(5, "m" * 300, 1000, leader_epoch=9)),
    ],
)
def test_offset_commit_value_round_trip(version: int, value: OffsetCommitValue) -> None:
    data = encode_offset_commit_value(value, version)
    assert record_version(data) == version
    assert decode_offset_commit_value(data) == value


def test_offset_commit_value_hand_built_bytes() -> None:
    v0 = struct.pack(">hq", 0, 10) + s16("md") + struct.pack(">q", 111)
    assert decode_offset_commit_value(v0) == OffsetCommitValue(10, "md", 111)
    v1 = struct.pack(">hq", 1, 10) + s16("") + struct.pack(">qq", 111, 222)
    assert decode_offset_commit_value(v1) == OffsetCommitValue(10, "", 111, expire_timestamp=222)
    v2 = struct.pack(">hq", 2, 10) + s16("x") + struct.pack(">q", 111)
    assert decode_offset_commit_value(v2) == OffsetCommitValue(10, "x", 111)
    v3 = struct.pack(">hqi", 3, 10, 4) + s16("x") + struct.pack(">q", 111)
    assert decode_offset_commit_value(v3) == OffsetCommitValue(10, "x", 111, leader_epoch=4)
    # v4: flexible — compact string, then tagged fields (here one unknown tag 0 of 2 bytes, skipped)
    v4 = struct.pack(">hqi", 4, 10, 4) + cstr("x") + struct.pack(">q", 111) + b"\x01\x00\x02zz"
    assert decode_offset_commit_value(v4) == OffsetCommitValue(10, "x", 111, leader_epoch=4)
    # what Kafka writes: v3, or v1 when an expire timestamp is set
    assert encode_value(OffsetCommitValue(10, "x", 111, leader_epoch=4)) == v3
    assert encode_value(OffsetCommitValue(10, "", 111, expire_timestamp=222)) == v1


def test_offset_commit_value_errors() -> None:
    with pytest.raises(OffsetsSchemaError):
        decode_offset_commit_value(struct.pack(">hq", 5, 1) + s16("") + struct.pack(">q", 1))
    with pytest.raises(OffsetsSchemaError):
        decode_offset_commit_value(struct.pack(">hq", 3, 1))  # truncated
    with pytest.raises(OffsetsSchemaError):
        encode_offset_commit_value(OffsetCommitValue(1, "", 1), 7)
    with pytest.raises(OffsetsSchemaError):
        encode_offset_commit_value(OffsetCommitValue(1, "x" * 40000, 1), 3)  # int16 length


# --- GroupMetadataValue ------------------------------------------------------------------------


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_group_metadata_value_round_trip(version: int) -> None:
    member = MEMBER
    value = GROUP
    if version < 3:
        member = MemberMetadata(
            MEMBER.member_id,
            None,
            MEMBER.client_id,
            MEMBER.client_host,
            MEMBER.rebalance_timeout,
            MEMBER.session_timeout,
            MEMBER.subscription,
            MEMBER.assignment,
        )
    if version < 1:  # v0 has no rebalance timeout: it reads back as the session timeout
        member = MemberMetadata(
            member.member_id, None, "c", "h", member.session_timeout, member.session_timeout, b"", b"a"
        )
    value = GroupMetadataValue(
        "consumer", 7, "range", "m-1", GROUP.current_state_timestamp if version >= 2 else -1, (member,)
    )
    data = encode_group_metadata_value(value, version)
    assert record_version(data) == version
    assert decode_group_metadata_value(data) == value


def test_empty_group_record_round_trip() -> None:
    empty = GroupMetadataValue("", 3, None, None, 1700000000000, ())
    assert decode_group_metadata_value(encode_value(empty)) == empty


def test_group_metadata_value_v3_hand_built_bytes() -> None:
    data = (
        struct.pack(">h", 3)
        + s16("consumer")
        + struct.pack(">i", 7)
        + s16("range")
        + s16("m-1")
        + struct.pack(">q", 1700000000123)
        + struct.pack(">i", 1)  # members
        + s16("m-1")
        + s16("inst-1")
        + s16("client")
        + s16("/10.0.0.1")
        + struct.pack(">ii", 300000, 45000)
        + struct.pack(">i", 5)
        + b"\x00\x01sub"
        + struct.pack(">i", 5)
        + b"\x00\x01asg"
    )
    assert decode_group_metadata_value(data) == GROUP
    assert encode_value(GROUP) == data  # writers use v3


def test_group_metadata_value_v0_and_v4_hand_built_bytes() -> None:
    v0 = (
        struct.pack(">h", 0)
        + s16("consumer")
        + struct.pack(">i", 1)
        + b"\xff\xff"  # protocol null
        + b"\xff\xff"  # leader null
        + struct.pack(">i", 1)
        + s16("m")
        + s16("c")
        + s16("h")
        + struct.pack(">i", 10000)  # session timeout (no rebalance timeout in v0)
        + struct.pack(">i", 0)
        + struct.pack(">i", 1)
        + b"A"
    )
    want0 = GroupMetadataValue(
        "consumer", 1, None, None, -1, (MemberMetadata("m", None, "c", "h", 10000, 10000, b"", b"A"),)
    )
    assert decode_group_metadata_value(v0) == want0
    v4 = (
        struct.pack(">h", 4)
        + cstr("consumer")
        + struct.pack(">i", 2)
        + b"\x00"  # protocol null (compact)
        + cstr("L")
        + struct.pack(">q", 99)
        + b"\x02"  # one member (compact array: n + 1)
        + cstr("m")
        + b"\x00"  # instance id null
        + cstr("c")
        + cstr("h")
        + struct.pack(">ii", 20, 10)
        + b"\x01"  # empty subscription (compact bytes: n + 1)
        + b"\x03ab"
        + b"\x00"  # member tagged fields
        + b"\x00"  # value tagged fields
    )
    want4 = GroupMetadataValue("consumer", 2, None, "L", 99, (MemberMetadata("m", None, "c", "h", 20, 10, b"", b"ab"),))
    assert decode_group_metadata_value(v4) == want4
    assert encode_group_metadata_value(want4, 4) == v4


def test_group_metadata_value_errors() -> None:
    with pytest.raises(OffsetsSchemaError):
        encode_group_metadata_value(GROUP, 2)  # instance id needs v3
    with pytest.raises(OffsetsSchemaError):
        decode_group_metadata_value(struct.pack(">h", 9))
    bad = struct.pack(">h", 3) + s16("consumer") + struct.pack(">i", 1) + b"\xff\xff\xff\xff" + struct.pack(">q", 1)
    with pytest.raises(OffsetsSchemaError):
        decode_group_metadata_value(bad + struct.pack(">i", 1_000_000))  # more members than bytes


def test_decode_value_by_key_and_tombstones() -> None:
    okey = OffsetCommitKey("g", "t", 0)
    oval = OffsetCommitValue(1, "", 2)
    assert decode_value(okey, encode_value(oval)) == oval
    assert decode_value(GroupMetadataKey("g"), encode_value(GROUP)) == GROUP
    assert decode_value(okey, None) is None
    assert encode_record(okey, None) == (encode_key(okey), None)
    with pytest.raises(OffsetsSchemaError):
        encode_record(okey, GROUP)


text = st.text(max_size=20)


@given(
    group=text,
    topic=text,
    partition=st.integers(-(2**31), 2**31 - 1),
    offset=st.integers(-(2**63), 2**63 - 1),
    metadata=st.text(max_size=50),
    ts=st.integers(-(2**63), 2**63 - 1),
    epoch=st.integers(-(2**31), 2**31 - 1),
    expire=st.none() | st.integers(0, 2**62),
)
def test_written_records_round_trip(
    group: str, topic: str, partition: int, offset: int, metadata: str, ts: int, epoch: int, expire: int | None
) -> None:
    key = OffsetCommitKey(group, topic, partition)
    value = OffsetCommitValue(offset, metadata, ts, epoch if expire is None else -1, expire)
    kb, vb = encode_record(key, value)
    assert decode_key(kb) == key
    assert vb is not None and decode_value(key, vb) == value


# --- the partition of a group ----------------------------------------------------------------

# (group id, Java's groupId.hashCode(), Kafka's Utils.abs(hash) % 50), printed by OpenJDK 17 with
# ``Utils.abs(n) = n == Integer.MIN_VALUE ? 0 : Math.abs(n)``.
JAVA_TABLE = [
    ("", 0, 0),
    ("hello", 99162322, 22),
    ("polygenelubricants", -2147483648, 0),  # Integer.MIN_VALUE: Utils.abs gives 0
    ("my-group", -1906497762, 12),
    ("console-consumer-12345", 158455506, 6),
    ("orders-service", 23943117, 17),
    ("spark-kafka-source-0f3c", -1257996639, 39),
    ("group-\u00e9t\u00e9", -1484026544, 44),
    ("\U0001f600-emoji", -1200436388, 38),  # a surrogate pair: two UTF-16 code units
    ("connect-cluster", 1440343063, 13),
    ("g", 103, 3),
    ("test-group-7", 2060176942, 42),
    ("payments", 1382682413, 13),
    ("analytics.v2", -874698268, 18),
    ("GROUP_WITH_CAPS", 2051202266, 16),
    ("grp-rhcbom", -680362085, 35),  # masking with 0x7fffffff would give 13
]


@pytest.mark.parametrize("group,java_hash,partition", JAVA_TABLE)
def test_partition_for_is_kafkas_utils_abs_of_the_java_hash(group: str, java_hash: int, partition: int) -> None:
    assert java_hash_code(group) == java_hash
    kafka_abs = 0 if java_hash == -(2**31) else abs(java_hash)
    assert kafka_abs % 50 == partition
    assert partition_for(group, 50) == partition


@given(st.text(max_size=30), st.integers(1, 1000))
def test_partition_for_any_group_and_count(group: str, n: int) -> None:
    h = java_hash_code(group)
    assert partition_for(group, n) == (0 if h == -(2**31) else abs(h)) % n
