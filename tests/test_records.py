"""Record batches (magic v2): our encoder against two independent readers (kafka-python's
``kafka.record`` and aiokafka's ``aiokafka.record``, both CRC-32C validating), their encoders
against our decoder, varints, and the torn-tail / CRC errors."""

from __future__ import annotations

import struct
import tracemalloc
from pathlib import Path
from typing import Any

import aiokafka.codec as aiocodec
import aiokafka.record as aiorecord
import kafka.record as kprecord
import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder as AioBatchBuilder
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatchBuilder
from rallypoint.protocol.records import (
    ATTR_LOG_APPEND_TIME,
    BatchHeader,
    CorruptBatchError,
    PayloadTooLargeError,
    Record,
    TornBatchError,
    UnsupportedBatchError,
    assemble_batch,
    build_batch,
    decode_records,
    encode_batch,
    iter_batches,
    iter_file_batches,
    iter_record_times,
    latest_record_times,
    read_header,
    records_payload,
    scan_batches,
)
from rallypoint.protocol.wire import read_varint, write_varint

pytestmark = pytest.mark.unit


def _their_batches(buf: bytes, lib: object) -> list[list[tuple[int, int, bytes | None, bytes | None, list]]]:
    mr = lib.MemoryRecords(buf)  # type: ignore[attr-defined]
    out = []
    while True:
        batch = mr.next_batch()
        if batch is None:
            break
        assert batch.validate_crc(), "independent reader rejects our CRC"
        out.append([(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in batch])
    return out


def test_build_batch_layout_bytes() -> None:
    b = build_batch(7, [(b"k", b"v")], 1000, partition_leader_epoch=3)
    h = read_header(b)  # checks the CRC-32C of attributes .. end
    assert h == BatchHeader(0, 7, len(b) - 12, 3, 2, crc32c(b[21:]), 0, 0, 1000, 1000, -1, -1, -1, 1)
    # one record: length 8 (zigzag 16), attributes 0, ts delta 0, offset delta 0,
    # key length 1 (zigzag 2), "k", value length, "v", 0 headers
    assert b[61:] == bytes([0x10, 0, 0, 0, 2]) + b"k" + bytes([2]) + b"v" + bytes([0])


def test_independent_readers_decode_our_batches() -> None:
    buf = build_batch(0, [(b"k1", b"v1"), (b"k2", None)], 1700000000000)
    buf += encode_batch(
        [
            Record(5, 1700000000009, b"a", b"b", (("h", b"x"), ("n", None))),
            Record(9, 1700000000001, None, b"c"),  # offset gap: as after compaction
        ],
        partition_leader_epoch=1,
    )
    want = [
        [(0, 1700000000000, b"k1", b"v1", []), (1, 1700000000000, b"k2", None, [])],
        [(5, 1700000000009, b"a", b"b", [("h", b"x"), ("n", None)]), (9, 1700000000001, None, b"c", [])],
    ]
    assert _their_batches(buf, kprecord) == want
    assert _their_batches(buf, aiorecord) == want
    ours = [[(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in b.records] for b in iter_batches(buf)]
    assert ours == want
    headers = list(scan_batches(buf))
    assert [h.last_offset for h in headers] == [1, 9]
    assert headers[1].position == headers[0].size


@pytest.mark.parametrize("compression", [0, 1])  # none, gzip
def test_we_decode_kafka_python_batches(compression: int) -> None:
    builder = DefaultRecordBatchBuilder(
        magic=2, compression_type=compression, is_transactional=False, producer_id=-1, producer_epoch=-1,
        base_sequence=-1, batch_size=1 << 20,
    )  # fmt: skip
    for i in range(50):
        builder.append(i, timestamp=1700000000000 + i, key=f"k{i}".encode(), value=b"v" * i, headers=[("h", b"1")])
    raw = bytes(builder.build())
    [batch] = list(iter_batches(raw))
    assert batch.header.compression == compression
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in batch.records] == [
        (i, 1700000000000 + i, f"k{i}".encode(), b"v" * i, (("h", b"1"),)) for i in range(50)
    ]


@pytest.mark.parametrize("compression", [1, 2, 3, 4])  # gzip, snappy, lz4, zstd
def test_we_decode_every_codec_of_aiokafka(compression: int) -> None:
    builder = AioBatchBuilder(2, compression, False, -1, -1, -1, 1 << 24)
    for i in range(300):
        builder.append(i, timestamp=1000 + i, key=f"k{i}".encode(), value=b"v" * i, headers=[])
    raw = bytes(builder.build())
    h = read_header(raw)
    assert h.compression == compression
    want = [(i, 1000 + i, f"k{i}".encode(), b"v" * i) for i in range(300)]
    assert [(r.offset, r.timestamp, r.key, r.value) for r in decode_records(raw, h)] == want
    assert list(iter_record_times(raw, h)) == [(i, 1000 + i) for i in range(300)]


def test_snappy_without_xerial_framing_is_one_raw_block() -> None:
    plain = build_batch(0, [(b"k", b"v" * 100)], 1)
    h = read_header(plain)
    raw = assemble_batch(h._replace(attributes=2), aiocodec.snappy_encode(plain[61:], xerial_compatible=False))
    assert [r.value for r in decode_records(raw, read_header(raw))] == [b"v" * 100]


def test_unknown_codec_and_bad_payloads_are_errors() -> None:
    plain = build_batch(0, [(b"k", b"v")], 1)
    h = read_header(plain)
    unknown = assemble_batch(h._replace(attributes=5), plain[61:])
    with pytest.raises(UnsupportedBatchError, match="compression id 5"):
        records_payload(unknown, read_header(unknown))
    for codec in (1, 2, 3, 4):
        bad = assemble_batch(h._replace(attributes=codec), plain[61:])  # not compressed at all
        with pytest.raises(CorruptBatchError, match="payload"):
            decode_records(bad, read_header(bad))


_BOMB = 64 << 20  # 64 MiB of zeros: a few KiB to a few hundred KiB compressed


@pytest.mark.parametrize(
    "compression,encode",
    [
        (1, aiocodec.gzip_encode),
        (2, aiocodec.snappy_encode),
        (3, aiocodec.lz4_encode),
        (4, aiocodec.zstd_encode),
    ],
)
def test_decompression_bombs_stop_at_the_bound(compression: int, encode: Any) -> None:
    """A batch decompressing to 64 MiB is refused by a reader allowed 1 MiB, which allocates a
    copy of the payload and at most twice the bound, not 64 MiB."""
    payload = encode(bytes(_BOMB))
    assert len(payload) < 4 << 20
    h = read_header(build_batch(0, [(b"k", b"v")], 1))
    bomb = assemble_batch(h._replace(attributes=compression), payload)
    tracemalloc.start()
    try:
        with pytest.raises(PayloadTooLargeError):
            records_payload(bomb, read_header(bomb), 1 << 20)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < len(payload) + (3 << 20), peak
    # allowed enough, the same batch decompresses (and its "records" are refused, not trusted)
    with pytest.raises(CorruptBatchError):
        list(iter_record_times(bomb, read_header(bomb), _BOMB))


def test_log_append_time_records_take_the_max_timestamp() -> None:
    raw = encode_batch([Record(0, 10, b"a", b"1"), Record(1, 20, b"b", b"2")])
    h = read_header(raw)
    raw = assemble_batch(h._replace(attributes=ATTR_LOG_APPEND_TIME, max_timestamp=999), raw[61:])
    [batch] = list(iter_batches(raw))
    assert [r.timestamp for r in batch.records] == [999, 999]
    assert list(iter_record_times(raw, batch.header)) == [(0, 999), (1, 999)]


def test_torn_tail_and_crc_mismatch_are_distinct_errors() -> None:
    one = build_batch(0, [(b"k", b"v")], 1)
    two = build_batch(1, [(b"k", b"w")], 2)
    buf = one + two
    for cut in (1, 11, 12, 60, len(two) - 1):
        with pytest.raises(TornBatchError) as ei:
            list(iter_batches(buf[: len(one) + cut]))
        assert ei.value.position == len(one)
    flipped = bytearray(buf)
    flipped[len(one) + 66] ^= 0x01  # inside the second batch's records
    got = []
    with pytest.raises(CorruptBatchError, match="CRC mismatch") as ci:
        for b in iter_batches(bytes(flipped)):
            got.append(b)
    assert ci.value.position == len(one)
    assert len(got) == 1  # the good batch before it was yielded
    with pytest.raises(CorruptBatchError):
        read_header(b"\x00" * 61)  # zero-filled: impossible batch length


def test_legacy_message_sets_are_refused() -> None:
    # a magic v1 message: offset, size, crc, magic 1, attributes, timestamp, key -1, value "x"
    body = struct.pack(">bbq", 1, 0, 0) + struct.pack(">i", -1) + struct.pack(">i", 1) + b"x"
    msg = struct.pack(">qiI", 0, len(body) + 4, 0) + body
    with pytest.raises(UnsupportedBatchError):
        read_header(msg)


def test_empty_batch_and_descending_offsets_are_refused() -> None:
    with pytest.raises(ValueError):
        encode_batch([])
    with pytest.raises(ValueError):
        encode_batch([Record(5, 0, b"a", b"b"), Record(5, 0, b"a", b"b")])


def test_file_reader(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.log"
    path.write_bytes(b"")
    assert list(iter_file_batches(path)) == []
    path.write_bytes(build_batch(0, [(b"k", b"v")], 1) + build_batch(1, [(b"k", None)], 2))
    assert [b.records[0].value for b in iter_file_batches(path)] == [b"v", None]


@given(st.integers(-(2**63), 2**63 - 1))
def test_varint_round_trip(n: int) -> None:
    out = bytearray()
    write_varint(n, out)
    assert read_varint(bytes(out), 0) == (n, len(out))


def test_varint_known_encodings() -> None:
    for n, enc in [(0, b"\x00"), (-1, b"\x01"), (1, b"\x02"), (63, b"\x7e"), (-64, b"\x7f"), (64, b"\x80\x01")]:
        out = bytearray()
        write_varint(n, out)
        assert bytes(out) == enc


keys = st.none() | st.binary(max_size=40)


@given(
    st.lists(
        st.tuples(
            st.integers(1, 5),
            st.integers(-(2**40), 2**40),
            keys,
            keys,
            st.lists(st.tuples(st.text(max_size=5), keys), max_size=2),
        ),
        min_size=1,
        max_size=20,
    ),
    st.integers(0, 2**40),
)
def test_batches_round_trip_and_agree_with_kafka_python(
    spec: list[tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes | None]]]], base: int
) -> None:
    recs = []
    off = base
    for gap, ts, k, v, hs in spec:
        recs.append(Record(off, ts, k, v, tuple(hs)))
        off += gap
    raw = encode_batch(recs)
    [batch] = list(iter_batches(raw))
    assert list(batch.records) == recs
    [theirs] = _their_batches(raw, kprecord)
    assert theirs == [(r.offset, r.timestamp, r.key, r.value, [tuple(h) for h in r.headers]) for r in recs]


