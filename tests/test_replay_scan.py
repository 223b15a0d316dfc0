"""The compiled replay scan of ``__consumer_offsets`` segments (``scan_offsets_batches`` in
protocol/_recwalk.pyx, folded by ``StateBuilder`` in coordinator/storage/loader.py) against the
reference path (every batch read by ``SegmentReader`` and applied by ``StateBuilder.add``).

Each case writes the same partition directory twice and replays one copy each way: the state,
the segments, the repair report and the damage (or the error raised) must be equal.  The
generated logs mix what the scan takes (plain commits, tombstones, group records, KIP-848 and
share records, keys of versions 0 and 1 for one partition) with what it leaves to the reference
(transactional batches and their markers, compressed batches, records with headers or without
a key, keys that do not decode), and then damage them."""

from __future__ import annotations

import gzip
import random
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
from rallypoint.protocol import records as R
from rallypoint.protocol.offsets_schema import (
    GroupMetadataKey,
    GroupMetadataValue,
    OffsetCommitKey,
    OffsetCommitValue,
    encode_offset_commit_key,
    encode_record,
)
from rallypoint.storage.recovery import replay_partition
from rallypoint.storage.segments import CorruptLogError, segment_name

pytestmark = pytest.mark.unit

Entry = tuple[bytes | None, bytes | None]


def _commit(rng: random.Random, i: int) -> Entry:
    key = OffsetCommitKey(f"g{rng.randint(0, 3)}", rng.choice(("a", "b")), rng.randint(0, 4))
    if rng.random() < 0.1:
        return encode_record(key, None)
    raw_key, value = encode_record(key, OffsetCommitValue(i, rng.choice(("", "m")), 1_700_000_000_000 + i))
    if rng.random() < 0.01:  # the same key written as version 0: one key for the loader
        raw_key = encode_offset_commit_key(key, 0)
    return raw_key, value


def _entry(rng: random.Random, i: int) -> Entry:
    roll = rng.random()
    if roll < 0.6:
        return _commit(rng, i)
    if roll < 0.75:
        gkey = GroupMetadataKey(f"g{rng.randint(0, 3)}")
        if rng.random() < 0.2:
            return encode_record(gkey, None)
        return encode_record(gkey, GroupMetadataValue("consumer", i, "range", "m-1", i))
    if roll < 0.85:  # a KIP-848 (3-8, 16) or share-group record, or an unknown version
        version = rng.choice((3, 4, 5, 8, 16, 9, 99, -1))
        return struct.pack(">h", version) + bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 12))), (
            None if rng.random() < 0.2 else b"\x00\x01v%d" % i
        )
    if roll < 0.9:  # a value that does not decode: counted once, in the result
        key, _ = _commit(rng, i)
        return key, b"\x00\x03\x01"
    return _commit(rng, i)


def _odd_entry(rng: random.Random) -> Entry:
    """An entry the loader's reference path words: no key, a short key, a key that does not
    decode (a version-1 key whose group string runs past the key)."""
    return rng.choice(((None, b"x"), (b"\x00", b"x"), (b"\x00\x01\x00\x09ab", b"x"), (b"\x00\x02\x00", None)))


def _batch(rng: random.Random, base: int, pid_state: dict[int, int]) -> bytes:
    kind = rng.random()
    ts = 1_700_000_000_000 + base
    n = rng.randint(1, 5)
    if kind < 0.7:
        entries = [_entry(rng, base + j) for j in range(n)]
        if rng.random() < 0.05:
            entries[rng.randrange(n)] = _odd_entry(rng)
        return R.build_batch(base, entries, ts)
    recs = [R.Record(base + j, ts, *_entry(rng, base + j)) for j in range(n)]
    if kind < 0.8:  # a transactional batch of some producer
        pid = rng.randint(1, 3)
        pid_state[pid] = base
        return R.encode_batch(recs, base_offset=base, producer_id=pid, producer_epoch=0, transactional=True)
    if kind < 0.88 and pid_state:  # its marker
        pid = rng.choice(sorted(pid_state))
        del pid_state[pid]
        return R.end_txn_marker(base, ts, pid, 0, rng.random() < 0.7)
    if kind < 0.94:  # compressed
        h = R.parse_header(R.encode_batch(recs, base_offset=base))
        payload = gzip.compress(bytes(R.encode_records(recs, base, ts)))
        return R.assemble_batch(h._replace(attributes=h.attributes | 1), payload)
    # a record with a header
    recs[0] = recs[0]._replace(headers=(("h", b"v"),))
    return R.encode_batch(recs, base_offset=base)


