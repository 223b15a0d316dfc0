"""Injected errors have Kafka's shape for every served API and version (coordinator/control/shapes.py).

The expectations below are written out per API from Kafka's ``getErrorResponse`` implementations
(``clients/src/main/java/org/apache/kafka/common/requests/*Request.java``), independently of the
generic code under test: where the error goes (top level, per group, per topic, per partition),
that every entry the request named comes back with its identity, and that the answer encodes and
decodes as a valid response of that version.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest
from rallypoint.control import shapes
from rallypoint.protocol import codec
from rallypoint.protocol.apis import SERVED_APIS

pytestmark = pytest.mark.unit

NOT_COORDINATOR = 16
TOPIC_IDS = {"t1": uuid.UUID(int=0x1111), "t2": uuid.UUID(int=0x2222)}
NAMES = {v: k for k, v in TOPIC_IDS.items()}


def namer(tid: uuid.UUID) -> str | None:
    return NAMES.get(tid)


def sample(cls: type, index: int = 0) -> dict[str, Any]:
    """A request body naming two topics (t1, t2) with two partitions each, or two groups."""
    out: dict[str, Any] = {}
    for name, kafka_type, nested, _default in codec._field_plan(cls):
        if nested is not None:
            f = next(f for f in dataclasses.fields(cls) if f.name == name)
            if "tuple" in str(f.type).lower():
                out[name] = [sample(nested, i) for i in range(2)]
            else:
                out[name] = sample(nested, 0)
        elif name in ("groups", "groups_names", "group_ids", "coordinator_keys"):
            out[name] = ["g1", "g2"]
        elif name == "topic_names":
            out[name] = ["t1", "t2"]
        elif name == "partition_indexes" or (name == "partitions" and kafka_type == "int32"):
            out[name] = [0, 1]
        elif name == "transactional_ids":
            out[name] = ["x1", "x2"]
        elif name in ("name", "topic") and kafka_type == "string":
            out[name] = f"t{index + 1}"
        elif name == "topic_id":
            out[name] = TOPIC_IDS[f"t{index + 1}"]
        elif name in ("group_id", "key"):
            out[name] = "g1"
        elif name in ("partition", "partition_index", "index"):
            out[name] = index
        elif name == "key_type":
            out[name] = 0
        elif name == "acks":
            out[name] = -1
    return out


def request_for(api_key: int, version: int) -> Any:
    data = sample(codec.request_class(api_key, version))
    # Topic entries: fix the names in nested levels (the sampler numbers by position).
    return codec.build_request(api_key, version, data)


def expected_paths(name: str, version: int) -> list[str]:
    """Where Kafka puts the error: "" = top level, else the entry path."""
    top: list[str] = [""]
    table: dict[str, list[str]] = {
        "Produce": ["responses.partition_responses"],
        "ListOffsets": ["topics.partitions"],
        "Metadata": ["topics"],
        "OffsetCommit": ["topics.partitions"],
        "OffsetForLeaderEpoch": ["topics.partitions"],
        "DescribeGroups": ["groups"],
        "ConsumerGroupDescribe": ["groups"],
        "ShareGroupDescribe": ["groups"],  # ShareGroupDescribeRequest.getErrorResponse: per group
        "DeleteGroups": ["results"],
        "CreateTopics": ["topics"],
        "DeleteTopics": ["responses"],
        "CreatePartitions": ["results"],
        "AlterUserScramCredentials": ["results"],
        "DescribeConfigs": ["results"],  # DescribeConfigsRequest.getErrorResponse: per resource
        "AlterConfigs": ["responses"],
        "IncrementalAlterConfigs": ["responses"],
        "DeleteRecords": ["topics.partitions"],  # DeleteRecordsRequest.getErrorResponse
        "DescribeTopicPartitions": ["topics"],
        "AddPartitionsToTxn": ["results_by_topic_v3_and_below.results_by_partition"],
        "TxnOffsetCommit": ["topics.partitions"],
        "DescribeTransactions": ["transaction_states"],
        "DescribeProducers": ["topics.partitions"],
    }
    if name == "Fetch":
        if version < 7:
            return ["responses.partitions"]
        return ["", "responses.partitions"] if version < 13 else top
    if name == "OffsetFetch":
        if version < 2:
            return ["topics.partitions"]
        return top if version < 8 else ["groups"]
    if name == "FindCoordinator":
        return top if version < 4 else ["coordinators"]
    if name == "DescribeLogDirs":  # getErrorResponse sets only the top-level code (v3+)
        return top if version >= 3 else []
    if name == "AddPartitionsToTxn" and version >= 4:  # the batch form: the top-level code only
        return top
    if name == "ElectLeaders":  # every named partition, and the top level from v1
        per_partition = ["replica_election_results.partition_result"]
        return ["", *per_partition] if version >= 1 else per_partition
    return table.get(name, top)


def error_places(msg: Any, path: str = "") -> dict[str, list[int]]:
    """path -> the error codes found there ("" = top level)."""
    out: dict[str, list[int]] = {}
    for f in dataclasses.fields(msg):
        value = getattr(msg, f.name)
        if f.name in ("error_code", "partition_error_code"):
            out.setdefault(path, []).append(int(value))
        elif isinstance(value, tuple):
            for item in value:
                if dataclasses.is_dataclass(item):
                    sub = f"{path}.{f.name}" if path else f.name
                    for k, v in error_places(item, sub).items():
                        out.setdefault(k, []).extend(v)
    return out


CASES = [
    (api.key, api.name, v)
    for api in sorted(SERVED_APIS.values(), key=lambda a: a.key)
    for v in range(api.min_version, api.max_version + 1)
]


@pytest.mark.parametrize(("api_key", "name", "version"), CASES, ids=[f"{n}-v{v}" for _k, n, v in CASES])
def test_whole_request_error_has_kafkas_shape(api_key: int, name: str, version: int) -> None:
    request = request_for(api_key, version)
    body = shapes.error_body(api_key, version, request, NOT_COORDINATOR, None, namer)
    frame = codec.encode_response(api_key, version, 7, body)
    corr, decoded = codec.decode_response_frame(api_key, version, frame[4:])
    assert corr == 7
    places = {p: codes for p, codes in error_places(decoded).items()}
    expected = expected_paths(name, version)
    for path in expected:
        assert path in places, f"{name} v{version}: no error at {path or 'top level'}: {places}"
        assert set(places[path]) == {NOT_COORDINATOR}, (path, places[path])
        if path:
            # every entry the request named is answered: 2 topics x 2 partitions, or 2 groups/topics
            depth = path.count(".") + 1
            assert len(places[path]) == 2**depth, (path, places[path])
    for path, codes in places.items():
        if path not in expected:
            assert set(codes) == {0}, f"{name} v{version}: unexpected error at {path}: {codes}"


def test_entries_carry_their_identity() -> None:
    # Produce v9 (names) and v13 (topic ids): each partition answer names its topic and index
    for version in (9, 13):
        req = request_for(0, version)
        msg = codec.build_response(0, version, shapes.error_body(0, version, req, 6, None, namer))
        got = {
            (getattr(t, "name", None) or NAMES[t.topic_id], p.index, int(p.error_code), p.base_offset)
            for t in msg.responses
            for p in t.partition_responses
        }
        assert got == {(t, i, 6, -1) for t in ("t1", "t2") for i in (0, 1)}
    # FindCoordinator v4: one coordinator entry per key, no node
    req = request_for(10, 4)
    msg = codec.build_response(10, 4, shapes.error_body(10, 4, req, 15, None, namer))
    assert [(c.key, int(c.error_code), c.node_id, c.port) for c in msg.coordinators] == [
        ("g1", 15, -1, -1),
        ("g2", 15, -1, -1),
    ]
    # Fetch v13: top level only, the session id of the request kept
    req = dataclasses.replace(request_for(1, 13), session_id=42)
    msg = codec.build_response(1, 13, shapes.error_body(1, 13, req, 71, None, namer))
    assert (int(msg.error_code), msg.session_id, msg.responses) == (71, 42, ())
    # JoinGroup: top level, no generation, no member id
    req = request_for(11, 9)
    msg = codec.build_response(11, 9, shapes.error_body(11, 9, req, 27, None, namer))
    assert (int(msg.error_code), msg.generation_id, msg.member_id, msg.members) == (27, -1, "", ())


def test_topic_target_only_that_topics_partitions() -> None:
    # OffsetCommit with t1 and t2: a rule for t1 errors t1's partitions, t2 goes to the handler
    req = request_for(8, 9)
    target = shapes.Target(None, frozenset({"t1"}))
    pruned, kept = shapes.prune(req, target, namer)
    assert [t.name for t in pruned.topics] == ["t2"] and kept == 1
    errors = shapes.error_body(8, 9, req, 16, target, namer)
    assert [t["name"] for t in errors["topics"]] == ["t1"]
    real = codec.build_response(
        8, 9, {"topics": [{"name": "t2", "partitions": [{"partition_index": 0}, {"partition_index": 1}]}]}
    )
    merged = shapes.merge(real, codec.build_response(8, 9, errors))
    got = {(t.name, p.partition_index, int(p.error_code)) for t in merged.topics for p in t.partitions}
    assert got == {("t1", 0, 16), ("t1", 1, 16), ("t2", 0, 0), ("t2", 1, 0)}


def test_group_target_in_a_multi_group_request() -> None:
    # DescribeGroups g1, g2 with a rule for g2: only g2's entry gets the error
    req = codec.build_request(15, 5, {"groups": ["g1", "g2"]})
    target = shapes.Target(frozenset({"g2"}), None)
    pruned, kept = shapes.prune(req, target, namer)
    assert pruned.groups == ("g1",) and kept == 1
    errors = codec.build_response(15, 5, shapes.error_body(15, 5, req, 16, target, namer))
    real = codec.build_response(15, 5, {"groups": [{"group_id": "g1", "group_state": "Stable"}]})
    merged = shapes.merge(real, errors)
    assert [(g.group_id, int(g.error_code), g.group_state) for g in merged.groups] == [
        ("g1", 0, "Stable"),
        ("g2", 16, ""),
    ]
    # all targeted: nothing left for the handler
    _pruned, kept = shapes.prune(codec.build_request(15, 5, {"groups": ["g2"]}), target, namer)
    assert kept == 0


def test_topic_target_inside_offset_fetch_groups() -> None:
    # OffsetFetch v8: groups [g1 {t1, t2}, g2 {t1, t2}]; rule group g1 + topic t2
    req = request_for(9, 8)
    req = dataclasses.replace(req, groups=(req.groups[0], dataclasses.replace(req.groups[1], group_id="g2")))
    target = shapes.Target(frozenset({"g1"}), frozenset({"t2"}))
    pruned, kept = shapes.prune(req, target, namer)
    assert [(g.group_id, [t.name for t in g.topics]) for g in pruned.groups] == [("g1", ["t1"]), ("g2", ["t1", "t2"])]
    assert kept >= 1
    errors = shapes.error_body(9, 8, req, 3, target, namer)
    assert [(g["group_id"], [t["name"] for t in g["topics"]]) for g in errors["groups"]] == [("g1", ["t2"])]
    assert all(p["error_code"] == 3 for p in errors["groups"][0]["topics"][0]["partitions"])
    assert "error_code" not in errors["groups"][0]  # the group itself is fine


def test_topics_and_groups_named() -> None:
    assert shapes.groups_named(12, codec.build_request(12, 4, {"group_id": "g", "member_id": "m"})) == ("g", ())
    assert shapes.groups_named(42, codec.build_request(42, 2, {"groups_names": ["a", "b"]})) == (None, ("a", "b"))
    fc_txn = codec.build_request(10, 4, {"key_type": 1, "coordinator_keys": ["txn"]})
    assert shapes.groups_named(10, fc_txn) == (None, ())
    fetch = codec.build_request(
        1,
        13,
        {"topics": [{"topic_id": TOPIC_IDS["t2"], "partitions": [{"partition": 0}]}], "forgotten_topics_data": []},
    )
    assert shapes.topics_named(fetch, namer) == {"t2"}
    assert shapes.topics_named(request_for(0, 9), namer) == {"t1", "t2"}


def test_error_codes_reads_dicts_and_messages() -> None:
    assert shapes.error_codes(12, 4, {"error_code": 0, "throttle_time": 0}) == ()
    assert shapes.error_codes(12, 4, {"error_code": 27}) == (27,)
    commit = {"topics": [{"partitions": [{"error_code": 16}, {"error_code": 0}]}]}
    assert shapes.error_codes(8, 9, commit) == (16,)
    msg = codec.build_response(15, 5, {"groups": [{"group_id": "a", "error_code": 69}, {"group_id": "b"}]})
    assert shapes.error_codes(15, 5, msg) == (69,)
    fetch = {"error_code": 0, "responses": [{"topic": "t", "partitions": [{"error_code": 1, "records": b"x"}]}]}
    assert shapes.error_codes(1, 12, fetch) == (1,)
    # a dict holding codec messages, and codes at several levels: read in the schema's order
    nested = codec.build_response(8, 9, {"topics": [{"name": "t", "partitions": [{"error_code": 22}]}]}).topics
    assert shapes.error_codes(8, 9, {"topics": [*nested, {"partitions": [{"error_code": 25}]}]}) == (22, 25)
    of = {"topics": [{"partitions": [{"error_code": 3}]}], "error_code": 16}
    assert shapes.error_codes(9, 5, of) == (3, 16)  # v5: topics come before the top-level code


def test_error_codes_of_a_cached_encoded_answer_are_read_once() -> None:
    """A pre-encoded answer (ApiVersions, Metadata) is decoded for its codes the first time only."""
    answer = codec.encode_body(3, 4, {"topics": [{"name": "gone", "error_code": 3}, {"name": "ok"}]})
    assert answer.errors is None
    assert shapes.error_codes(3, 4, answer) == (3,)
    assert answer.errors == (3,)
    answer.errors = (99,)  # kept with it: not decoded again
    assert shapes.error_codes(3, 4, answer) == (99,)
    assert shapes.error_codes(18, 2, codec.encode_body(18, 2, {"error_code": 0})) == ()


@pytest.mark.parametrize("version", [0, 1, 2])
def test_elect_leaders_error_names_every_partition(version: int) -> None:
    """ElectLeadersRequest.getErrorResponse: each named partition with the error (and v1+ the
    top-level code)."""
    request = codec.build_request(
        43, version, {"election_type": 0, "topic_partitions": [{"topic": "t", "partitions": [0, 2]}], "timeout": 1000}
    )
    body = shapes.error_body(43, version, request, NOT_COORDINATOR, None, namer)
    _corr, decoded = codec.decode_response_frame(43, version, codec.encode_response(43, version, 1, body)[4:])
    (result,) = decoded.replica_election_results
    assert result.topic == "t"
    assert [(p.partition_id, int(p.error_code)) for p in result.partition_result] == [(0, 16), (2, 16)]
    assert version == 0 or int(decoded.error_code) == 16


SERVED = [(api.key, v) for api in SERVED_APIS.values() for v in range(api.min_version, api.max_version + 1)]


def _python_codes(api_key: int, version: int, answer: Any) -> tuple[int, ...] | str:
    out: list[int] = []
    try:
        shapes._codes_along(answer, codec.response_class(api_key, version), out)
    except Exception as e:
        return f"refused: {type(e).__name__}"
    return tuple(out)


@pytest.mark.parametrize(("api_key", "version"), SERVED)
def test_compiled_codes_are_the_python_walks(api_key: int, version: int) -> None:
    """The compiled walk of the paths to error codes (protocol/_encode.pyx, ``codes``) gives the
    Python walk's codes, or declines; it declines no answer of plain dicts and lists."""
    import random

    from tests.support.schema_values import random_message

    compiled = shapes._compiled_codes
    assert compiled is not None, "protocol/_encode.pyx was not built"
    cls = codec.response_class(api_key, version)
    program = shapes._code_program(cls)
    rng = random.Random(f"codes {api_key}/{version}")
    for i in range(30):
        answer = random_message(rng, cls, odd=i % 3 == 0)
        expected = _python_codes(api_key, version, answer)
        got = compiled(program, answer)
        if got is None:
            assert i % 3 == 0, answer  # only odd answers (a struct as a message ...) are declined
            continue
        assert got == expected, answer
        if type(answer) is dict:
            assert shapes.error_codes(api_key, version, answer) == expected
