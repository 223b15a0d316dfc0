"""The pipeline's compiled offset rows (``OffsetRows`` in protocol/_recwalk.pyx, used by
``decode_segment`` in pipeline/decode.py) against the reference: every record decoded in Python.

Each case decodes the same generated segments both ways (tests/support/generated_logs.py: plain
and transactional batches, every offset commit value version, ASCII and not, group records with
members, records the compiled rows leave to the reference, then damage): the rows, sorted by
kind and offset, must be equal, and so must each segment's row (sizes, counts, status, error).
Also the direct readers of group values and consumer-protocol assignments against theirs."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from rallypoint.pipeline import decode
from rallypoint.protocol import consumer_protocol as cp
from rallypoint.protocol import offsets_schema as schema
from rallypoint.protocol import records as R
from rallypoint.protocol.offsets_schema import OffsetCommitKey, OffsetCommitValue, encode_record

from tests.support import generated_logs as logs

pytestmark = pytest.mark.unit

SORT = [("kind", "ascending"), ("segment_base", "ascending"), ("log_offset", "ascending")]


def _decode(pdir: Path, compiled: bool, batch_rows: int) -> tuple[pa.Table, list[int]]:
    files = decode.find_segments("b", pdir.parent)
    with R.compiled_walk(compiled):
        batches = list(decode.decode_segments(files, batch_rows))
    table = pa.Table.from_batches(batches, schema=decode.ARROW_SCHEMA).sort_by(SORT)
    return table, [b.num_rows for b in batches if b.column("kind")[0].as_py() == "offset"]


def _both(tmp_path: Path, segs: list[tuple[int, bytearray]], batch_rows: int = 7) -> tuple[Any, Any]:
    pdir = tmp_path / "__consumer_offsets-3"
    logs.write(pdir, segs)
    return _decode(pdir, False, batch_rows), _decode(pdir, True, batch_rows)


def _assert_alike(ref: pa.Table, fast: pa.Table) -> None:
    assert ref.num_rows == fast.num_rows
    for name in ref.column_names:  # one column at a time: a failure names it
        assert ref[name].to_pylist() == fast[name].to_pylist(), name
    assert ref.equals(fast)


def test_the_install_built_the_compiled_rows() -> None:
    assert R.compiled_offset_rows() is not None, "protocol/_recwalk.pyx was not built"
    with R.compiled_walk(False):
        assert R.compiled_offset_rows() is None


@pytest.mark.parametrize("seed", range(60))
def test_generated_logs_decode_alike(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    (ref, _), (fast, _) = _both(tmp_path, logs.segments(rng, rng.randint(1, 60)), rng.choice((3, 7, 1000)))
    _assert_alike(ref, fast)
    assert ref.num_rows > 0


@pytest.mark.parametrize("seed", range(100))
def test_damaged_logs_decode_alike(tmp_path: Path, seed: int) -> None:
    rng = random.Random(20_000 + seed)
    segs = logs.segments(rng, rng.randint(1, 40))
    logs.damage(rng, segs)
    (ref, _), (fast, _) = _both(tmp_path, segs)
    _assert_alike(ref, fast)


def test_the_compiled_rows_run_and_keep_batches_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Plain batches go through the compiled rows (not the reference twice), an Arrow batch is
    handed out once ``batch_rows`` rows are held, and what the rows leave (a version-4 value)
    is made by the reference."""
    made: list[int] = []
    real = decode._CompiledRows.batch

    def spy(self: Any, *args: Any) -> pa.RecordBatch:
        b = real(self, *args)
        made.append(b.num_rows)
        return b

    monkeypatch.setattr(decode._CompiledRows, "batch", spy)
    key = OffsetCommitKey("g", "t", 0)
    blobs = [R.build_batch(i * 3, [encode_record(key, OffsetCommitValue(i, "", 1))] * 3, 1) for i in range(10)]
    v4 = schema.encode_offset_commit_value(OffsetCommitValue(99, "", 1), 4)
    blobs.append(R.build_batch(30, [(schema.encode_offset_commit_key(key), v4)], 1))
    (ref, _), (fast, sizes) = _both(tmp_path, [(0, bytearray(b"".join(blobs)))], batch_rows=8)
    _assert_alike(ref, fast)
    # three batches of 3 rows reach 8 or more: handed out, after the reference has read the next
    # batch (the 4th and the 8th); the rest at the end
    assert made == [9, 9, 6]
    assert sorted(sizes) == [6, 7, 9, 9]  # 7: the reference's rows (two batches, the version-4 row)
    assert fast.filter(pa.compute.equal(fast["kind"], "segment"))["records"].to_pylist() == [31]


