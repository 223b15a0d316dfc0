"""A schema-walking reader that skips unknown tagged fields.

kio's native reader raises ``KeyError`` when a flexible message carries a tagged field it
does not know.  Kafka's generated readers keep such fields aside (``_unknownTaggedFields``)
and carry on, so a newer client talking to us must not be refused.  This slower reader walks
the same dataclass schema in Python, using kio's primitive readers, and skips tags it does
not know.  It is used only after the fast reader refused a message.
"""

from __future__ import annotations

import dataclasses
import functools
import struct
from typing import Any

from kio._kio_native import get_reader
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


@functools.cache
def _plan(cls: type) -> tuple[list[tuple[Any, ...]], dict[int, tuple[Any, ...]]]:
    """Ordered untagged field plans, and tagged field plans by tag."""
    flexible = bool(getattr(cls, "__flexible__", False))
    ordered: list[tuple[Any, ...]] = []
    tagged: dict[int, tuple[Any, ...]] = {}
    for f in dataclasses.fields(cls):
        fc = classify_field(f)
        optional = is_optional(f)
        kafka_type = f.metadata.get("kafka_type", "")
        if isinstance(fc, EntityTupleField):
            item: tuple[Any, ...] = ("entity_array", fc.type_, optional)
        elif isinstance(fc, EntityField):
            item = ("entity", fc.type_, optional)
        elif isinstance(fc, PrimitiveTupleField):
            item = ("array", get_reader(kafka_type, flexible, False), optional)
        else:
            item = ("primitive", get_reader(kafka_type, flexible, optional), optional)
        plan = (f.name, flexible, *item)
        tag = get_field_tag(f)
        if tag is None:
            ordered.append(plan)
        else:
            tagged[int(tag)] = plan
    return ordered, tagged


def _array_length(buf: bytes, pos: int, flexible: bool) -> tuple[int, int]:
    if flexible:
        n, pos = read_uvarint(buf, pos)
        return n - 1, pos
    if pos + 4 > len(buf):
        raise FrameError("truncated array length")
    return _I32.unpack_from(buf, pos)[0], pos + 4


def _read_value(plan: tuple[Any, ...], buf: bytes, pos: int) -> tuple[Any, int]:
    _name, flexible, kind, what, _optional = plan
    if kind == "primitive":
        value, size = what(buf, pos)
        return value, pos + size
    if kind == "entity":
        if flexible and _optional:
            # nullable struct: int8 marker (-1 null, 1 present) in flexible versions
            marker = buf[pos]
            pos += 1
            if marker == 0xFF:
                return None, pos
        return _read_entity(what, buf, pos)
    n, pos = _array_length(buf, pos, flexible)
    if n < 0:
        return None, pos
    items = []
    for _ in range(n):
        if kind == "entity_array":
            value, pos = _read_entity(what, buf, pos)
        else:
            value, size = what(buf, pos)
            pos += size
        items.append(value)
    return tuple(items), pos


def _read_entity(cls: type, buf: bytes, pos: int) -> tuple[Any, int]:
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


def decode_skipping_unknown_tags(cls: type, buf: bytes, offset: int = 0) -> Any:
    msg, _pos = _read_entity(cls, buf, offset)
    return msg
