"""End offsets survive a crash: no offset is handed out twice (docs/data-plane.md, "Restarts").

A "crash" here is a new TopicStore on the same data directory without the old one's stop()
(so without its final save): exactly what a SIGKILL leaves on disk.  The kill -9 suite
(test_kill9.py) checks the same with real producers and a broker process.
"""

from __future__ import annotations

import errno
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder
from rallypoint.protocol.errors import ErrorCode
from rallypoint.topics import TopicStore
from rallypoint.topics import store as store_mod
from rallypoint.topics.log_validator import (
    BatchError,
    validate_client_batch,
    validate_client_records,
    validate_produce_records,
)
from rallypoint.topics.partition import PartitionLog

from tests.support import BrokerProcess

pytestmark = [pytest.mark.clients, pytest.mark.slow]

MAX = 1048588


def batch(n: int) -> bytes:
    b = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 24)
    for i in range(n):
        b.append(i, 1_700_000_000_000 + i, None, b"v%d" % i, [])
    return bytes(b.build())


def append(plog: PartitionLog, n: int) -> tuple[int, int]:
    """Append n records; (base offset, end offset) handed out."""
    data = batch(n)
    pos, size = validate_produce_records(9, data)
    h = validate_client_batch(data, pos, size, MAX)
    checked = validate_client_records(data, h, 1 << 24)
    base = plog.append_client_batch(data, pos, size, h, checked).base_offset
    return base, base + n


def saved(tmp_path: Path) -> dict[str, list[int]]:
    t = json.loads((tmp_path / "topics.json").read_text())["topics"][0]
    return {"next": t["next_offsets"], "reserved": t["reserved_offsets"]}


def test_no_offset_is_handed_out_twice_across_a_crash(tmp_path: Path) -> None:
    store = TopicStore(data_dir=tmp_path)
    p = store.create("t", 1).partitions[0]
    handed_out: list[tuple[int, int]] = []
    # far more than one reservation step, with no periodic save in between (the event loop
    # that would run it never runs here): every step is saved before its offsets go out
    for n in (1, 7, 500, 1200, 3, 5000, 40):
        handed_out.append(append(p, n))
        on_disk = saved(tmp_path)["reserved"][0]
        assert on_disk >= handed_out[-1][1], "an offset went out before its reservation was on disk"

    # crash: no stop(), the last save is whatever the appends forced
    again = TopicStore(data_dir=tmp_path)
    p2 = again.get("t").partitions[0]  # type: ignore[union-attr]
    top = max(end for _base, end in handed_out)
    assert p2.next_offset >= top
    base, _end = append(p2, 2)
    assert base >= top  # continues past everything handed out before the crash
    # the log starts at the last saved next offset: a consumer there is not out of range
    assert p2.log_start_offset <= top


def test_a_clean_shutdown_leaves_no_gap(tmp_path: Path) -> None:
    import asyncio

    store = TopicStore(data_dir=tmp_path)
    p = store.create("t", 1).partitions[0]
    append(p, 5)
    asyncio.run(store.stop())
    assert saved(tmp_path) == {"next": [5], "reserved": [5]}
    p2 = TopicStore(data_dir=tmp_path).get("t").partitions[0]  # type: ignore[union-attr]
    assert (p2.log_start_offset, p2.next_offset) == (5, 5)
    assert append(p2, 1) == (5, 6)


