"""Unit tests of durable topic data (``rallypoint.log.storage=disk``): segment files, recovery at
load, checkpoints, and a differential test that drives a disk log and a memory log through the
same random operations (appends, rolls, retention, DeleteRecords, compaction, reloads) and
requires a consumer to read the same records from both.  Batches are built with kafka-python's
``kafka.record``; segment files are read back with aiokafka's ``aiokafka.record`` (independent
codecs)."""

from __future__ import annotations

import os
import random
import uuid
from pathlib import Path

import pytest
from aiokafka.record.memory_records import MemoryRecords as AioMemoryRecords
from rallypoint.clock import FakeClock
from rallypoint.protocol.records import split_batches
from rallypoint.topics import TopicStore, durable
from rallypoint.topics.configs import LogPolicy
from rallypoint.topics.log_validator import validate_client_batch, validate_client_records, validate_produce_records
from rallypoint.topics.partition import PartitionLog
from rallypoint.topics.segment_files import SegmentFiles, read_topic_id
from rallypoint.topics.store import TopicStateError

from tests.test_topic_compaction import T0, consume, keyed, put

pytestmark = pytest.mark.unit

TID = uuid.UUID(int=7)
SMALL = LogPolicy(segment_bytes=400, retention_bytes=-1)  # a new segment every few batches


def disk_log(pdir: Path) -> PartitionLog:
    return PartitionLog("t", 0, files=SegmentFiles(pdir, TID))


def reload(
    plog: PartitionLog, *, clean: bool = False, log_start: int | None = None
) -> tuple[PartitionLog, durable.LoadReport]:
    assert plog.files is not None
    pdir = plog.files.pdir
    plog.files.close()
    report = durable.LoadReport()
    new = durable.open_partition(
        pdir, "t", 0, TID, saved_next=0, log_start=log_start, recovery_point=None, clean=clean, now_ms=T0, report=report
    )
    return new, report


def idem(pairs: list[tuple[bytes, bytes]], *, pid: int, seq: int, epoch: int = 0, transactional: bool = False) -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    b = DefaultRecordBatchBuilder(2, 0, transactional, pid, epoch, seq, 1 << 24)
    for i, (k, v) in enumerate(pairs):
        b.append(i, T0 + i, k, v, [])
    return bytes(b.build())


def append_raw(plog: PartitionLog, data: bytes, policy: LogPolicy = SMALL, now: int = T0) -> tuple[int, bool]:
    pos, size = validate_produce_records(9, data)
    h = validate_client_batch(data, pos, size, 1 << 20)
    r = plog.append_client_batch(
        data, pos, size, h, validate_client_records(data, h, 1 << 24), policy=policy, now_ms=now
    )
    return r.base_offset, r.duplicate


# --------------------------------------------------------------------------- layout


def test_segments_hold_the_batches_as_served_in_kafkas_layout(tmp_path: Path) -> None:
    plog = disk_log(tmp_path / "t-0")
    sent = [keyed([(b"k%d" % i, b"v%d" % i) for i in range(3)], ts=T0 + n) for n in range(10)]
    for data in sent:
        put(plog, data, T0, SMALL)
    segs = sorted((tmp_path / "t-0").glob("*.log"))
    assert len(segs) > 2 and segs[0].name == "00000000000000000000.log"
    assert read_topic_id(tmp_path / "t-0") == TID
    assert (tmp_path / "t-0" / "leader-epoch-checkpoint").read_text() == "0\n1\n0 0\n"
    # an independent reader (aiokafka) finds every produced record at its offset, in order
    got = []
    for seg in segs:
        name_base = int(seg.name[:20])
        records = AioMemoryRecords(seg.read_bytes())
        first = True
        while (b := records.next_batch()) is not None:
            assert b.validate_crc()
            if first:
                assert b.base_offset == name_base
                first = False
            got.extend((r.offset, r.key, r.value) for r in b)
    assert got == [(n * 3 + i, b"k%d" % i, b"v%d" % i) for n in range(10) for i in range(3)]
    assert consume(plog) == got


def test_reload_brings_back_data_offsets_and_producer_state(tmp_path: Path) -> None:
    plog = disk_log(tmp_path / "t-0")
    first = idem([(b"a", b"1"), (b"b", b"2")], pid=5, seq=0)
    assert append_raw(plog, first) == (0, False)
    assert append_raw(plog, idem([(b"c", b"3")], pid=5, seq=2)) == (2, False)
    put(plog, keyed([(b"x", b"y")]), T0, SMALL)
    before = consume(plog)
    plog, report = reload(plog)
    assert report.batches == 3 and not report.truncated
    assert consume(plog) == before and plog.next_offset == 4
    # a retry of an acknowledged batch after the restart is a duplicate, with its first offset
    assert append_raw(plog, first) == (0, True)
    # and the sequence continues where it was
    assert append_raw(plog, idem([(b"d", b"4")], pid=5, seq=3)) == (4, False)


