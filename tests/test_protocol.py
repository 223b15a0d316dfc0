"""Unit tests of protocol/: framing, headers, every served API/version, unknown tags, bad bytes.

No sockets.  The served (api key, version) pairs are read from rallypoint.protocol.apis.SERVED_APIS at
collection time, so an API added to the table is covered here without touching this file.

Independent references used (so a bug shared by kio and our adapter cannot pass unnoticed):
Kafka's own JSON message schemas as shipped inside kafka-python 3 (``validVersions`` and
``flexibleVersions`` decide header versions), and kafka-python's schema-driven codec, which
must re-encode our bytes byte for byte.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import re
import struct
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.serial import entity_reader
from kio.serial._introspect import EntityField, EntityTupleField, PrimitiveTupleField, classify_field
from rallypoint.protocol import codec, framing, tagged
from rallypoint.protocol.apis import API_VERSIONS_KEY, SERVED_APIS

from tests.support import ROOT

pytestmark = pytest.mark.unit

SERVED: list[tuple[int, int]] = [
    (key, v) for key, api in sorted(SERVED_APIS.items()) for v in range(api.min_version, api.max_version + 1)
]
SERVED_IDS = [f"{SERVED_APIS[k].name}-v{v}" for k, v in SERVED]


# ----------------------------------------------------------------------------- helpers


def _scalar(kafka_type: str, n: int, name: str) -> Any:
    """A distinct, type-correct value in the form handlers use (ints for ms and error codes)."""
    if kafka_type == "int8":
        return n % 100
    if kafka_type in ("int16", "uint16"):
        return 100 + n
    if kafka_type in ("int32", "uint32", "int64", "uint64"):
        return n * 1000 + 7
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return n * 1000
    if kafka_type == "datetime_i64":
        return 1_700_000_000_000 + n
    if kafka_type == "error_code":
        return 27  # REBALANCE_IN_PROGRESS: any real non-zero code
    if kafka_type == "bool":
        return True
    if kafka_type == "string":
        return f"{name}-{n}"
    if kafka_type in ("bytes", "records"):
        return bytes([n % 256]) * 3
    if kafka_type == "uuid":
        return uuid.UUID(int=n)
    if kafka_type == "float64":
        return n + 0.5
    raise AssertionError(f"no test value for kafka type {kafka_type!r}")


def filled(cls: type, counter: Iterator[int] | None = None) -> dict[str, Any]:
    """Every field of ``cls`` set to a non-default value; arrays get two entries."""
    counter = counter or itertools.count(1)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        fc = classify_field(f)
        kafka_type = f.metadata.get("kafka_type", "")
        if isinstance(fc, EntityTupleField):
            out[f.name] = [filled(fc.type_, counter) for _ in range(2)]
        elif isinstance(fc, EntityField):
            out[f.name] = filled(fc.type_, counter)
        elif isinstance(fc, PrimitiveTupleField):
            out[f.name] = [_scalar(kafka_type, next(counter), f.name) for _ in range(2)]
        else:
            out[f.name] = _scalar(kafka_type, next(counter), f.name)
    return out


def _normalise(v: Any) -> Any:
    if isinstance(v, datetime.datetime):
        return round(v.timestamp() * 1000)
    if isinstance(v, dict):
        return {k: _normalise(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_normalise(x) for x in v]
    return v


def assert_carries(decoded: Any, expected: dict[str, Any]) -> None:
    """Every value of ``expected`` (handler-style dict) is what came out of the decoder."""
    assert _normalise(codec.to_dict(decoded)) == _normalise(expected)


def tags(*fields: tuple[int, bytes]) -> bytes:
    """A tagged-fields section."""
    out = framing.write_uvarint(len(fields))
    for tag, data in fields:
        out += framing.write_uvarint(tag) + framing.write_uvarint(len(data)) + data
    return out


def with_top_level_tags(body: bytes, section: bytes) -> bytes:
    """Replace a message's (empty) top-level tag section with ``section``."""
    assert body.endswith(b"\x00")
    return body[:-1] + section


