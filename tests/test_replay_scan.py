"""The compiled replay scan of ``__consumer_offsets`` segments (``scan_offsets_batches`` in
protocol/_recwalk.pyx, folded by ``StateBuilder`` in coordinator/storage/loader.py) against the
reference path (every batch read by ``SegmentReader`` and applied by ``StateBuilder.add``).

Each case writes the same partition directory twice and replays one copy each way: the state,
the segments, the repair report and the damage (or the error raised) must be equal.  The
generated logs mix what the scan takes (plain commits, tombstones, group records, KIP-848 and
share records, keys of versions 0 and 1 for one partition) with what it leaves to the reference
(transactional batches and their markers, compressed batches, records with headers or without
a key, keys that do not decode), and then damage them (tests/support/generated_logs.py)."""

from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any

import pytest
from rallypoint.protocol import records as R
from rallypoint.protocol.offsets_schema import (
    OffsetCommitKey,
    OffsetCommitValue,
    encode_record,
)
from rallypoint.storage.recovery import replay_partition
from rallypoint.storage.segments import CorruptLogError

from tests.support import generated_logs as logs

pytestmark = pytest.mark.unit


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
        logs.write(d, segs)
    return _outcome(ref, False, stop_at_damage), _outcome(fast, True, stop_at_damage)


def test_the_install_built_the_compiled_scan() -> None:
    assert R.compiled_offsets_scan() is not None, "protocol/_recwalk.pyx was not built"
    with R.compiled_walk(False):
        assert R.compiled_offsets_scan() is None


