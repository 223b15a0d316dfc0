"""pipeline/decode.py without Spark: segments crafted with protocol/'s encoders.

The pipeline reads segments with the broker's own reader (coordinator/storage: SegmentReader, the
torn-tail rule); its verdicts on damaged segments must be the broker recovery's, and damage is
counted, never raised.
"""

from __future__ import annotations

import dataclasses
import os
import random
import struct
from pathlib import Path

import pyarrow as pa
import pytest
from rallypoint.pipeline import decode
from rallypoint.protocol import consumer_group_records as cgr
from rallypoint.protocol import offsets_schema as schema
from rallypoint.protocol import records as rec
from rallypoint.storage.recovery import replay_partition
from rallypoint.storage.segments import CorruptLogError

from tests.support import offsets_synth as synth

pytestmark = pytest.mark.unit


def rows(seg: decode.SegmentFile) -> list[dict[str, object]]:
    """Decoded rows in log order, the segment row last (batches come per kind of row)."""
    batches = list(decode.decode_segment(seg, batch_rows=4))
    assert all(b.schema == decode.ARROW_SCHEMA for b in batches)
    out = pa.Table.from_batches(batches, schema=decode.ARROW_SCHEMA).to_pylist()
    assert [r["kind"] for r in out].count("segment") == 1
    return sorted(out, key=lambda r: (r["kind"] == "segment", r["log_offset"]))


def only_segment(data_dir: Path, broker: str = "b") -> decode.SegmentFile:
    (seg,) = decode.find_segments(broker, data_dir)
    return seg


def test_find_segments_lists_only_kafka_segment_files(tmp_path: Path) -> None:
    w = synth.LogWriter(tmp_path, 2, segment_bytes=1)  # a new segment per batch
    for i in range(3):
        w.append(0, [synth.offset_entry("g", "t", 0, i)], 1000 + i)
    w.append(1, [synth.offset_entry("g", "t", 1, 9)], 2000)
    pdir = tmp_path / "__consumer_offsets-0"
    for junk in ("00000000000000000000.index", "00000000000000000000.log.cleaned", "0.log", "x.log"):
        (pdir / junk).write_bytes(b"junk")
    (tmp_path / "__consumer_offsets-x").mkdir()
    (tmp_path / "other-0").mkdir()
    segs = decode.find_segments("b1", tmp_path)
    assert [(s.log_partition, s.base_offset, s.is_last) for s in segs] == [
        (0, 0, False),
        (0, 1, False),
        (0, 2, True),
        (1, 0, True),
    ]
    assert all(s.broker == "b1" and Path(s.path).exists() and s.size == Path(s.path).stat().st_size for s in segs)
    assert decode.find_segments("b", tmp_path / "missing") == []