def with_nested_tags(body: bytes, nested: Any, section: bytes) -> bytes:
    """Replace the (empty) tag section of the one struct ``nested`` inside ``body``."""
    raw = codec.encode_message(nested)
    assert raw.endswith(b"\x00") and body.count(raw) == 1
    return body.replace(raw, raw[:-1] + section)


def request_frame_body(frame: bytes) -> bytes:
    (size,) = struct.unpack_from(">i", frame)
    assert size == len(frame) - 4
    return frame[4:]


# ------------------------------------------------- Kafka's JSON schemas (via kafka-python)


def _kafka_python_classes() -> tuple[dict[int, Any], dict[int, Any]]:
    import kafka.protocol.admin
    import kafka.protocol.consumer
    import kafka.protocol.metadata
    import kafka.protocol.producer  # noqa: F401  (registers the message classes)
    from kafka.protocol.api_header import ResponseClassRegistry
    from kafka.protocol.api_message import ApiMessage

    def subclasses(c: type) -> Iterator[Any]:
        for s in c.__subclasses__():
            yield s
            yield from subclasses(s)

    requests = {
        s.API_KEY: s for s in subclasses(ApiMessage) if getattr(s, "_class_version", None) is None and s.is_request()
    }
    return requests, dict(ResponseClassRegistry._response_class_registry)


KP_REQUESTS, KP_RESPONSES = _kafka_python_classes()

# APIs whose schema kafka-python does not ship: Kafka's flexibleVersions from their JSON files.
FLEXIBLE_SINCE_EXTRA: dict[int, int] = {
    67: 0,  # AllocateProducerIds
    68: 0,  # ConsumerGroupHeartbeat
    69: 0,  # ConsumerGroupDescribe
    71: 0,  # GetTelemetrySubscriptions
    72: 0,  # PushTelemetry
    76: 0,  # ShareGroupHeartbeat
    77: 0,  # ShareGroupDescribe
    78: 0,  # ShareFetch
    79: 0,  # ShareAcknowledge
}


def kafka_says_flexible(api_key: int, version: int) -> bool:
    cls = KP_REQUESTS.get(api_key)
    if cls is not None and version <= cls.max_version:
        return bool(cls.flexible_version_q(version))
    if api_key in FLEXIBLE_SINCE_EXTRA:
        return version >= FLEXIBLE_SINCE_EXTRA[api_key]
    pytest.fail(
        f"api {api_key} v{version}: no Kafka schema known to the test; add Kafka's flexibleVersions "
        "for it to FLEXIBLE_SINCE_EXTRA in tests/test_protocol.py"
    )


# ----------------------------------------------------------------------------- framing


@pytest.mark.parametrize("value", [0, 1, 127, 128, 255, 16383, 16384, 2**21, 2**28 - 1, 2**31 - 1, 2**32 - 1])
def test_uvarint_round_trip(value: int) -> None:
    raw = framing.write_uvarint(value)
    assert framing.read_uvarint(raw + b"\xff", 0) == (value, len(raw))


def test_uvarint_known_bytes_and_limits() -> None:
    assert framing.write_uvarint(0) == b"\x00"
    assert framing.write_uvarint(300) == b"\xac\x02"
    with pytest.raises(framing.FrameError):
        framing.read_uvarint(b"\x80\x80", 0)  # truncated
    with pytest.raises(framing.FrameError):
        framing.read_uvarint(b"\x80\x80\x80\x80\x80\x01", 0)  # longer than 5 bytes


def test_frame_is_size_prefixed() -> None:
    assert framing.frame(b"abc") == b"\x00\x00\x00\x03abc"


def test_request_header_v1_bytes() -> None:
    raw = framing.encode_request_header(3, 4, 7, "kcat", 1)
    assert raw == b"\x00\x03\x00\x04\x00\x00\x00\x07\x00\x04kcat"
    h = framing.parse_request_header(raw + b"BODY", 1)
    assert (h.api_key, h.api_version, h.correlation_id, h.client_id, h.size) == (3, 4, 7, "kcat", len(raw))


def test_request_header_null_client_id() -> None:
    raw = framing.encode_request_header(18, 0, 1, None, 1)
    assert raw.endswith(b"\xff\xff")
    assert framing.parse_request_header(raw, 1).client_id is None


