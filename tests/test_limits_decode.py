"""Decoding bounded by the frame and by rallypoint.request.max.elements; the fast Metadata writer.

In-process unit tests of :mod:`protocol.tagged` and :mod:`protocol.metadata_response`
(docs/reliability.md, "Limits").
"""

from __future__ import annotations

import struct
import time
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rallypoint.protocol import codec, framing, metadata_response, tagged

pytestmark = pytest.mark.unit

# --------------------------------------------------------------------------- array sizes


def test_smallest_element_sizes_follow_the_schema() -> None:
    # MetadataRequestTopic v12: topic_id uuid (16) + nullable compact string (1) + tag count (1)
    v12_topic = codec.decode_request(3, 12, b"\x02" + bytes(16) + b"\x00\x00" + b"\x00\x00\x00").topics[0]
    assert tagged.min_size(type(v12_topic)) == 18
    # v1: a legacy string (2)
    v1_topic = codec.decode_request(3, 1, struct.pack(">i", 1) + b"\x00\x01a").topics[0]
    assert tagged.min_size(type(v1_topic)) == 2
    # ApiVersions v3 request: two compact strings and the tag count
    assert tagged.min_size(codec.request_class(18, 3)) == 3


def test_an_array_longer_than_its_bytes_allow_is_refused_before_any_element_is_read() -> None:
    # Metadata v12: 1,000 topics announced, each needs 18 bytes; 1,000 bytes follow.
    body = framing.write_uvarint(1001) + b"\x00" * 1000
    with pytest.raises(codec.DecodeError, match="cannot fit"):
        codec.decode_request(3, 12, body)
    # v1: 1,000 names of at least 2 bytes in 1,999 bytes
    with pytest.raises(codec.DecodeError, match="cannot fit"):
        codec.decode_request(3, 1, struct.pack(">i", 1000) + b"\x00" * 1999)
    assert len(codec.decode_request(3, 1, struct.pack(">i", 1000) + b"\x00" * 2000).topics) == 1000


def test_primitive_arrays_are_checked_by_their_item_width() -> None:
    # CreatePartitions v3: an assignment's broker_ids is an int32 array.
    body = codec.encode_message(
        codec.build_request(
            37, 3, {"topics": [{"name": "t", "count": 2, "assignments": [{"broker_ids": [1]}]}], "timeout": 1}
        )
    )
    msg = codec.decode_request(37, 3, body)
    assert list(msg.topics[0].assignments[0].broker_ids) == [1]
    # claim 10 broker ids (40 bytes) where fewer than 40 bytes are left
    one = framing.write_uvarint(2) + struct.pack(">i", 1)
    assert one in body and len(body) - body.index(one) < 40
    lying = body.replace(one, framing.write_uvarint(11) + struct.pack(">i", 1), 1)
    with pytest.raises(codec.DecodeError, match="cannot fit"):
        codec.decode_request(37, 3, lying)


# --------------------------------------------------------------------------- the element budget


def _metadata_v1(n: int) -> bytes:
    return struct.pack(">i", n) + b"\x00\x01a" * n


def test_the_element_budget_counts_every_element() -> None:
    assert len(codec.decode_request(3, 1, _metadata_v1(100), max_elements=100).topics) == 100
    with pytest.raises(codec.DecodeError, match="more than 99"):
        codec.decode_request(3, 1, _metadata_v1(100), max_elements=99)


def test_the_element_budget_is_shared_by_nested_arrays() -> None:
    # OffsetCommit v8: 3 topics x 10 partitions = 33 elements
    data = {
        "group_id": "g",
        "generation_id_or_member_epoch": 1,
        "member_id": "m",
        "topics": [
            {"name": f"t{i}", "partitions": [{"partition_index": p, "committed_offset": 1} for p in range(10)]}
            for i in range(3)
        ],
    }
    body = codec.encode_message(codec.build_request(8, 8, data))
    assert len(codec.decode_request(8, 8, body, max_elements=33).topics) == 3
    with pytest.raises(codec.DecodeError, match="more than 32"):
        codec.decode_request(8, 8, body, max_elements=32)