def test_every_record_kind_decodes(tmp_path: Path) -> None:
    w = synth.LogWriter(tmp_path, 1)
    a = synth.consumer_member("m-a", {"t": [0, 1]}, instance_id="inst-a")
    b = synth.consumer_member("m-b", {"t": [2]})
    w.append(
        0, [synth.offset_entry("g", "t", 0, 42, 1111), synth.offset_entry("g", "t", 1, 7, 1111, expire=9999)], 1111
    )
    w.append(0, [synth.group_entry("g", 3, [a, b], 1200)], 1200)
    w.append(0, [synth.offset_entry("g", "t", 0, None)], 1300)  # tombstone
    w.append(0, [(struct.pack(">h", 11) + b"share", b"\x00\x00")], 1400)  # a share-group key: skipped
    epoch_key, epoch_value = cgr.encode_record(cgr.GroupMetadataKey("cg"), cgr.GroupMetadataValue(7))
    member_key, _ = cgr.encode_record(cgr.CurrentMemberAssignmentKey("cg", "m-1"), None)
    w.append(0, [(epoch_key, epoch_value), (member_key, None)], 1450)  # KIP-848 records
    key = schema.encode_key(schema.OffsetCommitKey("g", "t", 3))
    w.append(0, [(key, b"\x00\x03\x00")], 1500)  # value cut short: undecodable
    w.append(0, [(synth.control_key(True), synth.CONTROL_VALUE)], 1600, producer_id=5, transactional=True, control=True)
    out = rows(only_segment(tmp_path))
    kinds = [r["kind"] for r in out]
    assert kinds == ["offset", "offset", "group", "offset", "other", "consumer", "consumer", "bad", "marker", "segment"]
    c0, c1, g, tomb, other, epoch, member, bad, marker, seg = out
    assert (epoch["record_type"], epoch["group"], epoch["generation"], epoch["tombstone"]) == (
        "consumer_group_metadata",
        "cg",
        7,
        False,
    )
    assert (member["record_type"], member["member_id"], member["generation"], member["tombstone"]) == (
        "consumer_group_current_member_assignment",
        "m-1",
        None,
        True,
    )
    assert (c0["group"], c0["topic"], c0["partition"], c0["offset"], c0["commit_timestamp"]) == ("g", "t", 0, 42, 1111)
    assert (c0["value_version"], c0["expire_timestamp"], c0["key_version"]) == (3, None, 1)
    assert (c1["value_version"], c1["expire_timestamp"]) == (1, 9999)
    assert (c0["log_offset"], c1["log_offset"], c1["batch_offset"]) == (0, 1, 0)
    assert (g["generation"], g["protocol_type"], g["protocol"], g["leader"]) == (3, "consumer", "range", "m-a")
    ma, mb = g["members"]
    assert (ma["member_id"], ma["group_instance_id"], mb["group_instance_id"]) == ("m-a", "inst-a", None)
    assert ma["assigned"] == [{"topic": "t", "partitions": [0, 1]}] and ma["assigned_partitions"] == 2
    assert mb["subscribed_topics"] == ["t"] and mb["protocol_error"] is None
    assert tomb["tombstone"] and tomb["offset"] is None and tomb["value_version"] is None
    assert other["key_version"] == 11
    assert "truncated" in bad["error"] or "need" in bad["error"]
    assert (marker["control_type"], marker["producer_id"], marker["transactional"]) == (1, 5, True)
    assert seg["status"] == "ok" and seg["error"] is None
    assert (seg["batches"], seg["records"], seg["bad_records"], seg["other_records"]) == (7, 9, 1, 1)
    assert seg["valid_bytes"] == seg["size_bytes"] == os.path.getsize(seg["path"])
    assert (seg["first_offset"], seg["last_offset"]) == (0, 8)


def test_members_with_bad_consumer_protocol_bytes_are_flagged(tmp_path: Path) -> None:
    w = synth.LogWriter(tmp_path, 1)
    ok = synth.consumer_member("ok", {"t": [0]})
    empty = synth.consumer_member("empty", None)
    junk = schema.MemberMetadata("junk", None, "c", "h", 1, 1, b"\xff", b"\x00\x00\x00")
    w.append(0, [synth.group_entry("g", 1, [ok, empty, junk])], 1)
    connect = schema.MemberMetadata("w", None, "c", "h", 1, 1, b"opaque", b"opaque")
    w.append(0, [synth.group_entry("c", 1, [connect], protocol_type="connect", protocol="default")], 2)
    out = rows(only_segment(tmp_path))
    members = {m["member_id"]: m for r in out if r["kind"] == "group" for m in r["members"]}
    assert members["ok"]["protocol_error"] is None
    assert members["empty"]["protocol_error"] == "assignment: empty"
    assert "subscription" in members["junk"]["protocol_error"] and "assignment" in members["junk"]["protocol_error"]
    # not the consumer protocol: bytes are not interpreted
    assert members["w"]["protocol_error"] is None and members["w"]["assigned"] is None
    assert members["w"]["assignment_bytes"] == 6


def _log_with_three_batches(tmp_path: Path) -> tuple[decode.SegmentFile, list[int]]:
    w = synth.LogWriter(tmp_path, 1)
    ends = []
    for i in range(3):
        w.append(0, [synth.offset_entry("g", "t", 0, i), synth.offset_entry("g", "t", 1, i)], 100 + i)
        ends.append(os.path.getsize(tmp_path / "__consumer_offsets-0" / "00000000000000000000.log"))
    return only_segment(tmp_path), ends


