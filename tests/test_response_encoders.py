"""The compiled response encoders (protocol/response_encoders.py) write exactly the generic
path's bytes (codec.build + kio's writer), for every API and version served.

Answers are generated from each response schema with a seeded generator: every field present,
absent or None, arrays as lists and tuples, error codes as ints and enums, durations as
ints and timedeltas, nested structs several levels deep.  Well-formed answers must be taken
by the compiled encoder (no fallback) and give the generic bytes; odd ones (a string as
bytes, an out-of-range int, a struct given as a dataclass ...) must either give the generic
bytes or fall back -- and fall back whenever the generic path refuses them.
"""

from __future__ import annotations

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