def test_request_header_v2_skips_its_tagged_fields() -> None:
    # Header v2 = v1 + tagged fields; the client id stays a legacy (int16-length) string.
    raw = b"\x00\x03\x00\x0c\x00\x00\x00\x09\x00\x01c" + tags((0, b"zz"), (5, b""))
    h = framing.parse_request_header(raw + b"BODY", 2)
    assert (h.api_key, h.api_version, h.correlation_id, h.client_id) == (3, 12, 9, "c")
    assert raw[h.size :] + b"BODY" == b"BODY"
    assert framing.encode_request_header(3, 12, 9, "c", 2) == b"\x00\x03\x00\x0c\x00\x00\x00\x09\x00\x01c\x00"


@pytest.mark.parametrize(
    "raw",
    [b"\x00\x03\x00", b"\x00\x03\x00\x0c\x00\x00\x00\x09\x00", b"\x00\x03\x00\x0c\x00\x00\x00\x09\x00\x05ab"],
    ids=["short", "no-client-id-length", "client-id-cut"],
)
def test_truncated_request_header(raw: bytes) -> None:
    with pytest.raises(framing.FrameError):
        framing.parse_request_header(raw, 1)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prefix=st.binary(min_size=8, max_size=8),
    length=st.integers(-3, 40),
    client=st.binary(max_size=40),
    tail=st.binary(max_size=6),
    version=st.sampled_from([1, 2]),
    as_view=st.booleans(),
)
def test_client_id_and_size_reads_as_parse_request_header(
    prefix: bytes, length: int, client: bytes, tail: bytes, version: int, as_view: bool
) -> None:
    """The server's header read (compiled when built) gives parse_request_header's client id and
    size, or its FrameError: lengths that lie, ids that are not UTF-8, tagged fields or none."""
    raw = prefix + struct.pack(">h", length) + client + tail
    frame: bytes | memoryview = memoryview(raw) if as_view else raw
    try:
        h = framing.parse_request_header(frame, version)
        expected: Any = (h.client_id, h.size)
    except framing.FrameError:
        expected = framing.FrameError
    try:
        got: Any = framing.client_id_and_size(frame, version)
    except framing.FrameError:
        got = framing.FrameError
    assert got == expected


def test_the_usual_header_is_read_compiled() -> None:
    compiled = framing._compiled_header
    assert compiled is not None, "protocol/_reqcheck.pyx was not built"
    raw = framing.encode_request_header(12, 4, 7, "rdkafka", 2)
    assert compiled(raw + b"BODY", 2) == ("rdkafka", len(raw))
    assert compiled(raw[:-1] + b"\x01\x00\x00", 2) is None  # a tagged field: parsed in Python


def test_truncated_header_tagged_fields() -> None:
    raw = b"\x00\x03\x00\x0c\x00\x00\x00\x09\x00\x01c" + b"\x01\x00\x09ab"  # says 9 bytes, has 2
    with pytest.raises(framing.FrameError):
        framing.parse_request_header(raw, 2)


def test_request_header_v2_without_tagged_fields_from_a_memoryview() -> None:
    """What clients send: one zero byte for "no tagged fields" (the common case read without
    the generic tagged-field reader); a header cut before that byte is refused."""
    raw = framing.encode_request_header(12, 4, 9, "cl\u00e9", 2)
    h = framing.parse_request_header(memoryview(raw + b"BODY").toreadonly(), 2)
    assert (h.api_key, h.api_version, h.correlation_id, h.client_id, h.size) == (12, 4, 9, "cl\u00e9", len(raw))
    with pytest.raises(framing.FrameError):
        framing.parse_request_header(raw[:-1], 2)


@pytest.mark.parametrize("header_version", [0, 1])
@pytest.mark.parametrize("body", [b"", b"xyz" * 100])
def test_response_frame_is_size_header_and_body(header_version: int, body: bytes) -> None:
    expected = framing.frame(_response_header(77, header_version) + body)
    assert framing.response_frame(77, header_version, body) == expected


def _response_header(correlation_id: int, header_version: int) -> bytes:
    """Response header v0 (the correlation id) or v1 (and no tagged fields), written out."""
    return struct.pack(">i", correlation_id) + (b"\x00" if header_version >= 1 else b"")


