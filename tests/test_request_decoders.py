"""The compiled request walkers (protocol/tagged.py, "compiled walkers") read exactly what the
interpreting walk reads, and refuse exactly what it refuses, for every request version served.

Requests are generated from each schema (tests/support/schema_values.py) and encoded by the
generic writer; each is read whole, then corrupted (bytes flipped, cut short, a length made
huge, a byte inserted) and read again.  Both readers must give equal messages and end
positions, or both refuse; the element budget (rallypoint.request.max.elements) too.
"""

from __future__ import annotations

import random

import pytest
from rallypoint.protocol import codec, tagged
from rallypoint.protocol.apis import SERVED_APIS

from tests.support.schema_values import random_message

pytestmark = pytest.mark.unit

SERVED = [(api.key, v) for api in SERVED_APIS.values() for v in range(api.min_version, api.max_version + 1)]


def _read(cls: type, data: bytes, budget: int | None) -> tuple[object, int] | str:
    try:
        return tagged.read(cls, data, 0, budget)
    except Exception as e:
        return f"refused: {type(e).__name__}"


def _both(cls: type, data: bytes, budget: int | None = None) -> None:
    compiled = _read(cls, data, budget)
    with tagged.interpreted():
        interpreted = _read(cls, data, budget)
    if isinstance(interpreted, str) or isinstance(compiled, str):
        # the same refusal (kio's native readers raise their own types on both paths)
        assert isinstance(interpreted, str) and isinstance(compiled, str), (data, compiled, interpreted)
    else:
        assert compiled == interpreted, data


def _corruptions(rng: random.Random, data: bytes) -> list[bytes]:
    out = []
    for _ in range(6):
        b = bytearray(data)
        if b:
            i = rng.randrange(len(b))
            b[i] = rng.randrange(256)
        out.append(bytes(b))
    if data:
        out.append(data[: rng.randrange(len(data))])
        i = rng.randrange(len(data))
        out.append(data[:i] + b"\xff\xff\xff\x7f" + data[i:])
        out.append(data[:i] + bytes([rng.randrange(256)]) + data[i:])
    return out


@pytest.mark.parametrize(("api_key", "version"), SERVED)
def test_compiled_walkers_read_and_refuse_as_the_interpreting_walk(api_key: int, version: int) -> None:
    cls = codec.request_class(api_key, version)
    if not tagged.has_arrays(cls):
        pytest.skip("read by kio's native reader alone")
    assert tagged.walker(cls) is not None, "no compiled walker"
    rng = random.Random(f"decode {api_key}/{version}")
    read_whole = 0
    for _ in range(30):
        try:
            data = codec.encode_message(codec.build(cls, random_message(rng, cls, odd=False)))
        except Exception:
            continue  # a generated message the writer refuses (None in a required field ...)
        _both(cls, data)
        _both(cls, data, budget=rng.randrange(0, 6))
        for bad in _corruptions(rng, data):
            _both(cls, bad)
        read_whole += 1
    assert read_whole >= 5, "too few messages generated to say anything"


def test_the_server_path_uses_the_compiled_walker() -> None:
    """An OffsetCommit request is read by its compiled walker (not the interpreting walk)."""
    cls = codec.request_class(8, 9)
    body = {
        "group_id": "g",
        "generation_id_or_member_epoch": 1,
        "member_id": "m",
        "topics": [{"name": "t", "partitions": [{"partition_index": 0, "committed_offset": 5}]}],
    }
    data = codec.encode_message(codec.build(cls, body))
    calls = []
    real = tagged._walk

    def spy(*args: object) -> object:
        calls.append(args[0])
        return real(*args)  # type: ignore[arg-type]

    try:
        tagged._walk = spy  # type: ignore[assignment]
        msg = codec.decode_request(8, 9, data)
    finally:
        tagged._walk = real  # type: ignore[assignment]
    assert calls == []
    assert msg.topics[0].partitions[0].committed_offset == 5