def _segments(rng: random.Random, batches: int) -> list[tuple[int, bytearray]]:
    """Segments (base offset, bytes) of a generated log: gaps between batches sometimes (as after
    compaction), a new segment now and then."""
    segs: list[tuple[int, bytearray]] = [(0, bytearray())]
    offset = 0
    pid_state: dict[int, int] = {}
    for _ in range(batches):
        if rng.random() < 0.1:
            offset += rng.randint(1, 5)
        if rng.random() < 0.08 and segs[-1][1]:
            segs.append((offset, bytearray()))
        blob = _batch(rng, offset, pid_state)
        segs[-1][1].extend(blob)
        offset = R.parse_header(blob).next_offset
    return segs


def _damage(rng: random.Random, segs: list[tuple[int, bytearray]]) -> None:
    roll = rng.random()
    _, data = segs[rng.randrange(len(segs))]
    if roll < 0.3 and data:  # a flipped byte anywhere
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif roll < 0.5 and segs[-1][1]:  # a torn tail
        del segs[-1][1][rng.randrange(len(segs[-1][1])) :]
    elif roll < 0.6:  # zeros after the last batch
        segs[-1][1].extend(bytes(rng.randint(1, 100)))
    elif roll < 0.7 and data:  # a batch whose CRC is recomputed after a change in its records
        pos = 0
        while pos < len(data):
            h = R.read_header(data, pos, verify_crc=False)
            if rng.random() < 0.3 or h.end >= len(data):
                body = bytearray(data[pos + R.HEADER_SIZE : h.end])
                if body:
                    body[rng.randrange(len(body))] = rng.getrandbits(8)
                data[pos : h.end] = R.assemble_batch(h, bytes(body))
                break
            pos = h.end


def _write(pdir: Path, segs: list[tuple[int, bytearray]]) -> None:
    pdir.mkdir(parents=True)
    for base, data in segs:
        (pdir / segment_name(base)).write_bytes(bytes(data))


def _outcome(pdir: Path, compiled: bool, stop_at_damage: bool) -> Any:
    with R.compiled_walk(compiled):
        try:
            rp = replay_partition(pdir, 7, repair=True, stop_at_damage=stop_at_damage)
        except CorruptLogError as e:
            return ("error", str(e).replace(str(pdir), "<dir>"))
    files = sorted((p.name, p.read_bytes()) for p in pdir.iterdir())
    damage = None if rp.damage is None else str(rp.damage).replace(str(pdir), "<dir>")
    report = [(p.name, pos, n, why) for p, pos, n, why in rp.report.truncated]
    segments = [(s.base_offset, s.size, s.next_offset, s.batches) for s in rp.segments]
    order = (list(rp.state.offsets), list(rp.state.groups))  # dict order too: the groups load in it
    return rp.state, order, segments, report, damage, rp.bytes, files


def _both(tmp_path: Path, segs: list[tuple[int, bytearray]], stop_at_damage: bool = False) -> tuple[Any, Any]:
    ref, fast = tmp_path / "ref", tmp_path / "fast"
    for d in (ref, fast):
        shutil.rmtree(d, ignore_errors=True)
        _write(d, segs)
    return _outcome(ref, False, stop_at_damage), _outcome(fast, True, stop_at_damage)


def test_the_install_built_the_compiled_scan() -> None:
    assert R.compiled_offsets_scan() is not None, "protocol/_recwalk.pyx was not built"
    with R.compiled_walk(False):
        assert R.compiled_offsets_scan() is None


