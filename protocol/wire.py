"""Kafka's wire primitives: the one implementation of varints, strings, bytes and arrays.

Used by request framing (``framing``, ``tagged``), the ``__consumer_offsets`` key and value
schemas (``offsets_schema``), the consumer protocol's subscriptions and assignments
(``consumer_protocol``) and record batches (``records``).  The encodings (Kafka's
``ByteUtils`` and its generated message classes; all big-endian):

* **unsigned varint** (``ByteUtils.readUnsignedVarint``): 7 bits per byte, low bits first, the
  high bit set on every byte but the last; at most 5 bytes (a 32-bit value).  Compact lengths,
  tagged-field counts, tags and sizes use it.
* **signed varint / varlong** (``ByteUtils.readVarint`` / ``readVarlong``): the zig-zag
  mapping of the signed value (0, -1, 1, -2 … → 0, 1, 2, 3 …) written as an unsigned varint; a
  varint takes at most 5 bytes, a varlong at most 10.  Records use them.
* **classic** (non-flexible) fields: ``STRING`` = int16 length + UTF-8, ``NULLABLE_STRING`` with
  length -1 for null, ``BYTES`` = int32 length + bytes (``NULLABLE_BYTES``: -1 for null),
  ``ARRAY`` = int32 count + items (-1 for null).
* **compact** (flexible) fields: the same with an unsigned varint of length + 1 (0 for null),
  and every struct ends with its tagged fields: an unsigned varint count, then per field an
  unsigned varint tag, an unsigned varint size and that many bytes.

Every reader checks what it takes against the bytes that are there: a length or count larger
than what remains is an error before anything is allocated, so the work done is bounded by the
input.  Readers raise the error class their caller chose (each format has its own, e.g.
``FrameError`` for request framing), always a subclass of ``ValueError``.
"""

from __future__ import annotations

import struct
from typing import Final

Buffer = bytes | bytearray | memoryview

I16: Final = struct.Struct(">h")
I32: Final = struct.Struct(">i")
I64: Final = struct.Struct(">q")


class WireError(ValueError):
    """Bytes that do not follow the wire format (the default error of this module's readers)."""


# --------------------------------------------------------------------------- varints


