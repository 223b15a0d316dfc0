"""Fuzz of the readers of bytes at rest: record batches, the offsets-log segments and their
recovery, the ``__consumer_offsets`` loader (docs/reliability.md, "Fuzzing").

Torn, flipped, spliced and garbage-extended bytes must end in the documented error types only
(``RecordsError`` and its subclasses; ``CorruptLogError`` from recovery; ``OffsetsSchemaError``
from the record schemas; nothing at all from the loader, which counts what it skips), within
bounded time and memory; recovery must truncate a torn tail to a valid prefix, and be
idempotent.
"""

from __future__ import annotations

import gzip
import random
import shutil
import struct
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest
from crc32c import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rallypoint.protocol.offsets_schema import (
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadata,
    OffsetCommitKey,
    OffsetCommitValue,
    OffsetsSchemaError,
    decode_group_metadata_value,
    decode_key,
    decode_offset_commit_value,
    encode_record,
)
from rallypoint.protocol.records import (
    DEFAULT_MAX_UNCOMPRESSED,
    Record,
    RecordBatch,
    RecordsError,
    build_batch,
    encode_batch,
    iter_batches,
    read_header,
)
from rallypoint.storage.loader import StateBuilder
from rallypoint.storage.recovery import replay_partition
from rallypoint.storage.segments import CorruptLogError, partition_dir, segment_name

pytestmark = [pytest.mark.unit, pytest.mark.slow]

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
TIME_BOUND_S = 2.0


# ------------------------------------------------------------------------------ test data


def offsets_records(n: int, start: int = 0) -> list[tuple[bytes, bytes | None]]:
    out: list[tuple[bytes, bytes | None]] = []
    for i in range(start, start + n):
        if i % 5 == 4:
            member = MemberMetadata(f"m{i}", None, "client", "/127.0.0.1", 30_000, 10_000, b"sub", b"assign")
            value = GroupMetadataValue("consumer", i, "range", f"m{i}", 1_700_000_000_000, (member,))
            k, v = encode_record(GroupMetadataKey(f"group-{i % 3}"), value)
        else:
            k, v = encode_record(
                OffsetCommitKey(f"group-{i % 3}", "topic", i % 4),
                OffsetCommitValue(i * 10, "meta", 1_700_000_000_000 + i, -1, None),
            )
            if i % 7 == 6:
                v = None  # a tombstone
        out.append((k, v))
    return out


def batches(count: int = 6, per_batch: int = 3) -> list[bytes]:
    """Consecutive offsets-log batches, as the offsets log writes them."""
    out = []
    offset = 0
    for b in range(count):
        out.append(build_batch(offset, offsets_records(per_batch, offset), 1_700_000_000_000 + b))
        offset += per_batch
    return out


def gzip_batch(records: list[Record]) -> bytes:
    """An uncompressed batch re-packed with a gzip payload (attributes bit 1), CRC fixed."""
    plain = bytearray(encode_batch(records))
    payload = gzip.compress(bytes(plain[61:]))
    out = bytearray(plain[:61]) + payload
    out[21:23] = struct.pack(">h", struct.unpack_from(">h", out, 21)[0] | 1)
    out[8:12] = struct.pack(">i", len(out) - 12)
    out[17:21] = struct.pack(">I", crc32c(bytes(out[21:])))
    return bytes(out)


def fix_crc(buf: bytearray, pos: int = 0) -> None:
    if len(buf) >= pos + 21:
        buf[pos + 17 : pos + 21] = struct.pack(">I", crc32c(bytes(buf[pos + 21 :])))


