"""Framing and request/response headers.

A Kafka frame is ``int32 size`` followed by ``size`` bytes.  A request starts with a header:

* v1: api_key int16, api_version int16, correlation_id int32, client_id NULLABLE_STRING (int16 len)
* v2: v1 followed by tagged fields (flexible request versions)

A response starts with ``correlation_id int32`` (header v0), followed by tagged fields for
header v1 (flexible response versions).  ApiVersions responses always use header v0 so a
client that does not know the broker's versions can still read them.
"""

from __future__ import annotations

import struct
from collections.abc import Callable

from msgspec import Struct

from . import wire
from .wire import I16 as _I16
from .wire import I32 as SIZE

_HDR = struct.Struct(">hhi")
_HDR_CLIENT = struct.Struct(">hhih")  # the header's fixed part and the client id's length


class FrameError(ValueError):
    """The bytes cannot be a Kafka frame or header; the connection must be closed."""


class RequestHeader(Struct, frozen=True):
    """A parsed request header (v1 or v2), with its size in bytes."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    header_version: int
    size: int  # bytes of the header inside the frame; the body starts here


def read_uvarint(buf: bytes | memoryview, pos: int) -> tuple[int, int]:
    """An unsigned varint at ``pos`` (``protocol/wire.py``); FrameError when malformed."""
    return wire.read_uvarint(buf, pos, FrameError)


def write_uvarint(value: int) -> bytes:
    return wire.uvarint(value)


def skip_tagged_fields(buf: bytes | memoryview, pos: int) -> int:
    return wire.skip_tagged_fields(buf, pos, FrameError)


def peek_api_key_version(frame: bytes | memoryview) -> tuple[int, int, int]:
    """(api_key, api_version, correlation_id) of a request frame body, without the client id."""
    if len(frame) < _HDR.size:
        raise FrameError("request shorter than a header")
    key, version, corr = _HDR.unpack_from(frame, 0)
    return key, version, corr


def parse_request_header(frame: bytes | memoryview, header_version: int) -> RequestHeader:
    """Parse a request header (v1 or v2) at the start of ``frame`` (the bytes after the size)."""
    if len(frame) < _HDR_CLIENT.size:
        raise FrameError("request shorter than a header" if len(frame) < _HDR.size else "truncated client id")
    key, version, corr, n = _HDR_CLIENT.unpack_from(frame, 0)
    pos = _HDR_CLIENT.size
    client_id: str | None
    if n < 0:
        client_id = None
    else:
        if len(frame) < pos + n:
            raise FrameError("truncated client id")
        client_id = str(frame[pos : pos + n], "utf-8", "replace")
        pos += n
    if header_version >= 2:
        if len(frame) > pos and frame[pos] == 0:
            pos += 1  # no tagged fields: what every client sends
        else:
            pos = skip_tagged_fields(frame, pos)
    return RequestHeader(key, version, corr, client_id, header_version, pos)


def client_id_and_size(frame: bytes | memoryview, header_version: int) -> tuple[str | None, int]:
    """(client id, header size) of the request header at the start of ``frame``: what the
    server needs of it.  The usual header is read by the compiled reader
    (``protocol/_reqcheck.pyx``) when it was built; anything else by :func:`parse_request_header`
    (the same answers, and its FrameError)."""
    if _compiled_header is not None:
        got = _compiled_header(frame, header_version)
        if got is not None:
            return got
    header = parse_request_header(frame, header_version)
    return header.client_id, header.size


_compiled_header: Callable[[bytes | memoryview, int], tuple[str | None, int] | None] | None
try:
    from ._reqcheck import client_id_and_size as _compiled_header
except ImportError:  # no C compiler at install, or a source tree never built
    _compiled_header = None


def encode_request_header(
    api_key: int, api_version: int, correlation_id: int, client_id: str | None, header_version: int
) -> bytes:
    out = bytearray(_HDR.pack(api_key, api_version, correlation_id))
    if client_id is None:
        out += _I16.pack(-1)
    else:
        raw = client_id.encode()
        out += _I16.pack(len(raw)) + raw
    if header_version >= 2:
        out.append(0)  # no tagged fields
    return bytes(out)


_SIZE_CORR = struct.Struct(">ii")
_SIZE_CORR_NO_TAGS = struct.Struct(">iiB")


def response_frame(correlation_id: int, header_version: int, body: bytes) -> bytes:
    """A whole response frame: size, header (v0: the correlation id; v1: it and an empty
    tagged-field section), ``body``."""
    if header_version >= 1:
        return _SIZE_CORR_NO_TAGS.pack(len(body) + 5, correlation_id, 0) + body
    return _SIZE_CORR.pack(len(body) + 4, correlation_id) + body


def frame(payload: bytes) -> bytes:
    return SIZE.pack(len(payload)) + payload


def parse_response_header(frame_body: bytes | memoryview, header_version: int) -> tuple[int, int]:
    """(correlation_id, body offset) of a response frame body."""
    if len(frame_body) < 4:
        raise FrameError("truncated response header")
    (corr,) = SIZE.unpack_from(frame_body, 0)
    pos = 4
    if header_version >= 1:
        pos = skip_tagged_fields(frame_body, pos)
    return corr, pos