def read_uvarint(buf: Buffer, pos: int, error: type[ValueError] = WireError) -> tuple[int, int]:
    """An unsigned varint (at most 5 bytes) at ``pos``: (value, position after it)."""
    result = 0
    shift = 0
    try:
        while True:
            b = buf[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            if b < 0x80:
                return result, pos
            shift += 7
            if shift >= 35:  # a fifth byte with its high bit set
                raise error("varint longer than 5 bytes")
    except IndexError:
        raise error("truncated varint") from None


def uvarint(value: int) -> bytes:
    """The bytes of an unsigned varint."""
    out = bytearray()
    write_uvarint(value, out)
    return bytes(out)


def write_uvarint(value: int, out: bytearray) -> None:
    """Append an unsigned varint to ``out``."""
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def write_varint(n: int, out: bytearray) -> None:
    """Append a signed (zig-zag) varint or varlong to ``out`` (the zig-zag mapping of Kafka's
    ``(n << 1) ^ (n >> 63)`` on 64 bits, then an unsigned varint)."""
    v = ((n << 1) ^ (n >> 63)) & 0xFFFFFFFFFFFFFFFF
    while v > 0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def read_varint(buf: Buffer, pos: int, error: type[ValueError] = WireError) -> tuple[int, int]:
    """A signed (zig-zag) varlong of at most 10 bytes at ``pos``: (value, position after it).

    Record fields hold varints (32-bit) and varlongs (64-bit); both read here, the caller
    checks the range a field allows.
    """
    result = 0
    shift = 0
    try:
        while True:
            b = buf[pos]
            pos += 1
            result |= (b & 0x7F) << shift
            if b < 0x80:
                return (result >> 1) ^ -(result & 1), pos
            shift += 7
            if shift >= 70:  # a tenth byte with its high bit set
                raise error("varint longer than 10 bytes")
    except IndexError:
        raise error("truncated varint") from None


def skip_tagged_fields(buf: Buffer, pos: int, error: type[ValueError] = WireError) -> int:
    """Skip a struct's tagged fields (count, then tag/size/bytes each); the position after them."""
    count, pos = read_uvarint(buf, pos, error)
    for _ in range(count):
        _tag, pos = read_uvarint(buf, pos, error)
        size, pos = read_uvarint(buf, pos, error)
        pos += size
        if pos > len(buf):
            raise error("truncated tagged field")
    return pos


# --------------------------------------------------------------------------- structs


class Reader:
    """Reads fields in order from ``buf`` starting at ``pos``; ``flexible`` selects the compact
    forms.  Errors are ``error`` (a ValueError subclass chosen by the format being read).

    Written for speed (the pipeline and start-up replay read millions of fields): fixed-size
    fields are unpacked in place, and each method reads its length itself.
    """

    __slots__ = ("buf", "error", "flexible", "pos")

    def __init__(
        self, buf: bytes, pos: int = 0, *, flexible: bool = False, error: type[ValueError] = WireError
    ) -> None:
        self.buf = buf
        self.pos = pos
        self.flexible = flexible
        self.error = error

    def _truncated(self, n: int) -> ValueError:
        return self.error(f"truncated: need {n} bytes at {self.pos}, have {len(self.buf) - self.pos}")

    def take(self, n: int) -> bytes:
        pos = self.pos
        end = pos + n
        if n < 0 or end > len(self.buf):
            raise self._truncated(n)
        self.pos = end
        return self.buf[pos:end]

    def int16(self) -> int:
        pos = self.pos
        if pos + 2 > len(self.buf):
            raise self._truncated(2)
        self.pos = pos + 2
        return int(I16.unpack_from(self.buf, pos)[0])

    def int32(self) -> int:
        pos = self.pos
        if pos + 4 > len(self.buf):
            raise self._truncated(4)
        self.pos = pos + 4
        return int(I32.unpack_from(self.buf, pos)[0])

    def int64(self) -> int:
        pos = self.pos
        if pos + 8 > len(self.buf):
            raise self._truncated(8)
        self.pos = pos + 8
        return int(I64.unpack_from(self.buf, pos)[0])

    def int32_array(self, n: int) -> tuple[int, ...]:
        """``n`` consecutive int32 values (the items of an INT32 array whose count was read)."""
        return struct.unpack(f">{n}i", self.take(4 * n))

    def uvarint(self) -> int:
        value, self.pos = read_uvarint(self.buf, self.pos, self.error)
        return value

    def _text(self, n: int) -> str:
        try:
            return self.take(n).decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.error(f"invalid UTF-8 in string: {e}") from None

    def string(self) -> str:
        n = self.uvarint() - 1 if self.flexible else self.int16()
        if n < 0:
            raise self.error("null in a non-nullable string")
        return self._text(n)

    def nullable_string(self) -> str | None:
        """Any negative length is null, as in Kafka's generated readers."""
        n = self.uvarint() - 1 if self.flexible else self.int16()
        return None if n < 0 else self._text(n)

    def bytes_(self) -> bytes:
        n = self.uvarint() - 1 if self.flexible else self.int32()
        if n < 0:
            raise self.error("null in a non-nullable bytes field")
        return self.take(n)

    def nullable_bytes(self) -> bytes | None:
        """Any negative length is null, as in Kafka's generated readers."""
        n = self.uvarint() - 1 if self.flexible else self.int32()
        return None if n < 0 else self.take(n)

    def array_length(self) -> int:
        """The item count of a non-nullable array, refused when more items than bytes remain
        (every item takes at least one byte)."""
        n = self.uvarint() - 1 if self.flexible else self.int32()
        if n < 0:
            raise self.error(f"bad array length {n} in a non-nullable array")
        if n > len(self.buf) - self.pos:
            raise self.error(f"array of {n} items cannot fit in the {len(self.buf) - self.pos} bytes left")
        return n

    def skip_tagged_fields(self) -> None:
        if self.flexible:
            self.pos = skip_tagged_fields(self.buf, self.pos, self.error)


class Writer:
    """Appends fields in order; ``flexible`` selects the compact forms.  Values a classic field
    cannot hold (a string over 32767 bytes) raise ``error``."""

    __slots__ = ("buf", "error", "flexible")

    def __init__(self, *, flexible: bool = False, error: type[ValueError] = WireError) -> None:
        self.buf = bytearray()
        self.flexible = flexible
        self.error = error

    def int16(self, n: int) -> None:
        self.buf += I16.pack(n)

    def int32(self, n: int) -> None:
        self.buf += I32.pack(n)

    def int64(self, n: int) -> None:
        self.buf += I64.pack(n)

    def int32_array(self, values: tuple[int, ...] | list[int]) -> None:
        """An INT32 array: its length, then the values."""
        self.array_length(len(values))
        self.buf += struct.pack(f">{len(values)}i", *values)

    def uvarint(self, n: int) -> None:
        write_uvarint(n, self.buf)

    def _length(self, n: int, wide: bool) -> None:
        if self.flexible:
            write_uvarint(n + 1, self.buf)
        elif wide:
            self.buf += I32.pack(n)
        else:
            self.buf += I16.pack(n)

    def string(self, s: str) -> None:
        raw = s.encode("utf-8")
        n = len(raw)
        if self.flexible:
            write_uvarint(n + 1, self.buf)
        elif n > 0x7FFF:
            raise self.error(f"string of {n} bytes is longer than 32767")
        else:
            self.buf += I16.pack(n)
        self.buf += raw

    def nullable_string(self, s: str | None) -> None:
        if s is None:
            self._length(-1, False)
        else:
            self.string(s)

    def bytes_(self, b: bytes) -> None:
        self._length(len(b), True)
        self.buf += b

    def nullable_bytes(self, b: bytes | None) -> None:
        if b is None:
            self._length(-1, True)
        else:
            self.bytes_(b)

    def array_length(self, n: int) -> None:
        self._length(n, True)

    def tagged_fields(self) -> None:
        """An empty tagged-field section (flexible versions only)."""
        if self.flexible:
            self.buf.append(0)

    def done(self) -> bytes:
        return bytes(self.buf)
