"""Compiled response encoders: a handler's answer (plain dicts and lists) straight to bytes.

The generic path (:func:`protocol.codec.build` into kio's dataclasses, then kio's pure-Python
writer) walks a field plan per value, builds a frozen dataclass per struct and calls a writer
function per field: most of the cost of a small answer such as OffsetCommit's.  This module
generates, once per response schema, Python source that lays out the same bytes directly
from the dict (docs/BENCHMARKS.md, "Profiling the hot path").

Byte-identical to the generic path by construction, and pinned by a test over every API and
version served (``tests/test_response_encoders.py``):

* a key the answer lacks writes the bytes kio writes for :func:`~protocol.codec.build`'s
  default of that field, computed once with kio's own field writer; so does ``None``;
* hot types are inlined (integers, booleans, error codes, strings, bytes, arrays, structs,
  integer durations); anything rarer (UUIDs, datetimes, ...) and every tagged field go through
  ``build``'s own conversion of that one field and kio's writer for it;
* whatever the generated code does not expect -- a struct given as a kio dataclass or a
  ``Mapping`` that is not a ``dict``, an array given as a generator, a string given as bytes,
  an unknown error code, a value out of range -- raises :class:`Fallback` before anything is
  consumed, and the caller encodes the answer with the generic path instead (which then
  answers it, or raises what it always raised).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import functools
import io
import itertools
import struct
import types
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from .framing import write_uvarint


class Fallback(Exception):
    """The compiled encoder does not take this answer: use the generic path."""


_SMALL_UVARINTS = tuple(bytes((n,)) for n in range(0x80))


def _uvarint(n: int) -> bytes:
    return _SMALL_UVARINTS[n] if 0 <= n < 0x80 else write_uvarint(n)


# kafka_type -> struct format of an integer field written as it is (kio's writers use the same)
_INT_FORMATS = {
    "int8": "b",
    "int16": "h",
    "int32": "i",
    "int64": "q",
    "uint8": "B",
    "uint16": "H",
    "uint32": "I",
    "uint64": "Q",
    "float64": "d",
}
_DURATIONS = {"timedelta_i32": "i", "timedelta_i64": "q"}
# |ms| below this round-trips exactly through build's timedelta and kio's round(seconds * 1000)
_EXACT_MS = 1 << 40


def _error_codes() -> dict[Any, bytes]:
    from kio.schema.errors import ErrorCode as KioErrorCode

    pack = struct.Struct(">h").pack
    return {int(c): pack(int(c)) for c in KioErrorCode}


class _Gen:
    """Generates one function per struct class; the namespace holds constants and helpers."""

    def __init__(self) -> None:
        from . import codec

        self.codec = codec
        self.ns: dict[str, Any] = {
            "M": _MISSING,
            "F": Fallback,
            "uv": _uvarint,
            "ERR": _error_codes(),
            "dict": dict,
            "list": list,
            "tuple": tuple,
            "str": str,
            "int": int,
            "bytes": bytes,
            "bytearray": bytearray,
            "memoryview": memoryview,
            "len": len,
            "EXACT_MS": _EXACT_MS,
        }
        self.names: dict[type, str] = {}
        self.lines: list[str] = []
        self._ids = itertools.count()

    def const(self, value: Any, prefix: str = "c") -> str:
        name = f"{prefix}{next(self._ids)}"
        self.ns[name] = value
        return name

    def struct_fn(self, cls: type) -> str:
        name = self.names.get(cls)
        if name is not None:
            return name
        name = self.names[cls] = f"e_{cls.__name__}_{next(self._ids)}"
        body = self._struct_body(cls)
        self.lines.append(f"def {name}(d, out):")
        self.lines.extend("    " + line for line in body)
        self.lines.append("")
        return name

    def _struct_body(self, cls: type) -> list[str]:

        flexible = bool(getattr(cls, "__flexible__", False))
        plans = {p[0]: p for p in self.codec._build_plan(cls)}
        body = ["if type(d) is not dict: raise F"]
        untagged, tagged = _split_fields(cls)
        for f in untagged:
            body.extend(self._field(f, plans[f.name], flexible))
        if flexible:
            if not tagged:
                body.append("out += b'\\x00'")
            else:
                body.append("tags = []")
                for number, tagged_field in sorted(tagged, key=lambda t: t[0]):
                    body.extend(self._tagged_field(tagged_field, number, plans[tagged_field.name]))
                body.append("out += uv(len(tags))")
                body.append("for t in tags: out += t")
        if len(body) == 1:
            body.append("pass")
        return body

    # ------------------------------------------------------------------ one field

    def _kio_bytes(self, f: dataclasses.Field[Any], flexible: bool, value: Any) -> bytes | None:
        """What kio writes for ``value`` in field ``f`` (None when kio refuses it)."""
        from kio.serial._serialize import get_field_writer

        writer = get_field_writer(f, flexible=flexible, is_request_header=False, is_tag=False)
        buf = io.BytesIO()
        try:
            writer(buf, value)
        except Exception:
            return None
        return buf.getvalue()

    def defaults(
        self, f: dataclasses.Field[Any], plan: tuple[Any, ...], flexible: bool
    ) -> tuple[bytes | None, bytes | None]:
        """The bytes of field ``f`` when the answer lacks it and when it gives None (None: the
        field may not be left out / be None)."""
        _name, _conv, nested, default = plan
        codec = self.codec
        if default is codec._NO_DEFAULT:
            default_value = codec.build(nested, {}) if nested is not None else _MISSING
        else:
            default_value = default
        missing = self._kio_bytes(f, flexible, default_value) if default_value is not _MISSING else None
        return missing, self._kio_bytes(f, flexible, None)

    def _field(self, f: dataclasses.Field[Any], plan: tuple[Any, ...], flexible: bool) -> list[str]:
        from kio.serial._introspect import (
            EntityField,
            EntityTupleField,
            PrimitiveTupleField,
            classify_field,
            is_optional,
        )

        name, conv, _nested, _default = plan
        missing, null = self.defaults(f, plan, flexible)
        lines = [f"v = d.get({name!r}, M)"]
        lines.append("if v is M: raise F" if missing is None else f"if v is M: out += {self.const(missing)}")
        lines.append("elif v is None: raise F" if null is None else f"elif v is None: out += {self.const(null)}")
        fc = classify_field(f)
        kafka_type = f.metadata.get("kafka_type", "")
        if isinstance(fc, EntityField):
            fn = self.struct_fn(fc.type_)
            if is_optional(f):  # kio's nullable struct: a marker byte first (KIP-893)
                lines.append("elif type(v) is dict:")
                lines.append("    out += b'\\x01'")
                lines.append(f"    {fn}(v, out)")
            else:
                lines.append(f"elif type(v) is dict: {fn}(v, out)")
            lines.append("else: raise F")
            return lines
        if isinstance(fc, EntityTupleField):
            fn = self.struct_fn(fc.type_)
            lines.append("elif type(v) is list or type(v) is tuple:")
            lines.append("    for x in v:")
            lines.append("        if type(x) is not dict: raise F")
            lines.append("    " + self._length("len(v)", flexible))
            lines.append(f"    for x in v: {fn}(x, out)")
            lines.append("else: raise F")
            return lines
        if isinstance(fc, PrimitiveTupleField):
            item = self._primitive("x", kafka_type, flexible, conv)
            if item is None:
                lines.append("else: out += " + self._generic_call(f, plan, flexible) + "(v)")
                return lines
            lines.append("elif type(v) is list or type(v) is tuple:")
            lines.append("    " + self._length("len(v)", flexible))
            lines.append("    for x in v:")
            lines.append("        if x is None: raise F")
            lines.extend("        " + line for line in item)
            lines.append("else: raise F")
            return lines
        inline = self._primitive("v", kafka_type, flexible, conv)
        if inline is None:
            lines.append("else: out += " + self._generic_call(f, plan, flexible) + "(v)")
        else:
            lines.append("else:")
            lines.extend("    " + line for line in inline)
        return lines

    def _length(self, expr: str, flexible: bool) -> str:
        if flexible:
            return f"out += uv({expr} + 1)"
        return f"out += {self.const(struct.Struct('>i').pack, 'p')}({expr})"

    def _primitive(self, var: str, kafka_type: str, flexible: bool, conv: Any) -> list[str] | None:
        """Statements writing non-None ``var`` of ``kafka_type`` (None: not inlined)."""
        if kafka_type in _INT_FORMATS and conv is None:
            return [f"out += {self.const(struct.Struct('>' + _INT_FORMATS[kafka_type]).pack, 'p')}({var})"]
        if kafka_type in _DURATIONS:
            pack = self.const(struct.Struct(">" + _DURATIONS[kafka_type]).pack, "p")
            slow = self.const(self._duration_ms, "h")
            return [
                f"if type({var}) is int and -EXACT_MS < {var} < EXACT_MS: out += {pack}({var})",
                f"else: out += {pack}({slow}({var}))",
            ]
        if kafka_type == "bool":
            return [f"out += b'\\x01' if {var} else b'\\x00'"]
        if kafka_type == "error_code":
            return [f"c = ERR.get({var})", "if c is None: raise F", "out += c"]
        if kafka_type == "string" and conv is None:
            prefix = "uv(len(b) + 1)" if flexible else f"{self.const(struct.Struct('>h').pack, 'p')}(len(b))"
            return [f"if type({var}) is not str: raise F", f"b = {var}.encode()", f"out += {prefix}", "out += b"]
        if kafka_type in ("bytes", "records") and conv is None:
            kinds = f"type({var}) is bytes or type({var}) is bytearray or type({var}) is memoryview"
            if flexible:
                return [f"if not ({kinds}): raise F", f"out += uv(len({var}) + 1)", f"out += {var}"]
            i = self.const(struct.Struct(">i").pack, "p")
            return [f"if not ({kinds}): raise F", f"out += {i}(len({var}))", f"out += {var}"]
        return None

    def _duration_ms(self, value: Any) -> int:
        converted: datetime.timedelta = self.codec._to_timedelta(value)
        return round(converted.total_seconds() * 1000)

    def _generic_call(self, f: dataclasses.Field[Any], plan: tuple[Any, ...], flexible: bool) -> str:
        """A helper writing one (non-None, present) value the way build + kio do."""
        from kio.serial._serialize import get_field_writer

        _name, conv, nested, _default = plan
        writer = get_field_writer(f, flexible=flexible, is_request_header=False, is_tag=False)
        convert = self.codec.convert_field

        def generic(value: Any) -> bytes:
            buf = io.BytesIO()
            writer(buf, convert(conv, nested, value))
            return buf.getvalue()

        return self.const(generic, "g")

    def tagged_writer(
        self, f: dataclasses.Field[Any], tag: int, plan: tuple[Any, ...]
    ) -> tuple[Callable[[Any], bytes | None], Any]:
        """(the bytes of tagged field ``f`` for a converted value, None when it is the default;
        the value when the answer lacks it, or _MISSING when it must be given)."""
        from kio.serial._implicit_defaults import get_tagged_field_default
        from kio.serial._serialize import get_field_writer

        _name, _conv, nested, default = plan
        codec = self.codec
        writer = get_field_writer(f, flexible=True, is_request_header=False, is_tag=True)
        implicit = get_tagged_field_default(f)

        def tagged_bytes(value: Any) -> bytes | None:
            if value == f.default or (f.default is dataclasses.MISSING and value == implicit):
                return None
            buf = io.BytesIO()
            writer(buf, value)
            data = buf.getvalue()
            return _uvarint(tag) + _uvarint(len(data)) + data

        if default is codec._NO_DEFAULT:
            absent: Any = codec.build(nested, {}) if nested is not None else _MISSING
        else:
            absent = default
        return tagged_bytes, absent

    def _tagged_field(self, f: dataclasses.Field[Any], tag: int, plan: tuple[Any, ...]) -> list[str]:
        """A tagged field: written unless its (converted) value is kio's default for it."""
        name, conv, nested, _default = plan
        tagged_bytes, absent = self.tagged_writer(f, tag, plan)
        convert = self.codec.convert_field
        lines = [f"v = d.get({name!r}, M)"]
        if absent is _MISSING:
            lines.append("if v is M: raise F")
        else:
            when_absent = tagged_bytes(absent)
            if when_absent is not None:
                lines.append(f"if v is M: tags.append({self.const(when_absent)})")
        helper = self.const(lambda value: tagged_bytes(convert(conv, nested, value)), "t")
        lines.append("if v is not M:")
        lines.append(f"    t = {helper}(v)")
        lines.append("    if t is not None: tags.append(t)")
        return lines