def test_transaction_state_is_rebuilt_from_the_log(tmp_path: Path) -> None:
    plog = disk_log(tmp_path / "t-0")
    append_raw(plog, idem([(b"a", b"1")], pid=9, seq=0, transactional=True))
    append_raw(plog, idem([(b"b", b"2")], pid=9, seq=1, transactional=True))
    plog.write_marker(9, 0, False, T0)  # aborted: [0, 1], marker at 2
    append_raw(plog, idem([(b"c", b"3")], pid=9, seq=2, transactional=True))  # open at 3
    plog, _ = reload(plog)
    assert plog.aborted_txns == [(9, 0, 2, 3)]
    assert plog.open_txns == {9: 3} and plog.last_stable_offset == 3
    plog.write_marker(9, 0, True, T0)
    assert plog.last_stable_offset == plog.next_offset == 5


# --------------------------------------------------------------------------- recovery


def _fill(plog: PartitionLog, n: int) -> None:
    for i in range(n):
        put(plog, keyed([(b"k", b"v%d" % i)]), T0, SMALL)


def test_a_torn_last_batch_is_cut_and_the_next_offset_follows_the_last_valid_one(tmp_path: Path) -> None:
    plog = disk_log(tmp_path / "t-0")
    _fill(plog, 12)
    last = sorted((tmp_path / "t-0").glob("*.log"))[-1]
    size = last.stat().st_size
    os.truncate(last, size - 5)  # the last batch lost its tail in a crash
    plog, report = reload(plog)
    [(_t, _i, where, pos, cut, _why)] = report.truncated
    assert Path(where) == last and pos + cut == size - 5 and 0 < cut < size
    assert plog.next_offset == 11
    assert consume(plog)[-1][0] == 10
    assert put(plog, keyed([(b"k", b"new")]), T0, SMALL) == 11
    assert consume(plog, 11) == [(11, b"k", b"new")]


def test_a_broken_crc_is_cut_after_a_crash_and_later_segments_go(tmp_path: Path) -> None:
    plog = disk_log(tmp_path / "t-0")
    _fill(plog, 12)
    segs = sorted((tmp_path / "t-0").glob("*.log"))
    assert len(segs) >= 3
    middle = segs[1]
    data = bytearray(middle.read_bytes())
    data[-3] ^= 0xFF  # the last record of the segment's last batch
    middle.write_bytes(bytes(data))
    last_good = int(segs[1].name[:20])
    batches_in_middle = len(split_batches(bytes(data)))
    plog, report = reload(plog)
    cut_at = last_good + batches_in_middle - 1
    assert plog.next_offset == cut_at
    assert [o for o, _k, _v in consume(plog)] == list(range(cut_at))
    assert not any(p.exists() for p in segs[2:])
    assert len(report.truncated) == 1 + len(segs[2:])
    # after a clean shutdown CRCs are trusted (Kafka does not re-check below the recovery point)
    plog2 = disk_log(tmp_path / "u-0")
    _fill(plog2, 3)
    seg = sorted((tmp_path / "u-0").glob("*.log"))[0]
    raw = bytearray(seg.read_bytes())
    raw[-1] ^= 0xFF
    seg.write_bytes(bytes(raw))
    assert reload(plog2, clean=True)[0].next_offset == 3
    assert reload(plog2)[0].next_offset == 2  # a crash: checked, and cut


def test_log_start_comes_from_the_checkpoint_and_retention_deletes_whole_segments(tmp_path: Path) -> None:
    plog = disk_log(tmp_path / "t-0")
    _fill(plog, 12)
    n_before = len(list((tmp_path / "t-0").glob("*.log")))
    assert plog.delete_records_before(5) == 5
    assert len(list((tmp_path / "t-0").glob("*.log"))) < n_before  # whole segments below 5 went
    plog, _ = reload(plog, log_start=5)
    assert plog.log_start_offset == 5 and [o for o, _k, _v in consume(plog)] == list(range(5, 12))
    # retention.ms past every batch: all segments go but a fresh active one at the end
    assert plog.expire(T0 + 10_000, 1000) > 0
    assert [p.name for p in (tmp_path / "t-0").glob("*.log")] == [f"{12:020d}.log"]
    plog, _ = reload(plog)
    assert (plog.log_start_offset, plog.next_offset) == (12, 12)


def test_compaction_on_disk_survives_a_reload(tmp_path: Path) -> None:
    policy = LogPolicy(delete=False, compact=True, segment_bytes=400, roll_ms=10**9, min_cleanable_ratio=0.01)
    plog = disk_log(tmp_path / "t-0")
    for i in range(15):
        put(plog, keyed([(b"k%d" % (i % 3), b"v%d" % i)]), T0, policy)
    before = {k: v for _o, k, v in consume(plog)}
    plog.clean(T0, policy)
    after = consume(plog)
    assert {k: v for _o, k, v in after} == before and len(after) < 15
    assert not list((tmp_path / "t-0").glob("*.swap")) and not list((tmp_path / "t-0").glob("*.cleaned"))
    plog, _ = reload(plog)
    assert consume(plog) == after
    assert put(plog, keyed([(b"k0", b"new")]), T0, policy) == 15


