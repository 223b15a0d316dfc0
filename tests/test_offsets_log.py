"""The offsets log component: durable group-committed appends, restart, recovery (torn tail,
CRC corruption), segment rolls, compaction (and its crash safety), errors, and files that
independent Kafka record readers accept."""

from __future__ import annotations

import asyncio
import errno
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiokafka.record as aiorecord
import kafka.record as kprecord
import pytest
from rallypoint.clock import FakeClock
from rallypoint.protocol.offsets_schema import (
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadata,
    OffsetCommitKey,
    OffsetCommitValue,
    decode_key,
    decode_value,
    partition_for,
)
from rallypoint.protocol.records import iter_file_batches
from rallypoint.storage import CorruptLogError, OffsetsLog
from rallypoint.storage import offsets_log as offsets_log_mod
from rallypoint.storage.errors import PersistError
from rallypoint.storage.recovery import PartitionCountError, replay_partition
from rallypoint.storage.segments import list_segments, partition_dir

from tests.support import async_wait_until
from tests.support.offsets_synth import old_partition_for, write_old_layout

pytestmark = pytest.mark.unit

DAY_MS = 86_400_000


class Loaded:
    """Collects what start() hands the groups runtime (contract item 2)."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.groups: dict[int, dict[str, GroupMetadataValue]] = {}
        self.offsets: dict[int, dict[OffsetCommitKey, OffsetCommitValue]] = {}

    def __call__(
        self, partition: int, groups: Mapping[str, GroupMetadataValue], offsets: Mapping[OffsetCommitKey, Any]
    ) -> None:
        self.calls.append(partition)
        self.groups[partition] = dict(groups)
        self.offsets[partition] = dict(offsets)


def make_log(data: Path, loaded: Loaded | None = None, **kw: Any) -> OffsetsLog:
    kw.setdefault("num_partitions", 3)
    kw.setdefault("cleaner", False)
    kw.setdefault("clock", FakeClock())
    return OffsetsLog(data, loader=loaded, **kw)


def commit(group: str, topic: str, partition: int, offset: int, ts: int = 1000) -> tuple[OffsetCommitKey, Any]:
    return OffsetCommitKey(group, topic, partition), OffsetCommitValue(offset, f"m{offset}", ts)


def group_value(gen: int, members: int = 1) -> GroupMetadataValue:
    ms = tuple(
        MemberMetadata(f"member-{i}", None, "client", "/127.0.0.1", 300000, 10000, b"sub" * i, b"asg" * i)
        for i in range(members)
    )
    return GroupMetadataValue("consumer", gen, "range" if ms else None, ms[0].member_id if ms else None, 5, ms)


async def test_append_then_restart_loads_every_partition(tmp_path: Path) -> None:
    # each group in its own partition (partition_for over 3 partitions): c → 0, a → 1, b → 2
    log = make_log(tmp_path)
    await log.start()
    await log.append(0, [commit("c", "t", 0, 5), commit("c", "t", 1, 7)])
    await log.append(0, [commit("c", "t", 0, 6)])
    await log.append(0, [(GroupMetadataKey("c"), group_value(3, members=2))])
    await log.append(1, [commit("a", "t", 0, 1)])
    await log.append(1, [(OffsetCommitKey("a", "t", 0), None)])  # offset tombstone
    await log.append(2, [(GroupMetadataKey("b"), group_value(1))])
    await log.append(2, [(GroupMetadataKey("b"), None)])  # group tombstone
    await log.append(2, [])  # nothing to write: no batch
    assert [log.next_offset(p) for p in range(3)] == [4, 2, 2]
    await log.stop()

    loaded = Loaded()
    log2 = make_log(tmp_path, loaded)
    await log2.start()
    try:
        assert loaded.calls == [0, 1, 2]  # once per partition, empty ones included
        assert loaded.offsets[0] == {
            OffsetCommitKey("c", "t", 0): OffsetCommitValue(6, "m6", 1000),
            OffsetCommitKey("c", "t", 1): OffsetCommitValue(7, "m7", 1000),
        }
        assert loaded.groups[0] == {"c": group_value(3, members=2)}
        assert loaded.offsets[1] == {} and loaded.groups[1] == {}
        assert loaded.groups[2] == {} and loaded.offsets[2] == {}
        # appends continue after the last offset
        await log2.append(0, [commit("c", "t", 0, 8)])
        assert log2.next_offset(0) == 5
    finally:
        await log2.stop()
    names = sorted(p.name for p in (tmp_path).iterdir())
    assert names == ["__consumer_offsets-0", "__consumer_offsets-1", "__consumer_offsets-2", "__consumer_offsets.lock"]
    assert [p.name for _b, p in list_segments(partition_dir(tmp_path, 0))] == ["00000000000000000000.log"]


async def test_one_append_is_one_batch_with_kafka_fields(tmp_path: Path) -> None:
    clock = FakeClock(1_700_000_000_000)
    log = make_log(tmp_path, clock=clock)
    await log.start()
    await log.append(0, [commit("g", "t", 0, 1), commit("g", "t", 1, 2), (GroupMetadataKey("g"), None)])
    await log.stop()
    [batch] = list(iter_file_batches(partition_dir(tmp_path, 0) / "00000000000000000000.log"))
    h = batch.header
    assert (h.base_offset, h.record_count, h.last_offset_delta) == (0, 3, 2)
    assert (h.producer_id, h.producer_epoch, h.base_sequence, h.compression, h.timestamp_type) == (
        -1,
        -1,
        -1,
        0,
        "CreateTime",
    )
    assert [r.timestamp for r in batch.records] == [1_700_000_000_000] * 3
    assert batch.records[2].value is None


def _synced_sizes(monkeypatch: pytest.MonkeyPatch, latency_s: float = 0.0) -> dict[str, int]:
    """Wrap the log's fdatasync: remember, per file, how many bytes each sync covered.

    ``latency_s`` makes every sync take at least that long, like a real disk, so how many
    appends a sync can share does not depend on how fast this machine's disk happens to be."""
    synced: dict[str, int] = {}
    real = offsets_log_mod._fdatasync

    def spy(fd: int) -> None:
        size = os.fstat(fd).st_size
        if latency_s:
            time.sleep(latency_s)
        real(fd)
        path = os.readlink(f"/proc/self/fd/{fd}")
        synced[path] = max(synced.get(path, 0), size)

    monkeypatch.setattr(offsets_log_mod, "_fdatasync", spy)
    return synced


