"""Unit tests of topic retention (``retention.ms``), segment rolling and log compaction
(``cleanup.policy=compact``) on partition logs and the topic store, with explicit clocks.
Batches are built with kafka-python's ``kafka.record`` and read back with aiokafka's
``aiokafka.record`` (codecs independent of rallypoint's)."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiokafka.record.memory_records import MemoryRecords as AioMemoryRecords
from kafka.record.default_records import DefaultRecordBatchBuilder
from rallypoint.clock import FakeClock
from rallypoint.protocol.errors import ErrorCode
from rallypoint.protocol.records import parse_header, split_batches
from rallypoint.topics import TopicStore
from rallypoint.topics.configs import LogPolicy
from rallypoint.topics.log_validator import (
    BatchError,
    check_keys,
    validate_client_batch,
    validate_client_records,
    validate_produce_records,
)
from rallypoint.topics.partition import PartitionLog

pytestmark = pytest.mark.unit

T0 = 1_700_000_000_000
COMPACT = LogPolicy(delete=False, compact=True, roll_ms=1000, delete_retention_ms=5000, min_cleanable_ratio=0.5)


def keyed(
    pairs: list[tuple[bytes | None, bytes | None]], *, ts: int = T0, compression: int = 0, pid: int = -1, seq: int = -1
) -> bytes:
    b = DefaultRecordBatchBuilder(2, compression, False, pid, 0 if pid >= 0 else -1, seq, 1 << 24)
    for i, (k, v) in enumerate(pairs):
        b.append(i, ts + i, k, v, [])
    return bytes(b.build())


def put(plog: PartitionLog, data: bytes, now: int, policy: LogPolicy = COMPACT) -> int:
    pos, size = validate_produce_records(9, data)
    h = validate_client_batch(data, pos, size, 1 << 20)
    checked = validate_client_records(data, h, 1 << 24)
    return plog.append_client_batch(data, pos, size, h, checked, policy=policy, now_ms=now).base_offset


def consume(plog: PartitionLog, offset: int | None = None) -> list[tuple[int, bytes | None, bytes | None]]:
    """What a consumer reading from ``offset`` (default: the log start) to the end gets, batch by
    batch as a client fetches (each fetch at the offset after the last record seen)."""
    pos = plog.log_start_offset if offset is None else offset
    out: list[tuple[int, bytes | None, bytes | None]] = []
    for _ in range(1000):
        r = plog.read(pos, 1 << 20, True)
        if not r.records:
            return out
        records = AioMemoryRecords(r.records)
        advanced = False
        while (b := records.next_batch()) is not None:
            for rec in b:
                if rec.offset >= pos:
                    out.append((rec.offset, rec.key, rec.value))
            pos = max(pos, b.base_offset + b.last_offset_delta + 1)  # type: ignore[attr-defined]
            advanced = True
        assert advanced
    raise AssertionError("the consumer made no progress")


def latest(plog: PartitionLog) -> dict[bytes | None, bytes | None]:
    return {k: v for _o, k, v in consume(plog)}


def test_compaction_keeps_the_last_record_of_every_key_with_its_offset() -> None:
    plog = PartitionLog("t", 0)
    put(plog, keyed([(b"a", b"1"), (b"b", b"1")]), T0)
    put(plog, keyed([(b"a", b"2")]), T0 + 1)
    put(plog, keyed([(b"c", b"1"), (b"b", b"2")]), T0 + 2)
    put(plog, keyed([(b"a", b"3")]), T0 + 2000)  # rolls: the three batches before are closed
    before = consume(plog)
    assert plog.needs_cleaning(T0 + 2000, COMPACT)
    r = plog.clean(T0 + 2000, COMPACT)
    assert r.records_removed == 2  # a=1 and b=1 (a=2 is superseded only by the active segment's a=3)
    got = consume(plog)
    assert got == [(2, b"a", b"2"), (3, b"c", b"1"), (4, b"b", b"2"), (5, b"a", b"3")]
    assert {o for o, *_ in got} <= {o for o, *_ in before}
    assert (plog.log_start_offset, plog.next_offset) == (0, 6)
    assert plog.first_dirty == 5 and not plog.needs_cleaning(T0 + 2000, COMPACT)
    # a fetch inside the gap compaction left gets the next batch, not the batch before it
    assert consume(plog, 1)[0] == (2, b"a", b"2")
    assert plog.bytes_available(1) == plog.bytes_available(2) > 0


def test_the_active_segment_is_never_cleaned_and_rolls_by_size_and_age() -> None:
    plog = PartitionLog("t", 0)
    small = LogPolicy(delete=False, compact=True, segment_bytes=200, roll_ms=10**9)
    for i in range(3):
        put(plog, keyed([(b"k", b"%d" % i)]), T0, small)  # ~75 bytes each: the third rolls
    plog.clean(T0, small)
    # the closed segment keeps its last k; the active segment's k does not count
    assert [(o, v) for o, _k, v in consume(plog)] == [(1, b"1"), (2, b"2")]
    aged = LogPolicy(delete=False, compact=True, roll_ms=1000)
    plog2 = PartitionLog("t", 1)
    put(plog2, keyed([(b"k", b"1")]), T0, aged)
    put(plog2, keyed([(b"k", b"2")]), T0 + 999, aged)  # same segment: nothing cleanable
    assert plog2.cleanable_end(T0 + 999, aged) == 0 and not plog2.needs_cleaning(T0 + 999, aged)
    put(plog2, keyed([(b"k", b"3")]), T0 + 1000, aged)  # a second old: a new segment
    plog2.clean(T0 + 1000, aged)
    assert [v for _o, _k, v in consume(plog2)] == [b"2", b"3"]  # 2 is the last of k in the closed segment


def test_tombstones_stay_until_their_delete_horizon_then_go() -> None:
    plog = PartitionLog("t", 0)
    put(plog, keyed([(b"a", b"1"), (b"b", b"1")]), T0)
    put(plog, keyed([(b"a", None)]), T0 + 1)
    put(plog, keyed([(b"z", b"x")]), T0 + 5000)  # rolls
    plog.clean(T0 + 5000, COMPACT)
    assert consume(plog) == [(1, b"b", b"1"), (2, b"a", None), (3, b"z", b"x")]
    (first, second, *_rest) = [parse_header(plog.read(o, 1 << 20, True).records) for o in (1, 2)]
    assert first.delete_horizon_ms is None
    assert second.delete_horizon_ms == T0 + 5000 + COMPACT.delete_retention_ms
    assert plog.latest_delete_horizon == T0 + 10000
    assert not plog.needs_cleaning(T0 + 9999, COMPACT)
    assert plog.needs_cleaning(T0 + 10000, COMPACT)  # nothing dirty, but the horizon passed
    r = plog.clean(T0 + 10000, COMPACT)
    assert r.tombstones_removed == 1
    assert consume(plog) == [(1, b"b", b"1"), (3, b"z", b"x")]
    assert not plog.needs_cleaning(T0 + 20000, COMPACT)


def test_keyless_records_go_and_a_compacted_topic_refuses_them_on_produce() -> None:
    plog = PartitionLog("t", 0)
    put(plog, keyed([(None, b"legacy"), (b"a", b"1")]), T0)  # written before the topic was compacted
    put(plog, keyed([(b"b", b"1")]), T0 + 5000)
    plog.clean(T0 + 5000, COMPACT)
    assert consume(plog) == [(1, b"a", b"1"), (2, b"b", b"1")]
    data = keyed([(b"a", b"1"), (None, b"x"), (None, b"y")])
    pos, size = validate_produce_records(9, data)
    h = validate_client_batch(data, pos, size, 1 << 20)
    with pytest.raises(BatchError) as e:
        check_keys(data, h, 1 << 24, "t-0")
    assert e.value.code == ErrorCode.INVALID_RECORD
    assert [i for i, _m in e.value.record_errors] == [1, 2]
    assert e.value.record_errors[0][1] == "Compacted topic cannot accept message without key in topic partition t-0."
    assert e.value.error_message is not None and "due to 2 record errors" in e.value.error_message
    check_keys(keyed([(b"a", b"1")]), parse_header(keyed([(b"a", b"1")])), 1 << 24, "t-0")  # keys: fine


def test_compressed_batches_are_rebuilt_uncompressed_and_producers_last_batches_stay() -> None:
    plog = PartitionLog("t", 0)
    put(plog, keyed([(b"a", b"1"), (b"b", b"1")], compression=1), T0)  # gzip
    put(plog, keyed([(b"a", b"2")], pid=7, seq=0), T0 + 1)
    put(plog, keyed([(b"a", b"3"), (b"b", b"2")]), T0 + 2)
    put(plog, keyed([(b"c", b"1")]), T0 + 5000)
    plog.clean(T0 + 5000, COMPACT)
    assert consume(plog) == [(3, b"a", b"3"), (4, b"b", b"2"), (5, b"c", b"1")]
    data = plog.read(0, 1 << 20, True).records
    headers = [parse_header(data, p) for p, _s in split_batches(data)]
    # the gzip batch lost every record and went; producer 7's only batch stays, empty, so an
    # idempotent retry of it is still recognised as a duplicate
    assert [(h.base_offset, h.record_count, h.producer_id) for h in headers[:2]] == [(2, 0, 7), (3, 2, -1)]
    assert plog.producers.get(7) is not None
    again = keyed([(b"a", b"2")], pid=7, seq=0)
    pos, size = validate_produce_records(9, again)
    h = validate_client_batch(again, pos, size, 1 << 20)
    res = plog.append_client_batch(again, pos, size, h, validate_client_records(again, h, 1 << 24), policy=COMPACT)
    assert res.duplicate and res.base_offset == 2


def test_the_dirty_ratio_decides_when_a_log_is_cleaned_again() -> None:
    plog = PartitionLog("t", 0)
    policy = LogPolicy(delete=False, compact=True, roll_ms=1000, min_cleanable_ratio=0.9)
    for i in range(10):
        put(plog, keyed([(b"k%d" % i, b"v")]), T0)
    put(plog, keyed([(b"x", b"v")]), T0 + 1000)  # rolls
    assert plog.dirty_ratio(plog.cleanable_end(T0 + 1000, policy)) == 1.0
    plog.clean(T0 + 1000, policy)
    put(plog, keyed([(b"k0", b"w")]), T0 + 2000)  # rolls: x's segment is now closed and dirty
    ratio = plog.dirty_ratio(plog.cleanable_end(T0 + 2000, policy))
    assert 0 < ratio < 0.9 and not plog.needs_cleaning(T0 + 2000, policy)
    assert plog.needs_cleaning(T0 + 2000, LogPolicy(delete=False, compact=True, min_cleanable_ratio=ratio))


def test_retention_ms_drops_old_batches_and_can_empty_the_log() -> None:
    plog = PartitionLog("t", 0)
    policy = LogPolicy(retention_ms=60_000)
    put(plog, keyed([(b"a", b"1")], ts=T0), T0, policy)
    put(plog, keyed([(b"a", b"2")], ts=T0 + 30_000), T0, policy)
    assert plog.expire(T0 + 60_000, 60_000) == 0
    assert plog.expire(T0 + 60_001, 60_000) == 1
    assert plog.log_start_offset == 1 and consume(plog) == [(1, b"a", b"2")]
    assert plog.expire(T0 + 90_001, 60_000) == 1
    assert (plog.log_start_offset, plog.next_offset, plog.batch_count) == (2, 2, 0)
    assert plog.read(2, 100, True).records == b""
    assert put(plog, keyed([(b"a", b"3")], ts=T0 + 90_001), T0 + 90_001, policy) == 2
    assert plog.expire(T0 + 90_001, -1) == 0  # -1: kept forever


def test_the_store_applies_the_topics_policy_on_its_clock(tmp_path: Path) -> None:
    clock = FakeClock(T0)
    store = TopicStore(default_partitions=1, clock=clock, log_defaults={"log.retention.ms": 1000, "log.roll.ms": 100})
    t = store.create("plain")
    c = store.create("compacted", configs={"cleanup.policy": "compact", "min.cleanable.dirty.ratio": "0.01"})
    assert store.policy(t).retention_ms == 1000 and store.policy(c).compact and not store.policy(c).delete
    assert store.policy(c).roll_ms == 100
    put(t.partitions[0], keyed([(b"a", b"1")], ts=T0), T0, store.policy(t))
    clock.advance(1001)
    assert store.expire_partition(t.partitions[0], store.policy(t)) == 1
    p = c.partitions[0]
    put(p, keyed([(b"a", b"1")]), clock.now_ms(), store.policy(c))
    put(p, keyed([(b"a", b"2")]), clock.now_ms() + 100, store.policy(c))
    clock.advance(100)
    assert store.clean_partition(p, store.policy(c))
    assert not store.clean_partition(p, store.policy(c))  # nothing dirty any more
    store.set_configs("compacted", {"cleanup.policy": "compact,delete", "retention.ms": "5"})
    assert store.policy(c).delete and store.policy(c).retention_ms == 5


def test_a_pass_whose_batches_changed_meanwhile_is_dropped() -> None:
    """The pass runs apart from the log (a worker thread): if DeleteRecords (or retention) moved
    the log start meanwhile, its result is not installed; appends after its batches are fine."""
    plog = PartitionLog("t", 0)
    for i in range(3):
        put(plog, keyed([(b"k", b"%d" % i)]), T0 + i * 2000)  # each batch its own segment
    job = plog.clean_job(T0 + 4000, COMPACT)
    result = job.run()
    put(plog, keyed([(b"k", b"new")]), T0 + 4001)  # an append meanwhile: still applies
    assert plog.apply_clean(job, result)
    assert [v for _o, _k, v in consume(plog)] == [b"1", b"2", b"new"]
    put(plog, keyed([(b"k", b"x")]), T0 + 9000)
    job = plog.clean_job(T0 + 9000, COMPACT)
    result = job.run()
    plog.delete_records_before(2)
    assert not plog.apply_clean(job, result)  # the log start moved: dropped
    assert plog.log_start_offset == 2 and [v for _o, _k, v in consume(plog)] == [b"2", b"new", b"x"]


def test_compact_only_topics_keep_the_brokers_memory_bound() -> None:
    plog = PartitionLog("t", 0)
    bounded = LogPolicy(delete=False, compact=True, retention_bytes=1, memory_bytes=300)
    for i in range(10):
        put(plog, keyed([(b"k%d" % i, b"v" * 20)]), T0, bounded)
    assert 0 < plog.size_bytes <= 300 + 100 and plog.log_start_offset > 0  # not its own retention.bytes