def test_torn_tail_is_counted_not_raised(tmp_path: Path) -> None:
    seg, ends = _log_with_three_batches(tmp_path)
    synth.tear_tail(Path(seg.path), 5)
    seg = only_segment(tmp_path)
    out = rows(seg)
    s = out[-1]
    assert s["status"] == "torn" and "needs" in s["error"]
    assert (s["batches"], s["records"], s["valid_bytes"], s["size_bytes"]) == (2, 4, ends[1], ends[2] - 5)
    assert [r["offset"] for r in out if r["kind"] == "offset"] == [0, 0, 1, 1]


def test_bad_crc_in_the_middle_is_corrupt_and_stops_the_segment(tmp_path: Path) -> None:
    seg, ends = _log_with_three_batches(tmp_path)
    synth.flip_byte(Path(seg.path), ends[0] + 70)  # inside the second batch's records
    s = rows(seg)[-1]
    assert s["status"] == "corrupt" and "CRC mismatch" in s["error"]
    assert (s["batches"], s["records"], s["valid_bytes"]) == (1, 2, ends[0])


def test_bad_crc_in_the_final_batch_of_the_last_segment_is_a_torn_tail(tmp_path: Path) -> None:
    # What the broker's recovery truncates instead of refusing to start: a final batch failing its
    # CRC that ends exactly at the end of the file (a write cut short inside a page).
    seg, ends = _log_with_three_batches(tmp_path)
    synth.flip_byte(Path(seg.path), ends[2] - 1)
    assert rows(seg)[-1]["status"] == "torn"
    closed = decode.SegmentFile(seg.broker, seg.log_partition, seg.base_offset, seg.path, seg.size, False)
    assert rows(closed)[-1]["status"] == "corrupt"  # in an older segment it is corruption


def test_zero_bytes_after_the_last_batch_are_a_torn_tail(tmp_path: Path) -> None:
    seg, ends = _log_with_three_batches(tmp_path)
    with open(seg.path, "ab") as f:
        f.write(b"\x00" * 100)
    s = rows(only_segment(tmp_path))[-1]
    assert (s["status"], s["batches"], s["valid_bytes"]) == ("torn", 3, ends[2])


def test_unreadable_and_unsupported_segments_are_counted(tmp_path: Path) -> None:
    _log_with_three_batches(tmp_path)
    gone = decode.SegmentFile("b", 0, 99, str(tmp_path / "vanished.log"), 10, True)
    s = rows(gone)[-1]
    assert s["status"] == "unreadable" and "FileNotFoundError" in s["error"]
    # a magic v1 message set: valid once, but not a v2 batch
    v1 = tmp_path / "v1.log"
    v1.write_bytes(struct.pack(">qi", 0, 30) + b"\x00\x00\x00\x00\x01" + b"\x00" * 25)
    s = rows(decode.SegmentFile("b", 0, 0, str(v1), v1.stat().st_size, True))[-1]
    assert s["status"] == "unsupported"


def test_bins_balance_by_size() -> None:
    files = [decode.SegmentFile("b", 0, i, f"/f{i}", size, False) for i, size in enumerate([50, 40, 30, 30, 20, 10])]
    bins = decode.bin_files(files, 3)
    assert sorted(sum(f.size for f in b) for b in bins) == [60, 60, 60]
    assert sorted(f.path for b in bins for f in b) == sorted(f.path for f in files)
    assert len(decode.bin_files(files[:2], 8)) == 2 and decode.bin_files([], 4) == []


def _broker_load(data_dir: Path) -> dict[tuple[int, str, str, int], int]:
    """Committed offsets as the broker's own recovery + loader rebuild them."""
    out = {}
    for pdir in sorted(data_dir.glob("__consumer_offsets-*")):
        n = int(pdir.name.rsplit("-", 1)[1])
        st = replay_partition(pdir, n, repair=False).state
        out.update({(n, k.group, k.topic, k.partition): v.offset for k, v in st.offsets.items()})
    return out


