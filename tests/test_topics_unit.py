"""Unit tests of the data plane without sockets: batches, partition logs, producer state,
fetch sessions, the topic store's persistence.  Batches are built with kafka-python's
``kafka.record`` and read back with aiokafka's ``aiokafka.record`` (independent codecs)."""

from __future__ import annotations

import asyncio
import json
import time
import tracemalloc
from pathlib import Path

import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder as AioBatchBuilder
from aiokafka.record.memory_records import MemoryRecords as AioMemoryRecords
from kafka.record.default_records import DefaultRecordBatchBuilder
from rallypoint.protocol.errors import ErrorCode
from rallypoint.protocol.records import assemble_batch, iter_record_times, parse_header, read_header, split_batches
from rallypoint.topics import TopicError, TopicStore
from rallypoint.topics.configs import LogPolicy
from rallypoint.topics.fetch_sessions import ZERO_UUID, FetchSessionCache, PartitionRequest
from rallypoint.topics.fetcher import ReadSpec, fetch, read_all
from rallypoint.topics.log_validator import (
    SLICE_RECORDS,
    BatchError,
    Checked,
    check_records,
    validate_client_batch,
    validate_client_records,
    validate_produce_records,
)
from rallypoint.topics.partition import AppendResult, OffsetOutOfRange, PartitionLog

from tests.support.crafted_batches import hostile_batches

pytestmark = pytest.mark.unit

MAX = 1048588


def batch(
    n: int = 3,
    *,
    pid: int = -1,
    epoch: int = -1,
    seq: int = -1,
    compression: int = 0,
    ts: int = 1_700_000_000_000,
    value_size: int = 10,
    transactional: bool = False,
) -> bytes:
    builder = AioBatchBuilder if compression == 4 else DefaultRecordBatchBuilder  # zstd: aiokafka has cramjam
    b = builder(2, compression, transactional, pid, epoch, seq, 1 << 24)
    for i in range(n):
        b.append(i, ts + i, f"k{i}".encode(), bytes([65 + i % 26]) * value_size, [("h", b"v")])
    return bytes(b.build())


def append_batch(
    plog: PartitionLog, data: bytes, pos: int, size: int, *, max_message_bytes: int = MAX, retention: int = -1
) -> AppendResult:
    """What the Produce handler does with one partition's batch: validate, then append."""
    h = validate_client_batch(data, pos, size, max_message_bytes)
    checked = validate_client_records(data, h, 1 << 24)
    return plog.append_client_batch(data, pos, size, h, checked, policy=LogPolicy(retention_bytes=retention))


def append(plog: PartitionLog, data: bytes, retention: int = -1) -> int:
    pos, size = validate_produce_records(9, data)
    return append_batch(plog, data, pos, size, retention=retention).base_offset


def read_records(data: bytes) -> list[tuple[int, bytes | None, bytes | None]]:
    out = []
    recs = AioMemoryRecords(data)
    while recs.has_next():
        b = recs.next_batch()
        for r in b:
            out.append((r.offset, r.key, r.value))
    return out


# --------------------------------------------------------------------------- batches


def test_offsets_are_assigned_and_batches_stay_valid() -> None:
    plog = PartitionLog("t", 0)
    assert append(plog, batch(3)) == 0
    gz = batch(2, compression=1, value_size=300)
    assert gz[22] & 7 == 1  # really gzip
    unpatched = bytearray(gz)
    unpatched[12:16] = b"\xff\xff\xff\xff"  # partitionLeaderEpoch -1, outside the CRC
    assert append(plog, bytes(unpatched)) == 3  # stored untouched but for offset and epoch
    assert plog.next_offset == 5
    res = plog.read(0, 1 << 20, True)
    recs = read_records(res.records)  # aiokafka validates nothing here; check the CRCs ourselves
    assert [r[0] for r in recs] == [0, 1, 2, 3, 4]
    assert recs[3] == (3, b"k0", b"A" * 300)
    # the patched batches still pass a CRC check by an independent reader
    from kafka.record.memory_records import MemoryRecords

    mr = MemoryRecords(res.records)
    while True:
        b = mr.next_batch()
        if b is None:
            break
        assert b.validate_crc()
        assert b.leader_epoch == 0


