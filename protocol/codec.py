"""Message bodies in and out: the kio adapter (with its reader, :mod:`protocol.tagged`).

Nothing outside ``protocol/`` imports kio.  Requests from the network are decoded by
:mod:`protocol.tagged`, never by kio's native reader alone (it aborts the process on a huge
array length and refuses unknown tagged fields).

Handlers receive decoded requests as kio's frozen dataclasses (read them by attribute; a
field a version lacks is absent, so use ``getattr(req, "field", default)``) and answer
with plain dicts.  :func:`build` turns a dict into the response class for the version
being answered, dropping keys that version does not have and filling missing keys with
Kafka's defaults -- like Kafka's generated messages, one handler body serves every version.

Conversions done by :func:`build`: ``int`` milliseconds for duration fields, ``int`` for
error codes, nested dicts/lists for nested structs and arrays.  :func:`ms` reads a duration
field of a decoded request back as int milliseconds.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import io
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode as KioErrorCode
from kio.serial import entity_writer
from kio.serial.errors import BufferUnderflow

from . import framing, metadata_response, response_encoders, tagged
from .errors import ErrorCode

Message = Any  # a kio dataclass instance


class DecodeError(ValueError):
    """A request body could not be decoded."""


class UnknownVersion(LookupError):
    """The codec has no schema for this API key and version."""


@functools.cache
def request_class(api_key: int, version: int) -> type:
    try:
        return load_request_schema(api_key, version)
    except Exception as e:  # kio raises its own index errors
        raise UnknownVersion(f"no request schema for api {api_key} v{version}") from e


@functools.cache
def response_class(api_key: int, version: int) -> type:
    try:
        return load_response_schema(api_key, version)
    except Exception as e:
        raise UnknownVersion(f"no response schema for api {api_key} v{version}") from e


@functools.cache
def codec_versions(api_key: int) -> tuple[int, int] | None:
    """(lowest, highest) version the codec knows for ``api_key``."""
    from kio.schema.index import api_key_map, schema_name_map

    name = api_key_map.get(api_key)
    if name is None:
        return None
    versions = sorted(schema_name_map[name])
    return versions[0], versions[-1]


@functools.cache
def first_flexible_version(api_key: int) -> int | None:
    rng = codec_versions(api_key)
    if rng is None:
        return None
    for v in range(rng[0], rng[1] + 1):
        if getattr(request_class(api_key, v), "__flexible__", False):
            return v
    return None


def request_header_version(api_key: int, version: int) -> int:
    """Header v2 for flexible request versions, else v1.

    Versions above what the codec knows are assumed flexible when the API already has
    flexible versions (true of every API Kafka has made flexible).
    """
    ff = first_flexible_version(api_key)
    return 2 if ff is not None and version >= ff else 1


@functools.cache
def response_header_version(api_key: int, version: int) -> int:
    if api_key == 18:  # ApiVersions: always header v0 (KIP-511)
        return 0
    return 1 if request_header_version(api_key, version) == 2 else 0


@functools.cache
def _writer(cls: type) -> Any:
    return entity_writer(cls)


def decode_request(
    api_key: int, version: int, body: bytes | memoryview, offset: int = 0, max_elements: int | None = None
) -> Message:
    """Decode the body of a request from the network.

    Never kio's native reader directly: :mod:`protocol.tagged` bounds array lengths (the
    native reader aborts the process on a huge one) and skips unknown tagged fields, as
    Kafka does.  ``max_elements`` bounds the array elements and tagged fields of the whole
    request (``rallypoint.request.max.elements``; docs/reliability.md, "Limits").
    """
    cls = request_class(api_key, version)
    try:
        msg, _end = tagged.read(cls, body, offset, max_elements)
        return msg
    except (BufferUnderflow, ValueError, IndexError, UnicodeDecodeError, OverflowError) as e:
        raise DecodeError(f"undecodable api {api_key} v{version} body: {e}") from e
    except Exception as e:  # the native reader may raise other errors on garbage
        raise DecodeError(f"undecodable api {api_key} v{version} body: {e!r}") from e


def decode_response(api_key: int, version: int, body: bytes | memoryview, offset: int = 0) -> Message:
    """Decode a response body (tests, the probe): same safe reader as requests."""
    cls = response_class(api_key, version)
    try:
        msg, _end = tagged.read(cls, body, offset)
        return msg
    except (BufferUnderflow, ValueError, IndexError, UnicodeDecodeError, OverflowError) as e:
        raise DecodeError(f"undecodable api {api_key} v{version} response: {e}") from e


def count_elements(data: Any, stop_at: int) -> int:
    """How many structs ``data`` (a handler's answer: dicts and lists) holds in its arrays,
    counting up to ``stop_at``.

    Cheap, so the server can tell a small answer (encoded at once) from a large one (encoded
    off the event loop) for every request: it stops at ``stop_at``, and in an array of structs
    it only looks at the fields that hold structs in the array's first element (or empty
    arrays), so leaf structs such as partition entries cost a dict lookup or two each.
    """
    if type(data) is not dict:
        return 0
    count = 0
    pending: list[list[Any] | tuple[Any, ...]] = [[data]]
    while pending:
        items = pending.pop()
        keys = _nesting_keys(items[0])
        if not keys:
            continue
        for item in items:
            for key in keys:
                v = item.get(key) if type(item) is dict else None
                kind = type(v)
                if kind is list or kind is tuple:
                    if v:
                        count += len(v)
                        if count >= stop_at:
                            return count
                        if type(v[0]) is dict:
                            pending.append(v)
                elif kind is dict:
                    pending.append([v])
    return count


def _nesting_keys(d: Any) -> list[str]:
    if type(d) is not dict:
        return []
    keys = []
    for k, v in d.items():
        kind = type(v)
        if kind is dict or ((kind is list or kind is tuple) and (not v or type(v[0]) is dict)):
            keys.append(k)
    return keys


def encode_message(msg: Message) -> bytes:
    buf = io.BytesIO()
    _writer(type(msg))(buf, msg)  # type: ignore[arg-type]
    return buf.getvalue()


def ms(value: Any) -> int:
    """A decoded duration field as integer milliseconds."""
    if isinstance(value, datetime.timedelta):
        return round(value.total_seconds() * 1000)
    return int(value)


# -------------------------------------------------------------------------------------------
# dict -> kio dataclass


@functools.cache
def _field_plan(cls: type) -> tuple[tuple[str, str, Any, Any], ...]:
    """(name, kafka_type, nested entity class or None, default) for each field of ``cls``."""
    from kio.serial._introspect import EntityField, EntityTupleField, classify_field

    plan = []
    for f in dataclasses.fields(cls):
        kafka_type = f.metadata.get("kafka_type", "")
        fc = classify_field(f)
        nested = fc.type_ if isinstance(fc, EntityField | EntityTupleField) else None
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = _implicit_default(f, fc)
        plan.append((f.name, kafka_type, nested, default))
    return tuple(plan)


_NO_DEFAULT: Final = object()


def _implicit_default(f: dataclasses.Field[Any], fc: Any) -> Any:
    from kio.serial._implicit_defaults import get_implicit_default
    from kio.serial._introspect import EntityField, EntityTupleField, PrimitiveTupleField, is_optional

    if isinstance(fc, EntityTupleField | PrimitiveTupleField):
        return ()
    if is_optional(f):
        return None
    if isinstance(fc, EntityField):
        return _NO_DEFAULT  # built from {} on demand
    kafka_type = f.metadata.get("kafka_type", "")
    if kafka_type == "error_code":
        return KioErrorCode.none
    if kafka_type == "records":
        return None
    if kafka_type == "bool":
        return False
    try:
        return get_implicit_default(fc.type_)
    except Exception:
        return _NO_DEFAULT


def _to_error_code(value: Any) -> Any:
    if type(value) is KioErrorCode:
        return value
    code = _ERROR_CODES.get(value)  # ints and rallypoint's ErrorCode (an IntEnum) alike
    return code if code is not None else KioErrorCode(int(value))


_ZERO_MS: Final = datetime.timedelta(0)


def _to_timedelta(value: Any) -> Any:
    if isinstance(value, datetime.timedelta):
        return value
    return _ZERO_MS if value == 0 else datetime.timedelta(milliseconds=int(value))


def _to_datetime(value: Any) -> Any:
    if isinstance(value, datetime.datetime):
        return value
    return datetime.datetime.fromtimestamp(int(value) / 1000, tz=datetime.UTC)


def _to_uuid(value: Any) -> Any:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


_ERROR_CODES: Final[dict[Any, KioErrorCode]] = {int(c): c for c in KioErrorCode}
# How a dict value becomes the field's type, by kio's kafka_type (absent: taken as it is).
_CONVERTERS: Final[dict[str, Callable[[Any], Any]]] = {
    "error_code": _to_error_code,
    "timedelta_i32": _to_timedelta,
    "timedelta_i64": _to_timedelta,
    "datetime_i64": _to_datetime,
    "uuid": _to_uuid,
    "bool": bool,
}


@functools.cache
def _build_plan(cls: type) -> tuple[tuple[str, Callable[[Any], Any] | None, Any, Any], ...]:
    """(name, converter or None, nested entity class or None, default) for each field."""
    return tuple((name, _CONVERTERS.get(kt), nested, default) for name, kt, nested, default in _field_plan(cls))


def build(cls: type, data: Mapping[str, Any]) -> Message:
    """Build ``cls`` from a dict; unknown keys are ignored, missing keys take defaults."""
    kwargs: dict[str, Any] = {}
    for name, conv, nested, default in _build_plan(cls):
        if name in data:
            kwargs[name] = convert_field(conv, nested, data[name])
        elif default is _NO_DEFAULT:
            if nested is not None:
                kwargs[name] = build(nested, {})
            else:
                raise TypeError(f"{cls.__name__}.{name} is required")
        else:
            kwargs[name] = default
    return cls(**kwargs)


def convert_field(conv: Callable[[Any], Any] | None, nested: type | None, value: Any) -> Any:
    """One field's value from a dict as :func:`build` puts it into the dataclass (``conv``
    and ``nested`` from :func:`_build_plan`)."""
    if value is None:
        return None
    if nested is not None:
        if type(value) is dict or isinstance(value, Mapping):
            return build(nested, value)
        if isinstance(value, Iterable) and not isinstance(value, (str, bytes)):
            return tuple(build(nested, item) if isinstance(item, Mapping) else item for item in value)
        return value
    if type(value) is list or type(value) is tuple:
        return tuple(value) if conv is None else tuple(None if v is None else conv(v) for v in value)
    if conv is not None:
        return conv(value)
    return value


def build_response(api_key: int, version: int, data: Mapping[str, Any]) -> Message:
    return build(response_class(api_key, version), data)


def build_request(api_key: int, version: int, data: Mapping[str, Any]) -> Message:
    return build(request_class(api_key, version), data)


_SMALL: Final = 4  # fields
_SCALARS: Final = frozenset({int, bool, type(None), ErrorCode, KioErrorCode})
_SMALL_BODIES: dict[tuple[Any, ...], bytes] = {}
_SMALL_BODIES_MAX: Final = 4096


class Encoded:
    """A response body already encoded (the bytes after the response header), for answers
    that never change: a handler may cache one and return it; :func:`encode_response` frames
    it as it is.  Tests pin such bodies to what the generic encoder makes of the same answer."""

    __slots__ = ("body", "errors")

    def __init__(self, body: bytes) -> None:
        self.body = body
        # its non-zero error codes, filled by the first reader that needs them (the request log)
        self.errors: tuple[int, ...] | None = None


def encode_body(api_key: int, version: int, data: Mapping[str, Any]) -> Encoded:
    """The generic encoder's body for ``data``, kept for re-use."""
    return Encoded(encode_message(build_response(api_key, version, data)))


