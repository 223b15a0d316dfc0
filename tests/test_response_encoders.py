"""The compiled response encoders (protocol/response_encoders.py) write exactly the generic
path's bytes (codec.build + kio's writer), for every API and version served; so do the compiled
programs (protocol/_encode.pyx, "compiled programs" in response_encoders.py) wherever they do
not decline.

Answers are generated from each response schema with a seeded generator: every field present,
absent or None, arrays as lists and tuples, error codes as ints and enums, durations as
ints and timedeltas, nested structs several levels deep.  Well-formed answers must be taken
by the compiled encoder (no fallback) and give the generic bytes; odd ones (a string as
bytes, an out-of-range int, a struct given as a dataclass ...) must either give the generic
bytes or fall back -- and fall back whenever the generic path refuses them.
"""

from __future__ import annotations

import datetime
import random
from typing import Any

import pytest
from rallypoint.protocol import codec, response_encoders
from rallypoint.protocol.apis import SERVED_APIS
from rallypoint.protocol.errors import ErrorCode

from tests.support.schema_values import random_message

pytestmark = pytest.mark.unit

SERVED = [(api.key, v) for api in SERVED_APIS.values() for v in range(api.min_version, api.max_version + 1)]


def _generic(cls: type, data: dict[str, Any]) -> bytes | Exception:
    try:
        return codec.encode_message(codec.build(cls, data))
    except Exception as e:
        return e


def _compiled(cls: type, data: dict[str, Any]) -> bytes | Exception:
    enc = response_encoders.encoder(cls)
    assert enc is not None, f"{cls.__module__}.{cls.__name__} did not compile"
    try:
        return enc(data)
    except Exception as e:
        return e


def _is_well_formed(cls: type, data: dict[str, Any]) -> bool:
    return not isinstance(_generic(cls, data), Exception)


@pytest.mark.parametrize(("api_key", "version"), SERVED)
def test_well_formed_answers_compile_to_the_generic_bytes(api_key: int, version: int) -> None:
    cls = codec.response_class(api_key, version)
    rng = random.Random(f"{api_key}/{version}")
    taken = 0
    for i in range(25):
        data = {} if i == 0 else random_message(rng, cls, odd=False)
        expected = _generic(cls, data)
        if isinstance(expected, Exception):
            # None for a field that is not nullable, a required field left out ...: the
            # compiled encoder must refuse it too (the caller then raises the generic error)
            assert isinstance(_compiled(cls, data), Exception), data
            continue
        got = _compiled(cls, data)
        assert got == expected, (data, got)
        taken += 1
    assert taken >= 5, "too few well-formed answers generated to say anything"


@pytest.mark.parametrize(("api_key", "version"), SERVED)
def test_odd_answers_give_the_generic_bytes_or_fall_back(api_key: int, version: int) -> None:
    cls = codec.response_class(api_key, version)
    rng = random.Random(f"odd {api_key}/{version}")
    for _ in range(15):
        data = random_message(rng, cls, odd=True)
        expected = _generic(cls, data)
        got = _compiled(cls, data)
        if isinstance(got, bytes):
            assert got == expected, data
        # else: a fallback; encode_response then gives exactly `expected` (or raises it)
        if isinstance(expected, Exception):
            assert isinstance(got, Exception), (data, got)


def test_encode_response_takes_the_compiled_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """An OffsetCommit answer is encoded without the generic writer."""
    answer = {"throttle_time_ms": 0, "topics": [{"name": "t", "partitions": [{"partition_index": 0, "error_code": 0}]}]}
    expected = codec.encode_response(8, 8, 7, answer)

    def no_generic(_msg: Any) -> bytes:
        raise AssertionError("the generic writer was used")

    monkeypatch.setattr(codec, "encode_message", no_generic)
    assert codec.encode_response(8, 8, 7, answer) == expected


def test_an_answer_the_compiled_encoder_does_not_take_is_encoded_by_the_generic_path() -> None:
    """A generator of partitions (consumed only by the generic path) and a struct given as a
    kio dataclass: the same bytes as the generic path, through the fallback."""
    cls = codec.response_class(8, 8)
    partitions = [{"partition_index": 3, "error_code": ErrorCode.NOT_COORDINATOR}]
    as_list = {"topics": [{"name": "t", "partitions": partitions}]}
    as_generator = {"topics": [{"name": "t", "partitions": (p for p in partitions)}]}
    with pytest.raises(response_encoders.Fallback):
        enc = response_encoders.encoder(cls)
        assert enc is not None
        enc({"topics": [{"name": "t", "partitions": (p for p in partitions)}]})
    assert codec.encode_response(8, 8, 1, as_generator) == codec.encode_response(8, 8, 1, as_list)
    frame = codec.encode_response(8, 8, 1, as_list)
    topic = codec.decode_response_frame(8, 8, frame[4:])[1].topics[0]  # a kio dataclass
    assert codec.encode_response(8, 8, 1, {"topics": [topic]}) == codec.encode_response(8, 8, 1, as_list)


def _program(cls: type) -> tuple[Any, ...]:
    assert response_encoders._encode is not None, "protocol/_encode.pyx was not built"
    program = response_encoders._program(cls)
    assert program is not None, f"no program for {cls.__module__}.{cls.__name__}"
    return program