def test_corrupt_batch_is_refused() -> None:
    data = bytearray(batch(2))
    data[-1] ^= 0xFF
    plog = PartitionLog("t", 0)
    with pytest.raises(BatchError) as e:
        append(plog, bytes(data))
    assert e.value.code == ErrorCode.CORRUPT_MESSAGE
    assert plog.next_offset == 0


def test_produce_record_rules() -> None:
    with pytest.raises(BatchError) as e:
        validate_produce_records(9, batch(1) + batch(1))
    assert e.value.code == ErrorCode.INVALID_RECORD
    with pytest.raises(BatchError) as e:
        validate_produce_records(9, b"")
    assert e.value.code == ErrorCode.INVALID_RECORD
    with pytest.raises(BatchError) as e:
        validate_produce_records(6, batch(1, compression=4))
    assert e.value.code == ErrorCode.UNSUPPORTED_COMPRESSION_TYPE
    # a trailing partial batch is ignored, as Kafka trims it
    one = batch(2)
    assert validate_produce_records(9, one + one[:20]) == (0, len(one))
    too_big = batch(1, value_size=2000)
    plog = PartitionLog("t", 0)
    with pytest.raises(BatchError) as e:
        append_batch(plog, too_big, 0, len(too_big), max_message_bytes=1000)
    assert e.value.code == ErrorCode.MESSAGE_TOO_LARGE


def test_record_times_of_uncompressed_and_compressed_batches() -> None:
    for compression in (0, 1, 4):
        data = batch(3, ts=1000, compression=compression)
        assert list(iter_record_times(data, parse_header(data))) == [(0, 1000), (1, 1001), (2, 1002)]
    data = batch(3, ts=1000)
    assert split_batches(data + data) == [(0, len(data)), (len(data), len(data))]


# --------------------------------------------------------------------------- idempotence


def test_duplicate_batch_returns_original_offsets() -> None:
    plog = PartitionLog("t", 0)
    assert append(plog, batch(2, pid=7, epoch=0, seq=0)) == 0
    assert append(plog, batch(3, pid=7, epoch=0, seq=2)) == 2
    pos, size = 0, len(batch(2, pid=7, epoch=0, seq=0))
    dup = batch(2, pid=7, epoch=0, seq=0)
    r = append_batch(plog, dup, pos, size)
    assert r.duplicate and r.base_offset == 0
    assert plog.next_offset == 5


def test_sequence_and_epoch_rules() -> None:
    plog = PartitionLog("t", 0)
    append(plog, batch(2, pid=7, epoch=1, seq=0))
    for bad, code in [
        (batch(1, pid=7, epoch=1, seq=5), ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),
        (batch(1, pid=7, epoch=0, seq=2), ErrorCode.INVALID_PRODUCER_EPOCH),
        (batch(1, pid=7, epoch=2, seq=3), ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER),  # new epoch must start at 0
    ]:
        with pytest.raises(BatchError) as e:
            append(plog, bad)
        assert e.value.code == code
    assert append(plog, batch(1, pid=7, epoch=2, seq=0)) == 2  # bumped epoch from 0 is fine
    # an unknown producer may start at any sequence
    assert append(plog, batch(1, pid=8, epoch=0, seq=42)) == 3
    # a duplicate older than the last five batches is out of order, not a duplicate
    plog2 = PartitionLog("t", 0)
    for s in range(6):
        append(plog2, batch(1, pid=9, epoch=0, seq=s))
    with pytest.raises(BatchError) as e:
        append(plog2, batch(1, pid=9, epoch=0, seq=0))
    assert e.value.code == ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER
    again = batch(1, pid=9, epoch=0, seq=1)
    r = append_batch(plog2, again, 0, len(again))
    assert r.duplicate and r.base_offset == 1


# --------------------------------------------------------------------------- reads, retention