def test_response_headers() -> None:
    assert framing.response_frame(5, 0, b"") == b"\x00\x00\x00\x04\x00\x00\x00\x05"
    assert framing.response_frame(5, 1, b"") == b"\x00\x00\x00\x05\x00\x00\x00\x05\x00"
    assert framing.parse_response_header(b"\x00\x00\x00\x05" + tags((1, b"x")) + b"B", 1) == (5, 8)
    assert framing.parse_response_header(b"\x00\x00\x00\x05B", 0) == (5, 4)


# ------------------------------------------------------------ header versions: Kafka's rules


@pytest.mark.parametrize(("api_key", "version"), SERVED, ids=SERVED_IDS)
def test_header_versions_follow_kafkas_flexible_versions(api_key: int, version: int) -> None:
    flexible = kafka_says_flexible(api_key, version)
    assert codec.request_header_version(api_key, version) == (2 if flexible else 1)
    expected_response = 0 if api_key == API_VERSIONS_KEY else (1 if flexible else 0)
    assert codec.response_header_version(api_key, version) == expected_response
    assert bool(getattr(codec.request_class(api_key, version), "__flexible__", False)) == flexible


def test_api_versions_v3_request_frame_exact_bytes() -> None:
    frame = codec.encode_request(18, 3, 7, {"client_software_name": "x", "client_software_version": "1"}, client_id="c")
    header = b"\x00\x12\x00\x03\x00\x00\x00\x07\x00\x01c\x00"  # v2 header: legacy client id + no tags
    body = b"\x02x\x021\x00"  # compact strings (length + 1) + no tags
    assert frame == struct.pack(">i", len(header + body)) + header + body


def test_api_versions_response_header_is_v0_even_when_the_body_is_flexible() -> None:
    frame = codec.encode_response(18, 3, 7, {"api_keys": [{"api_key": 18, "min_version": 0, "max_version": 4}]})
    body = request_frame_body(frame)
    # correlation id, then straight into the body: error_code int16 = 0, compact array of 1 (= 2)
    assert body[:4] == b"\x00\x00\x00\x07"
    assert body[4:7] == b"\x00\x00\x02"


def test_metadata_v12_response_header_is_v1() -> None:
    body = request_frame_body(codec.encode_response(3, 12, 9, {}))
    assert body[:5] == b"\x00\x00\x00\x09\x00"  # correlation id + empty tag section
    assert codec.decode_response_frame(3, 12, body)[0] == 9


# ------------------------------------------------------ every served API and version round-trips


def _request_round_trip(api_key: int, version: int, data: dict[str, Any]) -> tuple[Any, Any]:
    built = codec.build_request(api_key, version, data)
    frame = codec.encode_request(api_key, version, 42, built, client_id="round-trip")
    body = request_frame_body(frame)
    header = framing.parse_request_header(body, codec.request_header_version(api_key, version))
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (
        api_key,
        version,
        42,
        "round-trip",
    )
    return built, codec.decode_request(api_key, version, body, header.size)


@pytest.mark.parametrize(("api_key", "version"), SERVED, ids=SERVED_IDS)
def test_empty_request_round_trips(api_key: int, version: int) -> None:
    built, decoded = _request_round_trip(api_key, version, {})
    assert decoded == built


@pytest.mark.parametrize(("api_key", "version"), SERVED, ids=SERVED_IDS)
def test_filled_request_round_trips(api_key: int, version: int) -> None:
    data = filled(codec.request_class(api_key, version))
    built, decoded = _request_round_trip(api_key, version, data)
    assert decoded == built
    assert_carries(decoded, data)


@pytest.mark.parametrize(("api_key", "version"), SERVED, ids=SERVED_IDS)
def test_empty_response_round_trips(api_key: int, version: int) -> None:
    built = codec.build_response(api_key, version, {})
    frame = codec.encode_response(api_key, version, 77, {})
    corr, decoded = codec.decode_response_frame(api_key, version, request_frame_body(frame))
    assert corr == 77
    assert decoded == built


