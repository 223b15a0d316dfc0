"""Where the fields of a request frame are: the map structure-aware mutations work from.

``layout(body)`` walks a request body with the message schema (the same schema classes the
broker decodes with, found through ``rallypoint.protocol.codec.request_class``) and returns a
:class:`Span` per length prefix, number, tagged-field section and record-batch payload, so a
mutation can make an array length lie, null a non-nullable string, set ``num_partitions`` to
2**31-1 or repeat a tagged field, rather than hoping a random bit lands there.

Kafka's encodings (``Protocol.java`` / the generated message classes): non-flexible versions
use int32 array and bytes lengths and int16 string lengths (-1 = null); flexible versions use
unsigned varints holding length + 1 (0 = null) and end every structure with a tagged-field
section (count, then tag / size / bytes per field).
"""

from __future__ import annotations

import dataclasses
import functools
import struct
from dataclasses import dataclass

from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    is_optional,
)
from rallypoint.protocol import codec

_FIXED = {
    "bool": 1,
    "int8": 1,
    "int16": 2,
    "uint16": 2,
    "int32": 4,
    "uint32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "float64": 8,
    "uuid": 16,
}
_HDR = struct.Struct(">hhi")


class LayoutError(ValueError):
    pass


class Oversized(LayoutError):
    """An array or tagged-field section with more entries than the walk's ``limit``."""

    def __init__(self, kind: str, name: str, count: int) -> None:
        super().__init__(f"{kind} {name} has {count} entries")
        self.kind = kind
        self.name = name
        self.count = count


@dataclass(frozen=True, slots=True)
class Span:
    """One field: ``kind`` is ``array`` / ``string`` / ``bytes`` / ``records`` (``pos``, ``size``
    = the length prefix; ``value`` = the decoded length, -1 for null), ``int<N>`` (a number;
    ``value`` = the number), ``tagged`` (the count of a tagged-field section; ``value`` = the
    count) or ``payload`` (the bytes of a string, bytes or records field)."""

    pos: int
    size: int
    kind: str
    flexible: bool
    name: str
    value: int = 0
    nullable: bool = True


def read_uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise LayoutError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 35:
            raise LayoutError("varint too long")


