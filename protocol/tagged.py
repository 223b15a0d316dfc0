"""The request-body reader: kio's native reader made safe for untrusted bytes.

kio's native (Rust) reader has two problems with bytes from the network:

* It **aborts the whole process** on a huge array length: it reserves capacity for the
  announced element count before reading any element, and when that allocation fails Rust
  aborts (``memory allocation of N bytes failed``), which no ``except`` can catch.  A compact
  array length is a uvarint of up to 35 bits, so 8 garbage bytes in a JoinGroup body were
  enough to kill the broker; a legacy int32 length of 2**31-1 reserves 16 GiB.
* It raises ``KeyError`` on a tagged field it does not know.  Kafka's generated readers keep
  such fields aside (``_unknownTaggedFields``) and carry on, so a newer client must not be
  refused.

So this module walks the dataclass schema in Python wherever a message has arrays, checking
every array length against the bytes that remain (each element takes at least one byte, so a
larger count cannot be honest), and skipping unknown tags.  Sub-structures without arrays
(most of any message: a partition entry, a Heartbeat) are handed to the native reader, which
is safe for them; if it meets an unknown tag there, we walk that structure in Python too.
"""

from __future__ import annotations

import dataclasses
import functools
import struct
from typing import Any

from kio._kio_native import entity_reader, get_reader
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    is_optional,
)

from .framing import FrameError, read_uvarint

_I32 = struct.Struct(">i")
Buffer = bytes | memoryview

# A field plan: (name, flexible, kind, reader-or-class, optional)
#   kind "primitive": reader is kio's primitive reader
#   kind "array":     reader reads one item of a primitive array
#   kind "entity" / "entity_array": the nested dataclass
Plan = tuple[str, bool, str, Any, bool]


class MalformedMessage(ValueError):
    """The bytes do not follow the message's schema."""


@functools.cache
def has_arrays(cls: type) -> bool:
    """True when ``cls`` or any structure inside it has an array field."""
    for f in dataclasses.fields(cls):
        fc = classify_field(f)
        if isinstance(fc, EntityTupleField | PrimitiveTupleField):
            return True
        if isinstance(fc, EntityField) and has_arrays(fc.type_):
            return True
    return False


@functools.cache
def _native(cls: type) -> Any:
    return entity_reader(cls)


@functools.cache
def _plan(cls: type) -> tuple[tuple[Plan, ...], dict[int, Plan]]:
    """Ordered untagged field plans, and tagged field plans by tag."""
    flexible = bool(getattr(cls, "__flexible__", False))
    ordered: list[Plan] = []
    tagged: dict[int, Plan] = {}
    for f in dataclasses.fields(cls):
        fc = classify_field(f)
        optional = is_optional(f)
        kafka_type = f.metadata.get("kafka_type", "")
        plan: Plan
        if isinstance(fc, EntityTupleField):
            plan = (f.name, flexible, "entity_array", fc.type_, optional)
        elif isinstance(fc, EntityField):
            plan = (f.name, flexible, "entity", fc.type_, optional)
        elif isinstance(fc, PrimitiveTupleField):
            plan = (f.name, flexible, "array", get_reader(kafka_type, flexible, False), optional)
        else:
            plan = (f.name, flexible, "primitive", get_reader(kafka_type, flexible, optional), optional)
        tag = get_field_tag(f)
        if tag is None:
            ordered.append(plan)
        else:
            tagged[int(tag)] = plan
    return tuple(ordered), tagged


def _array_length(buf: Buffer, pos: int, flexible: bool) -> tuple[int, int]:
    if flexible:
        n, pos = read_uvarint(buf, pos)
        n -= 1  # compact arrays store length + 1; 0 is null
    else:
        if pos + 4 > len(buf):
            raise FrameError("truncated array length")
        n = _I32.unpack_from(buf, pos)[0]
        pos += 4
    if n > len(buf) - pos:
        raise MalformedMessage(f"array of {n} items in the {len(buf) - pos} bytes left")
    return n, pos


def _read_value(plan: Plan, buf: Buffer, pos: int) -> tuple[Any, int]:
    _name, flexible, kind, what, optional = plan
    if kind == "primitive":
        value, size = what(buf, pos)
        return value, pos + size
    if kind == "entity":
        if flexible and optional:
            # Nullable struct (KIP-893): int8 marker, negative = null, 1 = present.
            if pos >= len(buf):
                raise FrameError("truncated nullable struct marker")
            marker = buf[pos]
            pos += 1
            if marker >= 0x80:
                return None, pos
        return read(what, buf, pos)
    n, pos = _array_length(buf, pos, flexible)
    if n < 0:
        return None, pos
    items = []
    if kind == "entity_array":
        for _ in range(n):
            value, pos = read(what, buf, pos)
            items.append(value)
    else:
        for _ in range(n):
            value, size = what(buf, pos)
            pos += size
            items.append(value)
    return tuple(items), pos


def _walk(cls: type, buf: Buffer, pos: int) -> tuple[Any, int]:
    ordered, tagged = _plan(cls)
    kwargs: dict[str, Any] = {}
    for plan in ordered:
        kwargs[plan[0]], pos = _read_value(plan, buf, pos)
    if getattr(cls, "__flexible__", False):
        count, pos = read_uvarint(buf, pos)
        for _ in range(count):
            tag, pos = read_uvarint(buf, pos)
            size, pos = read_uvarint(buf, pos)
            end = pos + size
            if end > len(buf):
                raise FrameError("truncated tagged field")
            tagged_plan = tagged.get(tag)
            if tagged_plan is not None:
                kwargs[tagged_plan[0]], _ = _read_value(tagged_plan, buf[:end], pos)
            pos = end  # unknown tags: skipped, like Kafka's _unknownTaggedFields
    return cls(**kwargs), pos


def read(cls: type, buf: Buffer, pos: int = 0) -> tuple[Any, int]:
    """(message, position after it) of a ``cls`` structure at ``pos``."""
    if not has_arrays(cls):
        try:
            msg, size = _native(cls)(buf, pos)
            return msg, pos + size
        except KeyError:
            pass  # an unknown tagged field: walk it in Python, skipping the tag
    return _walk(cls, buf, pos)


def decode_skipping_unknown_tags(cls: type, buf: Buffer, offset: int = 0) -> Any:
    msg, _pos = read(cls, buf, offset)
    return msg