async def test_group_commit_shares_fsyncs_and_every_append_is_durable_when_it_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced = _synced_sizes(monkeypatch, latency_s=0.004)  # a 4 ms sync; the 200 appends arrive over 20 ms
    log = make_log(tmp_path, num_partitions=1, flush="always")
    await log.start()
    seg = str(partition_dir(tmp_path, 0) / "00000000000000000000.log")
    synced_at_ack: dict[int, int] = {}
    rng = random.Random(7)
    n = 200

    async def committer(i: int) -> None:
        await asyncio.sleep(rng.random() * 0.02)
        await log.append(0, [commit("g", f"topic-{i}", 0, i)])
        synced_at_ack[i] = synced.get(seg, 0)  # bytes known to be on disk when append returned

    fsyncs_before = log.fsyncs
    await asyncio.gather(*(committer(i) for i in range(n)))
    data_fsyncs = log.fsyncs - fsyncs_before
    await log.stop()
    assert log.appends == n
    assert data_fsyncs < n / 4, f"{data_fsyncs} fsyncs for {n} concurrent appends: no group commit"
    # where each committer's batch ends in the file
    ends: dict[int, int] = {}
    for b in iter_file_batches(seg):
        key = decode_key(b.records[0].key or b"")
        assert isinstance(key, OffsetCommitKey)
        ends[int(key.topic.split("-")[1])] = b.header.end
    assert sorted(ends) == list(range(n))
    late = [i for i in range(n) if synced_at_ack[i] < ends[i]]
    assert not late, f"appends {late[:5]} returned before their batch was fsynced"


async def test_group_commit_spans_partitions_and_every_append_is_durable_when_it_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 20 committers, each on its own partition, at once: their fdatasyncs go to the I/O threads
    # in shared rounds (one trip for all the partitions written meanwhile), not one trip each.
    synced = _synced_sizes(monkeypatch, latency_s=0.004)
    log = make_log(tmp_path, num_partitions=20, flush="always")
    await log.start()
    synced_at_ack: dict[int, int] = {}

    async def committer(p: int) -> None:
        await log.append(p, [commit(f"g{p}", "t", 0, p)])
        seg = str(partition_dir(tmp_path, p) / "00000000000000000000.log")
        synced_at_ack[p] = synced.get(seg, 0)

    rounds_before = log.sync_rounds
    await asyncio.gather(*(committer(p) for p in range(20)))
    rounds = log.sync_rounds - rounds_before
    await log.stop()
    assert 1 <= rounds <= 2, f"{rounds} sync rounds for 20 partitions written at once"
    for p in range(20):
        [batch] = list(iter_file_batches(partition_dir(tmp_path, p) / "00000000000000000000.log"))
        assert synced_at_ack[p] >= batch.header.end, f"partition {p} answered before its fsync"


