"""The share-group runtime in-process (docs/share-groups.md): acquisition from a real topic
store, the durable state through a restart of the runtime, topic deletion."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from rallypoint.assemble import build_topics
from rallypoint.clock import FakeClock
from rallypoint.config import load
from rallypoint.protocol.records import build_batch
from rallypoint.share.partition import AckBatch
from rallypoint.share.runtime import ShareGroupsRuntime, ShareSettings
from rallypoint.topics.log_validator import validate_client_batch, validate_client_records, validate_produce_records

pytestmark = pytest.mark.unit

SETTINGS = {
    "share.auto.offset.reset": "earliest",
    "share.isolation.level": "read_uncommitted",
    "share.record.lock.duration.ms": "30000",
    "share.session.timeout.ms": "45000",
    "share.heartbeat.interval.ms": "5000",
}


def test_acquire_acknowledge_restart_and_topic_deletion(tmp_path: Path) -> None:
    async def run() -> None:
        cfg = load({"data.dir": str(tmp_path), "rallypoint.log.storage": "memory"})
        clock = FakeClock()
        topics = build_topics(cfg, clock)
        await topics.start()
        topic = topics.create("t", 1)
        plog = topic.partitions[0]
        batch = build_batch(0, [(None, b"a"), (None, b"b"), (None, b"c")], clock.now_ms())
        pos, size = validate_produce_records(9, batch)
        h = validate_client_batch(batch, pos, size, 1 << 20)
        plog.append_client_batch(batch, pos, size, h, validate_client_records(batch, h, 1 << 24))

        def runtime() -> ShareGroupsRuntime:
            return ShareGroupsRuntime(ShareSettings(), clock, topics, lambda g, n: SETTINGS[n], data_dir=tmp_path)

        rt = runtime()
        await rt.start()
        tp = (topic.topic_id, 0)
        common = {"partitions": [tp], "forgotten": [], "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20}
        a = await rt.fetch("g", "m", 0, 1, acks={}, max_records=10, **common)  # type: ignore[arg-type]
        assert [(x.first_offset, x.last_offset, x.delivery_count) for x in a.partitions[tp].acquired] == [(0, 2, 1)]
        assert a.partitions[tp].records == batch
        r = await rt.acknowledge("g", "m", 1, 1, {tp: [AckBatch(0, 0, (1,))]})
        assert r.partitions[tp].ack_error == 0
        await rt.stop()

        rt = runtime()  # restart: 0 is done, 1-2 come back
        await rt.start()
        a = await rt.fetch("g", "m", 0, 1, acks={}, max_records=10, **common)  # type: ignore[arg-type]
        assert [(x.first_offset, x.last_offset, x.delivery_count) for x in a.partitions[tp].acquired] == [(1, 2, 2)]
        rt.connection_closed(1)  # releases them
        sp = rt.partitions[("g", topic.topic_id, 0)]
        assert sp.counts()["available"] == 2
        topics.delete("t")
        rt.on_topics_deleted([topic.topic_id])
        assert rt.partitions == {}
        await rt.stop()
        rt = runtime()
        await rt.start()
        assert rt._saved == {}  # the deletion was saved too
        await rt.stop()
        await topics.stop()

    asyncio.run(run())


@pytest.mark.parametrize("isolation", ["read_committed", "read_uncommitted"])
def test_read_committed_never_delivers_aborted_records(tmp_path: Path, isolation: str) -> None:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    def txn_batch(pid: int, base_seq: int, values: list[bytes]) -> bytes:
        b = DefaultRecordBatchBuilder(2, 0, True, pid, 0, base_seq, 1 << 24)
        for i, v in enumerate(values):
            b.append(i, 1_700_000_000_000 + i, None, v, [])
        return bytes(b.build())

    async def run() -> None:
        cfg = load({"data.dir": str(tmp_path), "rallypoint.log.storage": "memory"})
        clock = FakeClock()
        topics = build_topics(cfg, clock)
        await topics.start()
        topic = topics.create("t", 1)
        plog = topic.partitions[0]
        for data in (txn_batch(5, 0, [b"a1", b"a2"]), txn_batch(6, 0, [b"c1"])):
            pos, size = validate_produce_records(9, data)
            h = validate_client_batch(data, pos, size, 1 << 20)
            plog.append_client_batch(data, pos, size, h, validate_client_records(data, h, 1 << 24))
        plog.write_marker(5, 0, False, clock.now_ms())  # abort offsets 0-1 (marker at 3)
        open_end = plog.next_offset
        settings = {**SETTINGS, "share.isolation.level": isolation}
        rt = ShareGroupsRuntime(ShareSettings(), clock, topics, lambda g, n: settings[n], data_dir=tmp_path)
        await rt.start()
        tp = (topic.topic_id, 0)
        common = {"partitions": [tp], "forgotten": [], "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20}
        a = await rt.fetch("g", "m", 0, 1, acks={}, max_records=10, **common)  # type: ignore[arg-type]
        got = [(x.first_offset, x.last_offset) for x in a.partitions[tp].acquired] if tp in a.partitions else []
        if isolation == "read_committed":
            # producer 6's transaction is still open: the last stable offset is 2, and the
            # aborted records 0-1 are archived, never acquired
            assert got == []
            assert rt.partitions[("g", topic.topic_id, 0)].start_offset == 2
            plog.write_marker(6, 0, True, clock.now_ms())  # commit offset 2 (marker at 4)
            a = await rt.fetch("g", "m", 1, 1, acks={}, max_records=10, **common)  # type: ignore[arg-type]
            got = [(x.first_offset, x.last_offset) for x in a.partitions[tp].acquired]
            assert got == [(2, 4)]  # the committed record and the two markers (the client GAPs those)
        else:
            assert got == [(0, open_end - 1)]
        await rt.stop()
        await topics.stop()

    asyncio.run(run())


def test_a_fetch_over_many_partitions_lets_other_work_run_between_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Acquisition yields between partitions once its time slice is used (docs/reliability.md,
    "Limits"): with a zero slice, another task runs between every two partitions."""
    from rallypoint import slicing

    monkeypatch.setattr(slicing, "SLICE_S", 0.0)
    monkeypatch.setattr(slicing.Slicer.__init__, "__defaults__", (0.0,))

    async def run() -> None:
        cfg = load({"data.dir": str(tmp_path), "rallypoint.log.storage": "memory"})
        clock = FakeClock()
        topics = build_topics(cfg, clock)
        await topics.start()
        topic = topics.create("many", 8)
        rt = ShareGroupsRuntime(ShareSettings(), clock, topics, lambda g, n: SETTINGS[n], data_dir=tmp_path)
        await rt.start()
        order: list[str] = []
        real = rt._share_partition

        def traced(*args: object) -> object:
            order.append("partition")
            return real(*args)  # type: ignore[arg-type]

        rt._share_partition = traced  # type: ignore[method-assign]

        async def other() -> None:
            for _ in range(8):
                order.append("other")
                await asyncio.sleep(0)

        parts = [(topic.topic_id, p) for p in range(8)]
        common = {"forgotten": [], "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20, "max_records": 10}
        await asyncio.gather(rt.fetch("g", "m", 0, 1, partitions=parts, acks={}, **common), other())  # type: ignore[arg-type]
        first, last = order.index("partition"), len(order) - 1 - order[::-1].index("partition")
        assert "other" in order[first:last]  # interleaved, not all partitions in one go
        await rt.stop()
        await topics.stop()

    asyncio.run(run())
