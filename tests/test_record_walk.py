"""The compiled record walk of the produce check (protocol/_recwalk.pyx) against the reference,
the pure-Python walk in protocol/records.py: on valid and corrupted records, both give the same
yields and then the same error, or the same yields and no error.  Also: the install built it."""

from __future__ import annotations

import random

import pytest
from rallypoint.protocol import records as R

pytestmark = pytest.mark.unit


def _uvarint(v: int, pad: int = 0) -> bytes:
    """An unsigned LEB128 varint of ``v`` (any size), with ``pad`` needless continuation bytes."""
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v or pad:
            out.append(b | 0x80)
            if not v:
                pad -= 1
                if pad == 0:
                    out.append(0)
                    break
        else:
            out.append(b)
            break
    return bytes(out)


def _varint(n: int, pad: int = 0) -> bytes:
    """A zig-zag varint of ``n`` (any size: longer than Kafka allows when ``n`` is large)."""
    return _uvarint(n * 2 if n >= 0 else -n * 2 - 1, pad)


def _record(rng: random.Random, offset_delta: int) -> bytes:
    """One record's bytes (after its length), mostly well-formed, sometimes odd but legal."""
    pad = (lambda: rng.choice((0, 0, 0, 0, 1, 3))) if rng.random() < 0.2 else (lambda: 0)
    ts_delta = rng.choice((0, 1, -1, rng.randint(-(10**6), 10**6), rng.randint(-(2**62), 2**62)))
    body = bytearray(b"\x00")
    body += _varint(ts_delta, pad())
    body += _varint(offset_delta, pad())
    klen = rng.choice((-1, -1, 0, 3, 9, rng.randint(0, 200), -5))
    body += _varint(klen, pad())
    body += bytes(rng.getrandbits(8) for _ in range(max(klen, 0)))
    vlen = rng.choice((-1, 0, 10, 100, rng.randint(0, 9000)))
    body += _varint(vlen, pad())
    body += bytes(max(vlen, 0))
    nheaders = rng.choice((0, 0, 0, 1, 2))
    body += _varint(nheaders, pad())
    for _ in range(nheaders):
        hk = rng.randint(0, 10)
        body += _varint(hk) + b"k" * hk
        hv = rng.choice((-1, 0, 4))
        body += _varint(hv) + b"v" * max(hv, 0)
    return _varint(len(body), pad()) + bytes(body)


def _batch(rng: random.Random, count: int, *, log_append: bool = False) -> bytes:
    payload = b"".join(_record(rng, i) for i in range(count))
    base_ts = rng.choice((0, 1_700_000_000_000, 2**63 - 5, -(2**63) + 5))
    header = R.BatchHeader(
        0, 0, 0, 0, 2, 0, R.ATTR_LOG_APPEND_TIME if log_append else 0, max(count - 1, 0),
        base_ts, base_ts + 7 if base_ts < 2**62 else base_ts, -1, -1, -1, count,
    )  # fmt: skip
    return R.assemble_batch(header, payload)


def _corrupt(rng: random.Random, batch: bytes) -> bytes:
    """Damage the records part (or the count) of ``batch``; the CRC is not what is tested."""
    b = bytearray(batch)
    how = rng.randrange(6)
    start = R.HEADER_SIZE
    if how == 0 and len(b) > start:  # flip some bytes
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(start, len(b))] = rng.getrandbits(8)
    elif how == 1 and len(b) > start:  # cut the tail
        del b[rng.randrange(start, len(b)) :]
    elif how == 2:  # bytes after the records
        b += bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 9)))
    elif how == 3:  # another record count
        count = int.from_bytes(b[57:61], "big", signed=True)
        b[57:61] = rng.choice((count + 1, count - 1, -1, 0, 2**31 - 1)).to_bytes(4, "big", signed=True)
    elif how == 4 and len(b) > start:  # one byte removed or inserted
        i = rng.randrange(start, len(b))
        if rng.random() < 0.5:
            del b[i]
        else:
            b.insert(i, rng.getrandbits(8))
    else:  # a varint made too long
        i = rng.randrange(start, len(b)) if len(b) > start else start
        b[i:i] = b"\xff" * rng.randint(4, 11)
    length = len(b) - R.LOG_OVERHEAD
    b[8:12] = length.to_bytes(4, "big")
    return bytes(b)


def _outcome(batch: bytes, every: int, compiled: bool) -> tuple[list[tuple[int, int, int]], str | None]:
    h = R.parse_header(batch)
    got: list[tuple[int, int, int]] = []
    with R.compiled_walk(compiled):
        try:
            for item in R.latest_record_times(batch, h, R.DEFAULT_MAX_UNCOMPRESSED, every):
                got.append(item)
        except R.RecordsError as e:
            return got, f"{type(e).__name__}: {e}"
    return got, None


def test_the_install_built_the_compiled_walk() -> None:
    # Built by `pip install` from protocol/_recwalk.pyx (pyproject.toml, ext-modules): without
    # it every produce falls back to the reference walk, some 70 times slower per record.
    assert R._compiled is not None


@pytest.mark.parametrize("seed", range(40))
def test_valid_records_give_the_same_answer(seed: int) -> None:
    rng = random.Random(seed)
    batch = _batch(rng, rng.choice((0, 1, 2, 5, 17, 60)), log_append=rng.random() < 0.2)
    for every in (1, 4, 4096):
        reference = _outcome(batch, every, compiled=False)
        assert _outcome(batch, every, compiled=True) == reference