async def test_a_failed_fsync_in_a_shared_round_poisons_only_its_partition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = make_log(tmp_path, num_partitions=4, flush="always")
    await log.start()
    for p in range(4):
        await log.append(p, [commit(f"g{p}", "t", 0, 1)])
    bad = os.path.realpath(partition_dir(tmp_path, 2))
    real = offsets_log_mod._fdatasync

    def sync(fd: int) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").startswith(bad + os.sep):
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    monkeypatch.setattr(offsets_log_mod, "_fdatasync", sync)
    results = await asyncio.gather(
        *(log.append(p, [commit(f"g{p}", "t", 0, 2)]) for p in range(4)), return_exceptions=True
    )
    assert [isinstance(r, PersistError) for r in results] == [False, False, True, False]
    assert "Input/output" in str(results[2])
    monkeypatch.setattr(offsets_log_mod, "_fdatasync", real)
    with pytest.raises(PersistError, match="failed earlier"):
        await log.append(2, [commit("g2", "t", 0, 3)])
    await log.append(3, [commit("g3", "t", 0, 3)])  # the others go on
    await log.stop()


async def test_group_commit_off_syncs_every_append(tmp_path: Path) -> None:
    log = make_log(tmp_path, num_partitions=1, flush="always", group_commit=False)
    await log.start()
    before = log.fsyncs
    await asyncio.gather(*(log.append(0, [commit("g", "t", i, i)]) for i in range(50)))
    assert log.fsyncs - before >= 50
    assert log.rounds == 50
    await log.stop()


async def test_flush_interval_and_never(tmp_path: Path) -> None:
    log = make_log(tmp_path / "i", num_partitions=1, flush="interval", flush_interval_ms=10)
    await log.start()
    await log.append(0, [commit("g", "t", 0, 1)])  # first append: creates the segment (dir fsync)
    before = log.fsyncs
    for i in range(20):
        await log.append(0, [commit("g", "t", 0, i)])
    assert log.fsyncs == before  # appends do not wait for fsync
    await async_wait_until(lambda: log.fsyncs > before, 5, "the interval flusher to sync", step=0.005)
    await log.stop()

    log = make_log(tmp_path / "n", num_partitions=1, flush="never")
    await log.start()
    await log.append(0, [commit("g", "t", 0, 1)])
    before = log.fsyncs
    for i in range(20):
        await log.append(0, [commit("g", "t", 0, i)])
    assert log.fsyncs == before
    await log.stop()
    assert log.fsyncs == before + 1  # stop syncs what is open


async def test_segments_roll_by_size(tmp_path: Path) -> None:
    log = make_log(tmp_path, num_partitions=1, segment_bytes=1024)
    await log.start()
    for i in range(40):
        await log.append(0, [commit("g", "t", i % 4, i)])
    segs = log.segments(0)
    await log.stop()
    assert len(segs) >= 4
    names = [p.name for _b, p in list_segments(partition_dir(tmp_path, 0))]
    assert names == [f"{s.base_offset:020d}.log" for s in segs]
    offsets = []
    for s in segs:
        assert s.size <= 1024
        recs = [r.offset for b in iter_file_batches(s.path) for r in b.records]
        assert recs[0] == s.base_offset
        offsets += recs
    assert offsets == list(range(40))


def _segment(tmp_path: Path, partition: int = 0) -> Path:
    return list_segments(partition_dir(tmp_path, partition))[-1][1]


async def _write_three(tmp_path: Path) -> Path:
    log = make_log(tmp_path, num_partitions=1)
    await log.start()
    for i in range(3):
        await log.append(0, [commit("g", "t", 0, 10 + i)])
    await log.stop()
    return _segment(tmp_path)


@pytest.mark.parametrize("cut", [1, 20, 61])
async def test_torn_tail_is_truncated_with_a_warning(tmp_path: Path, cut: int) -> None:
    seg = await _write_three(tmp_path)
    size = seg.stat().st_size
    batch = size // 3
    with open(seg, "r+b") as f:
        f.truncate(size - cut)  # the last append was cut short by a crash
    rp = replay_partition(partition_dir(tmp_path, 0), 0)
    assert rp.report.truncated and rp.report.truncated[0][1] == 2 * batch
    assert seg.stat().st_size == 2 * batch
    assert rp.state.offsets[OffsetCommitKey("g", "t", 0)].offset == 11
    loaded = Loaded()
    log = make_log(tmp_path, loaded, num_partitions=1)
    await log.start()
    await log.append(0, [commit("g", "t", 0, 99)])
    assert log.next_offset(0) == 3  # the torn batch's offset is reused
    await log.stop()
    assert [r.offset for b in iter_file_batches(seg) for r in b.records] == [0, 1, 2]


