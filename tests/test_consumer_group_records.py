"""Consumer-group record layouts in ``__consumer_offsets`` (docs/consumer-groups.md, "Records")."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rallypoint.protocol.consumer_group_records import (
    ClassicMemberMetadata,
    ClassicProtocol,
    ConsumerRecordError,
    CurrentMemberAssignmentKey,
    CurrentMemberAssignmentValue,
    EpochTopicPartitions,
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadataKey,
    MemberMetadataValue,
    PartitionMetadataKey,
    PartitionMetadataValue,
    RegularExpressionKey,
    RegularExpressionValue,
    TargetAssignmentMemberKey,
    TargetAssignmentMemberValue,
    TargetAssignmentMetadataKey,
    TargetAssignmentMetadataValue,
    TopicPartitions,
    decode_key,
    decode_record,
    decode_value,
    describe,
    encode_key,
    encode_record,
    encode_value,
)

pytestmark = pytest.mark.unit

TID = uuid.UUID("00112233-4455-6677-8899-aabbccddeeff")


def test_keys_are_type_prefixed_classic_structs() -> None:
    assert encode_key(GroupMetadataKey("g")) == b"\x00\x03\x00\x01g"
    assert encode_key(MemberMetadataKey("g", "m")) == b"\x00\x05\x00\x01g\x00\x01m"
    assert encode_key(TargetAssignmentMetadataKey("g")) == b"\x00\x06\x00\x01g"
    assert encode_key(TargetAssignmentMemberKey("g", "m")) == b"\x00\x07\x00\x01g\x00\x01m"
    assert encode_key(CurrentMemberAssignmentKey("g", "m")) == b"\x00\x08\x00\x01g\x00\x01m"
    assert encode_key(RegularExpressionKey("g", "a.*")) == b"\x00\x10\x00\x01g\x00\x03a.*"
    assert decode_key(b"\x00\x04\x00\x01g") == PartitionMetadataKey("g")


def test_group_metadata_value_with_tagged_hash() -> None:
    assert encode_value(GroupMetadataValue(5)) == b"\x00\x00\x00\x00\x00\x05\x00"
    raw = encode_value(GroupMetadataValue(5, 1))
    assert raw == b"\x00\x00\x00\x00\x00\x05" + b"\x01\x00\x08" + b"\x00" * 7 + b"\x01"
    assert decode_value(GroupMetadataKey("g"), raw) == GroupMetadataValue(5, 1)


def test_target_metadata_value_with_tagged_timestamp() -> None:
    raw = encode_value(TargetAssignmentMetadataValue(3, 0x0102))
    assert raw == b"\x00\x00\x00\x00\x00\x03\x01\x00\x08" + b"\x00" * 6 + b"\x01\x02"


def test_current_assignment_value_layout() -> None:
    v = CurrentMemberAssignmentValue(4, 3, 1, (EpochTopicPartitions(TID, (0, 2), (3, 4)),), ())
    raw = encode_value(v)
    expected = (
        b"\x00\x00"  # version
        + b"\x00\x00\x00\x04\x00\x00\x00\x03\x01"  # epoch, previous, state
        + b"\x02"  # one topic
        + TID.bytes
        + b"\x03\x00\x00\x00\x00\x00\x00\x00\x02"  # partitions [0, 2]
        + b"\x01\x00\x09\x03\x00\x00\x00\x03\x00\x00\x00\x04"  # tag 0: AssignmentEpochs [3, 4]
        + b"\x01"  # no pending
        + b"\x00"  # tags
    )
    assert raw == expected
    assert decode_value(CurrentMemberAssignmentKey("g", "m"), raw) == v


def test_member_metadata_round_trip_with_classic_metadata() -> None:
    v = MemberMetadataValue(
        "i",
        None,
        "cid",
        "/127.0.0.1",
        ("a", "b"),
        "x.*",
        300000,
        "range",
        ClassicMemberMetadata(6000, (ClassicProtocol("range", b"\x01"),)),
    )
    assert decode_record(*encode_record(MemberMetadataKey("g", "m"), v)) == (MemberMetadataKey("g", "m"), v)


def test_tombstones_and_mismatched_values() -> None:
    assert encode_record(GroupMetadataKey("g"), None) == (b"\x00\x03\x00\x01g", None)
    assert decode_record(b"\x00\x03\x00\x01g", None) == (GroupMetadataKey("g"), None)
    with pytest.raises(ConsumerRecordError):
        encode_record(GroupMetadataKey("g"), TargetAssignmentMetadataValue(1))


@pytest.mark.parametrize(
    "raw",
    [b"", b"\x00", b"\x00\x03", b"\x00\x03\x00\x05ab", b"\x00\x09\x00\x01g", b"\x00\x08\x00\x01g"],
)
def test_bad_keys(raw: bytes) -> None:
    with pytest.raises(ConsumerRecordError):
        decode_key(raw)


def test_bad_values() -> None:
    k = CurrentMemberAssignmentKey("g", "m")
    good = encode_value(CurrentMemberAssignmentValue(1, 0, 0, (EpochTopicPartitions(TID, (0,), (1,)),), ()))
    for cut in range(len(good) - 1):
        with pytest.raises(ConsumerRecordError):
            decode_value(k, good[:cut])
    with pytest.raises(ConsumerRecordError):
        decode_value(k, b"\x00\x01" + good[2:])  # unknown value version
    huge_array = b"\x00\x00" + b"\x00" * 9 + b"\xff\xff\xff\x0f"
    with pytest.raises(ConsumerRecordError):
        decode_value(k, huge_array)


def test_unknown_tags_are_skipped() -> None:
    raw = b"\x00\x00\x00\x00\x00\x07" + b"\x01\x05\x02ab"
    assert decode_value(GroupMetadataKey("g"), raw) == GroupMetadataValue(7)


def test_legacy_partition_metadata_is_opaque() -> None:
    v = decode_value(PartitionMetadataKey("g"), b"\x00\x00\x01\x00")
    assert v == PartitionMetadataValue(b"\x01\x00")


names = st.text(min_size=0, max_size=8)
tps = st.lists(
    st.builds(
        lambda t, ps: EpochTopicPartitions(t, tuple(ps), tuple(range(len(ps)))),
        st.uuids(),
        st.lists(st.integers(0, 2**31 - 1), max_size=4),
    ),
    max_size=3,
).map(tuple)
values = st.one_of(
    st.builds(GroupMetadataValue, st.integers(-(2**31), 2**31 - 1), st.integers(-(2**63), 2**63 - 1)),
    st.builds(
        MemberMetadataValue,
        st.none() | names,
        st.none() | names,
        names,
        names,
        st.lists(names, max_size=3).map(tuple),
        st.none() | names,
        st.integers(-1, 2**31 - 1),
        st.none() | names,
    ),
    st.builds(TargetAssignmentMetadataValue, st.integers(-1, 2**31 - 1), st.integers(0, 2**62)),
    st.builds(
        TargetAssignmentMemberValue,
        st.lists(
            st.builds(TopicPartitions, st.uuids(), st.lists(st.integers(0, 99), max_size=3).map(tuple)), max_size=3
        ).map(tuple),
    ),
    st.builds(CurrentMemberAssignmentValue, st.integers(-2, 99), st.integers(-2, 99), st.integers(0, 2), tps, tps),
    st.builds(
        RegularExpressionValue, st.lists(names, max_size=3).map(tuple), st.integers(0, 99), st.integers(0, 2**40)
    ),
)
KEY_FOR = {
    GroupMetadataValue: GroupMetadataKey("g"),
    MemberMetadataValue: MemberMetadataKey("g", "m"),
    TargetAssignmentMetadataValue: TargetAssignmentMetadataKey("g"),
    TargetAssignmentMemberValue: TargetAssignmentMemberKey("g", "m"),
    CurrentMemberAssignmentValue: CurrentMemberAssignmentKey("g", "m"),
    RegularExpressionValue: RegularExpressionKey("g", "r"),
}


@given(values)
def test_round_trip(v: object) -> None:
    key = KEY_FOR[type(v)]
    assert decode_record(*encode_record(key, v)) == (key, v)  # type: ignore[arg-type]


def test_describe_for_dump_tools() -> None:
    k, v = encode_record(
        CurrentMemberAssignmentKey("g", "m"),
        CurrentMemberAssignmentValue(4, 3, 0, (EpochTopicPartitions(TID, (0,), (4,)),), ()),
    )
    d = describe(k, v)
    assert d["type"] == "consumer_group_current_member_assignment"
    assert d["key"] == {"groupId": "g", "memberId": "m"}
    assert d["value"]["memberEpoch"] == 4
    assert d["value"]["assignedPartitions"] == [{"topicId": str(TID), "partitions": [0], "assignmentEpochs": [4]}]
    tomb = describe(encode_key(GroupMetadataKey("g")), None)
    assert tomb == {"type": "consumer_group_metadata", "key": {"groupId": "g"}, "value": None}
    with pytest.raises(ConsumerRecordError):
        describe(b"\x00\x05\x00", None)