def test_a_log_append_time_batch_stamps_every_row_with_its_max_timestamp(tmp_path: Path) -> None:
    key = OffsetCommitKey("g", "t", 0)
    recs = [R.Record(j, 1000 + j, *encode_record(key, OffsetCommitValue(j, "", 1))) for j in range(3)]
    blob = R.with_max_timestamp(R.encode_batch(recs), 5000, log_append_time=True)
    (ref, _), (fast, _) = _both(tmp_path, [(0, bytearray(blob))])
    _assert_alike(ref, fast)
    assert fast.filter(pa.compute.equal(fast["kind"], "offset"))["timestamp"].to_pylist() == [5000] * 3


def _mutations(rng: random.Random, raw: bytes) -> list[bytes]:
    out = [raw, raw + b"\x00", raw[: rng.randrange(len(raw) + 1)]]
    for _ in range(6):
        b = bytearray(raw)
        if b:
            b[rng.randrange(len(b))] = rng.getrandbits(8)
        out.append(bytes(b))
    return out


def _outcome(f: Any, data: bytes) -> Any:
    try:
        return f(data)
    except ValueError as e:
        return type(e), str(e)


@pytest.mark.parametrize("seed", range(40))
def test_the_direct_group_value_reader_reads_as_the_reference(seed: int) -> None:
    rng = random.Random(seed)
    for i in range(20):
        for data in _mutations(rng, logs.group_value(rng, i)):
            assert _outcome(schema.decode_group_metadata_value, data) == _outcome(
                schema._group_metadata_value_reference, data
            )


@pytest.mark.parametrize("seed", range(40))
def test_the_direct_assignment_reader_reads_as_the_reference(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(20):
        tps = tuple(
            cp.TopicPartitions(t, tuple(rng.sample(range(50), rng.randint(0, 5))))
            for t in ("a", "bé")[: rng.randint(0, 2)]
        )
        raw = cp.encode_assignment(cp.Assignment(rng.randint(0, 3), tps, rng.choice((None, b"", b"ud"))))
        for data in _mutations(rng, raw):
            assert _outcome(cp.decode_assignment, data) == _outcome(cp._assignment_reference, data)


def test_every_cut_short_key_and_value_decodes_as_the_reference(tmp_path: Path) -> None:
    """Each field's bounds: keys and values of every version cut at every length (a bad row from
    the reference, never a row read past the bytes)."""
    key = OffsetCommitKey("grp", "topic", 3)
    raw_key = schema.encode_offset_commit_key(key)
    entries: list[tuple[bytes | None, bytes | None]] = [(raw_key[:n], None) for n in range(2, len(raw_key))]
    for version in range(5):
        value = OffsetCommitValue(7, "meta", 11, 2, 13 if version == 1 else None)
        raw = schema.encode_offset_commit_value(value, version)
        entries += [(raw_key, raw[:n]) for n in range(len(raw) + 1)]
    blob = R.build_batch(0, entries, 1)
    (ref, _), (fast, _) = _both(tmp_path, [(0, bytearray(blob))], batch_rows=1000)
    _assert_alike(ref, fast)
    bad = ref.filter(pa.compute.equal(ref["kind"], "bad")).num_rows
    assert bad > 60 and ref.filter(pa.compute.equal(ref["kind"], "offset")).num_rows == len(entries) - bad


def test_member_payloads_decode_as_without_the_payload_caches(tmp_path: Path) -> None:
    """Within a segment, consumer-protocol payloads are decoded once per distinct payload: every
    member row equals the row made with empty caches (many members share payloads here)."""
    rng = random.Random(5)
    values = [logs.group_value(rng, i) for i in range(300)]
    key = schema.encode_group_metadata_key(schema.GroupMetadataKey("g"))
    logs.write(tmp_path / "__consumer_offsets-3", [(0, bytearray(R.build_batch(0, [(key, v) for v in values], 1)))])
    (table, _) = _decode(tmp_path / "__consumer_offsets-3", True, 1000)
    rows = {r["log_offset"]: r for r in table.to_pylist() if r["kind"] == "group"}
    checked = 0
    for offset, raw in enumerate(values):
        try:
            g = schema._group_metadata_value_reference(raw)
        except schema.OffsetsSchemaError:
            assert offset not in rows
            continue
        consumer = g.protocol_type == "consumer"
        expected = [decode._member_row(m, consumer, {}, {}) for m in g.members]
        assert rows[offset]["members"] == expected
        checked += len(expected) * consumer
    assert checked > 150
