"""Mutations of recorded request frames (docs/reliability.md, "Fuzzing").

A :class:`Mutator` is seeded (``random.Random``): the n-th case of a seed is always the same
bytes, so any finding is reproducible from (seed, case number) alone.  Each case stacks one to
three operators on a corpus frame:

byte level
    ``flip`` bits, set a ``byte``/``int16``/``int32``/``int64``/``uvarint`` at a random position
    to an interesting value (-1, 0, 2**31-1, ...), ``truncate``, ``extend``, ``dup`` or
    ``delete`` a slice, ``api`` (random API key and version) and ``version`` (the same body read
    as another version), ``splice`` (this header, another frame's body);
structure aware (from :mod:`tests.fuzz.layout`)
    ``array_len`` (lie about an array's length, or null it), ``str_len`` (null or lie about a
    string/bytes length), ``int_field`` (num_partitions, timeouts, ... to extremes),
    ``tag_repeat`` (one tagged field repeated thousands of times), ``many`` (an array element
    repeated up to ~100k times with an honest count), ``records`` (a record batch's count,
    lengths or attributes changed *and its CRC fixed*, so it passes the CRC check), ``header_tags``;
stream level
    ``size_lie`` (the size prefix disagrees with the body: the stream desynchronises, one frame
    splits into several or swallows the next), ``join`` (several frames in one write),
    ``split`` (one frame in several writes).
"""

from __future__ import annotations

import random
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from crc32c import crc32c

from .frames import Frame
from .layout import Layout, LayoutError, Span, layout, read_uvarint, write_uvarint

I8 = (0x00, 0x01, 0x7F, 0x80, 0xFF)
I16 = (-1, 0, 1, 0x7FFF, -0x8000, 0x100, 0xFF, 2)
I32 = (-1, 0, 1, 0x7FFFFFFF, -0x80000000, 0x10000, 1_000_000, 10_000_000, 0xFFFF, 100_000, -2)
I64 = (-1, 0, 1, 2**63 - 1, -(2**63), 2**31, 2**32)
UVARINT = (0, 1, 2, 0x7F, 0x80, 0x3FFF, 0x4000, 2**21, 2**28 - 1, 2**31, 2**35 - 1)
# API keys: served ones mostly, some unknown.
SERVED_KEYS = (0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15, 16, 18, 19, 20, 22, 23, 37, 42, 47)
ODD_KEYS = (-1, 4, 17, 21, 50, 68, 1000, 0x7FFF, -0x8000)
MAX_CASE_BYTES = 1024 * 1024  # a case never sends more than this (the fuzzer's own memory)


@dataclass(slots=True)
class Case:
    """What to send: ``chunks`` written in order (with a short pause between chunks when
    ``split``), the operators applied, and the API of the frame it came from."""

    chunks: list[bytes]
    ops: list[str] = field(default_factory=list)
    api: tuple[int, int] = (-1, -1)
    source: str = ""

    @property
    def wire(self) -> bytes:
        return b"".join(self.chunks)


