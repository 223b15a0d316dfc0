"""Property: the state rebuilt from a compacted log equals the state from the uncompacted log
(docs/offsets-log-format.md, "Tombstones and compaction"), for random sequences of commits,
group metadata, tombstones, transactional commits with COMMIT/ABORT markers, segment rolls, time
passing and cleaning passes.

Two copies of one partition directory receive the same batches; only one is cleaned (any
number of times, at any point).  Both are replayed with the recovery code at the end."""

from __future__ import annotations

import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rallypoint.protocol.offsets_schema import (
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadata,
    OffsetCommitKey,
    OffsetCommitValue,
    encode_record,
)
from rallypoint.protocol.records import Record, encode_batch, iter_file_batches
from rallypoint.storage.cleaner import clean_partition
from rallypoint.storage.loader import rebuild
from rallypoint.storage.recovery import replay_partition
from rallypoint.storage.segments import recover_partition, segment_name

pytestmark = pytest.mark.unit

RETENTION = 1000
GROUPS = ("a", "b", "c")

commit_op = st.tuples(st.just("commit"), st.sampled_from(GROUPS), st.integers(0, 2), st.integers(0, 10**6))
meta_op = st.tuples(st.just("meta"), st.sampled_from(GROUPS), st.integers(0, 50), st.integers(0, 2))
otomb_op = st.tuples(st.just("otomb"), st.sampled_from(GROUPS), st.integers(0, 2))
gtomb_op = st.tuples(st.just("gtomb"), st.sampled_from(GROUPS))
multi_op = st.tuples(
    st.just("multi"),
    st.lists(st.tuples(st.sampled_from(GROUPS), st.integers(0, 2), st.integers(0, 99)), min_size=1, max_size=4),
)
txn_op = st.tuples(
    st.just("txn"),
    st.integers(1, 2),
    st.lists(st.tuples(st.sampled_from(GROUPS), st.integers(0, 2), st.integers(0, 99)), min_size=1, max_size=3),
)
marker_op = st.tuples(st.just("marker"), st.integers(1, 2), st.booleans())
advance_op = st.tuples(st.just("advance"), st.integers(0, 2 * RETENTION))
roll_op = st.tuples(st.just("roll"))
clean_op = st.tuples(st.just("clean"), st.sampled_from([200, 1000, 100_000]))

plain_ops = st.one_of(commit_op, meta_op, otomb_op, gtomb_op, multi_op, advance_op, roll_op, clean_op)
all_ops = st.one_of(plain_ops, txn_op, marker_op)


def _group(gen: int, members: int) -> GroupMetadataValue:
    ms = tuple(MemberMetadata(f"m{i}", None, "c", "/h", 10, 10, b"s", b"a" * i) for i in range(members))
    return GroupMetadataValue("consumer" if ms else "", gen, "range" if ms else None, "m0" if ms else None, gen, ms)


class TwoLogs:
    def __init__(self, root: Path) -> None:
        self.plain = root / "plain" / "__consumer_offsets-0"
        self.cleaned = root / "cleaned" / "__consumer_offsets-0"
        self.plain.mkdir(parents=True)
        self.cleaned.mkdir(parents=True)
        self.next_offset = 0
        self.now = 1_000_000
        self.active = segment_name(0)
        self.cleanings = 0

    def write(self, records: list[tuple[bytes, bytes | None]], **kw: object) -> None:
        recs = [Record(self.next_offset + i, self.now, k, v) for i, (k, v) in enumerate(records)]
        blob = encode_batch(recs, **kw)  # type: ignore[arg-type]
        self.next_offset += len(records)
        for d in (self.plain, self.cleaned):
            with open(d / self.active, "ab") as f:
                f.write(blob)

    def roll(self) -> None:
        self.active = segment_name(self.next_offset)

    def clean(self, segment_bytes: int) -> None:
        segs = recover_partition(self.cleaned, repair=False)
        if len(segs) < 2:
            return
        clean_partition(
            self.cleaned,
            segs[:-1],
            segs[-1],
            now_ms=self.now,
            delete_retention_ms=RETENTION,
            segment_bytes=segment_bytes,
        )
        self.cleanings += 1

    def apply(self, op: tuple) -> None:  # type: ignore[type-arg]
        kind = op[0]
        if kind == "commit":
            _, g, p, off = op
            self.write([encode_record(OffsetCommitKey(g, "t", p), OffsetCommitValue(off, "", self.now))])
        elif kind == "multi":
            self.write(
                [encode_record(OffsetCommitKey(g, "t", p), OffsetCommitValue(o, "", self.now)) for g, p, o in op[1]]
            )
        elif kind == "meta":
            _, g, gen, n = op
            self.write([encode_record(GroupMetadataKey(g), _group(gen, n))])
        elif kind == "otomb":
            _, g, p = op
            self.write([encode_record(OffsetCommitKey(g, "t", p), None)])
        elif kind == "gtomb":
            self.write([encode_record(GroupMetadataKey(op[1]), None)])
        elif kind == "txn":
            _, pid, commits = op
            recs = [
                encode_record(OffsetCommitKey(g, "t", p), OffsetCommitValue(o, "txn", self.now)) for g, p, o in commits
            ]
            self.write(recs, producer_id=pid, producer_epoch=0, transactional=True)  # type: ignore[arg-type]
        elif kind == "marker":
            _, pid, commit = op
            key = struct.pack(">hh", 0, 1 if commit else 0)
            self.write(
                [(key, struct.pack(">hi", 0, 0))], producer_id=pid, producer_epoch=0, transactional=True, control=True
            )
        elif kind == "advance":
            self.now += op[1]
        elif kind == "roll":
            self.roll()
        elif kind == "clean":
            self.clean(op[1])

    def check(self) -> None:
        self.roll()
        self.write([encode_record(GroupMetadataKey("zz-last"), _group(1, 0))])  # the active segment
        self.clean(1000)
        want = replay_partition(self.plain, 0, repair=False)
        got = replay_partition(self.cleaned, 0, repair=False)
        assert got.state.offsets == want.state.offsets
        assert got.state.groups == want.state.groups
        assert got.state.dropped_pending == want.state.dropped_pending
        assert got.bytes <= want.bytes
        # offsets and timestamps of kept records are those written
        written = {r.offset: r for p in sorted(self.plain.iterdir()) for b in iter_file_batches(p) for r in b.records}
        for p in sorted(self.cleaned.iterdir()):
            for b in iter_file_batches(p):
                for r in b.records:
                    assert written[r.offset] == r