@pytest.mark.parametrize(("api_key", "version"), SERVED, ids=SERVED_IDS)
def test_filled_response_round_trips(api_key: int, version: int) -> None:
    data = filled(codec.response_class(api_key, version))
    frame = codec.encode_response(api_key, version, 2**31 - 1, data)
    corr, decoded = codec.decode_response_frame(api_key, version, request_frame_body(frame))
    assert corr == 2**31 - 1
    assert decoded == codec.build_response(api_key, version, data)
    assert_carries(decoded, data)


@pytest.mark.parametrize(("api_key", "version"), SERVED, ids=SERVED_IDS)
def test_kafka_python_reencodes_our_bytes_identically(api_key: int, version: int) -> None:
    """An independent codec built from Kafka's JSON schemas reads our bytes and writes the same."""
    checked = 0
    for kind, cls, theirs in (
        ("request", codec.request_class(api_key, version), KP_REQUESTS.get(api_key)),
        ("response", codec.response_class(api_key, version), KP_RESPONSES.get(api_key)),
    ):
        if theirs is None or version > theirs.max_version:
            continue
        data = filled(cls)
        if api_key == API_VERSIONS_KEY and kind == "response":
            data["error_code"] = 0  # clients read any ApiVersions error body as v0 (KIP-511)
        ours = codec.encode_message(codec.build(cls, data))
        decoded = theirs[version].decode(ours)
        decoded._header = None
        assert decoded.encode(version=version) == ours, f"{kind} bytes differ"
        checked += 1
    if api_key not in FLEXIBLE_SINCE_EXTRA:
        assert checked == 2, "kafka-python knows this API: both directions must be compared"


def test_build_drops_keys_a_version_lacks_and_converts_ints() -> None:
    v0 = codec.build_response(18, 0, {"error_code": 35, "throttle_time": 100, "api_keys": []})
    assert not hasattr(v0, "throttle_time")
    assert int(v0.error_code) == 35
    v1 = codec.build_response(18, 1, {"throttle_time": 100})
    assert v1.throttle_time == datetime.timedelta(milliseconds=100)
    assert codec.ms(v1.throttle_time) == 100


# ----------------------------------------------------------------------- unknown tagged fields

UNKNOWN = tags((90, b"\x01\x02\x03"), (91, b""), (300, b"x" * 200))


def _join_group_v6() -> Any:
    return codec.build_request(
        11,
        6,
        {
            "group_id": "g",
            "session_timeout": 10000,
            "rebalance_timeout": 30000,
            "member_id": "",
            "group_instance_id": "static-1",
            "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b"\x00\x01"}, {"name": "roundrobin", "metadata": b"\x02"}],
        },
    )


def test_kio_native_reader_refuses_unknown_tags() -> None:
    """Why protocol/tagged.py exists: the native reader raises where Kafka skips."""
    msg = _join_group_v6()
    body = with_top_level_tags(codec.encode_message(msg), UNKNOWN)
    with pytest.raises(KeyError):
        entity_reader(type(msg))(body, 0)


def test_unknown_top_level_tags_are_skipped() -> None:
    msg = _join_group_v6()
    body = with_top_level_tags(codec.encode_message(msg), UNKNOWN)
    assert codec.decode_request(11, 6, body) == msg


def test_unknown_tags_in_nested_struct_are_skipped() -> None:
    msg = _join_group_v6()
    body = with_nested_tags(codec.encode_message(msg), msg.protocols[1], UNKNOWN)
    assert codec.decode_request(11, 6, body) == msg
    # and both at once, with the top-level section after them
    body = with_top_level_tags(with_nested_tags(body, msg.protocols[0], tags((7, b"q"))), UNKNOWN)
    assert codec.decode_request(11, 6, body) == msg


@pytest.mark.parametrize("version", [9, 10, 12])
def test_unknown_tags_in_metadata_topics_are_skipped(version: int) -> None:
    data: dict[str, Any] = {"topics": [{"name": "a"}, {"name": "b"}], "allow_auto_topic_creation": True}
    if version >= 10:
        data["topics"][1]["topic_id"] = uuid.UUID(int=5)
    msg = codec.build_request(3, version, data)
    body = with_nested_tags(codec.encode_message(msg), msg.topics[1], UNKNOWN)
    body = with_top_level_tags(body, tags((1000, b"abc")))
    assert codec.decode_request(3, version, body) == msg