def test_transaction_edge_cases_follow_kafkas_loader(tmp_path: Path) -> None:
    """GroupMetadataManager.doLoadGroupsAndOffsets: staged per producer, promoted at COMMIT only if
    newer (by batch offset) than what is loaded; a staged tombstone only un-stages."""
    w = synth.LogWriter(tmp_path, 1)
    off = synth.offset_entry

    def marker(pid: int, commit: bool) -> None:
        w.append(
            0, [(synth.control_key(commit), synth.CONTROL_VALUE)], 1, producer_id=pid, transactional=True, control=True
        )

    # k1: staged, then a plain tombstone, then COMMIT -> the staged offset is loaded (key absent)
    w.append(0, [off("g", "k1", 0, 11)], 1, producer_id=7, transactional=True)
    w.append(0, [off("g", "k1", 0, None)], 1)
    marker(7, True)
    # k2: staged, then a newer plain commit, then COMMIT -> the plain one stays (newer batch)
    w.append(0, [off("g", "k2", 0, 21)], 1, producer_id=8, transactional=True)
    w.append(0, [off("g", "k2", 0, 22)], 1)
    marker(8, True)
    # k3: plain, staged, ABORT -> plain
    w.append(0, [off("g", "k3", 0, 31)], 1)
    w.append(0, [off("g", "k3", 0, 32)], 1, producer_id=9, transactional=True)
    marker(9, False)
    # k4: plain, staged, staged tombstone, COMMIT -> plain (the tombstone only un-staged)
    w.append(0, [off("g", "k4", 0, 41)], 1)
    w.append(0, [off("g", "k4", 0, 42)], 1, producer_id=10, transactional=True)
    w.append(0, [off("g", "k4", 0, None)], 1, producer_id=10, transactional=True)
    marker(10, True)
    # k5: plain, staged without a marker -> plain
    w.append(0, [off("g", "k5", 0, 51)], 1)
    w.append(0, [off("g", "k5", 0, 52)], 1, producer_id=11, transactional=True)
    # k6: plain, staged, COMMIT -> staged (newer)
    w.append(0, [off("g", "k6", 0, 61)], 1)
    w.append(0, [off("g", "k6", 0, 62)], 1, producer_id=12, transactional=True)
    marker(12, True)
    expected = {(0, "g", f"k{i}", 0): v for i, v in ((1, 11), (2, 22), (3, 31), (4, 41), (5, 51), (6, 62))}
    assert _broker_load(tmp_path) == expected