@pytest.mark.parametrize("seed", range(80))
def test_generated_logs_replay_alike(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    segs = _segments(rng, rng.randint(1, 60))
    ref, fast = _both(tmp_path, segs)
    assert ref == fast
    assert ref[0].records > 0


@pytest.mark.parametrize("seed", range(150))
def test_damaged_logs_replay_alike(tmp_path: Path, seed: int) -> None:
    rng = random.Random(10_000 + seed)
    segs = _segments(rng, rng.randint(1, 40))
    _damage(rng, segs)
    stop = rng.random() < 0.5
    ref, fast = _both(tmp_path, segs, stop_at_damage=stop)
    assert ref == fast


def test_the_scan_takes_plain_batches_and_leaves_the_rest(tmp_path: Path) -> None:
    """The fast path really runs (not the reference twice): the sink sees the plain batches."""
    from rallypoint.storage.loader import StateBuilder
    from rallypoint.storage.segments import recover_partition

    key = OffsetCommitKey("g", "t", 0)
    plain = [R.build_batch(i, [encode_record(key, OffsetCommitValue(i, "", 1))], 1) for i in range(3)]
    txn = R.encode_batch(
        [R.Record(3, 1, *encode_record(key, OffsetCommitValue(3, "", 1)))],
        producer_id=9,
        producer_epoch=0,
        transactional=True,
    )
    pdir = tmp_path / "p"
    _write(pdir, [(0, bytearray(b"".join(plain) + txn))])
    taken: list[int] = []

    class Spy(StateBuilder):
        def add(self, batch: R.RecordBatch) -> None:
            taken.append(len(self.last))  # what the scan put there before the reference batch
            super().add(batch)

    b = Spy()
    with R.compiled_walk(True):
        segs = recover_partition(pdir, on_batch=b.add, repair=False, fast=b)
    assert taken == [1]  # three plain batches, one raw key; then the transactional batch
    assert segs[0].batches == 4
    st = b.result()
    assert st.records == 4 and st.offsets[key].offset == 2 and st.pending[9][key].offset == 3


def test_keys_tombstoned_and_written_again_keep_the_reference_order(tmp_path: Path) -> None:
    a, b, c = (OffsetCommitKey("g", "t", p) for p in range(3))
    seq = [(a, 1), (b, 2), (a, None), (c, 3), (a, 4), (b, None), (b, 5), (c, 6)]
    blobs = [
        R.build_batch(i, [encode_record(k, None if v is None else OffsetCommitValue(v, "", 1))], 1)
        for i, (k, v) in enumerate(seq)
    ]
    txn = R.encode_batch(
        [R.Record(8, 1, *encode_record(c, OffsetCommitValue(9, "", 1)))],
        producer_id=3,
        producer_epoch=0,
        transactional=True,
    )
    more = R.build_batch(9, [encode_record(a, None), encode_record(a, OffsetCommitValue(10, "", 1))], 1)
    ref, fast = _both(tmp_path, [(0, bytearray(b"".join(blobs) + txn + more))])
    assert ref == fast
    assert fast[1][0] == [c, b, a]


def test_a_header_count_with_no_headers_after_it_is_left_to_the_reference(tmp_path: Path) -> None:
    """A record whose last byte claims a header (its CRC made to match): the reference refuses
    the batch, in the last segment and in a closed one."""
    entry = encode_record(OffsetCommitKey("g", "t", 0), OffsetCommitValue(5, "", 1))
    good = R.build_batch(0, [entry], 1)
    h = R.parse_header(good)
    body = bytearray(good[R.HEADER_SIZE :])
    assert body[-1] == 0
    body[-1] = 2  # one header, and nothing after it
    bad = R.assemble_batch(h._replace(base_offset=1), bytes(body))
    later = R.build_batch(5, [entry], 1)
    for segs in ([(0, bytearray(good + bad))], [(0, bytearray(good + bad)), (5, bytearray(later))]):
        ref, fast = _both(tmp_path, segs)
        assert ref == fast
        assert ref[0] == "error" and "bad header count 1" in ref[1]


def test_a_key_that_does_not_decode_is_replayed_by_the_reference(tmp_path: Path) -> None:
    """A version-1 key the scan takes whose group string runs past the key: the partition is
    replayed again by the reference, which counts it and names its offset."""
    good = encode_record(OffsetCommitKey("g", "t", 0), OffsetCommitValue(5, "", 1))
    bad = (b"\x00\x01\x00\x09ab", b"x")
    segs = [(0, bytearray(R.build_batch(0, [good, bad, good], 1)))]
    ref, fast = _both(tmp_path, segs)
    assert ref == fast
    st = fast[0]
    assert st.undecodable_records == 1 and st.first_error is not None and "offset 1" in st.first_error
    assert st.offsets[OffsetCommitKey("g", "t", 0)].offset == 5