@pytest.mark.parametrize("seed", range(80))
def test_generated_logs_replay_alike(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    segs = logs.segments(rng, rng.randint(1, 60))
    ref, fast = _both(tmp_path, segs)
    assert ref == fast
    assert ref[0].records > 0


@pytest.mark.parametrize("seed", range(150))
def test_damaged_logs_replay_alike(tmp_path: Path, seed: int) -> None:
    rng = random.Random(10_000 + seed)
    segs = logs.segments(rng, rng.randint(1, 40))
    logs.damage(rng, segs)
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
    logs.write(pdir, [(0, bytearray(b"".join(plain) + txn))])
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


def test_a_commit_marker_among_unfolded_records_applies_as_the_reference(tmp_path: Path) -> None:
    """A COMMIT marker met while the scan's records wait for their fold: each staged commit
    against the key's latest write -- unfolded or folded, older or newer, a tombstone -- and a
    version 0 form of a staged key (two raw keys: the reference replays the partition)."""
    k = [OffsetCommitKey("g", "t", p) for p in range(7)]

    def v(n: int) -> OffsetCommitValue:
        return OffsetCommitValue(n, "", 1)

    def plain(base: int, entries: list[tuple[bytes, bytes | None]]) -> bytes:
        return R.build_batch(base, entries, 1)

    def txn(base: int, pid: int, keys: list[OffsetCommitKey]) -> bytes:
        recs = [R.Record(base + i, 1, *encode_record(key, v(100 + base + i))) for i, key in enumerate(keys)]
        return R.encode_batch(recs, producer_id=pid, producer_epoch=0, transactional=True)

    def case(raw_k6: bytes) -> tuple[Any, Any]:
        log = [
            plain(0, [encode_record(k[0], v(1)), encode_record(k[1], v(2)), encode_record(k[2], v(3))]),
            txn(3, 5, k[:6]),  # offsets 3..8, staged by producer 5 (a batch's commits count from its base)
            plain(9, [encode_record(k[3], v(5))]),  # newer than the staged k3, and folded next
            R.encode_batch([R.Record(10, 1, None, b"x")]),  # no key: the reference's, after a fold
            plain(11, [encode_record(k[1], v(4))]),  # unfolded and newer than the staged k1
            plain(12, [encode_record(k[2], None)]),  # an unfolded tombstone: the staged k2 applies
            plain(13, [(raw_k6, encode_record(k[6], v(6))[1])]),  # unfolded, older than producer 6's
            txn(14, 6, [k[6]]),
            R.end_txn_marker(15, 1, 5, 0, True),
            R.end_txn_marker(16, 1, 6, 0, True),
        ]
        return _both(tmp_path, [(0, bytearray(b"".join(log)))])

    expected = {k[0]: 103, k[1]: 4, k[2]: 105, k[3]: 5, k[4]: 107, k[5]: 108, k[6]: 114}
    ref, fast = case(encode_record(k[6], v(6))[0])
    assert ref == fast
    assert {key: val.offset for key, val in ref[0].offsets.items()} == expected
    from rallypoint.protocol.offsets_schema import encode_offset_commit_key

    ref, fast = case(encode_offset_commit_key(k[6], 0))  # k6 written as version 0 before its marker
    assert ref == fast
    assert {key: val.offset for key, val in ref[0].offsets.items()} == expected


@pytest.mark.parametrize("seed", range(4))
def test_the_compiled_key_and_value_readers_agree_with_offsets_schema(seed: int) -> None:
    """Keys and values as written, cut, flipped, given another version or bytes after them: the
    compiled readers answer only where protocol/offsets_schema.py reads the same thing."""
    from rallypoint.protocol.offsets_schema import (
        OffsetsSchemaError,
        decode_key,
        decode_offset_commit_value,
        encode_offset_commit_key,
        encode_offset_commit_value,
    )

    decoders = R.compiled_offsets_decoders()
    assert decoders is not None
    key_parts, value_parts = decoders
    rng = random.Random(seed)

    def mutants(good: bytes) -> list[bytes]:
        out = [good, good + b"\x00", good[:-1], good[: rng.randrange(len(good))], b"\x00\x02" + good[2:]]
        for _ in range(20):
            b = bytearray(good)
            b[rng.randrange(len(b))] = rng.choice((0x00, 0x01, 0x03, 0x7F, 0x80, 0xC3, 0xFF))
            out.append(bytes(b))
        return out

    answered = 0
    for i in range(60):
        group = rng.choice(("g", "grüppe", "", "x" * 300, "\u20ac"))
        key = OffsetCommitKey(group, rng.choice(("t", "töpic", "")), rng.choice((0, 7, -1, 2**31 - 1, -(2**31))))
        for raw in mutants(encode_offset_commit_key(key, i % 2)):
            got = key_parts(raw)
            if got is None:
                continue
            answered += 1
            ref = decode_key(raw)
            assert ref == OffsetCommitKey(got[0], got[1], got[2])
            assert got[3] == (encode_offset_commit_key(ref) == raw)
        value = OffsetCommitValue(rng.choice((0, -1, 2**62)), rng.choice(("", "m", "mëta")), i, rng.choice((-1, 5)))
        for raw in mutants(encode_offset_commit_value(value, rng.choice((3, 3, 1, 4)))):
            vgot = value_parts(raw)
            if vgot is None:
                continue
            answered += 1
            try:
                vref = decode_offset_commit_value(raw)
            except OffsetsSchemaError as e:
                raise AssertionError(f"compiled read {raw!r}, the reference refuses it: {e}") from None
            assert vref == OffsetCommitValue(vgot[0], vgot[1], vgot[2], vgot[3])
    assert answered > 500


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


def _apply_in_turn(last: dict[bytes, Any], records: list[tuple[int, bytes, bytes | None]]) -> None:
    """The scan's contract applied one record at a time (its docstring): what ``last`` must hold."""
    for base, key, value in records:
        prev = last.get(key)
        if value is None:
            last.pop(key, None)
            last[key] = (base, None, True)
        elif prev is None:
            last[key] = (base, value, False)
        elif prev[1] is None:
            del last[key]
            last[key] = (base, value, True)
        else:
            last[key] = (base, value, prev[2])


@pytest.mark.parametrize("seed", range(60))
def test_the_scan_leaves_last_as_records_applied_in_turn(seed: int) -> None:
    """Keys written, tombstoned and written again over several batches, on top of a ``last``
    that already holds some of them (a value or a tombstone, reset or not, from an earlier scan
    not folded yet): each key's entry and the keys' order are those of applying every record in
    turn, though only each key's last record makes objects."""
    scan = R.compiled_offsets_scan()
    assert scan is not None
    rng = random.Random(seed)
    keys = [encode_record(OffsetCommitKey("g", "t", p), None)[0] for p in range(rng.randrange(1, 12))]
    before: dict[bytes, Any] = {}
    for key in rng.sample(keys, rng.randrange(len(keys) + 1)):
        before[key] = (rng.randrange(100), rng.choice([None, b"old"]), rng.random() < 0.5)
    applied: list[tuple[int, bytes, bytes | None]] = []
    batches = []
    offset = 100
    for _ in range(rng.randrange(1, 30)):
        entries = []
        for _ in range(rng.randrange(1, 5)):
            key = rng.choice(keys)
            value = None if rng.random() < 0.3 else bytes([rng.randrange(256)]) * rng.randrange(1, 9)
            entries.append((key, value))
            applied.append((offset, key, value))
        batches.append(R.build_batch(offset, entries, 1))
        offset += len(entries)
    segment = b"".join(batches)
    expected = dict(before)
    _apply_in_turn(expected, applied)
    got = dict(before)
    others: list[Any] = []
    pos, after, taken, records = scan(segment, 0, 100, got, others, R.crc32c)
    assert (pos, after, taken, records) == (len(segment), offset, len(batches), len(applied))
    assert others == []
    assert list(got.items()) == list(expected.items())