def test_the_documented_example_batch() -> None:
    """docs/offsets-log-format.md, "Record", shows these exact bytes."""
    from rallypoint.protocol.offsets_schema import OffsetCommitKey, OffsetCommitValue, encode_record

    entry = encode_record(OffsetCommitKey("g", "t", 0), OffsetCommitValue(5, "", 1000))
    header = "0000000000000000 0000005c 00000000 02 b37c149a 0000 00000000 00000000000003e8 00000000000003e8"
    header += " ffffffffffffffff ffff ffffffff 00000001"
    record = " 54 00 00 00"  # length 42, attributes, timestamp delta, offset delta
    record += " 18 0001 000167 000174 00000000"  # key: length 12, v1, "g", "t", partition 0
    record += " 30 0003 0000000000000005 ffffffff 0000 00000000000003e8"  # value v3: 5, -1, "", 1000
    record += " 00"  # no headers
    want = bytes.fromhex((header + record).replace(" ", ""))
    assert build_batch(0, [entry], 1000) == want


def test_the_batch_checksum_is_crc32c_from_the_c_extension_without_its_package_init() -> None:
    """protocol/crc.py: the same function as the package's, loaded without importlib.metadata."""
    import subprocess
    import sys

    from rallypoint.protocol import crc

    assert crc.crc32c(b"123456789") == 0xE3069283  # the standard check value of CRC-32C
    data = bytes(range(256)) * 41
    assert crc.crc32c(data) == crc32c(data)
    probe = "import sys, rallypoint.protocol.records; print('importlib.metadata' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("every", [1, 3, 4, 7, 4096])