def test_read_limits_follow_kip74() -> None:
    plog = PartitionLog("t", 0)
    sizes = []
    for _ in range(4):
        data = batch(2, value_size=100)
        sizes.append(len(data))
        append(plog, data)
    # a limit below one batch still returns one whole batch when min_one
    assert len(plog.read(0, 10, True).records) == sizes[0]
    assert plog.read(0, 10, False).records == b""
    # fetching from the middle of a batch returns that whole batch
    assert read_records(plog.read(3, sizes[1], True).records)[0][0] == 2
    assert len(plog.read(0, sizes[0] + sizes[1] + 5, True).records) == sizes[0] + sizes[1]
    assert plog.read(8, 100, True).records == b""
    with pytest.raises(OffsetOutOfRange):
        plog.read(9, 100, True)


def test_read_all_stops_ignoring_limits_after_first_data() -> None:
    a, b = PartitionLog("t", 0), PartitionLog("t", 1)
    append(a, batch(2, value_size=500))
    append(b, batch(2, value_size=500))
    specs = [(0, ReadSpec(a, 0, 10)), (1, ReadSpec(b, 0, 10))]
    out, total, errored = read_all(specs, 10, False)
    assert len(out[0]["records"]) > 10 and out[1]["records"] == b""
    assert not errored and total == len(out[0]["records"])


def test_retention_drops_oldest_batches() -> None:
    plog = PartitionLog("t", 0)
    size = len(batch(2, value_size=100))
    for _ in range(10):
        append(plog, batch(2, value_size=100), retention=size * 3)
    assert plog.batch_count == 3
    assert plog.log_start_offset == 14 and plog.next_offset == 20
    with pytest.raises(OffsetOutOfRange):
        plog.read(13, 1 << 20, True)
    assert read_records(plog.read(14, 1 << 20, True).records)[0][0] == 14
    # a single batch larger than the limit is kept (never drop the newest)
    big = PartitionLog("t", 1)
    append(big, batch(2, value_size=5000), retention=100)
    assert big.batch_count == 1


def test_offset_for_timestamp() -> None:
    plog = PartitionLog("t", 0)
    append(plog, batch(3, ts=1000))  # 0..2 at 1000..1002
    append(plog, batch(3, ts=2000))  # 3..5
    append(plog, batch(2, ts=3000, compression=1, value_size=300))  # 6..7, compressed
    assert plog.offset_for_timestamp(0) == (1000, 0)
    assert plog.offset_for_timestamp(1002) == (1002, 2)
    assert plog.offset_for_timestamp(1500) == (2000, 3)
    assert plog.offset_for_timestamp(2500) == (3000, 6)  # compressed: decompressed and walked
    assert plog.offset_for_timestamp(3001) == (3001, 7)
    assert plog.offset_for_timestamp(9999) is None
    assert plog.max_timestamp_offset() == (3001, 7)


# --------------------------------------------------------------------------- long poll


async def test_parked_fetch_wakes_on_append() -> None:
    plog = PartitionLog("t", 0)
    spec = [(0, ReadSpec(plog, 0, 1 << 20))]
    events: list[str] = []

    async def fetcher() -> None:
        out = await fetch(
            spec, max_wait_ms=30_000, min_bytes=1, max_bytes=1 << 20, read_committed=False, closing=lambda: False
        )
        events.append("fetched")
        assert read_records(out[0]["records"])[0][0] == 0

    task = asyncio.create_task(fetcher())
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert not task.done()
    events.append("append")
    append(plog, batch(1))
    await asyncio.wait_for(task, 5)
    assert events == ["append", "fetched"]


async def test_parked_fetch_answers_when_topic_deleted_or_closing() -> None:
    plog = PartitionLog("t", 0)
    spec = [(0, ReadSpec(plog, 0, 1 << 20))]
    task = asyncio.create_task(
        fetch(spec, max_wait_ms=30_000, min_bytes=1, max_bytes=1 << 20, read_committed=False, closing=lambda: False)
    )
    await asyncio.sleep(0)
    plog.deleted = True
    plog.notify()
    out = await asyncio.wait_for(task, 5)
    assert out[0]["error_code"] == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


# --------------------------------------------------------------------------- fetch sessions


def _req(name: str, p: int, off: int = 0) -> tuple[tuple[str, int], PartitionRequest]:
    return (name, p), PartitionRequest(name, ZERO_UUID, p, off, 1000)


def _data(hw: int, records: bytes = b"", err: int = 0) -> dict[str, object]:
    return {"high_watermark": hw, "log_start_offset": 0, "records": records, "error_code": err}