# --------------------------------------------------------------------------- differential


@pytest.mark.parametrize("seed", range(int(os.environ.get("DURABLE_SEEDS", "12"))))
def test_disk_and_memory_logs_serve_the_same_records(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    policy = LogPolicy(
        segment_bytes=rng.choice([300, 800, 5000]),
        retention_bytes=rng.choice([-1, 2000]),
        compact=rng.random() < 0.5,
        delete=True,
        roll_ms=10**12,
        min_cleanable_ratio=0.01,
    )
    mem, disk = PartitionLog("t", 0), disk_log(tmp_path / "t-0")
    now = T0
    for step in range(150):
        op = rng.random()
        if op < 0.7:
            n = rng.randint(1, 4)
            data = keyed(
                [(b"k%d" % rng.randint(0, 5), b"v%d" % rng.randint(0, 99) * rng.randint(1, 8)) for _ in range(n)],
                ts=now,
            )
            assert put(mem, data, now, policy) == put(disk, data, now, policy)
        elif op < 0.75:
            mem.roll(now)
            disk.roll(now)
        elif op < 0.8 and mem.next_offset:
            target = rng.randint(mem.log_start_offset, mem.next_offset)
            assert mem.delete_records_before(target) == disk.delete_records_before(target)
        elif op < 0.85 and policy.compact:
            mem.clean(now, policy)
            disk.clean(now, policy)
        elif op < 0.9:
            disk, _ = reload(disk, log_start=disk.log_start_offset)  # its last segment stays the active one
        now += rng.randint(0, 50)
        assert (mem.log_start_offset, mem.next_offset) == (disk.log_start_offset, disk.next_offset), step
        assert consume(mem) == consume(disk), step
        if mem.next_offset:
            at = rng.randint(mem.log_start_offset, mem.next_offset)
            assert consume(mem, at) == consume(disk, at), step


# --------------------------------------------------------------------------- the store


def test_store_recreates_deletes_and_locks(tmp_path: Path) -> None:
    import asyncio

    async def run() -> None:
        store = TopicStore(data_dir=tmp_path, log_storage="disk", clock=FakeClock(T0))
        await store.start()
        t = store.create("orders", 2)
        put(t.partitions[1], keyed([(b"a", b"1")]), T0, store.policy(t))
        other = TopicStore(data_dir=tmp_path, log_storage="disk")
        with pytest.raises(TopicStateError, match="locked"):
            await other.start()
        await store.stop()
        assert (tmp_path / durable.CLEAN_SHUTDOWN).exists()
        assert "orders 1 1" in (tmp_path / durable.RECOVERY_POINT_CHECKPOINT).read_text()

        store = TopicStore(data_dir=tmp_path, log_storage="disk", clock=FakeClock(T0))
        await store.start()
        assert store.load_report is not None and store.load_report.clean_shutdown
        assert not (tmp_path / durable.CLEAN_SHUTDOWN).exists()
        t = store.get("orders")
        assert t is not None and consume(t.partitions[1]) == [(0, b"a", b"1")]
        store.delete("orders")
        assert not (tmp_path / "orders-1").exists()
        t = store.create("orders", 2)
        assert t.partitions[1].next_offset == 0 and consume(t.partitions[1]) == []
        await store.stop()

    asyncio.run(run())


def test_log_start_checkpoints_written_at_once_do_not_collide(tmp_path: Path) -> None:
    """DeleteRecords writes the log-start checkpoint from worker threads, several at once when
    several connections delete records, while the periodic duty writes it on the event loop:
    every write succeeds and the file ends with the latest log starts (found by the frame fuzz:
    two writers raced for the one temporary file, and one failed)."""
    import asyncio
    import threading

    async def run() -> None:
        store = TopicStore(data_dir=tmp_path, log_storage="disk", clock=FakeClock(T0))
        await store.start()
        t = store.create("orders", 8)
        for p in t.partitions:
            put(p, keyed([(b"k", b"v")] * 50), T0, store.policy(t))
        errors: list[BaseException] = []
        start = threading.Barrier(8)

        def writer(index: int) -> None:
            start.wait()
            try:
                for n in range(1, 6):
                    t.partitions[index].log_start_offset = n  # as DeleteRecords moves it
                    store.save_log_starts()
            except BaseException as e:  # what the race raised: FileNotFoundError from the rename
                errors.append(e)

        threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=60)
        assert errors == []
        store.save_log_starts()
        text = (tmp_path / durable.LOG_START_CHECKPOINT).read_text()
        assert all(f"orders {i} 5" in text for i in range(8)), text
        await store.stop()

    asyncio.run(run())