def _encode_dict(cls: type, data: Mapping[str, Any]) -> bytes:
    """The compiled encoder's bytes (:mod:`protocol.response_encoders`), or the generic path's
    for an answer it does not take: the same bytes either way."""
    compiled = response_encoders.encoder(cls)
    if compiled is not None:
        try:
            return compiled(data)
        except Exception:
            pass  # Fallback, or a value the generic path will answer (or refuse) itself
    return encode_message(build(cls, data))


def encode_response(
    api_key: int, version: int, correlation_id: int, data: Mapping[str, Any] | Message | Encoded
) -> bytes:
    """A whole response frame (size prefix, header, body).

    Metadata answers given as dicts take :mod:`protocol.metadata_response` (same bytes, a
    fraction of the time: they grow with the broker's topics and partitions)."""
    if isinstance(data, Encoded):
        body = data.body
    elif type(data) is dict or isinstance(data, Mapping):
        if api_key == metadata_response.API_KEY:
            body = metadata_response.encode(version, data)
        elif (compiled := response_encoders.encode_compiled(response_class(api_key, version), data)) is not None:
            body = compiled  # the compiled program (protocol/_encode.pyx), when built
        elif len(data) <= _SMALL and all(type(v) in _SCALARS for v in data.values()):
            # A small answer of numbers only (Heartbeat, LeaveGroup v0-2, ...): the same few
            # bodies over and over, so the generic encoder's output is kept per content.
            key = (api_key, version, *data.items())
            body = _SMALL_BODIES.get(key, b"")
            if not body:
                body = encode_message(build(response_class(api_key, version), data))
                if len(_SMALL_BODIES) >= _SMALL_BODIES_MAX:
                    _SMALL_BODIES.clear()
                _SMALL_BODIES[key] = body
        else:
            body = _encode_dict(response_class(api_key, version), data)
    else:
        body = encode_message(data)
    return framing.response_frame(correlation_id, response_header_version(api_key, version), body)