SAMPLES = [
    *batches(2),
    encode_batch([Record(0, 1000, b"k", b"v", (("h", b"x"), ("n", None))), Record(1, 1001, None, None)]),
    gzip_batch([Record(i, 1000 + i, b"key%d" % i, b"value" * i) for i in range(5)]),
]


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A sample batch (or two back to back) with one to four mutations, its CRC fixed or not."""
    buf = bytearray(draw(st.sampled_from(SAMPLES)))
    if draw(st.booleans()):
        buf += draw(st.sampled_from(SAMPLES))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "int32", "varint", "truncate", "insert", "delete", "count"]))
        p = draw(st.integers(0, max(0, len(buf) - 1)))
        if op == "flip" and buf:
            buf[p] ^= 1 << draw(st.integers(0, 7))
        elif op == "int32" and len(buf) >= 4:
            p = min(p, len(buf) - 4)
            v = draw(st.sampled_from([-1, 0, 1, 2**31 - 1, -(2**31), 61, 49, 1_000_000]))
            buf[p : p + 4] = struct.pack(">i", v)
        elif op == "varint":
            buf[p:p] = draw(st.sampled_from([b"\x01", b"\xff\xff\xff\xff\x0f", b"\xfe\xff\xff\xff\x0f", b"\x80"]))
        elif op == "truncate":
            del buf[p:]
        elif op == "insert":
            buf[p:p] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete":
            del buf[p : p + draw(st.integers(1, 8))]
        elif op == "count" and len(buf) >= 61:  # record count and offset range, consistent
            n = draw(st.sampled_from([2**31 - 1, 1_000_000, 2, 0]))
            buf[57:61] = struct.pack(">i", n)
            buf[23:27] = struct.pack(">i", n - 1)
    if draw(st.booleans()):
        fix_crc(buf)
    return bytes(buf)


class Bounded:
    """Time and Python-heap bounds around one call."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes

    def __enter__(self) -> Bounded:
        tracemalloc.start()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        elapsed = time.perf_counter() - self.t0
        _cur, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert elapsed < TIME_BOUND_S, f"took {elapsed:.1f} s"
        assert peak < self.max_bytes, f"allocated {peak} bytes (bound {self.max_bytes})"


# ------------------------------------------------------------------------- record batches


@FUZZ
@given(data=mutated())
def test_record_batch_reader_raises_only_records_errors(data: bytes) -> None:
    with Bounded(64 * len(data) + 1_000_000):
        try:
            for batch in iter_batches(data):
                assert batch.header.record_count == len(batch.records)
        except RecordsError:
            pass


@FUZZ
@given(data=st.binary(max_size=300), verify=st.booleans())
def test_record_batch_reader_on_garbage(data: bytes, verify: bool) -> None:
    with Bounded(64 * len(data) + 1_000_000):
        try:
            list(iter_batches(data, verify_crc=verify))
        except RecordsError:
            pass


def test_gzip_decompression_bomb_is_bounded() -> None:
    """A 256 MB run of zeros compresses to ~256 KB: reading it is refused once the payload passes
    the readers' bound (DEFAULT_MAX_UNCOMPRESSED, 64 MiB), never allocating the whole of it."""
    records = [Record(0, 1000, None, b"\x00" * (256 * 1024 * 1024))]
    bomb = gzip_batch(records)
    assert len(bomb) < 600_000
    with Bounded(3 * DEFAULT_MAX_UNCOMPRESSED), pytest.raises(RecordsError):
        list(iter_batches(bomb))


# ------------------------------------------------------------------------ offsets log files


SEGMENTS = [batches(6)[:3], batches(6)[3:]]
BASES = [read_header(seg[0]).base_offset for seg in SEGMENTS]


def write_partition(tmp: Path, segments: list[list[bytes]]) -> Path:
    """A __consumer_offsets partition directory holding these segments (lists of batches; the
    n-th is named after the base offset of SEGMENTS[n])."""
    pdir = Path(partition_dir(tmp, 0))
    if pdir.exists():
        shutil.rmtree(pdir)
    pdir.mkdir(parents=True)
    for base, seg in zip(BASES, segments, strict=True):
        (pdir / segment_name(base)).write_bytes(b"".join(seg))
    return pdir


def state_of(raw_batches: list[bytes]) -> tuple[object, object]:
    b = StateBuilder()
    for raw in raw_batches:
        for batch in iter_batches(raw):
            b.add(batch)
    st_ = b.result()
    return st_.groups, st_.offsets


@pytest.fixture
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    d = tmp_path_factory.mktemp("reader")
    yield d
    shutil.rmtree(d, ignore_errors=True)


@FUZZ
@given(cut=st.integers(0, sum(len(b) for b in SEGMENTS[1]) - 1))
def test_recovery_truncates_a_torn_tail_to_the_valid_prefix(workdir: Path, cut: int) -> None:
    last = b"".join(SEGMENTS[1])[:cut]
    pdir = write_partition(workdir, [SEGMENTS[0], [last]])
    with Bounded(2_000_000):
        r = replay_partition(pdir)
    kept, size = [], 0
    for raw in SEGMENTS[1]:
        if size + len(raw) > cut:
            break
        kept.append(raw)
        size += len(raw)
    assert r.segments[-1].size == size
    assert (r.state.groups, r.state.offsets) == state_of(SEGMENTS[0] + kept)
    assert bool(r.report.truncated) == (cut != size)
    again = replay_partition(pdir)  # idempotent: nothing more to cut, the same state
    assert not again.report.truncated
    assert (again.state.groups, again.state.offsets) == (r.state.groups, r.state.offsets)