async def test_bad_crc_of_the_final_batch_is_a_torn_tail(tmp_path: Path) -> None:
    seg = await _write_three(tmp_path)
    size = seg.stat().st_size
    data = bytearray(seg.read_bytes())
    data[-3] ^= 0xFF  # written length, lost content (power loss with flush != always)
    seg.write_bytes(bytes(data))
    rp = replay_partition(partition_dir(tmp_path, 0), 0)
    assert "CRC" in rp.report.truncated[0][3]
    assert seg.stat().st_size == size * 2 // 3


async def test_zero_filled_tail_is_truncated(tmp_path: Path) -> None:
    seg = await _write_three(tmp_path)
    size = seg.stat().st_size
    with open(seg, "ab") as f:
        f.write(b"\x00" * 4096)
    rp = replay_partition(partition_dir(tmp_path, 0), 0)
    assert rp.report.truncated[0][1:3] == (size, 4096)
    assert seg.stat().st_size == size


async def test_crc_corruption_mid_segment_stops_the_start(tmp_path: Path) -> None:
    seg = await _write_three(tmp_path)
    data = bytearray(seg.read_bytes())
    data[40] ^= 0x01  # inside the first batch's header (its producer id): CRC no longer matches
    seg.write_bytes(bytes(data))
    before = seg.read_bytes()
    log = make_log(tmp_path, num_partitions=1)
    with pytest.raises(CorruptLogError) as ei:
        await log.start()
    msg = str(ei.value)
    assert str(seg) in msg and "at byte 0" in msg and "CRC mismatch" in msg and "dump-log" in msg
    assert seg.read_bytes() == before  # nothing truncated or moved


async def test_corruption_in_a_closed_segment_stops_the_start(tmp_path: Path) -> None:
    log = make_log(tmp_path, num_partitions=1, segment_bytes=1024)
    await log.start()
    for i in range(30):
        await log.append(0, [commit("g", "t", 0, i)])
    await log.stop()
    segs = list_segments(partition_dir(tmp_path, 0))
    first = segs[0][1]
    data = bytearray(first.read_bytes())
    data[-2] ^= 0x01  # the last batch of a closed segment: not a torn tail
    first.write_bytes(bytes(data))
    with pytest.raises(CorruptLogError, match=first.name):
        replay_partition(partition_dir(tmp_path, 0), 0)


async def test_partition_count_change_is_refused(tmp_path: Path) -> None:
    log = make_log(tmp_path, num_partitions=3)
    await log.start()
    await log.append(2, [commit("g", "t", 0, 1)])
    await log.stop()
    with pytest.raises(PartitionCountError, match="__consumer_offsets-2"):
        await make_log(tmp_path, num_partitions=2).start()
    with pytest.raises(PartitionCountError, match="created with"):
        await make_log(tmp_path, num_partitions=5).start()
    partition_dir(tmp_path, 1).rmdir()  # an empty directory removed by hand is recreated
    log = make_log(tmp_path, num_partitions=3)
    await log.start()
    await log.stop()
    assert partition_dir(tmp_path, 1).is_dir()


async def test_append_errors_raise_persist_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = make_log(tmp_path, num_partitions=2)
    with pytest.raises(PersistError):
        await log.append(0, [commit("g", "t", 0, 1)])  # not started
    await log.start()
    with pytest.raises(PersistError):
        await log.append(2, [commit("g", "t", 0, 1)])
    with pytest.raises(PersistError):
        await log.append(0, [(OffsetCommitKey("g", "t", 0), group_value(1))])  # mismatched value
    await log.append(0, [commit("g", "t", 0, 1)])
    seg = _segment(tmp_path)
    size = seg.stat().st_size

    real_write = os.write
    calls = {"n": 0}

    def failing_write(fd: int, data: Any) -> int:
        calls["n"] += 1
        real_write(fd, bytes(data)[:10])  # a partial write, then the disk fails
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(offsets_log_mod.os, "write", failing_write)
    with pytest.raises(PersistError, match="No space left"):
        await log.append(0, [commit("g", "t", 0, 2)])
    monkeypatch.setattr(offsets_log_mod.os, "write", real_write)
    assert calls["n"] == 1
    assert seg.stat().st_size == size  # rolled back
    await log.append(0, [commit("g", "t", 0, 3)])  # the partition still works
    assert log.next_offset(0) == 2

    def failing_sync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    real_sync = offsets_log_mod._fdatasync
    monkeypatch.setattr(offsets_log_mod, "_fdatasync", failing_sync)
    with pytest.raises(PersistError, match="Input/output"):
        await log.append(0, [commit("g", "t", 0, 4)])
    monkeypatch.setattr(offsets_log_mod, "_fdatasync", real_sync)
    with pytest.raises(PersistError, match="failed earlier"):
        await log.append(0, [commit("g", "t", 0, 5)])  # a failed fsync poisons the partition
    await log.append(1, [commit("other", "t", 0, 1)])  # other partitions are fine
    await log.stop()
    with pytest.raises(PersistError):
        await log.append(1, [commit("other", "t", 0, 2)])