def test_tagged_fields_count_against_the_budget_and_must_fit() -> None:
    av3 = {"client_software_name": "a", "client_software_version": "b"}
    body = codec.encode_message(codec.build_request(18, 3, av3))
    assert body.endswith(b"\x00")
    five_unknown = framing.write_uvarint(5) + b"".join(framing.write_uvarint(100 + i) + b"\x00" for i in range(5))
    assert codec.decode_request(18, 3, body[:-1] + five_unknown, max_elements=5).client_software_name == "a"
    with pytest.raises(codec.DecodeError, match="more than 4"):
        codec.decode_request(18, 3, body[:-1] + five_unknown, max_elements=4)
    with pytest.raises(codec.DecodeError, match="tagged fields cannot fit"):
        codec.decode_request(18, 3, body[:-1] + framing.write_uvarint(2**30) + b"\x00" * 10)


# --------------------------------------------------------------------------- null arrays


def test_a_null_non_nullable_array_is_malformed() -> None:
    # CreateTopics v4: topics is not nullable
    with pytest.raises(codec.DecodeError, match="non-nullable field topics was serialized as null"):
        codec.decode_request(19, 4, struct.pack(">i", -1) + struct.pack(">i?", 1000, False))
    # JoinGroup v6 protocols (flexible: compact null is 0)
    body = codec.encode_message(
        codec.build_request(
            11,
            6,
            {
                "group_id": "g",
                "session_timeout": 10000,
                "rebalance_timeout": 10000,
                "member_id": "",
                "protocol_type": "consumer",
                "protocols": [],
            },
        )
    )
    assert body.endswith(b"\x01\x00")  # empty protocols array, then the tag count
    with pytest.raises(codec.DecodeError, match="non-nullable field protocols"):
        codec.decode_request(11, 6, body[:-2] + b"\x00\x00")


def test_a_null_nullable_array_is_none() -> None:
    assert codec.decode_request(3, 1, struct.pack(">i", -1)).topics is None
    assert codec.decode_request(3, 12, b"\x00\x01\x00\x00\x00").topics is None


# --------------------------------------------------------------------------- repeated tagged fields


def _fetch_v12_with_repeats(n: int) -> bytes:
    body = codec.encode_message(
        codec.build_request(
            1,
            12,
            {"replica_id": -1, "max_wait": 1, "min_bytes": 1, "max_bytes": 1, "session_epoch": -1, "rack_id": ""},
        )
    )
    one = b"\x00\x01\x01"  # tag 0 (cluster_id), 1 byte: the compact string ""
    last = b"\x00\x02\x02z"  # ... and last of all "z"
    return body[:-1] + framing.write_uvarint(n + 1) + one * n + last


def test_a_repeated_known_tagged_field_decodes_to_its_last_value() -> None:
    assert codec.decode_request(1, 12, _fetch_v12_with_repeats(3)).cluster_id == "z"


def test_a_repeated_known_tagged_field_decodes_in_linear_time() -> None:
    """Each occurrence used to copy the rest of the body: 1 MB of repeats took seconds."""

    def took(n: int) -> float:
        body = _fetch_v12_with_repeats(n)
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            codec.decode_request(1, 12, body)
            best = min(best, time.perf_counter() - start)
        return best

    small, large = took(5_000), took(80_000)
    assert large < 64 * small + 0.05, (small, large)  # 16 times the repeats: linear ~16x, quadratic ~256x


# --------------------------------------------------------------------------- count_elements


def test_count_elements_counts_structs_and_stops_at_the_bound() -> None:
    def topic(n: int) -> dict[str, Any]:
        return {"partitions": [{"index": i, "replicas": [1, 2]} for i in range(n)], "ids": [1, 2, 3]}

    data = {"topics": [topic(0), topic(10), topic(40)], "x": 1}  # the first one has no partitions
    assert codec.count_elements(data, 10**6) == 53
    assert 3 <= codec.count_elements(data, 3) < 53
    assert codec.count_elements({"a": 1, "ids": list(range(100))}, 10) == 0  # plain values: not structs