@pytest.mark.parametrize(("api_key", "version"), SERVED)
def test_compiled_programs_write_the_generated_bytes_or_decline(api_key: int, version: int) -> None:
    """Where the compiled program answers, it gives the generated encoder's bytes; it declines
    whatever the generated encoder refuses; and it answers most well-formed answers given the
    way handlers give them (so the fast path is taken, not always declined)."""
    assert response_encoders._encode is not None
    cls = codec.response_class(api_key, version)
    program = _program(cls)
    rng = random.Random(f"program {api_key}/{version}")
    plain = answered = 0
    for i in range(40):
        data = {} if i == 0 else random_message(rng, cls, odd=i % 2 == 0)
        if i % 2 == 1:
            data = _as_handlers_give(data)
        got = response_encoders._encode.encode(program, data)
        expected = _compiled(cls, data)
        if isinstance(expected, Exception):
            assert got is None, data
            continue
        if got is not None:
            assert got == expected, data
        if i % 2 == 1 and not _tagged_given(cls, data):
            plain += 1
            answered += got is not None
    # declined besides tagged fields: UUIDs and timestamps, which the generated encoder writes
    # (the answers on the hot paths are held to the program below)
    assert plain < 4 or answered > 0, (answered, plain)


def _as_handlers_give(value: Any) -> Any:
    """Durations as int milliseconds, byte fields as bytes and integers as ints, as handlers
    answer (the generated answers mix in timedeltas, memoryviews and enums)."""
    if type(value) is dict:
        return {k: _as_handlers_give(v) for k, v in value.items()}
    if type(value) is list or type(value) is tuple:
        return type(value)(_as_handlers_give(v) for v in value)
    if isinstance(value, datetime.timedelta):
        return codec.ms(value)
    if isinstance(value, memoryview):
        return bytes(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return int(value)
    return value


def _tagged_given(cls: type, data: Any) -> bool:
    """Does ``data`` give a value for a tagged field anywhere (which the program declines)?"""
    import dataclasses

    from kio.serial._introspect import EntityField, EntityTupleField, classify_field, get_field_tag

    if type(data) is not dict:
        return False
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        if get_field_tag(f) is not None:
            return True
        fc = classify_field(f)
        value = data[f.name]
        if isinstance(fc, EntityField) and _tagged_given(fc.type_, value):
            return True
        if isinstance(fc, EntityTupleField) and isinstance(value, list | tuple):
            if any(_tagged_given(fc.type_, item) for item in value):
                return True
    return False


HOT_ANSWERS = [
    (12, 4, {"throttle_time": 0, "error_code": ErrorCode.REBALANCE_IN_PROGRESS}),
    (8, 8, {"throttle_time": 0, "topics": [{"name": "t", "partitions": [{"partition_index": 0, "error_code": 0}]}]}),
    (
        9,
        8,
        {
            "throttle_time": 0,
            "groups": [
                {
                    "group_id": "g",
                    "error_code": 0,
                    "topics": [
                        {
                            "name": "t",
                            "partitions": [
                                {
                                    "partition_index": 0,
                                    "committed_offset": 7,
                                    "committed_leader_epoch": -1,
                                    "metadata": "",
                                    "error_code": 0,
                                }
                            ],
                        }
                    ],
                }
            ],
        },
    ),
    (
        14,
        5,
        {
            "throttle_time": 0,
            "error_code": 0,
            "protocol_type": "consumer",
            "protocol_name": "range",
            "assignment": b"\x00\x01",
        },
    ),
    (
        11,
        9,
        {
            "throttle_time": 0,
            "error_code": 0,
            "generation_id": 3,
            "protocol_type": "consumer",
            "protocol_name": "range",
            "leader": "m-1",
            "skip_assignment": False,
            "member_id": "m-1",
            "members": [{"member_id": "m-1", "group_instance_id": None, "metadata": b"\x00"}],
        },
    ),
    (
        1,
        11,
        {
            "throttle_time": 0,
            "error_code": 0,
            "session_id": 0,
            "responses": [
                {
                    "topic": "t",
                    "partitions": [
                        {
                            "partition_index": 0,
                            "error_code": 0,
                            "high_watermark": 10,
                            "last_stable_offset": 10,
                            "log_start_offset": 0,
                            "aborted_transactions": None,
                            "preferred_read_replica": -1,
                            "records": b"\x00" * 70,
                        }
                    ],
                }
            ],
        },
    ),
]


@pytest.mark.parametrize(("api_key", "version", "answer"), HOT_ANSWERS)
def test_hot_answers_take_the_compiled_program(api_key: int, version: int, answer: dict[str, Any]) -> None:
    """Answers as the hot handlers give them are written by the program, to the generated bytes."""
    _program(codec.response_class(api_key, version))
    got = response_encoders.encode_compiled(codec.response_class(api_key, version), answer)
    assert got is not None
    assert got == _compiled(codec.response_class(api_key, version), answer)
    assert got == _generic(codec.response_class(api_key, version), answer)


def test_encode_response_takes_the_compiled_program(monkeypatch: pytest.MonkeyPatch) -> None:
    """An OffsetFetch answer is encoded by the compiled program, not the generated encoder; an
    answer it declines (a partition index given as an IntEnum) by the generated one, to the
    same bytes."""
    assert response_encoders._encode is not None
    answer: dict[str, Any] = {
        "throttle_time": 0,
        "error_code": 0,
        "topics": [{"name": "t", "partitions": [{"partition_index": 1, "committed_offset": 5, "error_code": 0}]}],
    }
    with response_encoders.generated_only():
        expected = codec.encode_response(9, 5, 7, answer)

    def no_generated(_cls: type) -> Any:
        raise AssertionError("the generated encoder was used")

    monkeypatch.setattr(response_encoders, "encoder", no_generated)
    assert codec.encode_response(9, 5, 7, answer) == expected
    monkeypatch.undo()
    answer["topics"][0]["partitions"][0]["partition_index"] = ErrorCode(1)  # an int subclass
    assert response_encoders.encode_compiled(codec.response_class(9, 5), answer) is None
    assert codec.encode_response(9, 5, 7, answer) == expected