def test_fetch_session_life_cycle() -> None:
    cache = FetchSessionCache()
    full = cache.new_context(12, 0, 0, [_req("a", 0), _req("a", 1)], [], 0)
    assert full.kind == "full"
    err, sid, out = cache.finish(full, [(k, r, _data(5)) for k, r in full.partitions], 0)
    assert err == ErrorCode.NONE and sid > 0 and len(out) == 2
    # incremental with no changes: the response carries nothing
    inc = cache.new_context(12, sid, 1, [], [], 1)
    assert inc.kind == "incremental" and len(inc.partitions) == 2
    err, sid2, out = cache.finish(inc, [(k, r, _data(5)) for k, r in inc.partitions], 1)
    assert (err, sid2, out) == (ErrorCode.NONE, sid, [])
    # a changed high watermark is sent; a partition with records moves to the end
    inc = cache.new_context(12, sid, 2, [], [], 2)
    results = [(k, r, _data(6, b"x" if k == ("a", 0) else b"")) for k, r in inc.partitions]
    _err, _sid, out = cache.finish(inc, results, 2)
    assert [k for k, _r, _d in out] == [("a", 0), ("a", 1)]
    assert list(cache.sessions[sid].partitions) == [("a", 1), ("a", 0)]
    # wrong epoch, unknown session, topic-id mismatch
    assert cache.new_context(12, sid, 9, [], [], 3).error == ErrorCode.INVALID_FETCH_SESSION_EPOCH
    assert cache.new_context(12, sid + 1, 1, [], [], 3).error == ErrorCode.FETCH_SESSION_ID_NOT_FOUND
    assert cache.new_context(13, sid, 3, [], [], 3).error == ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR
    # forgetting every partition closes the session
    last = cache.new_context(12, sid, 3, [], [("a", 0), ("a", 1)], 4)
    assert last.kind == "sessionless" and sid not in cache.sessions
    # epoch -1 closes a named session and creates none
    full = cache.new_context(12, 0, 0, [_req("b", 0)], [], 5)
    _e, sid, _o = cache.finish(full, [(k, r, _data(0)) for k, r in full.partitions], 5)
    ctx = cache.new_context(12, sid, -1, [_req("b", 0)], [], 6)
    assert ctx.kind == "sessionless" and sid not in cache.sessions


def test_fetch_session_cache_is_bounded() -> None:
    cache = FetchSessionCache(max_entries=1, eviction_ms=1000)
    a = cache.new_context(12, 0, 0, [_req("a", 0)], [], 0)
    assert cache.finish(a, [(k, r, _data(0)) for k, r in a.partitions], 0)[1] > 0
    b = cache.new_context(12, 0, 0, [_req("b", 0)], [], 10)
    assert cache.finish(b, [(k, r, _data(0)) for k, r in b.partitions], 10)[1] == 0  # no room yet
    c = cache.new_context(12, 0, 0, [_req("c", 0)], [], 2000)
    assert cache.finish(c, [(k, r, _data(0)) for k, r in c.partitions], 2000)[1] > 0  # stale one evicted


# --------------------------------------------------------------------------- the store


def test_store_persists_metadata_and_next_offsets(tmp_path: Path) -> None:
    store = TopicStore(default_partitions=2, data_dir=tmp_path)
    t = store.create("orders", 3, configs={"retention.bytes": "1000"})
    append(t.partitions[1], batch(5))
    pid = store.next_producer_id()
    store.save_now(final=True)  # what a clean shutdown saves (a crash: tests/crash/test_end_offsets.py)
    state = json.loads((tmp_path / "topics.json").read_text())
    assert state["topics"][0]["next_offsets"] == [0, 5, 0]

    again = TopicStore(default_partitions=2, data_dir=tmp_path)
    t2 = again.get("orders")
    assert t2 is not None and t2.topic_id == t.topic_id and t2.configs == {"retention.bytes": "1000"}
    p1 = t2.partitions[1]
    assert (p1.log_start_offset, p1.next_offset, p1.batch_count) == (5, 5, 0)
    assert append(p1, batch(1)) == 5
    assert again.next_producer_id() > pid  # never reuse a producer id
    assert again.policy(t2).retention_bytes == 1000