def test_decode_never_raises_on_random_damage(tmp_path: Path) -> None:
    import random

    synth.generate(tmp_path, synth.SynthConfig(seed=5, events=120, log_partitions=1, segment_bytes=1 << 20))
    seg = only_segment(tmp_path)
    pristine = Path(seg.path).read_bytes()
    rng = random.Random(7)
    statuses = set()
    for _ in range(40):
        data = bytearray(pristine)
        for _ in range(rng.randint(1, 3)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        if rng.random() < 0.3:
            del data[rng.randrange(len(data)) :]
        Path(seg.path).write_bytes(bytes(data))
        s = rows(decode.SegmentFile("b", 0, 0, seg.path, len(data), True))[-1]
        statuses.add(s["status"])
        assert s["valid_bytes"] <= len(data)
    assert statuses & {"corrupt", "torn"}


def test_a_final_batch_with_a_good_crc_but_bad_records_is_corrupt(tmp_path: Path) -> None:
    """Not a torn write (the CRC matches): the broker refuses it, so it is corruption."""
    seg, ends = _log_with_three_batches(tmp_path)
    data = Path(seg.path).read_bytes()
    last = ends[1]
    h = rec.read_header(data, last)
    liar = rec.assemble_batch(h._replace(record_count=h.record_count + 1), data[last + rec.HEADER_SIZE :])
    Path(seg.path).write_bytes(data[:last] + liar)  # one record more than there is, a good CRC
    s = rows(seg)[-1]
    assert (s["status"], s["batches"]) == ("corrupt", 2)
    with pytest.raises(CorruptLogError):
        replay_partition(tmp_path / "__consumer_offsets-0", 0, repair=False)


def _damage(rng: random.Random, segs: list[Path]) -> str:
    how = rng.choice(["flip", "flip-offset", "cut", "zeros", "garbage"])
    last = segs[-1]
    if how == "flip":
        p = rng.choice(segs)
        synth.flip_byte(p, rng.randrange(p.stat().st_size))
    elif how == "flip-offset":  # inside a batch's base offset: not covered by its CRC
        p = rng.choice(segs)
        starts = [h.position for h in rec.scan_batches(p.read_bytes())]
        synth.flip_byte(p, rng.choice(starts) + rng.randrange(4, 8))
    elif how == "cut":
        synth.tear_tail(last, rng.randrange(1, 200))
    elif how == "zeros":
        with open(last, "ab") as f:
            f.write(b"\x00" * rng.randrange(1, 300))
    else:
        with open(last, "ab") as f:
            f.write(rng.randbytes(rng.randrange(1, 300)))
    return how


@pytest.mark.parametrize("seed", range(40))
def test_damage_verdicts_match_the_broker_recovery(tmp_path: Path, seed: int) -> None:
    """torn <=> the broker truncates and starts; corrupt/unsupported <=> it refuses to start."""
    rng = random.Random(seed)
    synth.generate(tmp_path, synth.SynthConfig(seed=seed, events=150, log_partitions=1, segment_bytes=4096))
    pdir = tmp_path / "__consumer_offsets-0"
    segs = sorted(pdir.glob("*.log"))
    assert len(segs) >= 2
    how = _damage(rng, segs)
    files = decode.find_segments("b", tmp_path)
    statuses = [r["status"] for r in decode.check_order([rows(f)[-1] for f in files])]
    try:
        rp = replay_partition(pdir, 0, repair=False)
    except CorruptLogError:
        assert set(statuses) & {"corrupt", "unsupported"}, (how, statuses)
        return
    assert not set(statuses) & {"corrupt", "unsupported", "unreadable"}, (how, statuses)
    assert ("torn" in statuses) == bool(rp.report.truncated), (how, statuses, rp.report.truncated)


def test_the_staging_writer_writes_each_bin_once_as_the_decoder_decodes_it(tmp_path: Path) -> None:
    # The Spark tasks' side of the decode stage (pipeline/README.md, "How it runs"), without a JVM.
    import pyarrow.parquet as pq

    synth.generate(tmp_path / "in", synth.SynthConfig(seed=3, events=150, log_partitions=2, segment_bytes=4096))
    files = decode.find_segments("b", tmp_path / "in")
    bins = decode.bin_files(files, bins=3)
    assert len(bins) == 3
    staging = tmp_path / "staging"
    staging.mkdir()
    batch = pa.RecordBatch.from_pylist([{"id": i} for i in range(3)], schema=pa.schema([("id", pa.int64())]))
    write = decode.staging_writer(str(staging), [[dataclasses.asdict(f) for f in b] for b in bins])
    for _ in range(2):  # a task run again rewrites its file
        answers = pa.Table.from_batches(list(write([batch])), schema=decode.STAGED_ARROW).to_pylist()
        assert sorted(os.listdir(staging)) == [f"part-0000{i}.parquet" for i in range(3)]  # no temporary file left
    written = pa.concat_tables(pq.read_table(staging / name) for name in sorted(os.listdir(staging)))
    assert written.schema == decode.ARROW_SCHEMA
    expected = pa.Table.from_batches(list(decode.decode_segments(files)), schema=decode.ARROW_SCHEMA)
    assert sorted(map(repr, written.to_pylist())) == sorted(map(repr, expected.to_pylist()))
    assert sorted((a["bin"], a["rows"]) for a in answers) == [
        (i, sum(b.num_rows for b in decode.decode_segments(bins[i]))) for i in range(3)
    ]