def encode_request(
    api_key: int,
    version: int,
    correlation_id: int,
    data: Mapping[str, Any] | Message,
    client_id: str | None = "rallypoint",
) -> bytes:
    """A whole request frame: used by tests, benchmarks and the probe command."""
    msg = data if not isinstance(data, Mapping) else build_request(api_key, version, data)
    header = framing.encode_request_header(
        api_key, version, correlation_id, client_id, request_header_version(api_key, version)
    )
    return framing.frame(header + encode_message(msg))


def decode_response_frame(api_key: int, version: int, frame_body: bytes) -> tuple[int, Message]:
    """(correlation_id, message) of a response frame body (the bytes after the size)."""
    corr, pos = framing.parse_response_header(frame_body, response_header_version(api_key, version))
    return corr, decode_response(api_key, version, frame_body, pos)


def to_dict(msg: Message) -> dict[str, Any]:
    """A decoded message as plain Python values (for tests, logs and dump tools)."""

    def conv(v: Any) -> Any:
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return {f.name: conv(getattr(v, f.name)) for f in dataclasses.fields(v)}
        if isinstance(v, tuple):
            return [conv(x) for x in v]
        if isinstance(v, datetime.timedelta):
            return ms(v)
        if isinstance(v, KioErrorCode):
            return int(v)
        return v

    result = conv(msg)
    assert isinstance(result, dict)
    return result