async def test_cancelled_caller_does_not_lose_or_break_the_write(tmp_path: Path) -> None:
    log = make_log(tmp_path, num_partitions=1)
    await log.start()
    t = asyncio.ensure_future(log.append(0, [commit("g", "t", 0, 1)]))
    await asyncio.sleep(0)
    t.cancel()
    await log.append(0, [commit("g", "t", 0, 2)])
    await log.stop()
    assert [r.offset for b in iter_file_batches(_segment(tmp_path)) for r in b.records] == [0, 1]


# --- compaction --------------------------------------------------------------------------------


async def _fill(log: OffsetsLog, rounds: int, clock: FakeClock | None = None) -> None:
    for i in range(rounds):
        await log.append(0, [commit("g", "t", i % 5, i, ts=1000 + i)])
        if i % 7 == 0:
            await log.append(0, [(GroupMetadataKey("g"), group_value(i, members=1 + i % 3))])
        if i % 11 == 0:
            await log.append(0, [(OffsetCommitKey("g", "t", i % 5), None)])
        if clock is not None:
            clock.advance(10)


async def test_cleaner_compacts_keeps_offsets_and_state(tmp_path: Path) -> None:
    clock = FakeClock()
    log = make_log(tmp_path, num_partitions=1, segment_bytes=2048, clock=clock)
    await log.start()
    await _fill(log, 200, clock)
    pdir = partition_dir(tmp_path, 0)
    before_state = replay_partition(pdir, 0, repair=False).state
    before_records = {r.offset: r for _b, p in list_segments(pdir) for b in iter_file_batches(p) for r in b.records}
    segs_before = log.segments(0)
    res = await log.clean(0)
    segs_after = log.segments(0)
    await log.append(0, [commit("g", "t", 0, 1000)])  # appends still work after cleaning
    await log.stop()
    assert res.records_kept < res.records_read
    assert len(segs_after) < len(segs_before)
    assert sum(s.size for s in segs_after[:-1]) < sum(s.size for s in segs_before[:-1]) / 3
    assert [p.name for _b, p in list_segments(pdir)] == [f"{s.base_offset:020d}.log" for s in log.segments(0)]
    after = {r.offset: r for _b, p in list_segments(pdir) for b in iter_file_batches(p) for r in b.records}
    for off, rec in after.items():  # kept records keep offset, timestamp, key and value
        if off in before_records:
            assert before_records[off] == rec
    rp = replay_partition(pdir, 0, repair=False)
    expected = dict(before_state.offsets)
    expected[OffsetCommitKey("g", "t", 0)] = OffsetCommitValue(1000, "m1000", 1000)
    assert rp.state.offsets == expected
    assert rp.state.groups == before_state.groups


async def test_tombstones_are_dropped_after_delete_retention(tmp_path: Path) -> None:
    clock = FakeClock()
    log = make_log(tmp_path, num_partitions=1, segment_bytes=1024, clock=clock, delete_retention_ms=DAY_MS)
    await log.start()
    await log.append(0, [commit("g", "t", 0, 1)])
    await log.append(0, [(OffsetCommitKey("g", "t", 0), None)])
    await log.append(0, [(GroupMetadataKey("g"), group_value(1))])
    await log.append(0, [(GroupMetadataKey("g"), None)])
    for i in range(30):  # roll the tombstones into a closed segment
        await log.append(0, [commit("other", "t", 0, i)])
    pdir = partition_dir(tmp_path, 0)

    def tombstones() -> int:
        return sum(
            1 for _b, p in list_segments(pdir) for b in iter_file_batches(p) for r in b.records if r.value is None
        )

    res = await log.clean(0)
    assert tombstones() == 2 and res.tombstones_dropped == 0
    assert res.next_tombstone_expiry == FakeClock().now_ms() + DAY_MS
    clock.advance(DAY_MS)
    assert log._needs_cleaning(log._parts[0], clock.now_ms())
    res = await log.clean(0)
    assert res.tombstones_dropped == 2 and tombstones() == 0
    await log.stop()
    st = replay_partition(pdir, 0).state
    assert st.groups == {} and set(st.offsets) == {OffsetCommitKey("other", "t", 0)}


