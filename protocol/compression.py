"""Bounded decompression of record-batch payloads: Kafka's codecs, never more than asked for.

A compressed batch (``protocol/records.py``) stores its records as one compressed stream.  The
codecs and the framing Kafka writes (its ``CompressionType`` classes):

* 1 gzip: one gzip member or several concatenated (Java's ``GZIPInputStream`` reads them all);
  the standard library's ``zlib``, asked for at most ``max_bytes + 1`` bytes;
* 2 snappy: xerial framing — a 16-byte header (``\\x82SNAPPY\\x00``, version, compatible
  version), then blocks of an int32 length and a raw snappy block — or, without the header, one
  raw snappy block (what xerial's reader falls back to).  A raw block announces its length
  before anything is decompressed, and is refused when that is over the bound;
* 3 lz4: the LZ4 frame format;
* 4 zstd: one or more zstd frames.

lz4 and zstd go through ``cramjam``'s ``decompress_into``, which stops with an error when the
output does not fit the buffer it is given: the buffer starts small and doubles up to
``max_bytes``, so memory never exceeds the bound (plus the copy being replaced) whatever the
stream claims.
"""

from __future__ import annotations

import struct
import zlib
from typing import Final

import cramjam

GZIP: Final = 1
SNAPPY: Final = 2
LZ4: Final = 3
ZSTD: Final = 4
NAMES: Final = {0: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}

_XERIAL_MAGIC: Final = b"\x82SNAPPY\x00"
_XERIAL_HEADER_SIZE: Final = 16
_I32 = struct.Struct(">i")
_FIRST_BUFFER: Final = 64 * 1024


class TooLarge(ValueError):
    """The stream decompresses to more than the bound."""


class Truncated(ValueError):
    """The stream ends before its end marker (Java's readers see an EOF)."""


class Undecompressable(ValueError):
    """The codec refuses the stream (not of that codec, or damaged)."""


def decompress(codec: int, data: bytes, max_bytes: int) -> bytes:
    """``data`` decompressed with Kafka's ``codec`` (1-4), at most ``max_bytes`` of it."""
    try:
        if codec == GZIP:
            return _gunzip(data, max_bytes)
        if codec == SNAPPY:
            return _unsnappy(data, max_bytes)
        if codec in (LZ4, ZSTD):
            return _decompress_into(cramjam.lz4 if codec == LZ4 else cramjam.zstd, data, max_bytes)
    except (TooLarge, Truncated):
        raise
    except (zlib.error, ValueError, cramjam.DecompressionError) as e:
        raise Undecompressable(str(e)) from None
    raise ValueError(f"no codec {codec}")


def _gunzip(data: bytes, max_bytes: int) -> bytes:
    out = bytearray()
    while True:
        d = zlib.decompressobj(wbits=31)
        out += d.decompress(data, max_bytes + 1 - len(out))
        if len(out) > max_bytes or d.unconsumed_tail:
            raise TooLarge(f"decompresses to more than {max_bytes} bytes")
        if not d.eof:
            raise Truncated("the gzip stream ends early")
        data = d.unused_data
        if not data:
            return bytes(out)


def _unsnappy(data: bytes, max_bytes: int) -> bytes:
    if not data.startswith(_XERIAL_MAGIC):
        return _unsnappy_block(data, max_bytes)
    if len(data) < _XERIAL_HEADER_SIZE:
        raise Truncated("the snappy stream ends inside its header")
    out = bytearray()
    pos = _XERIAL_HEADER_SIZE
    while pos < len(data):
        if pos + 4 > len(data):
            raise Truncated("the snappy stream ends inside a block length")
        (n,) = _I32.unpack_from(data, pos)
        pos += 4
        if n < 0 or pos + n > len(data):
            raise Truncated(f"a snappy block of {n} bytes in the {len(data) - pos} left")
        out += _unsnappy_block(data[pos : pos + n], max_bytes - len(out))
        pos += n
    return bytes(out)


def _unsnappy_block(block: bytes, max_bytes: int) -> bytes:
    n = int(cramjam.snappy.decompress_raw_len(block))  # the length the block's preamble announces
    if n > max_bytes:
        raise TooLarge(f"decompresses to more than {max_bytes} bytes")
    out = bytearray(n)
    written = int(cramjam.snappy.decompress_raw_into(block, out))
    return bytes(out[:written])


def _decompress_into(codec: object, data: bytes, max_bytes: int) -> bytes:
    size = min(max_bytes, max(_FIRST_BUFFER, 4 * len(data)))
    while True:
        out = bytearray(size)
        try:
            written = int(codec.decompress_into(data, out))  # type: ignore[attr-defined]
        except cramjam.DecompressionError as e:
            if "whole buffer" not in str(e):
                raise
            if size >= max_bytes:
                raise TooLarge(f"decompresses to more than {max_bytes} bytes") from None
            del out
            size = min(max_bytes, size * 2)
            continue
        return bytes(out[:written])