_MISSING = object()


def _split_fields(cls: type) -> tuple[list[dataclasses.Field[Any]], list[tuple[int, dataclasses.Field[Any]]]]:
    """``cls``'s untagged fields in order, and its tagged fields with their tags."""
    from kio.serial._introspect import get_field_tag

    untagged: list[dataclasses.Field[Any]] = []
    tagged: list[tuple[int, dataclasses.Field[Any]]] = []
    for f in dataclasses.fields(cls):
        tag = get_field_tag(f)
        if tag is None:
            untagged.append(f)
        else:
            tagged.append((int(tag), f))
    return untagged, tagged


@functools.cache
def encoder(cls: type) -> Callable[[Mapping[str, Any]], bytes] | None:
    """The compiled encoder of response class ``cls`` (dict -> body bytes; it raises
    :class:`Fallback` or any other exception for an answer it does not take), or None for a
    schema it cannot compile (the generic path serves it)."""
    try:
        return _compile(cls)
    except Exception:
        return None


def _compile(cls: type) -> Callable[[Mapping[str, Any]], bytes]:
    gen = _Gen()
    top = gen.struct_fn(cls)
    source = "\n".join(gen.lines)
    source += f"\ndef encode(d):\n    out = bytearray()\n    {top}(d, out)\n    return bytes(out)\n"
    exec(compile(source, f"<response encoder {cls.__module__}.{cls.__name__}>", "exec"), gen.ns)
    fn: Callable[[Mapping[str, Any]], bytes] = gen.ns["encode"]
    return fn