@pytest.mark.parametrize("seed", range(300))
def test_corrupted_records_give_the_same_answer(seed: int) -> None:
    rng = random.Random(1000 + seed)
    batch = _corrupt(rng, _batch(rng, rng.choice((1, 2, 5, 17)), log_append=rng.random() < 0.2))
    for every in (1, 3, 4096):
        reference = _outcome(batch, every, compiled=False)
        assert _outcome(batch, every, compiled=True) == reference


def test_the_compiled_walk_answers_for_plain_records() -> None:
    # The equivalence above would hold if the compiled walk never answered at all; it must
    # answer for ordinary records without handing them to the reference.
    rng = random.Random(7)
    recs = [R.Record(i, 1000 + rng.randint(0, 50), str(i).encode(), b"x" * 100) for i in range(50)]
    batch = R.encode_batch(recs)
    h = R.parse_header(batch)
    data = batch[R.HEADER_SIZE :]
    walked = R._compiled.walk_times(data, 0, 50, h.base_timestamp, False, h.max_timestamp, -1, -1)
    best = max(r.timestamp for r in recs)
    first = next(i for i, r in enumerate(recs) if r.timestamp == best)
    assert walked == (len(data), best, first)


@pytest.mark.parametrize(
    ("field", "value", "pad"),
    [
        ("ts", 2**63 - 1, 0),  # base + delta leaves 64 bits
        ("ts", 2**66, 0),  # a ten-byte varlong
        ("ts", 5, 8),  # a ten-byte varlong of a small value
        ("off", 2**33, 0),  # a five-byte varint beyond 32 bits
        ("off", 3, 5),  # a six-byte varint
        ("klen", -5, 0),  # a negative key length other than -1 (null, as Kafka reads it)
        ("klen", -(2**33), 0),
    ],
)
def test_edge_values_give_the_same_answer(field: str, value: int, pad: int) -> None:
    fields = {"ts": (0, 0), "off": (0, 0), "klen": (-1, 0)}
    fields[field] = (value, pad)
    body = (
        b"\x00"
        + _varint(fields["ts"][0], fields["ts"][1])
        + _varint(fields["off"][0], fields["off"][1])
        + _varint(fields["klen"][0], fields["klen"][1])
        + _varint(1)
        + b"v"
        + _varint(0)
    )
    payload = _varint(len(body)) + body
    header = R.BatchHeader(0, 0, 0, 0, 2, 0, 0, 0, 2**62, 2**62, -1, -1, -1, 1)
    batch = R.assemble_batch(header, payload)
    for every in (1, 4096):
        assert _outcome(batch, every, compiled=True) == _outcome(batch, every, compiled=False)


@pytest.mark.parametrize(
    "headers",
    [
        _varint(1) + _varint(-1) + _varint(0),  # a null header key: refused
        _varint(1) + _varint(-3) + _varint(0),  # a negative header key length: refused
        _varint(1) + _varint(-(2**33)) + _varint(0),  # one that would point far before the buffer
        _varint(1) + _varint(1) + b"k" + _varint(-3),  # a header value length of -3 (null)
        _varint(2) + _varint(1) + b"k" + _varint(0),  # fewer headers than counted
        _varint(40) + _varint(0) + _varint(0),  # a count larger than the bytes left
        _varint(-1),  # a negative count
        _varint(1) + _varint(0) + _varint(5) + b"vv",  # a header value past the record
    ],
)
def test_header_edges_give_the_same_answer(headers: bytes) -> None:
    body = b"\x00" + _varint(0) + _varint(0) + _varint(-1) + _varint(1) + b"v" + headers
    payload = _varint(len(body)) + body
    header = R.BatchHeader(0, 0, 0, 0, 2, 0, 0, 0, 1000, 1000, -1, -1, -1, 1)
    batch = R.assemble_batch(header, payload)
    for every in (1, 4096):
        assert _outcome(batch, every, compiled=True) == _outcome(batch, every, compiled=False)


@pytest.mark.parametrize("seed", range(20))
def test_the_compiled_batch_builder_writes_the_reference_bytes(seed: int) -> None:
    """``build_batch`` (the offsets log's batches) compiled and not: the same bytes for keys and
    values of every size class, tombstones, keys left out, offsets and timestamps at their
    extremes; and the same refusal of what the reference refuses."""
    assert R._compiled is not None
    rng = random.Random(f"build {seed}")

    def blob() -> bytes | None:
        if rng.random() < 0.15:
            return None
        return rng.randbytes(rng.choice((0, 1, 63, 64, 65, 200, 8200, 20000)))

    for _ in range(40):
        entries = [(blob(), blob()) for _ in range(rng.randrange(1, 8))]
        base = rng.choice((0, 1, 5, 2**40, 2**63 - 100))
        ts = rng.choice((0, -1, 1_700_000_000_000, 2**63 - 1, -(2**63)))
        epoch = rng.choice((0, 3, -1, 2**31 - 1))
        with R.compiled_walk(False):
            expected = R.build_batch(base, entries, ts, partition_leader_epoch=epoch)
        assert R._compiled.build_plain_batch(base, entries, ts, epoch, R.crc32c) == expected
        assert R.build_batch(base, tuple(entries), ts, partition_leader_epoch=epoch) == expected
        batch = next(iter(R.iter_batches(expected)))
        assert [(r.key, r.value) for r in batch.records] == entries
    for bad in ([], [(b"k",)], [("k", b"v")], [(b"k", memoryview(b"v"))]):
        assert R._compiled.build_plain_batch(0, bad, 0, 0, R.crc32c) is None  # type: ignore[arg-type]
    with pytest.raises(Exception) as compiled_err:
        R.build_batch(2**63, [(b"k", b"v")], 0)
    with R.compiled_walk(False), pytest.raises(Exception) as reference_err:
        R.build_batch(2**63, [(b"k", b"v")], 0)
    assert type(compiled_err.value) is type(reference_err.value)