def test_steady_appends_stop_forcing_saves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A partition that outruns its step doubles it, so a steady rate costs ~no extra saves."""
    store = TopicStore(data_dir=tmp_path)
    p = store.create("t", 1).partitions[0]
    writes: list[int] = []
    real = store._write

    def counting(state: object, gen: int, reserved: list[tuple[PartitionLog, int]]) -> None:
        writes.append(gen)
        real(state, gen, reserved)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "_write", counting)
    for _ in range(2000):
        append(p, 10)  # 20,000 offsets
    # 1000 → 2000 → 4000 → 8000 → 16000 → 32000: five forced saves, not one per thousand offsets
    assert len(writes) <= 6, writes


def test_gap_after_a_crash_reads_like_a_compacted_log(tmp_path: Path) -> None:
    store = TopicStore(data_dir=tmp_path)
    p = store.create("t", 1).partitions[0]
    append(p, 3)
    store.save_now()  # the periodic save: next offset 3, reservation ahead of it
    p2 = TopicStore(data_dir=tmp_path).get("t").partitions[0]  # type: ignore[union-attr]
    start, end = p2.log_start_offset, p2.next_offset
    assert start == 3 and end > start
    # inside the gap: no data yet, not out of range
    assert p2.read(start, 1 << 20, True).records == b""
    assert p2.bytes_available(start) == 0
    base, _ = append(p2, 2)
    assert base == end
    got = p2.read(start, 1 << 20, True)  # a consumer parked in the gap gets the new batch
    assert got.records and int.from_bytes(got.records[:8], "big") == end


def test_an_old_state_file_without_reservations_loads(tmp_path: Path) -> None:
    store = TopicStore(data_dir=tmp_path)
    t = store.create("t", 2)
    append(t.partitions[1], 4)
    store.save_now(final=True)
    state = json.loads((tmp_path / "topics.json").read_text())
    del state["topics"][0]["reserved_offsets"]
    (tmp_path / "topics.json").write_text(json.dumps(state))
    p = TopicStore(data_dir=tmp_path).get("t").partitions[1]  # type: ignore[union-attr]
    assert (p.log_start_offset, p.next_offset) == (4, 4)
    assert append(p, 1) == (4, 5)


def test_a_reservation_that_cannot_be_saved_refuses_the_append(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = TopicStore(data_dir=tmp_path)
    p = store.create("t", 1).partitions[0]
    reserved = p.reserved_end
    assert reserved is not None
    append(p, reserved)  # exactly up to the reservation: no save needed

    def full_disk(*_a: object, **_k: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store_mod.json, "dump", full_disk)
    with pytest.raises(BatchError) as e:
        append(p, 1)
    assert e.value.code == ErrorCode.KAFKA_STORAGE_ERROR  # Kafka's answer for a failed log dir
    assert p.next_offset == reserved and p.batch_count == 1  # nothing handed out
    monkeypatch.undo()
    assert append(p, 1) == (reserved, reserved + 1)


def test_no_data_dir_no_reservations() -> None:
    store = TopicStore()
    p = store.create("t", 1).partitions[0]
    assert p.on_reserve is None
    assert append(p, 5000) == (0, 5000)


# --------------------------------------------------------------------------- real clients


@pytest.mark.clients
def test_consumers_resume_across_the_gap_after_a_sigkill(broker_factory: Callable[..., BrokerProcess]) -> None:
    """Consumers that committed the end before a SIGKILL resume there without a reset and
    get the new messages, whose offsets skip the reserved gap (kafka-python and librdkafka).
    Memory-only topic data: durable data keeps the messages themselves (test_durable_clients)."""
    from confluent_kafka import Consumer as CkConsumer
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    broker = broker_factory(config={"rallypoint.log.storage": "memory"})
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", enable_idempotence=False)
    for i in range(10):
        producer.send("gap", value=b"before-%d" % i, partition=0)
    producer.flush(10)
    producer.close(5)
    tp = TopicPartition("gap", 0)
    for group in ("kp", "ck"):
        c = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=group, enable_auto_commit=False)
        c.assign([tp])
        c.commit({tp: OffsetAndMetadata(10, "", -1)})
        c.close()
    time.sleep(2 * store_mod.FLUSH_INTERVAL_S)  # the periodic save has run: next offset 10 on disk
    broker.kill()
    broker.start()

    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, acks="all", enable_idempotence=False)
    bases = [producer.send("gap", value=b"after-%d" % i, partition=0).get(10).offset for i in range(3)]
    producer.close(5)
    assert bases[0] > 10  # past the reservation, not 10 again
    assert bases == [bases[0], bases[0] + 1, bases[0] + 2]

    # auto.offset.reset=latest: an OFFSET_OUT_OF_RANGE reset would skip the new messages
    kc = KafkaConsumer(
        bootstrap_servers=broker.bootstrap, group_id="kp", enable_auto_commit=False, auto_offset_reset="latest"
    )
    kc.assign([tp])
    got: list[tuple[int, bytes]] = []
    deadline = time.monotonic() + 20
    while len(got) < 3 and time.monotonic() < deadline:
        for recs in kc.poll(timeout_ms=500).values():
            got += [(r.offset, r.value) for r in recs]
    kc.close()
    assert got == [(b, b"after-%d" % i) for i, b in enumerate(bases)]

    cc = CkConsumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "ck",
            "enable.auto.commit": False,
            "auto.offset.reset": "latest",
        }
    )
    cc.subscribe(["gap"])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 3 and time.monotonic() < deadline:
        m = cc.poll(0.5)
        if m is not None and m.error() is None:
            got.append((m.offset(), m.value()))
    cc.close()
    assert got == [(b, b"after-%d" % i) for i, b in enumerate(bases)]
