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

So this module walks the dataclass schema in Python wherever a message has arrays, and skips
unknown tags.  Sub-structures without arrays (most of any message: a partition entry, a
Heartbeat) are handed to the native reader, which is safe for them; if it meets an unknown tag
there, we walk that structure in Python too.

What the walk bounds (docs/reliability.md, "Limits"):

* an array of N elements must fit in the bytes that remain: N times the smallest encoding of
  one element (its fixed-width fields, the length prefixes of its strings and arrays, ...),
  checked before a single element is read;
* a tagged-field section of N fields needs at least 2 bytes per field;
* every element of every array and every tagged field counts against one ``Budget`` per
  request (``rallypoint.request.max.elements``), so a legal frame cannot make the broker
  build millions of objects;
* a null (-1) length for an array the schema does not declare nullable is malformed, as in
  Kafka's generated readers ("non-nullable field ... was serialized as null");
* the bytes are read through a ``memoryview``, so a tagged field repeated many times costs a
  constant per occurrence (the last occurrence wins, as in Kafka's generated readers).
"""

from __future__ import annotations

import array
import contextlib
import dataclasses
import functools
import struct
import types
from collections.abc import Callable, Iterator
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

# A field plan: (name, flexible, kind, reader-or-class, optional, smallest element size)
#   kind "primitive": reader is kio's primitive reader
#   kind "array":     reader reads one item of a primitive array
#   kind "entity" / "entity_array": the nested dataclass
Plan = tuple[str, bool, str, Any, bool, int]

# Smallest encoding of one value of each fixed-width kafka type.
_FIXED_SIZE = {
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "uint32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "uuid": 16,
}


class MalformedMessage(ValueError):
    """The bytes do not follow the message's schema."""


class TooManyElements(MalformedMessage):
    """More array elements and tagged fields than one request may hold."""


class Budget:
    """Array elements and tagged fields one message may still hold (``None``: no limit)."""

    __slots__ = ("left", "limit")

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.left = limit

    def take(self, n: int) -> None:
        if self.left is None or n <= 0:
            return
        if n > self.left:
            raise TooManyElements(f"more than {self.limit} array elements and tagged fields in one message")
        self.left -= n


_UNLIMITED = Budget(None)


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


def _primitive_min_size(kafka_type: str, flexible: bool) -> int:
    if kafka_type in _FIXED_SIZE:
        return _FIXED_SIZE[kafka_type]
    if kafka_type == "string":
        return 1 if flexible else 2
    if kafka_type in ("bytes", "records"):
        return 1 if flexible else 4
    return 0  # unknown to us: no claim


@functools.cache
def min_size(cls: type) -> int:
    """The fewest bytes any encoding of a ``cls`` structure can take."""
    flexible = bool(getattr(cls, "__flexible__", False))
    total = 1 if flexible else 0  # the tagged-field count
    for f in dataclasses.fields(cls):
        if get_field_tag(f) is not None:
            continue  # tagged fields may be absent
        fc = classify_field(f)
        if isinstance(fc, EntityTupleField | PrimitiveTupleField):
            total += 1 if flexible else 4
        elif isinstance(fc, EntityField):
            total += 1 if flexible and is_optional(f) else min_size(fc.type_)
        else:
            total += _primitive_min_size(f.metadata.get("kafka_type", ""), flexible)
    return total


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
            plan = (f.name, flexible, "entity_array", fc.type_, optional, max(1, min_size(fc.type_)))
        elif isinstance(fc, EntityField):
            plan = (f.name, flexible, "entity", fc.type_, optional, 0)
        elif isinstance(fc, PrimitiveTupleField):
            item_size = max(1, _primitive_min_size(kafka_type, flexible))
            plan = (f.name, flexible, "array", get_reader(kafka_type, flexible, False), optional, item_size)
        else:
            plan = (f.name, flexible, "primitive", get_reader(kafka_type, flexible, optional), optional, 0)
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
    return n, pos


def _read_value(plan: Plan, buf: memoryview, pos: int, budget: Budget) -> tuple[Any, int]:
    name, flexible, kind, what, optional, item_size = plan
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
        return _read(what, buf, pos, budget)
    n, pos = _array_length(buf, pos, flexible)
    if n < 0:
        if not optional:
            raise MalformedMessage(f"non-nullable field {name} was serialized as null")
        return None, pos
    left = len(buf) - pos
    if n * item_size > left:
        raise MalformedMessage(f"array {name} of {n} items cannot fit in the {left} bytes left")
    budget.take(n)
    items = []
    if kind == "entity_array":
        for _ in range(n):
            value, pos = _read(what, buf, pos, budget)
            items.append(value)
    else:
        for _ in range(n):
            value, size = what(buf, pos)
            pos += size
            items.append(value)
    return tuple(items), pos


def _walk(cls: type, buf: memoryview, pos: int, budget: Budget) -> tuple[Any, int]:
    ordered, tagged = _plan(cls)
    kwargs: dict[str, Any] = {}
    for plan in ordered:
        kwargs[plan[0]], pos = _read_value(plan, buf, pos, budget)
    if getattr(cls, "__flexible__", False):
        count, pos = read_uvarint(buf, pos)
        if count * 2 > len(buf) - pos:  # each field takes a tag and a size byte at least
            raise MalformedMessage(f"{count} tagged fields cannot fit in the {len(buf) - pos} bytes left")
        budget.take(count)
        for _ in range(count):
            tag, pos = read_uvarint(buf, pos)
            size, pos = read_uvarint(buf, pos)
            end = pos + size
            if end > len(buf):
                raise FrameError("truncated tagged field")
            tagged_plan = tagged.get(tag)
            if tagged_plan is not None:
                # a memoryview slice: no copy, so a repeated field costs O(its own size)
                kwargs[tagged_plan[0]], _ = _read_value(tagged_plan, buf[:end], pos, budget)
            pos = end  # unknown tags: skipped, like Kafka's _unknownTaggedFields
    return cls(**kwargs), pos


_compiled_walkers = True


def _read(cls: type, buf: memoryview, pos: int, budget: Budget) -> tuple[Any, int]:
    if not has_arrays(cls):
        try:
            msg, size = _native(cls)(buf, pos)
            return msg, pos + size
        except KeyError:
            pass  # an unknown tagged field: walk it in Python, skipping the tag
    if _compiled_walkers:
        compiled = walker(cls)
        if compiled is not None:
            result: tuple[Any, int] = compiled(buf, pos, budget)
            return result
    return _walk(cls, buf, pos, budget)


@contextlib.contextmanager
def interpreted() -> Iterator[None]:
    """Read with the interpreting walk only (what tests hold the compiled walkers to)."""
    global _compiled_walkers
    _compiled_walkers = False
    try:
        yield
    finally:
        _compiled_walkers = True


# ------------------------------------------------------------------ compiled walkers
#
# _walk interprets a field plan per value.  For the structures it walks (those with arrays:
# OffsetCommit's topics, Produce's and Fetch's partitions ...) the same steps are generated as
# Python source once per class: the same kio readers, the same checks in the same order
# (array length against the bytes left, the element budget, null arrays, nullable structs,
# tagged fields by number with unknown ones skipped and the last occurrence winning), the same
# dataclass -- without the per-field dispatch.  tests/test_request_decoders.py holds them to
# _walk's results and refusals on every request version served, valid and corrupted bytes.


@functools.cache
def walker(cls: type) -> Any:
    """The compiled walker of ``cls`` (``(buf, pos, budget) -> (message, pos)``), or None."""
    try:
        return _compile_walker(cls)
    except Exception:
        return None


def _compile_walker(cls: type) -> Any:
    ns: dict[str, Any] = {
        "cls": cls,
        "array_length": _array_length,
        "read_uvarint": read_uvarint,
        "Malformed": MalformedMessage,
        "FrameError": FrameError,
        "len": len,
        "range": range,
        "tuple": tuple,
    }
    consts = iter(range(10**6))

    def const(value: Any) -> str:
        name = f"k{next(consts)}"
        ns[name] = value
        return name

    def read_into(var: str, nested: type, indent: str) -> list[str]:
        """Statements reading one ``nested`` structure into ``var`` and moving ``pos`` past it
        (as _read: kio's native reader for a structure without arrays, walked when it meets
        an unknown tagged field)."""
        walk = const(walker_or_walk(nested))
        if has_arrays(nested):
            return [f"{indent}{var}, pos = {walk}(buf, pos, budget)"]
        return [
            f"{indent}try:",
            f"{indent}    {var}, size = {const(_native(nested))}(buf, pos)",
            f"{indent}except KeyError:",
            f"{indent}    {var}, pos = {walk}(buf, pos, budget)",
            f"{indent}else:",
            f"{indent}    pos += size",
        ]

    ordered, tagged = _plan(cls)
    flexible = bool(getattr(cls, "__flexible__", False))
    lines = ["def walk(buf, pos, budget):"]
    names: list[str] = []
    for i, (name, flex, kind, what, optional, item_size) in enumerate(ordered):
        var = f"v{i}"
        names.append(f"{name}={var}")
        if kind == "primitive":
            lines += [f"    {var}, size = {const(what)}(buf, pos)", "    pos += size"]
            continue
        if kind == "entity":
            if flex and optional:
                lines += [
                    "    if pos >= len(buf): raise FrameError('truncated nullable struct marker')",
                    "    marker = buf[pos]",
                    "    pos += 1",
                    f"    if marker >= 0x80: {var} = None",
                    "    else:",
                    *read_into(var, what, "        "),
                ]
            else:
                lines += read_into(var, what, "    ")
            continue
        lines.append(f"    n, pos = array_length(buf, pos, {flex})")
        lines.append("    if n < 0:")
        if optional:
            lines.append(f"        {var} = None")
        else:
            lines.append(f"        raise Malformed({f'non-nullable field {name} was serialized as null'!r})")
        lines += [
            "    else:",
            "        left = len(buf) - pos",
            f"        if n * {item_size} > left:",
            f"            raise Malformed(f'array {name} of {{n}} items cannot fit in the {{left}} bytes left')",
            "        budget.take(n)",
            "        items = []",
            "        append = items.append",
            "        for _ in range(n):",
        ]
        if kind == "entity_array":
            lines += [*read_into("item", what, "            "), "            append(item)"]
        else:
            lines += [
                f"            item, size = {const(what)}(buf, pos)",
                "            pos += size",
                "            append(item)",
            ]
        lines.append(f"        {var} = tuple(items)")
    if flexible:
        # the tagged-field section, exactly as _walk reads it
        lines += [
            "    tags = {}",
            "    count, pos = read_uvarint(buf, pos)",
            "    if count * 2 > len(buf) - pos:",
            "        raise Malformed(f'{count} tagged fields cannot fit in the {len(buf) - pos} bytes left')",
            "    budget.take(count)",
            "    for _ in range(count):",
            "        tag, pos = read_uvarint(buf, pos)",
            "        size, pos = read_uvarint(buf, pos)",
            "        end = pos + size",
            "        if end > len(buf): raise FrameError('truncated tagged field')",
            f"        plan = {const(tagged)}.get(tag)",
            "        if plan is not None:",
            f"            tags[plan[0]], _ = {const(_read_value)}(plan, buf[:end], pos, budget)",
            "        pos = end",
            f"    return cls({', '.join([*names, '**tags'])}), pos",
        ]
    else:
        lines.append(f"    return cls({', '.join(names)}), pos")
    exec(compile("\n".join(lines) + "\n", f"<request walker {cls.__module__}.{cls.__name__}>", "exec"), ns)
    return ns["walk"]


def walker_or_walk(cls: type) -> Any:
    """``cls``'s compiled walker, or the interpreting walk bound to it."""
    compiled = walker(cls)
    return compiled if compiled is not None else functools.partial(_walk, cls)


def read(cls: type, buf: Buffer, pos: int = 0, max_elements: int | None = None) -> tuple[Any, int]:
    """(message, position after it) of a ``cls`` structure at ``pos``.

    ``max_elements`` bounds the array elements and tagged fields of the whole message
    (:class:`TooManyElements` beyond it); ``None`` means no bound besides the bytes.
    """
    if _compiled_walkers:
        fast = _FAST.get(cls)
        if fast is None:
            fast = _FAST[cls] = _fast(cls)
        program, native = fast
        if not program:
            if native is not None:  # no arrays: kio's native reader, as _read reads it
                try:
                    msg, size = native(buf, pos)
                    return msg, pos + size
                except KeyError:
                    pass  # an unknown tagged field: walk it in Python, skipping the tag
        elif _check is not None:
            end = _check(program, buf, pos, -1 if max_elements is None else max_elements)
            if end >= 0:
                try:
                    msg, size = native(buf, pos)
                except Exception:
                    pass  # refused (a string that is not UTF-8 ...): the walk words it
                else:
                    if pos + size == end:
                        return msg, end
    view = buf if isinstance(buf, memoryview) else memoryview(buf)
    budget = _UNLIMITED if max_elements is None else Budget(max_elements)
    return _read(cls, view, pos, budget)


def decode_skipping_unknown_tags(cls: type, buf: Buffer, offset: int = 0) -> Any:
    msg, _pos = read(cls, buf, offset)
    return msg


# ------------------------------------------------------------------ checked native reads
#
# kio's native reader builds a whole message in one call, some eight times faster than walking
# it in Python, and is unsafe only on bytes this module exists to refuse (a huge array length,
# an unknown tagged field).  So a message with arrays is first checked by a compiled walk that
# makes no objects (``protocol/_reqcheck.pyx``: lengths against the bytes left, nulls, the
# element budget, no tagged field anywhere); only a message it vouches for is read natively,
# and only when the native reader ends where the check did.  Anything else -- tagged fields, a
# refusal, the extension not built -- is walked as before, which words every refusal.
# tests/test_request_decoders.py holds this path to the interpreting walk on every request
# version served, valid and corrupted bytes.

_reqcheck: types.ModuleType | None
try:
    from . import _reqcheck
except ImportError:  # no C compiler at install, or a source tree never built
    _reqcheck = None
_check: Callable[[bytes, Buffer, int, int], int] | None = None if _reqcheck is None else _reqcheck.check
_OPS: dict[str, int] = {} if _reqcheck is None else _reqcheck.OPS


# cls -> (its shape check program or b"", kio's native reader when the program vouches or the
# structure has no arrays, else None): one lookup per request
_FAST: dict[type, tuple[bytes, Any]] = {}


def _fast(cls: type) -> tuple[bytes, Any]:
    program = _program(cls) if _check is not None else b""
    if not program and has_arrays(cls):
        return b"", None
    return program, _native(cls)


class _Uncovered(Exception):
    """A field of a kind the shape check does not cover."""


@functools.cache
def _program(cls: type) -> bytes:
    """The shape check's program for ``cls`` (``protocol/_reqcheck.pyx``), or b"" when a field
    is of a kind it does not cover (then the message is always walked)."""
    if not _OPS or not has_arrays(cls):
        return b""
    words: list[int] = []

    def struct(c: type) -> int:
        """Append ``c``'s program (its nested structs after it) and answer where it starts."""
        start = len(words)
        flexible = bool(getattr(c, "__flexible__", False))
        nested: list[tuple[int, type]] = []  # (index of the word to patch, struct)
        last_skip = -1  # where the last SKIP op of this struct is
        for f in dataclasses.fields(c):
            if get_field_tag(f) is not None:
                continue  # a tagged field: present only in a tagged section, which the check refuses
            fc = classify_field(f)
            optional = is_optional(f)
            kafka_type = f.metadata.get("kafka_type", "")
            if isinstance(fc, EntityTupleField):
                words.extend((_OPS["ARRAY_STRUCT"], flexible, optional, max(1, min_size(fc.type_)), -1))
                nested.append((len(words) - 1, fc.type_))
            elif isinstance(fc, EntityField):
                if optional and not flexible:
                    raise _Uncovered(f.name)
                words.extend((_OPS["NULLABLE_STRUCT"] if optional else _OPS["STRUCT"], -1))
                nested.append((len(words) - 1, fc.type_))
            elif isinstance(fc, PrimitiveTupleField):
                if kafka_type in _FIXED_SIZE:
                    words.extend((_OPS["ARRAY_FIXED"], flexible, optional, _FIXED_SIZE[kafka_type]))
                elif kafka_type == "string":
                    words.extend((_OPS["ARRAY_STRING"], flexible, optional))
                else:
                    raise _Uncovered(f.name)
            elif kafka_type in _FIXED_SIZE:
                if last_skip == len(words) - 2:
                    words[-1] += _FIXED_SIZE[kafka_type]  # runs of fixed-width fields: one SKIP
                else:
                    last_skip = len(words)
                    words.extend((_OPS["SKIP"], _FIXED_SIZE[kafka_type]))
            elif kafka_type == "string":
                words.extend((_OPS["STRING"], flexible, optional))
            elif kafka_type in ("bytes", "records"):
                words.extend((_OPS["BYTES"], flexible, optional))
            else:
                raise _Uncovered(f.name)
        words.extend((_OPS["END"], flexible))
        for index, c2 in nested:
            words[index] = struct(c2)
        return start

    try:
        struct(cls)
    except _Uncovered:
        return b""
    return array.array("i", words).tobytes()