@FUZZ
@given(
    segment=st.integers(0, 1),
    data=st.data(),
    fix=st.booleans(),
)
def test_recovery_of_flipped_bytes_stops_or_repairs(
    workdir: Path, segment: int, data: st.DataObject, fix: bool
) -> None:
    segs = [list(s) for s in SEGMENTS]
    which = data.draw(st.integers(0, len(segs[segment]) - 1))
    raw = bytearray(segs[segment][which])
    for _ in range(data.draw(st.integers(1, 3))):
        p = data.draw(st.integers(0, len(raw) - 1))
        raw[p] ^= 1 << data.draw(st.integers(0, 7))
    if fix:
        fix_crc(raw)
    segs[segment][which] = bytes(raw)
    pdir = write_partition(workdir, segs)
    with Bounded(2_000_000):
        try:
            r = replay_partition(pdir)
        except CorruptLogError:
            return
    # Accepted (a torn-looking tail was cut, or the change is outside the CRC, or a fixed CRC):
    # recovery is then idempotent and what is left reads back without error.
    again = replay_partition(pdir, repair=False)
    assert not again.report.truncated
    assert (again.state.groups, again.state.offsets) == (r.state.groups, r.state.offsets)


@FUZZ
@given(tail=st.one_of(st.binary(min_size=1, max_size=200), st.integers(1, 200).map(lambda n: b"\x00" * n)))
def test_recovery_of_garbage_after_the_last_batch(workdir: Path, tail: bytes) -> None:
    pdir = write_partition(workdir, [SEGMENTS[0], [*SEGMENTS[1], tail]])
    try:
        r = replay_partition(pdir)
    except CorruptLogError:
        # only bytes that could be a complete batch (and are not all zeros) may stop the broker
        assert tail.count(0) != len(tail)
        return
    assert (r.state.groups, r.state.offsets) == state_of(SEGMENTS[0] + SEGMENTS[1])
    assert r.segments[-1].size == sum(len(b) for b in SEGMENTS[1])


# ----------------------------------------------------------------------- loader and schemas


@FUZZ
@given(
    records=st.lists(
        st.tuples(st.one_of(st.none(), st.binary(max_size=40)), st.one_of(st.none(), st.binary(max_size=80))),
        min_size=1,
        max_size=8,
    ),
    flags=st.sampled_from([0, 0x10, 0x20, 0x30]),
    seed=st.integers(0, 2**16),
)
def test_loader_skips_what_does_not_decode(
    records: list[tuple[bytes | None, bytes | None]], flags: int, seed: int
) -> None:
    """Random keys and values, some of them real records with a byte changed: never an exception."""
    rng = random.Random(seed)
    real = offsets_records(4)
    recs = []
    for i, (k, v) in enumerate(records):
        if rng.random() < 0.5:
            rk, rv = real[i % len(real)]
            kb = bytearray(rk)
            if kb and rng.random() < 0.5:
                kb[rng.randrange(len(kb))] ^= 0xFF
            k = bytes(kb)
            if rv is not None and rng.random() < 0.7:
                vb = bytearray(rv)
                vb[rng.randrange(len(vb))] = rng.randrange(256)
                v = bytes(vb)
        recs.append(Record(i, 1000, k, v))
    raw = bytearray(encode_batch(recs, producer_id=7 if flags & 0x10 else -1))
    raw[21:23] = struct.pack(">h", flags)
    fix_crc(raw)
    builder = StateBuilder()
    for batch in iter_batches(bytes(raw)):
        builder.add(RecordBatch(batch.header, batch.records))
    state = builder.result()
    assert state.records == len(recs)


@FUZZ
@given(data=st.binary(max_size=120), which=st.sampled_from(["key", "commit", "group"]))
def test_offsets_schema_decoders_raise_only_their_error(data: bytes, which: str) -> None:
    decode = {"key": decode_key, "commit": decode_offset_commit_value, "group": decode_group_metadata_value}[which]
    with Bounded(64 * len(data) + 200_000):
        try:
            decode(data)
        except OffsetsSchemaError:
            pass
