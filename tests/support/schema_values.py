"""Random messages for a kio schema class, as handlers write them (plain dicts and lists):
every field present, absent or None, arrays as lists and tuples, error codes as ints and
enums, durations as ints and timedeltas, nested structs several levels deep; with ``odd``
also values the encoders may refuse (a string as bytes, an out-of-range int, a struct given as
a dataclass ...).  Used to hold the compiled codec paths to the generic ones."""

from __future__ import annotations

import dataclasses
import datetime
import random
import uuid
from typing import Any

from rallypoint.protocol import codec
from rallypoint.protocol.errors import ErrorCode

_RANGES = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint8": (0, 2**8 - 1),
    "uint16": (0, 2**16 - 1),
    "uint32": (0, 2**32 - 1),
    "uint64": (0, 2**64 - 1),
}
_CODES = [int(c) for c in ErrorCode][:40]


def _int(rng: random.Random, lo: int, hi: int) -> int:
    return rng.choice([lo, hi, 0, -1 if lo < 0 else 1, rng.randint(lo, hi), rng.randint(max(lo, -300), min(hi, 300))])


def _primitive(rng: random.Random, kafka_type: str, odd: bool) -> Any:
    if odd and rng.random() < 0.3:
        return rng.choice([b"raw", 2**70, -(2**70), 1.5, "text", True, object(), [1], {"a": 1}, ErrorCode.NONE])
    if kafka_type in _RANGES:
        return _int(rng, *_RANGES[kafka_type])
    if kafka_type == "float64":
        return rng.choice([0.0, -1.5, 1e300, rng.random()])
    if kafka_type == "bool":
        return rng.choice([True, False, 0, 1])
    if kafka_type == "error_code":
        code = rng.choice(_CODES)
        return rng.choice([code, ErrorCode(code)])
    if kafka_type == "string":
        return rng.choice(["", "topic-1", "ünïcødé ✓", "x" * rng.randint(0, 300)])
    if kafka_type in ("bytes", "records"):
        return rng.choice([b"", b"\x00\x01\xff", bytes(rng.randint(0, 200)), bytearray(b"ab"), memoryview(b"mv")])
    if kafka_type == "uuid":
        u = uuid.UUID(int=rng.getrandbits(128))
        return rng.choice([u, str(u)])
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        ms = rng.choice([0, 1, 30000, 2**31 - 1, -1, rng.randint(0, 10**6)])
        return rng.choice([ms, datetime.timedelta(milliseconds=ms)])
    if kafka_type == "datetime_i64":
        return rng.choice([0, 1_700_000_000_000, rng.randint(0, 2**41)])
    raise AssertionError(f"no generator for {kafka_type}")


def random_message(rng: random.Random, cls: type, odd: bool, depth: int = 0) -> dict[str, Any]:
    from kio.serial._introspect import EntityField, EntityTupleField, PrimitiveTupleField, classify_field

    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        roll = rng.random()
        if roll < 0.15:
            continue  # absent: the schema's default
        if roll < 0.22:
            out[f.name] = None
            continue
        fc = classify_field(f)
        kafka_type = f.metadata.get("kafka_type", "")
        if isinstance(fc, EntityField):
            if odd and rng.random() < 0.2:
                out[f.name] = codec.build(fc.type_, {})  # a dataclass instead of a dict
            else:
                out[f.name] = random_message(rng, fc.type_, odd, depth + 1) if depth < 4 else {}
        elif isinstance(fc, EntityTupleField):
            n = rng.randint(0, 3) if depth < 4 else 0
            items = [random_message(rng, fc.type_, odd, depth + 1) for _ in range(n)]
            out[f.name] = tuple(items) if rng.random() < 0.3 else items
        elif isinstance(fc, PrimitiveTupleField):
            items = [_primitive(rng, kafka_type, odd) for _ in range(rng.randint(0, 4))]
            out[f.name] = tuple(items) if rng.random() < 0.3 else items
        else:
            out[f.name] = _primitive(rng, kafka_type, odd)
    if odd and rng.random() < 0.1:
        out["not_a_field"] = 1  # ignored by both
    return out