def test_store_create_rules(tmp_path: Path) -> None:
    store = TopicStore(default_partitions=1)
    store.create("a.b")
    for name, code in [
        ("a_b", ErrorCode.INVALID_TOPIC_EXCEPTION),  # collides with a.b
        ("a.b", ErrorCode.TOPIC_ALREADY_EXISTS),
        ("bad name", ErrorCode.INVALID_TOPIC_EXCEPTION),
        ("x" * 250, ErrorCode.INVALID_TOPIC_EXCEPTION),
        ("..", ErrorCode.INVALID_TOPIC_EXCEPTION),
        ("", ErrorCode.INVALID_TOPIC_EXCEPTION),
        ("__cluster_metadata", ErrorCode.INVALID_REQUEST),
    ]:
        with pytest.raises(TopicError) as e:
            store.create(name)
        assert e.value.code == code, name
    with pytest.raises(TopicError) as e:
        store.create("c", 0)
    assert e.value.code == ErrorCode.INVALID_PARTITIONS
    with pytest.raises(TopicError) as e:
        store.create("c", configs={"no.such.config": "1"})
    assert e.value.code == ErrorCode.INVALID_CONFIG
    internal = store.create("__consumer_offsets", 5, is_internal=True)
    assert store.create("__consumer_offsets", 5, is_internal=True) is internal
    assert internal.is_internal


# --------------------------------------------------------------------------- hostile batches


@pytest.mark.parametrize("name", sorted(hostile_batches()))
def test_hostile_batches_get_kafkas_error_within_bounded_time_and_memory(name: str) -> None:
    data, code = hostile_batches()[name]
    plog = PartitionLog("t", 0)
    started = time.monotonic()
    tracemalloc.start()
    try:
        with pytest.raises(BatchError) as e:
            pos, size = validate_produce_records(9, data)
            h = validate_client_batch(data, pos, size, MAX)
            validate_client_records(data, h, 1 << 20)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert e.value.code == code, e.value.message
    assert time.monotonic() - started < 2
    assert peak < len(data) + (3 << 20), peak  # the bound (1 MiB) twice over at most, plus a copy
    assert plog.next_offset == 0


def test_a_lying_max_timestamp_is_replaced_by_the_records_one() -> None:
    """LogValidator stores the largest record timestamp it walked (and recomputes the CRC)."""
    good = batch(3, ts=1000)
    liar = assemble_batch(parse_header(good)._replace(max_timestamp=9_999_999), good[61:])
    plog = PartitionLog("t", 0)
    append(plog, liar)
    stored = plog.read(0, 1 << 20, True).records
    h = read_header(stored)  # the CRC is valid
    assert h.max_timestamp == 1002
    assert plog.max_timestamp_offset() == (1002, 2)
    assert plog.offset_for_timestamp(1003) is None


def test_list_offsets_by_timestamp_walks_one_batch() -> None:
    plog = PartitionLog("t", 0)
    for i in range(2000):
        append(plog, batch(2, ts=10 * i))
    calls = []
    import rallypoint.topics.partition as partition_mod

    real = partition_mod.iter_record_times

    def counting(*args: object, **kw: object) -> object:
        calls.append(1)
        return real(*args, **kw)  # type: ignore[arg-type]

    partition_mod.iter_record_times = counting  # type: ignore[assignment]
    try:
        assert plog.offset_for_timestamp(10 * 1500 + 1) == (10 * 1500 + 1, 3001)
    finally:
        partition_mod.iter_record_times = real
    assert len(calls) == 1


def test_the_record_walk_comes_in_slices() -> None:
    """check_records hands control back every SLICE_RECORDS records (the Produce handler lets other
    connections run there), then gives its summary."""
    big = batch(3 * SLICE_RECORDS + 5, value_size=1)
    h = validate_client_batch(big, 0, len(big), 1 << 24)
    steps = list(check_records(big, h, 1 << 24))
    assert steps[:-1] == [None, None, None]
    assert steps[-1] == Checked(1_700_000_000_000 + 3 * SLICE_RECORDS + 4, 3 * SLICE_RECORDS + 4)
