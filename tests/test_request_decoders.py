"""The compiled request walkers (protocol/tagged.py, "compiled walkers") and the checked native
reads (protocol/tagged.py, "checked native reads"; protocol/_reqcheck.pyx) read exactly what the
interpreting walk reads, and refuse exactly what it refuses, for every request version served.

Requests are generated from each schema (tests/support/schema_values.py) and encoded by the
generic writer; each is read whole, then corrupted (bytes flipped, cut short, a length made
huge, a byte inserted) and read again.  Both readers must give equal messages and end
positions, or both refuse; the element budget (rallypoint.request.max.elements) too.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from kio.serial._introspect import get_field_tag
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
    # without arrays: kio's native reader alone (and the walk on an unknown tagged field)
    assert tagged.walker(cls) is not None or not tagged.has_arrays(cls), "no compiled walker"
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


def _checked() -> object:
    check = tagged._check
    assert check is not None, "protocol/_reqcheck.pyx was not built"
    return check


@pytest.mark.parametrize(("api_key", "version"), SERVED)
def test_the_shape_check_vouches_only_for_what_the_native_reader_reads_as_the_walk(api_key: int, version: int) -> None:
    """Where the compiled shape check accepts bytes, kio's native reader ends where it ends and
    gives the interpreting walk's message; it accepts most generated messages without tagged
    fields (so the fast path is taken, not always declined)."""
    check = _checked()
    cls = codec.request_class(api_key, version)
    program = tagged._program(cls)
    if not tagged.has_arrays(cls):
        assert program == b""
        pytest.skip("read by kio's native reader alone")
    assert program, "the shape check does not cover this request"
    rng = random.Random(f"check {api_key}/{version}")
    vouched = plain = 0
    for _ in range(30):
        try:
            data = codec.encode_message(codec.build(cls, random_message(rng, cls, odd=False)))
        except Exception:
            continue
        with tagged.interpreted():
            expected = _read(cls, data, None)
        if isinstance(expected, str):
            continue  # a generated message the reader refuses (a null the version does not allow)
        plain += not _has_tagged_fields(expected[0])
        for candidate in [data, *_corruptions(rng, data)]:
            end = check(program, candidate, 0, -1)  # type: ignore[operator]
            if end < 0:
                continue
            if candidate is data:
                vouched += 1
            with tagged.interpreted():
                walked = _read(cls, candidate, None)
            try:
                msg, size = tagged._native(cls)(candidate, 0)
            except Exception:
                assert isinstance(walked, str), candidate  # the walk refuses it too
                continue
            assert size == end, candidate
            assert (msg, size) == walked, candidate
            # the element budget: vouched only when the arrays hold no more than it allows
            elements = _elements(msg)
            assert check(program, candidate, 0, elements) == end  # type: ignore[operator]
            if elements:
                assert check(program, candidate, 0, elements - 1) == -1  # type: ignore[operator]
    assert vouched >= plain * 0.9, (vouched, plain)


def _elements(msg: object) -> int:
    """Array elements in a decoded message (what the element budget counts, without tags)."""
    total = 0
    if dataclasses.is_dataclass(msg):
        for f in dataclasses.fields(msg):
            total += _elements(getattr(msg, f.name))
    elif isinstance(msg, tuple):
        total += len(msg)
        for item in msg:
            total += _elements(item)
    return total


def _has_tagged_fields(msg: object) -> bool:
    """Does the message set a tagged field (so the shape check must decline it)?"""
    if dataclasses.is_dataclass(msg):
        for f in dataclasses.fields(msg):
            value = getattr(msg, f.name)
            if get_field_tag(f) is not None and value != f.default and value is not None:
                return True
            if _has_tagged_fields(value):
                return True
    elif isinstance(msg, tuple):
        return any(_has_tagged_fields(item) for item in msg)
    return False


def _offset_commit(tagged_field: bool) -> bytes:
    cls = codec.request_class(8, 9)
    body = {
        "group_id": "g",
        "generation_id_or_member_epoch": 1,
        "member_id": "m",
        "topics": [{"name": "t", "partitions": [{"partition_index": 0, "committed_offset": 5}]}],
    }
    data = codec.encode_message(codec.build(cls, body))
    if tagged_field:
        assert data.endswith(b"\x00\x00\x00")  # partition, topic and request: no tagged fields
        data = data[:-1] + b"\x01\x07\x01\x00"  # the request: one field, unknown tag 7
    return data


def _spied(data: bytes) -> tuple[object, list[str]]:
    calls: list[str] = []
    real_walk, real_walker = tagged._walk, tagged.walker

    def spy_walk(*args: object) -> object:
        calls.append("walk")
        return real_walk(*args)  # type: ignore[arg-type]

    def spy_walker(cls: type) -> object:
        calls.append("compiled walker")
        return real_walker(cls)

    try:
        tagged._walk = spy_walk  # type: ignore[assignment]
        tagged.walker = spy_walker  # type: ignore[assignment]
        msg = codec.decode_request(8, 9, data)
    finally:
        tagged._walk = real_walk  # type: ignore[assignment]
        tagged.walker = real_walker  # type: ignore[assignment]
    return msg, calls


def test_the_server_path_reads_a_plain_request_natively_after_the_check() -> None:
    """A plain OffsetCommit request is read by the checked native read (no walk at all); one
    with a tagged field by the compiled walker, which skips the unknown tag."""
    _checked()
    msg, calls = _spied(_offset_commit(False))
    assert calls == []
    assert msg.topics[0].partitions[0].committed_offset == 5  # type: ignore[attr-defined]
    msg, calls = _spied(_offset_commit(True))
    assert calls == ["compiled walker"]
    assert msg.topics[0].partitions[0].committed_offset == 5  # type: ignore[attr-defined]


def test_without_the_extension_requests_are_walked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pure-Python path: with the shape check not built, the compiled walker reads it."""
    monkeypatch.setattr(tagged, "_check", None)
    msg, calls = _spied(_offset_commit(False))
    assert calls == ["compiled walker"]
    assert msg.topics[0].partitions[0].committed_offset == 5  # type: ignore[attr-defined]