def test_latest_record_times_yields_running_maxima_every_n_records(every: int) -> None:
    """The produce path's walk: the same records as iter_record_times, one yield per ``every``
    records and one after the last, with the latest timestamp so far (first record on ties)."""
    import random

    rng = random.Random(every)
    for n in (1, 2, 4, 7, 12, 100):
        stamps = [1_700_000_000_000 + rng.choice([0, 5, 9, 9, 3]) for _ in range(n)]
        recs = [Record(i, stamps[i], b"k", b"v" * rng.randrange(0, 300)) for i in range(n)]
        batch = encode_batch(recs, base_offset=0)
        h = read_header(batch, 0)
        got = list(latest_record_times(batch, h, 1 << 20, every))
        expected = []
        best_ts, best_delta = -1, -1
        for i, (offset, ts) in enumerate(iter_record_times(batch, h), start=1):
            if ts > best_ts:
                best_ts, best_delta = ts, offset
            if i % every == 0 or i == n:
                expected.append((i, best_ts, best_delta))
        assert got == expected
    good = encode_batch([Record(0, 1, b"k", b"v"), Record(1, 2, b"k", b"v")], base_offset=0)
    h = read_header(good, 0)
    trailing = assemble_batch(h, records_payload(good, h, 1 << 20) + b"\x00")  # a byte after the records
    with pytest.raises(CorruptBatchError, match="remain"):
        list(latest_record_times(trailing, read_header(trailing, 0), 1 << 20, 2))