@pytest.mark.parametrize(
    ("segment_bytes", "point"),
    [
        (100_000, "cleaned_written"),  # several segments in one group (merge via swap)
        (100_000, "swap_committed"),
        (100_000, "old_segments_deleted"),
        (1024, "cleaned_written"),  # one segment per group (direct rename)
        (1024, "installed"),
    ],
)
async def test_cleaner_crash_leaves_a_log_that_recovers_to_the_same_state(
    tmp_path: Path, segment_bytes: int, point: str
) -> None:
    clock = FakeClock()
    log = make_log(tmp_path, num_partitions=1, segment_bytes=1024, clock=clock)
    await log.start()
    await _fill(log, 150, clock)
    pdir = partition_dir(tmp_path, 0)
    want = replay_partition(pdir, 0, repair=False).state
    log.segment_bytes = segment_bytes  # group size for the cleaner

    class Crash(Exception):
        pass

    def crash(at: str) -> None:
        if at == point:
            raise Crash(at)

    log.cleaner_crash_hook = crash
    with pytest.raises(Crash):
        await log.clean(0)
    await log.stop()
    leftovers = sorted(p.name for p in pdir.iterdir() if not p.name.endswith(".log"))
    if point == "cleaned_written":
        assert leftovers and leftovers[0].endswith(".log.cleaned")
    if point in ("swap_committed", "old_segments_deleted"):
        assert leftovers and leftovers[0].endswith(".log.swap")

    loaded = Loaded()
    log2 = make_log(tmp_path, loaded, num_partitions=1, segment_bytes=segment_bytes, clock=clock)
    await log2.start()  # recovery resolves the cleaner's files
    assert loaded.offsets[0] == want.offsets and loaded.groups[0] == want.groups
    assert all(p.name.endswith(".log") for p in pdir.iterdir())
    await log2.clean(0)  # and cleaning works again
    await log2.stop()
    again = replay_partition(pdir, 0).state
    assert again.offsets == want.offsets and again.groups == want.groups


async def test_background_cleaner_runs_after_rolls(tmp_path: Path) -> None:
    log = make_log(tmp_path, num_partitions=1, segment_bytes=1024, cleaner=True, cleaner_backoff_ms=60_000)
    await log.start()
    for i in range(200):
        await log.append(0, [commit("g", "t", 0, i)])
    await async_wait_until(lambda: log.cleanings >= 1, 10, "a roll to wake the cleaner")
    await log.stop()
    assert replay_partition(partition_dir(tmp_path, 0), 0).state.offsets == {
        OffsetCommitKey("g", "t", 0): OffsetCommitValue(199, "m199", 1000)
    }


# --- independent readers -----------------------------------------------------------------------


async def test_independent_kafka_readers_accept_our_segments(tmp_path: Path) -> None:
    clock = FakeClock()
    log = make_log(tmp_path, num_partitions=1, segment_bytes=1024, clock=clock)
    await log.start()
    await _fill(log, 120, clock)
    await log.clean(0)  # include re-batched segments (offset gaps inside batches)
    await _fill(log, 10, clock)
    await log.stop()
    files = [p for _b, p in list_segments(partition_dir(tmp_path, 0))]
    assert len(files) >= 2
    for path in files:
        raw = path.read_bytes()
        ours = [(r.offset, r.timestamp, r.key, r.value) for b in iter_file_batches(path) for r in b.records]
        for lib in (kprecord, aiorecord):
            mr = lib.MemoryRecords(raw)
            theirs = []
            while (batch := mr.next_batch()) is not None:
                assert batch.validate_crc(), f"{lib.__name__} rejects the CRC of a batch in {path.name}"
                theirs += [(r.offset, r.timestamp, r.key, r.value) for r in batch]
            assert theirs == ours, lib.__name__
        for _off, _ts, k, v in ours:  # and their key/value bytes decode with the schema
            key = decode_key(k or b"")
            assert isinstance(key, (OffsetCommitKey, GroupMetadataKey))
            decode_value(key, v)


# --- process crash: every acknowledged commit survives SIGKILL ----------------------------------

_STORM = textwrap.dedent(
    """
    import asyncio, sys
    from rallypoint import logger
    from rallypoint.storage import OffsetsLog
    from rallypoint.protocol.offsets_schema import OffsetCommitKey, OffsetCommitValue

    async def main():
        logger.configure("json", "warning")  # logs to stderr; stdout carries only acknowledgements
        log = OffsetsLog(sys.argv[1], num_partitions=4, flush="always", cleaner=False, segment_bytes=4096)
        await log.start()
        async def committer(c):
            for n in range(1, 10**9):
                await log.append(c % 4, [(OffsetCommitKey("g", "t", c), OffsetCommitValue(n, "", 0))])
                sys.stdout.write(f"{c} {n}\\n")
                sys.stdout.flush()
        await asyncio.gather(*(committer(c) for c in range(32)))

    asyncio.run(main())
    """
)