def _run(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    with tempfile.TemporaryDirectory() as tmp:
        logs = TwoLogs(Path(tmp))
        for op in ops:
            logs.apply(op)
        logs.check()


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(plain_ops, max_size=60))
def test_compacted_state_equals_uncompacted_state(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    _run(ops)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(all_ops, max_size=60))
def test_compacted_state_equals_uncompacted_state_with_transactions(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    _run(ops)


def test_transactional_promotion_uses_batch_offsets_after_compaction() -> None:
    """A committed transactional offset does not replace a newer normal commit (olderThan),
    also after the cleaner dropped unrelated records around them."""
    ops: list[tuple] = [  # type: ignore[type-arg]
        ("commit", "a", 0, 1),
        ("txn", 1, [("a", 1, 50)]),  # staged at offset 1
        ("commit", "a", 1, 7),  # normal commit at offset 2, newer than the staged one
        ("commit", "a", 0, 2),  # supersedes offset 0
        ("marker", 1, True),  # COMMIT: the staged offset is older than offset 2 → ignored
        ("roll",),
        ("clean", 100_000),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        logs = TwoLogs(Path(tmp))
        for op in ops:
            logs.apply(op)
        logs.check()
        st_ = replay_partition(logs.cleaned, 0, repair=False).state
        assert st_.offsets[OffsetCommitKey("a", "t", 1)].offset == 7


def test_rebuild_is_last_record_per_key_with_tombstones() -> None:
    k = OffsetCommitKey("g", "t", 0)
    batches = []
    for i, (key, value) in enumerate(
        [
            (k, OffsetCommitValue(1, "", 0)),
            (GroupMetadataKey("g"), _group(1, 1)),
            (k, OffsetCommitValue(2, "", 0)),
            (GroupMetadataKey("g"), None),
            (OffsetCommitKey("g", "t", 1), OffsetCommitValue(3, "", 0)),
            (OffsetCommitKey("g", "t", 1), None),
        ]
    ):
        kb, vb = encode_record(key, value)
        batches += list(iter_file_batches_from_bytes(encode_batch([Record(i, 0, kb, vb)])))
    unknown = encode_batch([Record(10, 0, struct.pack(">h", 5) + b"\x00\x01x", b"\x00\x00")])
    batches += list(iter_file_batches_from_bytes(unknown))
    st_ = rebuild(batches)
    assert st_.offsets == {k: OffsetCommitValue(2, "", 0)}
    assert st_.groups == {}
    assert st_.unknown_records == 1


def iter_file_batches_from_bytes(raw: bytes):  # type: ignore[no-untyped-def]
    from rallypoint.protocol.records import iter_batches

    return iter_batches(raw)


def test_old_tombstone_of_a_transactional_key_is_kept() -> None:
    """A tombstone that deletes a transactionally committed offset must outlive the retention:
    without it the transactional record (copied unchanged) would come back at load."""
    ops: list[tuple] = [  # type: ignore[type-arg]
        ("txn", 1, [("a", 0, 5)]),
        ("marker", 1, True),
        ("otomb", "a", 0),
        ("advance", 10 * RETENTION),
        ("roll",),
        ("clean", 100_000),
    ]
    _run(ops)