def write_uvarint(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


class _Walker:
    def __init__(self, buf: bytes, limit: int | None) -> None:
        self.buf = buf
        self.limit = limit
        self.spans: list[Span] = []

    def need(self, pos: int, n: int) -> None:
        if pos + n > len(self.buf):
            raise LayoutError(f"truncated at {pos}")

    def length(
        self, pos: int, flexible: bool, width: int, kind: str, name: str, nullable: bool = True
    ) -> tuple[int, int]:
        if flexible:
            n, end = read_uvarint(self.buf, pos)
            n -= 1
        else:
            self.need(pos, width)
            n = int.from_bytes(self.buf[pos : pos + width], "big", signed=True)
            end = pos + width
        self.spans.append(Span(pos, end - pos, kind, flexible, name, n, nullable))
        return n, end

    def primitive(self, kafka_type: str, pos: int, flexible: bool, name: str, nullable: bool = True) -> int:
        if kafka_type in _FIXED:
            size = _FIXED[kafka_type]
            self.need(pos, size)
            if size in (1, 2, 4, 8) and kafka_type not in ("float64",):
                value = int.from_bytes(self.buf[pos : pos + size], "big", signed=True)
                self.spans.append(Span(pos, size, f"int{size * 8}", flexible, name, value))
            return pos + size
        if kafka_type in ("string", "bytes", "records"):
            width = 2 if kafka_type == "string" else 4
            n, pos = self.length(pos, flexible, width, kafka_type, name, nullable)
            if n > 0:
                self.need(pos, n)
                self.spans.append(Span(pos, n, "payload", flexible, name, n))
                pos += n
            return pos
        raise LayoutError(f"unknown kafka type {kafka_type!r}")

    def entity(self, cls: type, pos: int) -> int:
        flexible, ordered, tagged = _plan(cls)
        for plan in ordered:
            pos = self.field(plan, pos, flexible)
        if flexible:
            start = pos
            count, pos = read_uvarint(self.buf, pos)
            self.spans.append(Span(start, pos - start, "tagged", True, cls.__name__, count))
            if self.limit is not None and count > self.limit:
                raise Oversized("tagged", cls.__name__, count)
            for _ in range(count):
                tag, pos = read_uvarint(self.buf, pos)
                size, pos = read_uvarint(self.buf, pos)
                self.need(pos, size)
                known = tagged.get(tag)
                if known is not None:
                    try:
                        self.field(known, pos, flexible)
                    except LayoutError:
                        pass
                pos += size
        return pos

    def field(self, plan: _Plan, pos: int, flexible: bool) -> int:
        name, kind, kafka_type, nullable, nested = plan
        if kind in ("entity_array", "array"):
            n, pos = self.length(pos, flexible, 4, "array", name, nullable)
            if n > len(self.buf) - pos:
                raise LayoutError("array longer than the frame")
            if self.limit is not None and n > self.limit:
                raise Oversized("array", name, n)
            for _ in range(max(n, 0)):
                if nested is not None:
                    pos = self.entity(nested, pos)
                else:
                    pos = self.primitive(kafka_type, pos, flexible, name, False)
            return pos
        if nested is not None:
            return self.entity(nested, pos)
        return self.primitive(kafka_type, pos, flexible, name, nullable)


# (field name, kind, kafka type, nullable, nested structure class)
_Plan = tuple[str, str, str, bool, type | None]


@functools.cache
def _plan(cls: type) -> tuple[bool, tuple[_Plan, ...], dict[int, _Plan]]:
    """(flexible, untagged fields in order, tagged fields by tag) of a schema class."""
    ordered: list[_Plan] = []
    tagged: dict[int, _Plan] = {}
    for f in dataclasses.fields(cls):
        fc = classify_field(f)
        kafka_type = f.metadata.get("kafka_type", "")
        plan: _Plan
        if isinstance(fc, EntityTupleField):
            plan = (f.name, "entity_array", kafka_type, is_optional(f), fc.type_)
        elif isinstance(fc, PrimitiveTupleField):
            plan = (f.name, "array", kafka_type, is_optional(f), None)
        elif isinstance(fc, EntityField):
            plan = (f.name, "entity", kafka_type, is_optional(f), fc.type_)
        else:
            plan = (f.name, "primitive", kafka_type, is_optional(f), None)
        tag = get_field_tag(f)
        if tag is None:
            ordered.append(plan)
        else:
            tagged[int(tag)] = plan
    return bool(getattr(cls, "__flexible__", False)), tuple(ordered), tagged


@functools.cache
def _schema(key: int, version: int) -> tuple[type, int] | None:
    """(request class, header version), or None for an API/version without a schema (cached too)."""
    try:
        return codec.request_class(key, version), codec.request_header_version(key, version)
    except Exception:
        return None


@dataclass(frozen=True, slots=True)
class Layout:
    api_key: int
    api_version: int
    header_size: int
    header_tagged: int | None  # position of the header's tagged-field count (header v2)
    spans: tuple[Span, ...]
    complete: bool  # the whole body was walked and nothing was left over
    body: bytes = b""


def layout(body: bytes, limit: int | None = None) -> Layout:
    """The field map of a well-formed request frame body; :class:`LayoutError` otherwise
    (:class:`Oversized` when an array or tagged section has more than ``limit`` entries)."""
    if len(body) < 10:
        raise LayoutError("shorter than a request header")
    key, version, _corr = _HDR.unpack_from(body, 0)
    schema = _schema(key, version)
    if schema is None:
        raise LayoutError(f"no schema for api {key} v{version}")
    cls, header_version = schema
    w = _Walker(body, limit)
    n = int.from_bytes(body[8:10], "big", signed=True)
    pos = 10 + max(n, 0)
    w.need(pos, 0)
    header_tagged = None
    if header_version >= 2:
        header_tagged = pos
        count, pos = read_uvarint(body, pos)
        if limit is not None and count > limit:
            raise Oversized("tagged", "RequestHeader", count)
        for _ in range(count):
            _tag, pos = read_uvarint(body, pos)
            size, pos = read_uvarint(body, pos)
            pos += size
    header_size = pos
    end = w.entity(cls, pos)
    return Layout(key, version, header_size, header_tagged, tuple(w.spans), end == len(body), body)