def test_an_offset_fetch_answer_is_bounded_by_its_request_only_when_it_names_partitions() -> None:
    """The server encodes an answer bounded by its request without counting it first;
    OffsetFetch's is bounded unless a topic list is null (every committed offset)."""
    from rallypoint.server import _answer_bounded

    def request(version: int, body: dict[str, Any]) -> Any:
        frame = codec.encode_request(9, version, 1, body, "t")[4:]
        header = framing.parse_request_header(frame, codec.request_header_version(9, version))
        return codec.decode_request(9, version, frame, header.size, 10_000)

    named = {"group_id": "g", "topics": [{"name": "t", "partition_indexes": [0]}]}
    assert _answer_bounded(9, request(5, named))
    assert not _answer_bounded(9, request(5, {"group_id": "g", "topics": None}))
    groups = [{"group_id": "a", "topics": [{"name": "t", "partition_indexes": [0]}]}, {"group_id": "b", "topics": None}]
    assert _answer_bounded(9, request(8, {"groups": groups[:1], "require_stable": False}))
    assert not _answer_bounded(9, request(8, {"groups": groups, "require_stable": False}))
    assert _answer_bounded(12, object()) and not _answer_bounded(3, object())  # Heartbeat; Metadata counts


# --------------------------------------------------------------------------- the Metadata writer


def _partition(i: int) -> dict[str, Any]:
    return {
        "error_code": 0,
        "partition_index": i,
        "leader_id": 1,
        "leader_epoch": i % 3,
        "replica_nodes": [1, 2][: 1 + i % 2],
        "isr_nodes": [1],
        "offline_replicas": [2] if i % 4 == 3 else [],
    }


topic_st = st.fixed_dictionaries(
    {
        "error_code": st.sampled_from([0, 3, 17, 100]),
        "name": st.text(max_size=20),
        "partitions": st.lists(st.integers(0, 50).map(_partition), max_size=4),
    },
    optional={
        "topic_id": st.uuids(),
        "is_internal": st.booleans(),
        "topic_authorized_operations": st.integers(-(2**31), 2**31 - 1),
    },
)
broker_st = st.fixed_dictionaries(
    {"node_id": st.integers(0, 2**31 - 1), "host": st.text(max_size=10), "port": st.integers(0, 65535)},
    optional={"rack": st.none() | st.text(max_size=5)},
)
response_st = st.fixed_dictionaries(
    {"brokers": st.lists(broker_st, max_size=3), "topics": st.lists(topic_st, max_size=4)},
    optional={
        "throttle_time": st.integers(0, 2**31 - 1),
        "cluster_id": st.none() | st.text(max_size=22),
        "controller_id": st.integers(-1, 2**31 - 1),
        "cluster_authorized_operations": st.integers(-(2**31), 2**31 - 1),
        "error_code": st.sampled_from([0, 41]),
    },
)


@settings(max_examples=60, deadline=None)
@given(data=response_st)
@pytest.mark.parametrize("version", range(metadata_response.FIRST_VERSION, metadata_response.LAST_VERSION + 1))
def test_the_metadata_writer_writes_kios_bytes(version: int, data: dict[str, Any]) -> None:
    expected = codec.encode_message(codec.build_response(3, version, data))
    assert metadata_response.encode(version, data) == expected


@pytest.mark.parametrize("version", [12, 13])
def test_the_metadata_writer_writes_null_names_from_v12(version: int) -> None:
    data = {"brokers": [], "topics": [{"error_code": 100, "name": None, "topic_id": uuid.uuid4(), "partitions": []}]}
    assert metadata_response.encode(version, data) == codec.encode_message(codec.build_response(3, version, data))


def test_the_metadata_writer_refuses_a_null_name_before_v12() -> None:
    with pytest.raises(ValueError, match="null topic name"):
        metadata_response.encode(11, {"brokers": [], "topics": [{"error_code": 3, "name": None, "partitions": []}]})


def test_encode_response_takes_the_fast_writer_for_metadata() -> None:
    data = {"brokers": [], "topics": [{"error_code": 0, "name": "t", "partitions": [_partition(0)]}]}
    frame = codec.encode_response(3, 12, 9, data)
    corr, msg = codec.decode_response_frame(3, 12, frame[4:])
    assert corr == 9 and msg.topics[0].name == "t" and msg.topics[0].partitions[0].leader_epoch == 0