def test_known_tagged_fields_still_decode_among_unknown_ones() -> None:
    # FetchRequest v12+: cluster_id is tagged field 0 (a nullable compact string).
    msg = codec.build_request(
        1,
        12,
        {
            "cluster_id": "my-cluster",
            "max_wait": 500,
            "min_bytes": 1,
            "topics": [{"topic": "t", "partitions": [{"partition": 0, "fetch_offset": 5, "partition_max_bytes": 9}]}],
        },
    )
    body = codec.encode_message(msg)
    raw_cluster = b"\x0bmy-cluster"
    section = tags((0, raw_cluster))
    assert body.endswith(section)
    body = body[: -len(section)] + tags((0, raw_cluster), (44, b"??"))
    decoded = codec.decode_request(1, 12, body)
    assert decoded == msg
    assert decoded.cluster_id == "my-cluster"


def test_known_tagged_structs_in_a_response_decode_with_unknown_ones() -> None:
    # ApiVersionsResponse v3: supported_features (tag 0, an array of structs),
    # finalized_features_epoch (tag 1, int64), zk_migration_ready (tag 3, bool).
    data = {
        "api_keys": [{"api_key": 18, "min_version": 0, "max_version": 4}],
        "supported_features": [{"name": "group.version", "min_version": 0, "max_version": 1}],
        "finalized_features_epoch": 12,
        "zk_migration_ready": True,
    }
    msg = codec.build_response(18, 3, data)
    assert codec.decode_response(18, 3, codec.encode_message(msg)) == msg
    untagged = codec.encode_message(codec.build_response(18, 3, {"api_keys": data["api_keys"]}))
    feature = codec.encode_message(msg.supported_features[0])
    feature_with_unknown = feature[:-1] + tags((9, b"x"))  # unknown tag inside a struct inside a tag
    section = tags(
        (0, framing.write_uvarint(2) + feature_with_unknown),
        (1, struct.pack(">q", 12)),
        (2, b"\x01"),  # finalized_features: an empty compact array, written explicitly
        (3, b"\x01"),
        (40, b"!"),  # unknown, after the known ones
    )
    assert codec.decode_response(18, 3, with_top_level_tags(untagged, section)) == msg


@pytest.mark.parametrize(
    "section",
    [b"\x01\x05\x09ab", b"\x02\x05\x01a", b"\x01\x05", b"\x01"],
    ids=["size-beyond-end", "fewer-tags-than-counted", "no-size", "no-tag"],
)
def test_truncated_tag_sections_are_decode_errors(section: bytes) -> None:
    body = with_top_level_tags(codec.encode_message(_join_group_v6()), section)
    with pytest.raises(codec.DecodeError):
        codec.decode_request(11, 6, body)


# ------------------------------------------------------------------- hostile and garbage bodies

_HUGE_LENGTHS = r"""
import struct, sys
from rallypoint.protocol import codec, framing
group = b"\x00\x01g" + struct.pack(">ii", 10000, 30000) + b"\x00\x00\xff\xff\x00\x08consumer"
cases = {
    # JoinGroup v5 protocols: legacy int32 array length
    "legacy-entity-array": (11, 5, group + struct.pack(">i", 2**31 - 1) + b"\x00"),
    # Metadata v0 topics: legacy array of strings
    "legacy-string-array": (3, 0, struct.pack(">i", 2**31 - 1) + b"\x00\x01a"),
    # JoinGroup v6 protocols: compact array length = a 5-byte uvarint (~2**35)
    "compact-entity-array": (11, 6, b"\x02g" + struct.pack(">ii", 10000, 30000) + b"\x01\x00\x09consumer"
                             + framing.write_uvarint(2**34) + b"\x00"),
    # Metadata v12 topics, compact
    "compact-topic-array": (3, 12, framing.write_uvarint(2**34) + b"\x00"),
}
for name, (key, version, body) in cases.items():
    try:
        codec.decode_request(key, version, body)
    except codec.DecodeError:
        print(name, "refused")
    else:
        print(name, "DECODED")
"""


