"""The primitives of ``__consumer_offsets`` record keys and flexible values (KIP-848 consumer
groups and KIP-932 share groups): int16-prefixed keys with classic strings, and flexible values
(compact strings/arrays: unsigned varint length + 1, 0 = null; 16-byte uuids; a tagged-field
section ending every struct).  Layouts: docs/consumer-groups.md, "Records".
"""

from __future__ import annotations

import struct
import uuid

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_I8 = struct.Struct(">b")


class RecordLayoutError(ValueError):
    """Bytes that are not a record of a layout we know."""


class ValueWriter:
    __slots__ = ("buf",)

    def __init__(self, prefix: int) -> None:
        self.buf = bytearray(_I16.pack(prefix))

    def uvarint(self, n: int) -> None:
        if n < 0:
            raise RecordLayoutError("negative unsigned varint")
        while n > 0x7F:
            self.buf.append((n & 0x7F) | 0x80)
            n >>= 7
        self.buf.append(n)

    def i8(self, n: int) -> None:
        self.buf += _I8.pack(n)

    def i32(self, n: int) -> None:
        self.buf += _I32.pack(n)

    def i64(self, n: int) -> None:
        self.buf += _I64.pack(n)

    def classic_string(self, s: str) -> None:
        raw = s.encode("utf-8")
        if len(raw) > 0x7FFF:
            raise RecordLayoutError(f"string of {len(raw)} bytes is longer than 32767")
        self.buf += _I16.pack(len(raw))
        self.buf += raw

    def string(self, s: str | None) -> None:
        if s is None:
            self.uvarint(0)
            return
        raw = s.encode("utf-8")
        if len(raw) > 0x7FFF:
            raise RecordLayoutError(f"string of {len(raw)} bytes is longer than 32767")
        self.uvarint(len(raw) + 1)
        self.buf += raw

    def bytes_(self, b: bytes) -> None:
        self.uvarint(len(b) + 1)
        self.buf += b

    def uuid(self, u: uuid.UUID) -> None:
        self.buf += u.bytes

    def array_len(self, n: int) -> None:
        self.uvarint(n + 1)

    def i32_array(self, items: tuple[int, ...]) -> None:
        self.array_len(len(items))
        for i in items:
            self.i32(i)

    def string_array(self, items: tuple[str, ...]) -> None:
        self.array_len(len(items))
        for s in items:
            self.string(s)

    def tags(self, fields: list[tuple[int, bytes]] | None = None) -> None:
        fields = fields or []
        self.uvarint(len(fields))
        for tag, data in fields:
            self.uvarint(tag)
            self.uvarint(len(data))
            self.buf += data

    def done(self) -> bytes:
        return bytes(self.buf)


class ValueReader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes, pos: int = 2) -> None:
        self.buf = buf
        self.pos = pos

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if n < 0 or end > len(self.buf):
            raise RecordLayoutError(f"truncated: need {n} bytes at {self.pos}, have {len(self.buf) - self.pos}")
        out = self.buf[self.pos : end]
        self.pos = end
        return out

    def uvarint(self) -> int:
        n = shift = 0
        while True:
            if self.pos >= len(self.buf):
                raise RecordLayoutError("truncated varint")
            b = self.buf[self.pos]
            self.pos += 1
            n |= (b & 0x7F) << shift
            if not b & 0x80:
                return n
            shift += 7
            if shift > 35:
                raise RecordLayoutError("varint too long")

    def i8(self) -> int:
        return int(_I8.unpack(self.take(1))[0])

    def i32(self) -> int:
        return int(_I32.unpack(self.take(4))[0])

    def i64(self) -> int:
        return int(_I64.unpack(self.take(8))[0])

    def _utf8(self, raw: bytes) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise RecordLayoutError(f"invalid UTF-8: {e}") from None

    def classic_string(self) -> str:
        n = int(_I16.unpack(self.take(2))[0])
        if n < 0:
            raise RecordLayoutError("null in a non-nullable string")
        return self._utf8(self.take(n))

    def nullable_string(self) -> str | None:
        n = self.uvarint()
        return None if n == 0 else self._utf8(self.take(n - 1))

    def string(self) -> str:
        s = self.nullable_string()
        if s is None:
            raise RecordLayoutError("null in a non-nullable string")
        return s

    def bytes_(self) -> bytes:
        n = self.uvarint()
        if n == 0:
            raise RecordLayoutError("null in non-nullable bytes")
        return self.take(n - 1)

    def uuid(self) -> uuid.UUID:
        return uuid.UUID(bytes=self.take(16))

    def array_len(self) -> int:
        n = self.uvarint()
        if n == 0:
            raise RecordLayoutError("null in a non-nullable array")
        count = n - 1
        if count > len(self.buf) - self.pos:  # every element takes at least one byte
            raise RecordLayoutError(f"array of {count} elements in {len(self.buf) - self.pos} bytes")
        return count

    def i32_array(self) -> tuple[int, ...]:
        return tuple(self.i32() for _ in range(self.array_len()))

    def string_array(self) -> tuple[str, ...]:
        return tuple(self.string() for _ in range(self.array_len()))

    def tags(self) -> dict[int, bytes]:
        out: dict[int, bytes] = {}
        for _ in range(self.uvarint()):
            tag = self.uvarint()
            out[tag] = self.take(self.uvarint())
        return out