def test_sigkill_mid_commit_storm_keeps_every_acknowledged_commit(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _STORM, str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    acked: dict[int, int] = {}
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    lines = 0
    try:
        for raw in proc.stdout:
            c, n = map(int, raw.split())
            acked[c] = max(acked.get(c, 0), n)
            lines += 1
            if lines == 3000 or time.monotonic() > deadline:
                break
        proc.send_signal(signal.SIGKILL)
        for raw in proc.stdout:  # acknowledgements printed before the kill landed
            c, n = map(int, raw.split())
            acked[c] = max(acked.get(c, 0), n)
    finally:
        proc.kill()
        proc.wait(10)
    assert lines >= 3000, "the commit storm was too slow"
    recovered: dict[int, int] = {}
    for p in range(4):
        st = replay_partition(partition_dir(tmp_path, p), p).state
        for key, value in st.offsets.items():
            recovered[key.partition] = value.offset
    missing = {c: (n, recovered.get(c)) for c, n in acked.items() if recovered.get(c, 0) < n}
    assert not missing, f"acknowledged commits lost: {missing}"


async def test_log_order_is_call_order_without_waiting(tmp_path: Path) -> None:
    """The groups runtime may start appends without awaiting the previous one: the log keeps
    the order of the calls (and group commit can batch them)."""
    log = make_log(tmp_path, num_partitions=1)
    await log.start()
    tasks = [asyncio.ensure_future(log.append(0, [commit("g", f"t{i}", 0, i)])) for i in range(100)]
    await asyncio.gather(*tasks)
    rounds = log.rounds
    await log.stop()
    topics = [decode_key(r.key or b"").topic for b in iter_file_batches(_segment(tmp_path)) for r in b.records]  # type: ignore[union-attr]
    assert topics == [f"t{i}" for i in range(100)]
    assert rounds < 10


async def test_persist_error_codes(tmp_path: Path) -> None:
    from rallypoint.protocol.errors import ErrorCode

    log = make_log(tmp_path, num_partitions=1)
    await log.start()
    with pytest.raises(PersistError) as ei:
        await log.append(5, [commit("g", "t", 0, 1)])
    assert ei.value.error == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    with pytest.raises(PersistError) as ei:
        await log.append(0, [(OffsetCommitKey("g", "t", 0), OffsetCommitValue(1, "x" * 40000, 0))])
    assert ei.value.error == ErrorCode.UNKNOWN_SERVER_ERROR
    await log.stop()
    with pytest.raises(PersistError) as ei:
        await log.append(0, [commit("g", "t", 0, 1)])
    assert ei.value.error == ErrorCode.KAFKA_STORAGE_ERROR


async def test_a_second_log_on_the_same_data_dir_is_refused(tmp_path: Path) -> None:
    from rallypoint.storage.errors import OffsetsLogStartError

    first = make_log(tmp_path)
    await first.start()
    second = make_log(tmp_path)
    with pytest.raises(OffsetsLogStartError, match="another rallypoint process"):
        await second.start()
    await first.stop()
    await second.start()  # released on stop
    await second.append(0, [commit("c", "t", 0, 1)])
    await second.stop()
    await second.start()  # the same object restarts cleanly
    assert second.next_offset(0) == 1
    await second.stop()


# --- groups written before partition_for followed Kafka's Utils.abs ----------------------------


async def test_groups_of_an_old_layout_are_moved_where_they_belong(tmp_path: Path) -> None:
    n = 50
    moved, staying = "grp-rhcbom", "hello"  # hashes -680362085 (home 35, old 13) and 99162322 (22)
    old = old_partition_for(moved, n)
    assert (old, partition_for(moved, n)) == (13, 35)
    assert old_partition_for(staying, n) == partition_for(staying, n) == 22
    write_old_layout(
        tmp_path,
        n,
        {
            old: [
                commit(moved, "t", 0, 41),
                commit(moved, "t", 1, 42),
                (GroupMetadataKey(moved), group_value(4, members=2)),
            ],
            22: [commit(staying, "t", 0, 7)],
        },
    )
    loaded = Loaded()
    log = make_log(tmp_path, loaded, num_partitions=n)
    await log.start()
    await log.stop()
    want_offsets = {
        OffsetCommitKey(moved, "t", 0): OffsetCommitValue(41, "m41", 1000),
        OffsetCommitKey(moved, "t", 1): OffsetCommitValue(42, "m42", 1000),
    }
    assert loaded.offsets[35] == want_offsets and loaded.groups[35] == {moved: group_value(4, members=2)}
    assert loaded.offsets[old] == {} and loaded.groups[old] == {}
    assert loaded.offsets[22] == {OffsetCommitKey(staying, "t", 0): OffsetCommitValue(7, "m7", 1000)}
    # on disk: the records were appended to 35, tombstones to 13
    home = replay_partition(partition_dir(tmp_path, 35), 35, repair=False).state
    assert home.offsets == want_offsets and home.groups == {moved: group_value(4, members=2)}
    was = replay_partition(partition_dir(tmp_path, old), old, repair=False).state
    assert was.offsets == {} and was.groups == {} and was.records == 6  # 3 records + 3 tombstones
    # a second start finds nothing to move and loads the same
    sizes = [p.stat().st_size for p in sorted(tmp_path.glob("__consumer_offsets-*/*.log"))]
    again = Loaded()
    log = make_log(tmp_path, again, num_partitions=n)
    await log.start()
    await log.stop()
    assert again.offsets == loaded.offsets and again.groups == loaded.groups
    assert [p.stat().st_size for p in sorted(tmp_path.glob("__consumer_offsets-*/*.log"))] == sizes


async def test_a_move_cut_short_before_its_tombstones_completes_without_duplicates(tmp_path: Path) -> None:
    """A crash after the copies were written but before the tombstones: the home partition's copy
    wins, the old records get their tombstones, nothing is copied twice."""
    n = 50
    moved = "grp-rhcbom"
    write_old_layout(tmp_path, n, {13: [commit(moved, "t", 0, 41)], 35: [commit(moved, "t", 0, 43)]})
    loaded = Loaded()
    log = make_log(tmp_path, loaded, num_partitions=n)
    await log.start()
    await log.stop()
    assert loaded.offsets[35] == {OffsetCommitKey(moved, "t", 0): OffsetCommitValue(43, "m43", 1000)}
    assert loaded.offsets[13] == {}
    assert replay_partition(partition_dir(tmp_path, 35), 35, repair=False).state.records == 1


async def test_append_now_writes_at_once_only_when_nothing_can_come_between(tmp_path: Path) -> None:
    """``append_now``: the synchronous write the groups runtime tries first (no fsync to wait
    for); it declines (False, nothing written) whenever ``append`` must keep a rule."""
    log = make_log(tmp_path / "a", num_partitions=2, flush="always")
    await log.start()
    assert not log.append_now(0, [commit("g", "t", 0, 1)])  # an fsync to wait for
    assert log.next_offset(0) == 0
    await log.stop()

    log = make_log(tmp_path / "n", num_partitions=1, flush="never")
    assert not log.append_now(0, [commit("g", "t", 0, 1)])  # not started
    await log.start()
    assert log.append_now(0, [commit("g", "t", 0, 1), commit("g", "t", 1, 2)])
    assert log.next_offset(0) == 2  # written before returning, one batch
    assert not log.append_now(5, [commit("g", "t", 0, 1)])  # no such partition: append raises
    assert not log.append_now(0, [])
    # a batch queued by append goes first: append_now declines until the writer took it
    queued = asyncio.ensure_future(log.append(0, [commit("g", "queued", 0, 3)]))
    await asyncio.sleep(0)
    assert not log.append_now(0, [commit("g", "late", 0, 4)])
    await queued
    assert log.append_now(0, [commit("g", "now", 0, 5)])
    await log.stop()
    topics = [decode_key(r.key or b"").topic for b in iter_file_batches(_segment(tmp_path / "n")) for r in b.records]  # type: ignore[union-attr]
    assert topics == ["t", "t", "queued", "now"]

    loaded = Loaded()
    log = make_log(tmp_path / "n", loaded, num_partitions=1, flush="never")
    await log.start()
    assert loaded.offsets[0][OffsetCommitKey("g", "now", 0)] == OffsetCommitValue(5, "m5", 1000)
    await log.stop()


async def test_append_now_failure_raises_persist_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rallypoint.protocol.errors import ErrorCode
    from rallypoint.storage import offsets_log as mod

    KAFKA_STORAGE_ERROR = ErrorCode.KAFKA_STORAGE_ERROR
    log = make_log(tmp_path, num_partitions=1, flush="interval")
    await log.start()
    assert log.append_now(0, [commit("g", "t", 0, 1)])

    def broken(fd: int, data: Any) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(mod, "_write", broken)
    with pytest.raises(PersistError) as ei:
        log.append_now(0, [commit("g", "t", 0, 2)])
    assert ei.value.error == KAFKA_STORAGE_ERROR
    assert log.next_offset(0) == 1  # nothing counted
    monkeypatch.undo()
    assert log.append_now(0, [commit("g", "t", 0, 3)])
    assert log.next_offset(0) == 2
    await log.stop()