def source_of(cls: type) -> str:
    """The generated source for ``cls`` (debugging aid)."""
    gen = _Gen()
    gen.struct_fn(cls)
    return "\n".join(gen.lines)


# ------------------------------------------------------------------ compiled programs
#
# The generated encoders above are Python: for a small answer such as OffsetFetch's, most of
# its encoding time is the interpreter stepping through them.  When the install built
# ``protocol/_encode.pyx``, the same layout is also described as a program (nested tuples, one
# entry per field, with the bytes of a missing or None field computed here exactly as the
# generated code's) that the compiled ``encode`` follows; it declines (None) whatever the
# generated encoder would not write the common way, and the generated encoder answers those.
# tests/test_response_encoders.py holds the three paths to the same bytes.

_encode: types.ModuleType | None
try:
    from . import _encode
except ImportError:  # no C compiler at install, or a source tree never built
    _encode = None

_compiled_programs = True

# The non-zero error codes of an answer along a program of the paths to them, or None
# (``protocol/_encode.pyx``; used by the request log, coordinator/control/shapes.py).
compiled_codes: Callable[[tuple[Any, ...], Any], tuple[int, ...] | None] | None = (
    None if _encode is None else _encode.codes
)


@contextlib.contextmanager
def generated_only() -> Iterator[None]:
    """Encode with the generated Python encoders only (what tests hold the programs to)."""
    global _compiled_programs
    _compiled_programs = False
    try:
        yield
    finally:
        _compiled_programs = True