def _frame(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def _short_waits(f: Frame, lay: Layout) -> tuple[Frame, Layout]:
    """The frame with Fetch's ``max_wait_ms`` at 5 ms: recorded fetches wait up to 500 ms for
    data that never comes, which would idle a fuzz connection (mutations still set it to extremes)."""
    spans = [s for s in lay.spans if s.name == "max_wait_ms" and s.kind == "int32"]
    if lay.api_key != 1 or not spans:
        return f, lay
    body = bytearray(f.body)
    for s in spans:
        body[s.pos : s.pos + 4] = struct.pack(">i", 5)
    nf = Frame(f.source, bytes(body))
    return nf, layout(nf.body)


class Mutator:
    def __init__(self, corpus: Sequence[Frame], seed: int, *, short_waits: bool = True) -> None:
        if not corpus:
            raise ValueError("empty corpus: run python -m tests.fuzz.record_corpus")
        self.seed = seed
        self.rng = random.Random(seed)
        self.corpus: list[Frame] = []
        self.layouts: list[Layout | None] = []
        for f in corpus:
            try:
                lay: Layout | None = layout(f.body)
            except LayoutError:
                lay = None
            if lay is not None and short_waits:
                f, lay = _short_waits(f, lay)
            self.corpus.append(f)
            self.layouts.append(lay)
        self.byte_ops: list[tuple[Callable[[bytearray], str], int]] = [
            (self.flip, 6),
            (self.set_byte, 3),
            (self.set_int16, 3),
            (self.set_int32, 4),
            (self.set_int64, 1),
            (self.set_uvarint, 3),
            (self.truncate, 3),
            (self.extend, 2),
            (self.dup, 2),
            (self.delete, 2),
            (self.api, 2),
            (self.version, 4),
            (self.splice, 1),
        ]
        self.field_ops: list[tuple[Callable[[bytearray, Layout], str | None], int]] = [
            (self.array_len, 6),
            (self.str_len, 4),
            (self.int_field, 6),
            (self.tag_repeat, 1),
            (self.many, 1),
            (self.records, 4),
            (self.header_tags, 1),  # header v2 only
        ]
        self._byte_w = [w for _, w in self.byte_ops]
        self._field_w = [w for _, w in self.field_ops]
        self.cases = 0

    # ------------------------------------------------------------------ the driver

    def case(self) -> Case:
        """The next case of this seed."""
        self.cases += 1
        rng = self.rng
        i = rng.randrange(len(self.corpus))
        src, lay = self.corpus[i], self.layouts[i]
        body = bytearray(src.body)
        ops: list[str] = []
        if rng.random() < 0.05:  # an unchanged frame now and then: the broker must keep answering them
            ops.append("none")
        else:
            if lay is not None and rng.random() < 0.6:
                (op,) = rng.choices([o for o, _ in self.field_ops], self._field_w)
                name = op(body, lay)
                if name:
                    ops.append(name)
            for _ in range(rng.choice((0, 1, 1, 1, 2)) if ops else rng.choice((1, 1, 2, 3))):
                (bop,) = rng.choices([o for o, _ in self.byte_ops], self._byte_w)
                ops.append(bop(body))
        del body[MAX_CASE_BYTES:]
        chunks = [_frame(bytes(body))]
        r = rng.random()
        if r < 0.08:
            ops.append(self.size_lie(chunks))
        elif r < 0.16:
            ops.append(self.join(chunks))
        elif r < 0.22:
            ops.append(self.split(chunks))
        return Case(chunks, ops, (src.api_key, src.api_version), src.source)

    # ---------------------------------------------------------------- byte level

    def _pos(self, body: bytearray, width: int = 1) -> int:
        return self.rng.randrange(max(1, len(body) - width + 1))

    def flip(self, body: bytearray) -> str:
        if not body:
            return "flip(empty)"
        for _ in range(self.rng.choice((1, 1, 2, 4, 8))):
            p = self._pos(body)
            body[p] ^= 1 << self.rng.randrange(8)
        return "flip"

    def set_byte(self, body: bytearray) -> str:
        if body:
            body[self._pos(body)] = self.rng.choice(I8)
        return "byte"

    def _put(self, body: bytearray, fmt: str, values: Sequence[int], name: str) -> str:
        width = struct.calcsize(fmt)
        if len(body) < width:
            return name + "(short)"
        v = self.rng.choice(values)
        p = self._pos(body, width)
        body[p : p + width] = struct.pack(fmt, v)
        return f"{name}@{p}={v}"

    def set_int16(self, body: bytearray) -> str:
        return self._put(body, ">h", I16, "int16")

    def set_int32(self, body: bytearray) -> str:
        return self._put(body, ">i", I32, "int32")

    def set_int64(self, body: bytearray) -> str:
        return self._put(body, ">q", I64, "int64")

    def set_uvarint(self, body: bytearray) -> str:
        v = self.rng.choice(UVARINT)
        raw = write_uvarint(v)
        p = self._pos(body)
        body[p : p + self.rng.choice((1, len(raw)))] = raw
        return f"uvarint@{p}={v}"

    def truncate(self, body: bytearray) -> str:
        n = self.rng.randrange(len(body) + 1)
        del body[n:]
        return f"truncate={n}"

    def extend(self, body: bytearray) -> str:
        n = self.rng.choice((1, 2, 4, 16, 64, 300))
        body += self.rng.randbytes(n) if self.rng.random() < 0.5 else bytes([self.rng.choice(I8)]) * n
        return f"extend+{n}"

    def dup(self, body: bytearray) -> str:
        if not body:
            return "dup(empty)"
        a = self._pos(body)
        b = min(len(body), a + self.rng.choice((1, 2, 4, 8, 32, 128)))
        chunk = body[a:b] * self.rng.choice((1, 2, 8, 64))
        body[b:b] = chunk
        return f"dup[{a}:{b}]x"

    def delete(self, body: bytearray) -> str:
        if not body:
            return "delete(empty)"
        a = self._pos(body)
        b = min(len(body), a + self.rng.choice((1, 2, 4, 8, 32)))
        del body[a:b]
        return f"delete[{a}:{b}]"

    def api(self, body: bytearray) -> str:
        if len(body) < 4:
            return "api(short)"
        key = self.rng.choice(SERVED_KEYS) if self.rng.random() < 0.8 else self.rng.choice(ODD_KEYS)
        version = self.rng.randrange(-2, 20)
        body[0:4] = struct.pack(">hh", key, version)
        return f"api={key}v{version}"

    def version(self, body: bytearray) -> str:
        if len(body) < 4:
            return "version(short)"
        (v,) = struct.unpack_from(">h", body, 2)
        nv = max(-1, min(0x7FFF, v + self.rng.choice((-3, -2, -1, 1, 2, 3))))
        body[2:4] = struct.pack(">h", nv)
        return f"version={nv}"

    def splice(self, body: bytearray) -> str:
        other = self.rng.choice(self.corpus).body
        cut = self.rng.randrange(min(len(body), 40) + 1)
        ocut = self.rng.randrange(len(other) + 1)
        body[cut:] = other[ocut:]
        return "splice"

    # ----------------------------------------------------------- structure aware

    def _spans(self, lay: Layout, kinds: tuple[str, ...]) -> list[Span]:
        return [s for s in lay.spans if s.kind in kinds]

    def _length_bytes(self, span: Span, value: int) -> bytes:
        """``value`` (-1 = null) encoded as ``span``'s length prefix."""
        if span.flexible:
            return write_uvarint(max(0, value + 1) & (2**35 - 1))
        if span.size == 2:
            return struct.pack(">h", max(-0x8000, min(0x7FFF, value)))
        return struct.pack(">i", max(-0x80000000, min(0x7FFFFFFF, value)))

    def array_len(self, body: bytearray, lay: Layout) -> str | None:
        spans = self._spans(lay, ("array",))
        if not spans:
            return None
        s = self.rng.choice(spans)
        v = self.rng.choice((-1, -1, 0, s.value + 1, s.value + 2, 2**31 - 1, 2**20, 5_000_000, 2**28, s.value * 1000))
        body[s.pos : s.pos + s.size] = self._length_bytes(s, v)
        return f"array_len:{s.name}={v}"

    def str_len(self, body: bytearray, lay: Layout) -> str | None:
        spans = self._spans(lay, ("string", "bytes", "records"))
        if not spans:
            return None
        s = self.rng.choice(spans)
        v = self.rng.choice((-1, -1, 0, s.value + 1, max(0, s.value - 1), 0x7FFF, 2**31 - 1, 2**20))
        body[s.pos : s.pos + s.size] = self._length_bytes(s, v)
        return f"str_len:{s.name}={v}"

    def int_field(self, body: bytearray, lay: Layout) -> str | None:
        spans = self._spans(lay, ("int8", "int16", "int32", "int64"))
        if not spans:
            return None
        s = self.rng.choice(spans)
        fmt, values = {1: (">B", I8), 2: (">h", I16), 4: (">i", I32), 8: (">q", I64)}[s.size]
        v = self.rng.choice(values)
        body[s.pos : s.pos + s.size] = struct.pack(fmt, v)
        return f"int:{s.name}={v}"

    def tag_repeat(self, body: bytearray, lay: Layout) -> str | None:
        spans = self._spans(lay, ("tagged",))
        if not spans:
            return None
        s = self.rng.choice(spans)
        tag = self.rng.choice((0, 0, 1, 2, 3, 7, 100))
        payload = self.rng.choice((b"", b"\x00", b"\x01\x00", b"\x00" * 8, b"\x02a"))
        one = write_uvarint(tag) + write_uvarint(len(payload)) + payload
        n = self.rng.choice((2, 2, 100, 100, 1000, 10_000, 200_000))
        n = min(n, MAX_CASE_BYTES // max(1, len(one)))
        # Replace the whole (usually empty) section: count, then n copies.
        end = s.pos + s.size
        for _ in range(s.value):
            try:
                _t, end = read_uvarint(bytes(body), end)
                size, end = read_uvarint(bytes(body), end)
                end += size
            except LayoutError:
                break
        body[s.pos : end] = write_uvarint(n) + one * n
        return f"tag_repeat:{s.name}:tag{tag}x{n}"

    def header_tags(self, body: bytearray, lay: Layout) -> str | None:
        if lay.header_tagged is None:
            return None
        n = self.rng.choice((1, 50, 50, 5000, 100_000))
        one = b"\x00\x01\x00"  # tag 0, one byte
        p = lay.header_tagged
        body[p : lay.header_size] = write_uvarint(n) + one * n
        return f"header_tags x{n}"

    def many(self, body: bytearray, lay: Layout) -> str | None:
        """An array with one element repeated up to ~100k times and an honest count."""
        arrays = [s for s in self._spans(lay, ("array",)) if s.value >= 1]
        if not arrays:
            return None
        s = self.rng.choice(arrays)
        start = s.pos + s.size
        # The element ends where the next span at the same depth would start: take the bytes up
        # to the next span of the same name, or a small guess, bounded by the frame.
        later = [t.pos for t in lay.spans if t.pos > start and t.name == s.name]
        elem_end = min(later) if later else min(len(body), start + self.rng.choice((1, 4, 16)))
        if s.value == 1:
            # one element: it ends at the end of the array; estimate from the following span
            follow = [t.pos for t in lay.spans if t.pos > start and t.kind in ("array", "tagged")]
            elem_end = min(follow) if follow else elem_end
        elem = bytes(body[start:elem_end]) or b"\x00"
        n = self.rng.choice((10, 100, 100, 1000, 1000, 20_000, 1_000_000))
        n = min(n, MAX_CASE_BYTES // len(elem))
        body[s.pos : elem_end] = self._length_bytes(s, n) + elem * n
        return f"many:{s.name}x{n}"

    def records(self, body: bytearray, lay: Layout) -> str | None:
        """Change a record batch inside the frame, then fix its CRC so it is believed."""
        payloads = [s for s in lay.spans if s.kind == "payload" and s.name == "records" and s.size >= 61]
        if not payloads:
            return None
        s = self.rng.choice(payloads)
        batch = bytearray(body[s.pos : s.pos + s.size])
        what = self.rng.choice(("count", "count", "last_delta", "compression", "record_len", "flip", "length"))
        if what == "count":
            # the count, with a consistent offset range half of the time (so the broker's
            # header checks pass and only the records themselves disagree)
            v = self.rng.choice((2**31 - 1, 1_000_000, 0, -1, 2**16, 2, 100))
            batch[57:61] = struct.pack(">i", v)
            if self.rng.random() < 0.5:
                batch[23:27] = struct.pack(">i", v - 1)
        elif what == "last_delta":
            batch[23:27] = struct.pack(">i", self.rng.choice((2**31 - 1, -1, 0, 1_000_000)))
        elif what == "compression":
            attrs = struct.unpack_from(">h", batch, 21)[0]
            batch[21:23] = struct.pack(">h", (attrs & ~7) | self.rng.randrange(8))
        elif what == "record_len":
            # the first record's length varint: -1 (zig-zag 1), huge, or 0
            batch[61:62] = self.rng.choice((b"\x01", b"\x00", b"\xfe\xff\xff\xff\x0f"))
        elif what == "length":
            batch[8:12] = struct.pack(">i", self.rng.choice((0, 49, len(batch) - 11, 2**31 - 1, -1)))
        else:
            p = 61 + self.rng.randrange(max(1, len(batch) - 61))
            if p < len(batch):
                batch[p] ^= 1 << self.rng.randrange(8)
        if len(batch) >= 21:
            batch[17:21] = struct.pack(">I", crc32c(bytes(batch[21:])))
        body[s.pos : s.pos + s.size] = batch
        return f"records:{what}"

    # --------------------------------------------------------------- stream level

    def size_lie(self, chunks: list[bytes]) -> str:
        body = chunks[0][4:]
        v = self.rng.choice(
            (0, -1, len(body) - 1, len(body) + 1, len(body) // 2, len(body) + 100, 2**31 - 1, 100 * 1024 * 1024 + 1)
        )
        chunks[0] = struct.pack(">i", v) + body
        if v > len(body) and self.rng.random() < 0.5:
            chunks.append(_frame(self.rng.choice(self.corpus).body))  # the next frame is swallowed
        return f"size_lie={v}"

    def join(self, chunks: list[bytes]) -> str:
        n = self.rng.choice((1, 2, 4))
        extra = b"".join(_frame(self.rng.choice(self.corpus).body) for _ in range(n))
        chunks[0] = chunks[0] + extra
        return f"join+{n}"

    def split(self, chunks: list[bytes]) -> str:
        data = chunks[0]
        if len(data) < 2:
            return "split(short)"
        cuts = sorted(self.rng.sample(range(1, len(data)), min(len(data) - 1, self.rng.choice((1, 2, 5)))))
        chunks[:1] = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        return f"split/{len(cuts) + 1}"
