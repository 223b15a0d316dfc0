"""Hostile record batches for Produce: valid CRCs around records that lie, and decompression
bombs.  Built with the codec (``protocol/records.py``, ``protocol/wire.py``), each with the error
Kafka answers for it (``topics/log_validator.py`` explains each)."""

from __future__ import annotations

import functools
import gzip
from collections.abc import Sequence

import cramjam
from rallypoint.protocol.errors import ErrorCode
from rallypoint.protocol.records import Record, assemble_batch, encode_batch, parse_header
from rallypoint.protocol.wire import write_varint

BOMB_BYTES = 64 << 20  # what the bombs decompress to: 64 MiB of zeros


def record(
    *,
    length: int | None = None,
    ts_delta: int = 0,
    offset_delta: int = 0,
    key: bytes | None = b"k",
    value: bytes | None = b"v",
    headers: Sequence[tuple[bytes | None, bytes | None]] = (),
    header_count: int | None = None,
    tail: bytes = b"",
) -> bytes:
    """One record's bytes; ``length``/``header_count`` override the true ones, ``tail`` is added
    inside the record (after the headers, counted by the true length)."""
    body = bytearray(b"\x00")
    write_varint(ts_delta, body)
    write_varint(offset_delta, body)
    for field in (key, value):
        write_varint(-1 if field is None else len(field), body)
        body += field or b""
    write_varint(len(headers) if header_count is None else header_count, body)
    for hk, hv in headers:
        write_varint(-1 if hk is None else len(hk), body)
        body += hk or b""
        write_varint(-1 if hv is None else len(hv), body)
        body += hv or b""
    body += tail
    out = bytearray()
    write_varint(len(body) if length is None else length, out)
    return bytes(out + body)


def batch(payload: bytes, count: int, *, compression: int = 0, ts: int = 1_700_000_000_000) -> bytes:
    """A produce-ready batch (base offset 0, a valid CRC) of ``payload`` claiming ``count``
    records, offsets 0..count-1."""
    h = parse_header(encode_batch([Record(0, ts, b"k", b"v")]))
    return assemble_batch(h._replace(attributes=compression, last_offset_delta=count - 1, record_count=count), payload)


def records(n: int) -> bytes:
    return b"".join(record(offset_delta=i, ts_delta=i) for i in range(n))


@functools.cache
def hostile_batches() -> dict[str, tuple[bytes, ErrorCode]]:
    """name → (batch, the error Kafka answers).  Every batch has a correct CRC."""
    two = records(2)
    return {
        "record-count-int32-max": (batch(two, 2**31 - 1), ErrorCode.INVALID_RECORD),
        "record-length-minus-one": (batch(record(length=-1), 1), ErrorCode.INVALID_RECORD),
        "record-length-past-the-batch": (batch(record(length=1000), 1), ErrorCode.INVALID_RECORD),
        "record-length-short-of-its-fields": (batch(record(length=6) + records(1), 2), ErrorCode.INVALID_RECORD),
        "fewer-records-than-counted": (batch(two, 3), ErrorCode.INVALID_RECORD),
        "bytes-after-the-records": (batch(two + b"\x00\x00", 2), ErrorCode.INVALID_RECORD),
        "negative-header-count": (batch(record(header_count=-5), 1), ErrorCode.INVALID_RECORD),
        "header-count-past-the-record": (batch(record(header_count=1000), 1), ErrorCode.INVALID_RECORD),
        "null-header-key": (batch(record(headers=[(None, b"x")]), 1), ErrorCode.INVALID_RECORD),
        "eleven-byte-varint": (batch(b"\xff" * 10 + b"\x01" + two, 2), ErrorCode.INVALID_RECORD),
        "unknown-compression-id": (batch(two, 2, compression=6), ErrorCode.UNKNOWN_SERVER_ERROR),
        "not-gzip": (batch(two, 2, compression=1), ErrorCode.UNKNOWN_SERVER_ERROR),
        "gzip-cut-short": (
            batch(gzip.compress(two)[:-12], 2, compression=1),
            ErrorCode.INVALID_RECORD,
        ),
        "gzip-bomb": (batch(gzip.compress(bytes(BOMB_BYTES)), 1, compression=1), ErrorCode.MESSAGE_TOO_LARGE),
        "zstd-bomb": (
            batch(bytes(cramjam.zstd.compress(bytes(BOMB_BYTES))), 1, compression=4),
            ErrorCode.MESSAGE_TOO_LARGE,
        ),
        "lz4-bomb": (
            batch(bytes(cramjam.lz4.compress(bytes(BOMB_BYTES))), 1, compression=3),
            ErrorCode.MESSAGE_TOO_LARGE,
        ),
    }
