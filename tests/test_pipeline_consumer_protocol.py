"""protocol/consumer_protocol.py: the consumer embedded protocol inside group metadata.

kafka-python's own generated encoder (an independent implementation of Kafka's JSON schemas) is the
oracle for every version; hypothesis checks our encoder/decoder round trip and that garbage is refused
with ConsumerProtocolError, never another exception.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment, ConsumerProtocolSubscription
from rallypoint.protocol.consumer_protocol import (
    Assignment,
    ConsumerProtocolError,
    Subscription,
    TopicPartitions,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_subscription_matches_kafka_python(version: int) -> None:
    tp = ConsumerProtocolSubscription.TopicPartition(topic="orders", partitions=[2, 0])
    theirs = ConsumerProtocolSubscription(
        topics=["orders", "payments"],
        user_data=b"\x01\x02",
        owned_partitions=[tp],
        generation_id=42,
        rack_id="rack-a",
        version=version,
    ).encode(version=version)
    sub = decode_subscription(theirs)
    assert sub.version == version
    assert sub.topics == ("orders", "payments")
    assert sub.user_data == b"\x01\x02"
    assert sub.owned_partitions == ((TopicPartitions("orders", (2, 0)),) if version >= 1 else ())
    assert sub.generation_id == (42 if version >= 2 else -1)
    assert sub.rack_id == ("rack-a" if version >= 3 else None)
    assert encode_subscription(sub) == theirs


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_assignment_matches_kafka_python(version: int) -> None:
    tps = [
        ConsumerProtocolAssignment.TopicPartition(topic="orders", partitions=[0, 3]),
        ConsumerProtocolAssignment.TopicPartition(topic="p", partitions=[]),
    ]
    theirs = ConsumerProtocolAssignment(assigned_partitions=tps, user_data=None, version=version).encode(
        version=version
    )
    a = decode_assignment(theirs)
    assert a == Assignment(version, (TopicPartitions("orders", (0, 3)), TopicPartitions("p", ())), None)
    assert a.topic_partitions() == [("orders", 0), ("orders", 3)]
    assert encode_assignment(a) == theirs


def test_newer_version_is_read_with_the_latest_schema() -> None:
    # Kafka's ConsumerProtocol reads versions above the newest known with the newest schema,
    # ignoring fields appended after it.
    body = encode_subscription(Subscription(3, ("t",), None, (), 5, "r"))[2:]
    sub = decode_subscription(struct.pack(">h", 9) + body + b"future-field")
    assert (sub.version, sub.topics, sub.generation_id, sub.rack_id) == (9, ("t",), 5, "r")
    a = decode_assignment(struct.pack(">h", 7) + encode_assignment(Assignment(0, ()))[2:] + b"xx")
    assert a.version == 7 and a.partitions == ()


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00",
        b"\xff\xff",  # negative version
        b"\x00\x00\x00\x00\x00\x01",  # one topic promised, none there
        b"\x00\x00\x7f\xff\xff\xff",  # absurd array length
        b"\x00\x00\x00\x00\x00\x01\x00\x02\xff\xfe\x00\x00\x00\x00\xff\xff\xff\xff",  # bad UTF-8
    ],
)
def test_garbage_is_refused(data: bytes) -> None:
    with pytest.raises(ConsumerProtocolError):
        decode_assignment(data)
    with pytest.raises(ConsumerProtocolError):
        decode_subscription(data)


_tps = st.lists(
    st.builds(
        TopicPartitions,
        st.text(max_size=8),
        st.lists(st.integers(-(2**31), 2**31 - 1), max_size=5).map(tuple),
    ),
    max_size=4,
).map(tuple)


@given(st.integers(0, 3), _tps, st.none() | st.binary(max_size=8))
def test_assignment_round_trip(version: int, tps: tuple[TopicPartitions, ...], user_data: bytes | None) -> None:
    a = Assignment(version, tps, user_data)
    assert decode_assignment(encode_assignment(a)) == a


@given(
    st.integers(0, 3),
    st.lists(st.text(max_size=8), max_size=4).map(tuple),
    st.none() | st.binary(max_size=8),
    _tps,
    st.integers(-(2**31), 2**31 - 1),
    st.none() | st.text(max_size=5),
)
def test_subscription_round_trip(
    version: int,
    topics: tuple[str, ...],
    user_data: bytes | None,
    owned: tuple[TopicPartitions, ...],
    generation: int,
    rack: str | None,
) -> None:
    s = Subscription(
        version,
        topics,
        user_data,
        owned if version >= 1 else (),
        generation if version >= 2 else -1,
        rack if version >= 3 else None,
    )
    assert decode_subscription(encode_subscription(s)) == s


@given(st.binary(max_size=64))
def test_random_bytes_never_raise_anything_else(data: bytes) -> None:
    for decode in (decode_assignment, decode_subscription):
        try:
            decode(data)
        except ConsumerProtocolError:
            pass