def encode_compiled(cls: type, data: Any) -> bytes | None:
    """``data``'s body by the compiled program of ``cls``, or None (not built, no program, or
    an answer it declines)."""
    program = _program(cls) if _compiled_programs else None
    if program is None or _encode is None:
        return None
    body: bytes | None = _encode.encode(program, data)
    return body


@functools.cache
def _program(cls: type) -> tuple[Any, ...] | None:
    if _encode is None:
        return None
    try:
        return _Programs(_encode.KINDS).struct(cls)
    except Exception:
        return None


class _Programs:
    """The program of a response class for ``protocol/_encode.pyx`` (its entries described there)."""

    def __init__(self, kinds: dict[str, int]) -> None:
        self.k = kinds
        self.gen = _Gen()
        self.errors = _error_codes()

    def struct(self, cls: type) -> tuple[Any, ...]:
        from kio.serial._introspect import (
            EntityField,
            EntityTupleField,
            PrimitiveTupleField,
            classify_field,
            is_optional,
        )

        k = self.k
        flexible = bool(getattr(cls, "__flexible__", False))
        plans = {p[0]: p for p in self.gen.codec._build_plan(cls)}
        entries: list[tuple[Any, ...]] = []
        untagged, tagged = _split_fields(cls)
        for f in untagged:
            plan = plans[f.name]
            name, conv, _nested, _default = plan
            missing, null = self.gen.defaults(f, plan, flexible)
            fc = classify_field(f)
            kafka_type = f.metadata.get("kafka_type", "")
            if isinstance(fc, EntityField):
                entries.append((k["STRUCT"], name, missing, null, self.struct(fc.type_), is_optional(f)))
            elif isinstance(fc, EntityTupleField):
                entries.append((k["STRUCTS"], name, missing, null, self.struct(fc.type_), flexible))
            elif isinstance(fc, PrimitiveTupleField):
                item = self._item(kafka_type, flexible, conv)
                if item is None:
                    entries.append((k["OTHER"], name, missing, null, None, None))
                else:
                    entries.append((k["ARRAY"], name, missing, null, item, flexible))
            else:
                item = self._item(kafka_type, flexible, conv)
                if item is None:
                    entries.append((k["OTHER"], name, missing, null, None, None))
                else:
                    entries.append((item[0], name, missing, null, item[4], item[5]))
        if flexible:
            names = []
            section: list[bytes] | None = []
            for number, f in sorted(tagged, key=lambda t: t[0]):
                names.append(f.name)
                tagged_bytes, absent = self.gen.tagged_writer(f, number, plans[f.name])
                if absent is _MISSING:
                    section = None  # must be given: the generated encoder refuses it
                elif section is not None:
                    when_absent = tagged_bytes(absent)
                    if when_absent is not None:
                        section.append(when_absent)
            written = None if section is None else _uvarint(len(section)) + b"".join(section)
            entries.append((k["TAGS"], "", None, None, tuple(names), written))
        return tuple(entries)

    def _item(self, kafka_type: str, flexible: bool, conv: Any) -> tuple[Any, ...] | None:
        """The entry of a primitive value, as ``_Gen._primitive`` writes it (None: not covered)."""
        k = self.k
        if kafka_type in _INT_FORMATS and conv is None:
            fmt = _INT_FORMATS[kafka_type]
            if fmt in ("d", "Q"):
                return None
            return (k["INT"], "", None, None, struct.calcsize(fmt), fmt.islower())
        if kafka_type in _DURATIONS:
            return (k["DURATION"], "", None, None, struct.calcsize(_DURATIONS[kafka_type]), True)
        if kafka_type == "bool":
            return (k["BOOL"], "", None, None, None, None)
        if kafka_type == "error_code":
            return (k["ERROR"], "", None, None, self.errors, None)
        if kafka_type == "string" and conv is None:
            return (k["STRING"], "", None, None, flexible, None)
        if kafka_type in ("bytes", "records") and conv is None:
            return (k["BYTES"], "", None, None, flexible, None)
        return None