def test_huge_array_lengths_are_refused_without_allocating() -> None:
    """kio's native reader reserves capacity for the announced count first; a count of ~2**34
    aborted the whole process (Rust ``memory allocation failed``).  Run in a child process so a
    regression is a clear failure here rather than a dead test run."""
    proc = subprocess.run([sys.executable, "-c", _HUGE_LENGTHS], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.split("\n")
    assert [line.split()[1] for line in lines if line] == ["refused"] * 4, proc.stdout


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
@pytest.mark.parametrize(("api_key", "version"), SERVED, ids=SERVED_IDS)
@pytest.mark.slow
def test_mutated_requests_decode_or_raise_decode_error(api_key: int, version: int, data: st.DataObject) -> None:
    msg = codec.build_request(api_key, version, filled(codec.request_class(api_key, version)))
    body = bytearray(codec.encode_message(msg))
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "cut", "insert", "big"]))
        pos = data.draw(st.integers(0, max(0, len(body) - 1)))
        if op == "flip" and body:
            body[pos] ^= data.draw(st.integers(1, 255))
        elif op == "cut":
            del body[pos:]
        elif op == "insert":
            body[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
        else:
            body[pos : pos + 5] = b"\xff\xff\xff\xff\x0f"
    try:
        codec.decode_request(api_key, version, bytes(body))
    except codec.DecodeError:
        pass


@settings(max_examples=300, deadline=None)
@given(body=st.binary(max_size=64))
def test_garbage_bodies_decode_or_raise_decode_error(body: bytes) -> None:
    for api_key, version in SERVED:
        try:
            codec.decode_request(api_key, version, body)
        except codec.DecodeError:
            pass


def test_has_arrays_sends_array_free_structs_to_the_native_reader() -> None:
    assert not tagged.has_arrays(codec.request_class(12, 4))  # Heartbeat
    assert tagged.has_arrays(codec.request_class(11, 5))  # JoinGroup protocols
    assert tagged.has_arrays(codec.request_class(3, 12))


def test_nothing_outside_protocol_imports_kio() -> None:
    offenders = [
        str(path.relative_to(ROOT))
        for folder in ("coordinator", "bench")
        if (ROOT / folder).exists()
        for path in (ROOT / folder).rglob("*.py")
        if re.search(r"^\s*(from|import) kio\b", path.read_text(encoding="utf-8"), re.M)
    ]
    assert offenders == [], "use protocol.codec instead"


def _small_numeric_answers() -> Iterator[tuple[int, int, dict[str, Any]]]:
    """For every served API and version whose response has a top-level error code: the
    smallest answer of numbers only (what the small-body cache of encode_response keeps)."""
    for key, api in sorted(SERVED_APIS.items()):
        for version in range(api.min_version, api.max_version + 1):
            try:
                cls = codec.response_class(key, version)
            except codec.UnknownVersion:
                continue
            names = {f.name for f in dataclasses.fields(cls)}
            if "error_code" in names:
                body: dict[str, Any] = {"error_code": 0}
                if "throttle_time" in names:
                    body["throttle_time"] = 0
                yield key, version, body


def test_small_numeric_answers_are_cached_byte_identical_to_the_generic_encoder() -> None:
    from rallypoint.protocol.errors import ErrorCode

    checked = 0
    for key, version, body in _small_numeric_answers():
        for code in (0, ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.REBALANCE_IN_PROGRESS):
            answer = {**body, "error_code": code}
            generic = codec.encode_message(codec.build_response(key, version, answer))
            header = _response_header(9, codec.response_header_version(key, version))
            first = codec.encode_response(key, version, 9, answer)  # fills the cache
            again = codec.encode_response(key, version, 9, dict(answer))  # served from it
            assert first == again == framing.frame(header + generic), (key, version, code)
            checked += 1
    assert checked > 50
    # the cache keys on content: different codes, different bytes
    hb = [codec.encode_response(12, 4, 1, {"throttle_time": 0, "error_code": c}) for c in (0, 25, 27)]
    assert len(set(hb)) == 3
