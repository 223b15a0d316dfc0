"""The data plane over real sockets with a raw wire client: Produce, Fetch, ListOffsets,
InitProducerId, OffsetForLeaderEpoch, CreateTopics, DeleteTopics, CreatePartitions, Metadata.

Record batches are built with kafka-python's ``kafka.record`` builder and read back with
aiokafka's ``aiokafka.record`` reader (independent implementations of the format).
"""

from __future__ import annotations

import os
import select
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiokafka.record.memory_records import MemoryRecords as AioMemoryRecords
from kafka.record.default_records import DefaultRecordBatchBuilder
from rallypoint.protocol import codec
from rallypoint.protocol.errors import ErrorCode as E

from tests.support import BrokerProcess, WireClient
from tests.support.crafted_batches import hostile_batches

pytestmark = pytest.mark.wire

PRODUCE, FETCH, LIST_OFFSETS, METADATA = 0, 1, 2, 3
CREATE_TOPICS, DELETE_TOPICS, INIT_PID, OFFSET_FOR_EPOCH, CREATE_PARTITIONS = 19, 20, 22, 23, 37


# --------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker for the tests that only need default settings (each uses its own topics)."""
    b = BrokerProcess(data_dir=tmp_path_factory.mktemp("shared"), config={"num.partitions": "1"})
    b.start()
    yield b
    b.kill()


@pytest.fixture
def wire(shared: BrokerProcess) -> Iterator[WireClient]:
    with WireClient(shared.host, shared.port) as c:
        yield c


def batch(
    n: int = 3,
    *,
    pid: int = -1,
    epoch: int = -1,
    seq: int = -1,
    ts: int | None = None,
    value: bytes = b"v",
    transactional: bool = False,
) -> bytes:
    b = DefaultRecordBatchBuilder(2, 0, transactional, pid, epoch, seq, 1 << 24)
    for i in range(n):
        b.append(i, (ts + i) if ts is not None else None, f"k{i}".encode(), value + str(i).encode(), [("h", b"x")])
    return bytes(b.build())


def records_of(data: bytes) -> list[tuple[int, bytes | None, bytes | None]]:
    out = []
    recs = AioMemoryRecords(data)
    while recs.has_next():
        for r in recs.next_batch():
            out.append((r.offset, r.key, r.value))
    return out


def create(c: WireClient, name: str, partitions: int = 1, version: int = 7, **extra: Any) -> dict[str, Any]:
    body = {
        "topics": [
            {
                "name": name,
                "num_partitions": partitions,
                "replication_factor": extra.pop("replication_factor", 1),
                "assignments": extra.pop("assignments", []),
                "configs": extra.pop("configs", []),
            }
        ],
        "timeout": 5000,
        "validate_only": extra.pop("validate_only", False),
    }
    return codec.to_dict(c.call(CREATE_TOPICS, version, body))["topics"][0]


def produce(
    c: WireClient,
    topic: str,
    data: bytes,
    partition: int = 0,
    *,
    acks: int = 1,
    version: int = 9,
    transactional_id: str | None = None,
) -> dict[str, Any]:
    body = {
        "transactional_id": transactional_id,
        "acks": acks,
        "timeout": 5000,
        "topic_data": [{"name": topic, "partition_data": [{"index": partition, "records": data}]}],
    }
    resp = codec.to_dict(c.call(PRODUCE, version, body))
    return resp["responses"][0]["partition_responses"][0]


def fetch_body(
    parts: list[tuple[str, int, int]],
    *,
    max_wait: int = 0,
    min_bytes: int = 1,
    max_bytes: int = 1 << 20,
    partition_max_bytes: int = 1 << 20,
    session_id: int = 0,
    session_epoch: int = -1,
    forgotten: list[tuple[str, list[int]]] | None = None,
) -> dict[str, Any]:
    topics: dict[str, list[dict[str, Any]]] = {}
    for t, p, off in parts:
        topics.setdefault(t, []).append(
            {"partition": p, "fetch_offset": off, "partition_max_bytes": partition_max_bytes}
        )
    return {
        "max_wait": max_wait,
        "min_bytes": min_bytes,
        "max_bytes": max_bytes,
        "isolation_level": 0,
        "session_id": session_id,
        "session_epoch": session_epoch,
        "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()],
        "forgotten_topics_data": [{"topic": t, "partitions": ps} for t, ps in (forgotten or [])],
        "rack_id": "",
    }


def fetch(c: WireClient, parts: list[tuple[str, int, int]], version: int = 12, **kw: Any) -> dict[str, Any]:
    return codec.to_dict(c.call(FETCH, version, fetch_body(parts, **kw)))


def list_offset(c: WireClient, topic: str, ts: int, partition: int = 0, version: int = 7) -> dict[str, Any]:
    body = {
        "replica_id": -1,
        "isolation_level": 0,
        "topics": [{"name": topic, "partitions": [{"partition_index": partition, "timestamp": ts}]}],
        "timeout": 1000,
    }
    return codec.to_dict(c.call(LIST_OFFSETS, version, body))["topics"][0]["partitions"][0]


def init_pid(c: WireClient, transactional_id: str | None = None) -> dict[str, Any]:
    body = {"transactional_id": transactional_id, "transaction_timeout": 60000, "producer_id": -1, "producer_epoch": -1}
    return codec.to_dict(c.call(INIT_PID, 4, body))


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# --------------------------------------------------------------------------- produce / fetch


def test_produce_assigns_offsets_and_fetch_returns_them(wire: WireClient) -> None:
    t = unique("basic")
    assert create(wire, t, 2)["error_code"] == 0
    r1 = produce(wire, t, batch(3))
    r2 = produce(wire, t, batch(2))
    assert (r1["error_code"], r1["base_offset"], r1["log_start_offset"]) == (0, 0, 0)
    assert (r2["error_code"], r2["base_offset"]) == (0, 3)
    resp = fetch(wire, [(t, 0, 0), (t, 1, 0)])
    p0, p1 = resp["responses"][0]["partitions"]
    assert p0["high_watermark"] == 5 and p0["last_stable_offset"] == 5 and p0["log_start_offset"] == 0
    assert records_of(p0["records"]) == [(i, f"k{j}".encode(), f"v{j}".encode()) for i, j in enumerate([0, 1, 2, 0, 1])]
    assert p1["high_watermark"] == 0 and p1["records"] == b""
    # v13+: topics by id
    tid = codec.to_dict(wire.call(METADATA, 12, {"topics": [{"name": t}]}))["topics"][0]["topic_id"]
    body = fetch_body([(t, 0, 3)])
    body["topics"] = [{"topic_id": tid, "partitions": body["topics"][0]["partitions"]}]
    resp = codec.to_dict(wire.call(FETCH, 16, body))
    assert resp["responses"][0]["topic_id"] == tid
    assert [r[0] for r in records_of(resp["responses"][0]["partitions"][0]["records"])] == [3, 4]
    body["topics"][0]["topic_id"] = uuid.uuid4()
    resp = codec.to_dict(wire.call(FETCH, 16, body))
    assert resp["responses"][0]["partitions"][0]["error_code"] == E.UNKNOWN_TOPIC_ID


def test_produce_v13_by_topic_id(wire: WireClient) -> None:
    t = unique("v13")
    tid = create(wire, t)["topic_id"]
    body = {
        "transactional_id": None,
        "acks": -1,
        "timeout": 5000,
        "topic_data": [
            {"topic_id": tid, "partition_data": [{"index": 0, "records": batch(2)}]},
            {"topic_id": uuid.uuid4(), "partition_data": [{"index": 0, "records": batch(2)}]},
        ],
    }
    resp = codec.to_dict(wire.call(PRODUCE, 13, body))["responses"]
    assert resp[0]["topic_id"] == tid and resp[0]["partition_responses"][0]["error_code"] == 0
    assert resp[1]["partition_responses"][0]["error_code"] == E.UNKNOWN_TOPIC_ID


def test_produce_errors(wire: WireClient) -> None:
    t = unique("errs")
    create(wire, t)
    corrupt = bytearray(batch(2))
    corrupt[-1] ^= 0x55
    assert produce(wire, t, bytes(corrupt))["error_code"] == E.CORRUPT_MESSAGE
    assert produce(wire, t, batch(1) + batch(1))["error_code"] == E.INVALID_RECORD  # one batch per partition
    assert produce(wire, unique("nope"), batch(1))["error_code"] == E.UNKNOWN_TOPIC_OR_PARTITION  # no auto-create
    assert produce(wire, t, batch(1), partition=5)["error_code"] == E.UNKNOWN_TOPIC_OR_PARTITION
    assert produce(wire, t, batch(1), acks=2)["error_code"] == E.INVALID_REQUIRED_ACKS
    # nothing was appended by any of those
    assert list_offset(wire, t, -1)["offset"] == 0


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_hostile_batches_are_refused_and_never_stored(shared: BrokerProcess, wire: WireClient) -> None:
    """Each batch (valid CRC, lying records, decompression bombs) gets Kafka's error, nothing is
    stored, ListOffsets by timestamp keeps answering at once, memory stays bounded, and the
    connection and the broker keep serving."""
    t = unique("hostile")
    create(wire, t)
    assert shared.proc is not None
    rss_before = _rss_bytes(shared.proc.pid)
    for name, (data, code) in hostile_batches().items():
        started = time.monotonic()
        assert produce(wire, t, data)["error_code"] == code, name
        found = list_offset(wire, t, 0)
        assert (found["error_code"], found["offset"]) == (0, -1), name
        assert time.monotonic() - started < 5, name
    assert list_offset(wire, t, -1)["offset"] == 0  # nothing was appended
    assert _rss_bytes(shared.proc.pid) < rss_before + (100 << 20)
    assert produce(wire, t, batch(2, ts=5000))["error_code"] == 0
    found = list_offset(wire, t, 5001)
    assert (found["offset"], found["timestamp"]) == (1, 5001)


def test_transactional_records_need_a_transactional_id(wire: WireClient) -> None:
    """Transactional batches in a request without a transactional id: KafkaApis answers
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED (docs/transactions.md has the rest)."""
    t = unique("txn")
    create(wire, t)
    pid = init_pid(wire)
    assert pid["error_code"] == 0 and pid["producer_id"] >= 0 and pid["producer_epoch"] == 0
    assert init_pid(wire)["producer_id"] != pid["producer_id"]
    txb = batch(1, pid=pid["producer_id"], epoch=0, seq=0, transactional=True)
    assert produce(wire, t, txb)["error_code"] == E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert init_pid(wire, "")["error_code"] == E.INVALID_REQUEST


def test_idempotent_duplicate_is_appended_once(wire: WireClient) -> None:
    t = unique("idem")
    create(wire, t)
    pid = init_pid(wire)["producer_id"]
    first = produce(wire, t, batch(3, pid=pid, epoch=0, seq=0), acks=-1)
    second = produce(wire, t, batch(2, pid=pid, epoch=0, seq=3), acks=-1)
    assert (first["base_offset"], second["base_offset"]) == (0, 3)
    # the same first batch again (a retry): success, original offsets, no second append
    again = produce(wire, t, batch(3, pid=pid, epoch=0, seq=0), acks=-1)
    assert (again["error_code"], again["base_offset"]) == (0, 0)
    assert list_offset(wire, t, -1)["offset"] == 5
    data = fetch(wire, [(t, 0, 0)])["responses"][0]["partitions"][0]["records"]
    assert [r[0] for r in records_of(data)] == [0, 1, 2, 3, 4]
    # a gap in the sequence, a stale epoch
    assert produce(wire, t, batch(1, pid=pid, epoch=0, seq=9))["error_code"] == E.OUT_OF_ORDER_SEQUENCE_NUMBER
    produce(wire, t, batch(1, pid=pid, epoch=1, seq=0))
    assert produce(wire, t, batch(1, pid=pid, epoch=0, seq=5))["error_code"] == E.INVALID_PRODUCER_EPOCH


def test_acks_zero(shared: BrokerProcess, wire: WireClient) -> None:
    t = unique("acks0")
    create(wire, t)
    body = {
        "transactional_id": None,
        "acks": 0,
        "timeout": 5000,
        "topic_data": [{"name": t, "partition_data": [{"index": 0, "records": batch(4)}]}],
    }
    wire.send(PRODUCE, 9, body)  # no response comes for this one
    corr = wire.send(METADATA, 12, {"topics": [{"name": t}]})
    md = wire.receive(METADATA, 12, corr)  # the next frame answers the Metadata request
    assert md.topics[0].name == t
    assert list_offset(wire, t, -1)["offset"] == 4
    # acks=0 with an error: Kafka closes the connection so the producer refreshes metadata
    with WireClient(shared.host, shared.port) as c:
        bad = dict(body)
        bad["topic_data"] = [{"name": unique("missing"), "partition_data": [{"index": 0, "records": batch(1)}]}]
        c.send(PRODUCE, 9, bad)
        assert c.is_closed_by_peer(5.0)


def test_offset_out_of_range_and_list_offsets(wire: WireClient) -> None:
    t = unique("oor")
    create(wire, t)
    produce(wire, t, batch(3, ts=1_000_000))
    produce(wire, t, batch(3, ts=2_000_000))
    p = fetch(wire, [(t, 0, 7)])["responses"][0]["partitions"][0]
    assert (p["error_code"], p["high_watermark"], p["log_start_offset"]) == (E.OFFSET_OUT_OF_RANGE, -1, -1)
    assert fetch(wire, [(t, 0, -5)])["responses"][0]["partitions"][0]["error_code"] == E.OFFSET_OUT_OF_RANGE
    assert fetch(wire, [(t, 0, 6)])["responses"][0]["partitions"][0]["error_code"] == 0  # at the end: empty, fine
    assert fetch(wire, [(unique("x"), 0, 0)])["responses"][0]["partitions"][0]["error_code"] == (
        E.UNKNOWN_TOPIC_OR_PARTITION
    )
    latest = list_offset(wire, t, -1)
    assert (latest["offset"], latest["timestamp"], latest["leader_epoch"]) == (6, -1, 0)
    assert list_offset(wire, t, -2)["offset"] == 0
    found = list_offset(wire, t, 1_000_001)
    assert (found["offset"], found["timestamp"]) == (1, 1_000_001)
    assert list_offset(wire, t, 1_500_000)["offset"] == 3
    none = list_offset(wire, t, 9_000_000)
    assert (none["error_code"], none["offset"], none["timestamp"]) == (0, -1, -1)
    mx = list_offset(wire, t, -3)
    assert (mx["offset"], mx["timestamp"]) == (5, 2_000_002)
    assert list_offset(wire, t, -3, version=6)["error_code"] == E.UNSUPPORTED_VERSION
    assert list_offset(wire, t, -7)["error_code"] == E.UNSUPPORTED_VERSION
    assert list_offset(wire, t, -1, version=1)["offset"] == 6
    # OffsetForLeaderEpoch: epoch 0 ends at the log end
    body = {"replica_id": -1, "topics": [{"topic": t, "partitions": [{"partition": 0, "leader_epoch": 0}]}]}
    eo = codec.to_dict(wire.call(OFFSET_FOR_EPOCH, 4, body))["topics"][0]["partitions"][0]
    assert (eo["error_code"], eo["leader_epoch"], eo["end_offset"]) == (0, 0, 6)


def test_fetch_long_poll_wakes_on_produce(shared: BrokerProcess, wire: WireClient) -> None:
    t = unique("poll")
    create(wire, t)
    with WireClient(shared.host, shared.port) as consumer:
        started = time.monotonic()
        corr = consumer.send(FETCH, 12, fetch_body([(t, 0, 0)], max_wait=5000, min_bytes=1))
        # parked: no answer while nothing arrives
        ready, _, _ = select.select([consumer.sock], [], [], 0.5)
        assert not ready, "the fetch answered before any data arrived"
        produce(wire, t, batch(2))
        produced = time.monotonic()
        resp = codec.to_dict(consumer.receive(FETCH, 12, corr))
        answered = time.monotonic()
    p = resp["responses"][0]["partitions"][0]
    assert [r[0] for r in records_of(p["records"])] == [0, 1]
    assert produced - started >= 0.5
    assert answered - started < 4.0, "the fetch waited for max_wait instead of waking on the produce"


def test_fetch_waits_max_wait_without_data_and_min_bytes(wire: WireClient) -> None:
    t = unique("wait")
    create(wire, t)
    start = time.monotonic()
    resp = fetch(wire, [(t, 0, 0)], max_wait=300)
    assert time.monotonic() - start >= 0.28
    assert resp["responses"][0]["partitions"][0]["records"] == b""
    produce(wire, t, batch(1))
    # min_bytes not reached by the one small batch: waits, then returns what there is
    start = time.monotonic()
    resp = fetch(wire, [(t, 0, 0)], max_wait=300, min_bytes=1 << 20)
    assert time.monotonic() - start >= 0.28
    assert [r[0] for r in records_of(resp["responses"][0]["partitions"][0]["records"])] == [0]


def test_fetch_size_limits(wire: WireClient) -> None:
    t = unique("kip74")
    create(wire, t, 2)
    big = batch(3, value=b"x" * 1000)
    for p in (0, 1):
        produce(wire, t, big, partition=p)
        produce(wire, t, big, partition=p)
    # max bytes below one batch: the first non-empty partition still returns one whole batch
    resp = fetch(wire, [(t, 0, 0), (t, 1, 0)], max_bytes=100, partition_max_bytes=100)
    p0, p1 = resp["responses"][0]["partitions"]
    assert len(p0["records"]) == len(big) and p1["records"] == b""
    # a partition limit of 1.5 batches: one batch per partition
    resp = fetch(wire, [(t, 0, 0), (t, 1, 0)], partition_max_bytes=len(big) * 3 // 2)
    assert [len(p["records"]) for p in resp["responses"][0]["partitions"]] == [len(big), len(big)]


def test_fetch_sessions(wire: WireClient) -> None:
    t = unique("sess")
    create(wire, t, 2)
    produce(wire, t, batch(2), partition=0)
    full = fetch(wire, [(t, 0, 0), (t, 1, 0)], session_id=0, session_epoch=0)
    sid = full["session_id"]
    assert sid > 0 and len(full["responses"][0]["partitions"]) == 2
    # incremental, nothing new: no partitions in the answer
    inc = fetch(wire, [(t, 0, 2)], session_id=sid, session_epoch=1)
    assert inc["error_code"] == 0 and inc["session_id"] == sid and inc["responses"] == []
    # new data on partition 1 only: only it is sent (its fetch offset comes from the session)
    produce(wire, t, batch(3), partition=1)
    inc = fetch(wire, [], session_id=sid, session_epoch=2)
    parts = inc["responses"][0]["partitions"]
    assert [p["partition_index"] for p in parts] == [1] and len(records_of(parts[0]["records"])) == 3
    assert fetch(wire, [], session_id=sid, session_epoch=2)["error_code"] == E.INVALID_FETCH_SESSION_EPOCH
    assert fetch(wire, [], session_id=sid + 1, session_epoch=1)["error_code"] == E.FETCH_SESSION_ID_NOT_FOUND
    # forgetting partition 1 and asking partition 0 from offset 0 again
    inc = fetch(wire, [(t, 0, 0)], session_id=sid, session_epoch=3, forgotten=[(t, [1])])
    parts = inc["responses"][0]["partitions"]
    assert [p["partition_index"] for p in parts] == [0]
    # a session-less full fetch (epoch -1) creates no session
    assert fetch(wire, [(t, 0, 0)], session_id=0, session_epoch=-1)["session_id"] == 0


def test_read_committed_reports_no_aborted_transactions(wire: WireClient) -> None:
    t = unique("rc")
    create(wire, t)
    produce(wire, t, batch(1))
    body = fetch_body([(t, 0, 0)])
    body["isolation_level"] = 1
    p = codec.to_dict(wire.call(FETCH, 12, body))["responses"][0]["partitions"][0]
    assert p["aborted_transactions"] == [] and p["last_stable_offset"] == 1
    p = fetch(wire, [(t, 0, 0)])["responses"][0]["partitions"][0]
    assert p["aborted_transactions"] is None


# --------------------------------------------------------------------------- topics admin


def test_create_topics_errors(wire: WireClient) -> None:
    t = unique("ct")
    ok = create(wire, t, 3, configs=[{"name": "retention.bytes", "value": "12345"}])
    assert ok["error_code"] == 0 and ok["num_partitions"] == 3 and ok["replication_factor"] == 1
    configs = {c["name"]: c for c in ok["configs"]}
    assert configs["retention.bytes"]["value"] == "12345" and configs["retention.bytes"]["config_source"] == 1
    assert configs["cleanup.policy"]["value"] == "delete"
    assert create(wire, t)["error_code"] == E.TOPIC_ALREADY_EXISTS
    for bad in ("", "a b", "x" * 250, "..", "ü"):
        assert create(wire, bad)["error_code"] == E.INVALID_TOPIC_EXCEPTION, bad
    assert create(wire, t.replace("-", "."))["error_code"] == 0
    assert create(wire, t.replace("-", "_"))["error_code"] == E.INVALID_TOPIC_EXCEPTION  # collides over '.'/'_'
    assert create(wire, unique("p"), 0)["error_code"] == E.INVALID_PARTITIONS
    assert create(wire, unique("p"), -3)["error_code"] == E.INVALID_PARTITIONS
    assert create(wire, unique("r"), replication_factor=3)["error_code"] == E.INVALID_REPLICATION_FACTOR
    assert create(wire, unique("r"), replication_factor=0)["error_code"] == E.INVALID_REPLICATION_FACTOR
    dflt = create(wire, unique("d"), -1, replication_factor=-1)
    assert (dflt["error_code"], dflt["num_partitions"]) == (0, 1)
    assert create(wire, unique("c"), configs=[{"name": "bogus", "value": "1"}])["error_code"] == E.INVALID_CONFIG
    cfg = [{"name": "retention.bytes", "value": "lots"}]
    assert create(wire, unique("c"), configs=cfg)["error_code"] == E.INVALID_CONFIG
    assigned = create(
        wire, unique("a"), -1, replication_factor=-1, assignments=[{"partition_index": 0, "broker_ids": [9]}]
    )
    assert assigned["error_code"] == E.INVALID_REPLICA_ASSIGNMENT
    a2 = [{"partition_index": 0, "broker_ids": [1]}, {"partition_index": 1, "broker_ids": [1]}]
    assert create(wire, unique("a"), -1, replication_factor=-1, assignments=a2)["num_partitions"] == 2
    assert create(wire, unique("a"), 2, replication_factor=-1, assignments=a2)["error_code"] == E.INVALID_REQUEST
    v = unique("v")
    assert create(wire, v, 2, validate_only=True)["error_code"] == 0
    md = codec.to_dict(wire.call(METADATA, 12, {"topics": [{"name": v}], "allow_auto_topic_creation": False}))
    assert md["topics"][0]["error_code"] == E.UNKNOWN_TOPIC_OR_PARTITION  # validate_only created nothing
    dup = {"name": unique("dup"), "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []}
    resp = codec.to_dict(wire.call(CREATE_TOPICS, 5, {"topics": [dup, dup], "timeout": 1000, "validate_only": False}))
    assert [r["error_code"] for r in resp["topics"]] == [E.INVALID_REQUEST]


def test_delete_topics(wire: WireClient) -> None:
    a, b = unique("del"), unique("del")
    create(wire, a)
    tid_b = create(wire, b)["topic_id"]
    produce(wire, a, batch(2))
    resp = codec.to_dict(wire.call(DELETE_TOPICS, 5, {"topic_names": [a, unique("missing")], "timeout": 1000}))
    codes = {r["name"]: r["error_code"] for r in resp["responses"]}
    assert codes[a] == 0 and sorted(codes.values()) == [0, E.UNKNOWN_TOPIC_OR_PARTITION]
    assert produce(wire, a, batch(1))["error_code"] == E.UNKNOWN_TOPIC_OR_PARTITION
    body = {"topics": [{"name": None, "topic_id": tid_b}, {"name": None, "topic_id": uuid.uuid4()}], "timeout": 1000}
    resp = codec.to_dict(wire.call(DELETE_TOPICS, 6, body))
    by_id = {r["topic_id"]: r for r in resp["responses"]}
    assert by_id[tid_b]["error_code"] == 0 and by_id[tid_b]["name"] == b
    assert sorted(r["error_code"] for r in resp["responses"]) == [0, E.UNKNOWN_TOPIC_ID]
    both = {"topics": [{"name": "x", "topic_id": uuid.uuid4()}], "timeout": 1000}
    assert codec.to_dict(wire.call(DELETE_TOPICS, 6, both))["responses"][0]["error_code"] == E.INVALID_REQUEST
    # a recreated topic starts over with a new id
    again = create(wire, a)
    assert again["error_code"] == 0
    assert list_offset(wire, a, -1)["offset"] == 0


def test_delete_wakes_parked_fetch(shared: BrokerProcess, wire: WireClient) -> None:
    t = unique("delpoll")
    create(wire, t)
    with WireClient(shared.host, shared.port) as consumer:
        start = time.monotonic()
        corr = consumer.send(FETCH, 12, fetch_body([(t, 0, 0)], max_wait=10000))
        time.sleep(0.2)
        wire.call(DELETE_TOPICS, 5, {"topic_names": [t], "timeout": 1000})
        resp = codec.to_dict(consumer.receive(FETCH, 12, corr))
        assert time.monotonic() - start < 5
    assert resp["responses"][0]["partitions"][0]["error_code"] == E.UNKNOWN_TOPIC_OR_PARTITION


def test_create_partitions(wire: WireClient) -> None:
    t = unique("cp")
    create(wire, t, 2)

    def grow(name: str, count: int, validate_only: bool = False, assignments: Any = None) -> dict[str, Any]:
        body = {
            "topics": [{"name": name, "count": count, "assignments": assignments}],
            "timeout": 1000,
            "validate_only": validate_only,
        }
        return codec.to_dict(wire.call(CREATE_PARTITIONS, 3, body))["results"][0]

    assert grow(t, 2)["error_code"] == E.INVALID_PARTITIONS
    assert grow(t, 1)["error_code"] == E.INVALID_PARTITIONS
    assert grow(unique("nope"), 3)["error_code"] == E.UNKNOWN_TOPIC_OR_PARTITION
    assert grow(t, 4, assignments=[{"broker_ids": [1]}])["error_code"] == E.INVALID_REPLICA_ASSIGNMENT
    assert grow(t, 4, validate_only=True)["error_code"] == 0
    assert codec.to_dict(wire.call(METADATA, 12, {"topics": [{"name": t}]}))["topics"][0]["partitions"].__len__() == 2
    assert grow(t, 4)["error_code"] == 0
    md = codec.to_dict(wire.call(METADATA, 12, {"topics": [{"name": t}]}))["topics"][0]
    assert [p["partition_index"] for p in md["partitions"]] == [0, 1, 2, 3]
    assert produce(wire, t, batch(1), partition=3)["base_offset"] == 0


def test_internal_topic_is_listed_and_refuses_produce(wire: WireClient) -> None:
    resp = create(wire, "__consumer_offsets", 3)
    assert resp["error_code"] in (0, E.TOPIC_ALREADY_EXISTS)
    md = codec.to_dict(wire.call(METADATA, 12, {"topics": None}))
    entry = next(t for t in md["topics"] if t["name"] == "__consumer_offsets")
    assert entry["is_internal"] is True
    # ReplicaManager.appendToLocalLog: "Cannot append to internal topic"
    assert produce(wire, "__consumer_offsets", batch(1))["error_code"] == E.INVALID_TOPIC_EXCEPTION
    del_body = {"topic_names": ["__consumer_offsets"], "timeout": 1000}
    assert codec.to_dict(wire.call(DELETE_TOPICS, 5, del_body))["responses"][0]["error_code"] == E.INVALID_REQUEST


def test_metadata_auto_creation(broker_factory: Callable[..., BrokerProcess]) -> None:
    b = broker_factory(config={"num.partitions": "3"})
    with WireClient(b.host, b.port) as c:
        md = codec.to_dict(c.call(METADATA, 12, {"topics": [{"name": "auto1"}], "allow_auto_topic_creation": True}))
        assert md["topics"][0]["error_code"] == 0 and len(md["topics"][0]["partitions"]) == 3
        md = codec.to_dict(c.call(METADATA, 12, {"topics": [{"name": "auto2"}], "allow_auto_topic_creation": False}))
        assert md["topics"][0]["error_code"] == E.UNKNOWN_TOPIC_OR_PARTITION
        md = codec.to_dict(c.call(METADATA, 12, {"topics": [{"name": "bad name"}], "allow_auto_topic_creation": True}))
        assert md["topics"][0]["error_code"] == E.INVALID_TOPIC_EXCEPTION
    off = broker_factory(config={"auto.create.topics.enable": "false"})
    with WireClient(off.host, off.port) as c:
        md = codec.to_dict(c.call(METADATA, 4, {"topics": [{"name": "auto3"}], "allow_auto_topic_creation": True}))
        assert md["topics"][0]["error_code"] == E.UNKNOWN_TOPIC_OR_PARTITION


# --------------------------------------------------------------------------- memory bound, restart


def test_retention_trims_oldest_batches(broker_factory: Callable[..., BrokerProcess]) -> None:
    b = broker_factory(config={"log.retention.bytes": "5000"})
    one = batch(2, value=b"r" * 400)
    with WireClient(b.host, b.port) as c:
        create(c, "ret")
        for _ in range(20):
            produce(c, "ret", one)
        earliest = list_offset(c, "ret", -2)["offset"]
        assert earliest > 0 and list_offset(c, "ret", -1)["offset"] == 40
        kept = 40 - earliest
        assert kept * len(one) // 2 <= 5000
        assert fetch(c, [("ret", 0, 0)])["responses"][0]["partitions"][0]["error_code"] == E.OFFSET_OUT_OF_RANGE
        p = fetch(c, [("ret", 0, earliest)])["responses"][0]["partitions"][0]
        assert p["log_start_offset"] == earliest and records_of(p["records"])[0][0] == earliest
        # the topic config overrides the broker setting
        create(c, "ret2", configs=[{"name": "retention.bytes", "value": "-1"}])
        for _ in range(20):
            produce(c, "ret2", one)
        assert list_offset(c, "ret2", -2)["offset"] == 0


@pytest.mark.slow
def test_restart_keeps_topics_and_offsets(broker_factory: Callable[..., BrokerProcess], tmp_path: Path) -> None:
    """Memory-only topic data (``rallypoint.log.storage=memory``): after a restart each
    partition is empty at its old end, so committed positions stay valid; after a kill the end
    is the saved reservation (docs/data-plane.md, "Restarts").  Durable data: test_durable_*."""
    b = broker_factory(data_dir=tmp_path / "restart", config={"rallypoint.log.storage": "memory"})
    with WireClient(b.host, b.port) as c:
        tid = create(c, "keep", 2)["topic_id"]
        produce(c, "keep", batch(3))
        produce(c, "keep", batch(4), partition=1)
        pid = init_pid(c)["producer_id"]
    b.restart()
    with WireClient(b.host, b.port) as c:
        md = codec.to_dict(c.call(METADATA, 12, {"topics": [{"name": "keep"}]}))["topics"][0]
        assert md["topic_id"] == tid and len(md["partitions"]) == 2
        assert (list_offset(c, "keep", -2)["offset"], list_offset(c, "keep", -1)["offset"]) == (3, 3)
        assert (list_offset(c, "keep", -2, 1)["offset"], list_offset(c, "keep", -1, 1)["offset"]) == (4, 4)
        # a consumer's committed position (3) is still valid: empty answer, no error
        p = fetch(c, [("keep", 0, 3)])["responses"][0]["partitions"][0]
        assert (p["error_code"], p["high_watermark"], p["records"]) == (0, 3, b"")
        assert produce(c, "keep", batch(1))["base_offset"] == 3
        assert init_pid(c)["producer_id"] > pid
    # a kill (no clean shutdown): the log starts at the last saved next offset, the end is the
    # saved reservation, so no offset is handed out twice (docs/data-plane.md, "Restarts")
    with WireClient(b.host, b.port) as c:
        produce(c, "keep", batch(5))
    time.sleep(1.5)
    b.kill()
    b.start()
    with WireClient(b.host, b.port) as c:
        assert list_offset(c, "keep", -2)["offset"] == 9
        end = list_offset(c, "keep", -1)["offset"]
        assert end >= 9
        assert produce(c, "keep", batch(1))["base_offset"] == end


@pytest.mark.slow
def test_durable_data_survives_restart_and_kill(broker_factory: Callable[..., BrokerProcess], tmp_path: Path) -> None:
    """The default storage keeps the records: a clean restart and a kill -9 both bring back
    every acknowledged batch at its offset, and the next append continues after the last one."""
    b = broker_factory(data_dir=tmp_path / "durable")
    with WireClient(b.host, b.port) as c:
        tid = create(c, "keep", 2)["topic_id"]
        produce(c, "keep", batch(3))
        produce(c, "keep", batch(4), partition=1)
    b.restart()
    with WireClient(b.host, b.port) as c:
        md = codec.to_dict(c.call(METADATA, 12, {"topics": [{"name": "keep"}]}))["topics"][0]
        assert md["topic_id"] == tid and len(md["partitions"]) == 2
        assert (list_offset(c, "keep", -2)["offset"], list_offset(c, "keep", -1)["offset"]) == (0, 3)
        assert (list_offset(c, "keep", -2, 1)["offset"], list_offset(c, "keep", -1, 1)["offset"]) == (0, 4)
        p = fetch(c, [("keep", 0, 0)])["responses"][0]["partitions"][0]
        assert [r[0] for r in records_of(p["records"])] == [0, 1, 2]
        assert produce(c, "keep", batch(5))["base_offset"] == 3
    b.kill()  # no clean shutdown, no periodic save needed: the write reached the OS
    b.start()
    assert b.events("topic data loaded")[-1]["clean_shutdown"] is False
    with WireClient(b.host, b.port) as c:
        assert list_offset(c, "keep", -1)["offset"] == 8
        p = fetch(c, [("keep", 0, 0)])["responses"][0]["partitions"][0]
        assert [r[0] for r in records_of(p["records"])] == list(range(8))
        assert produce(c, "keep", batch(1))["base_offset"] == 8
    # a torn last batch (the segment cut by a few bytes after a kill) is cut at start and logged
    b.kill()
    seg = tmp_path / "durable" / "keep-0" / "00000000000000000000.log"
    size = seg.stat().st_size
    os.truncate(seg, size - 3)
    b.start()
    [cut] = b.events("partition log truncated at recovery")
    assert (cut["topic"], cut["partition"], cut["position"] + cut["bytes_cut"]) == ("keep", 0, size - 3)
    with WireClient(b.host, b.port) as c:
        assert list_offset(c, "keep", -1)["offset"] == 8  # the one-record batch at 8 is gone
        p = fetch(c, [("keep", 0, 0)])["responses"][0]["partitions"][0]
        assert [r[0] for r in records_of(p["records"])] == list(range(8))
        assert produce(c, "keep", batch(2))["base_offset"] == 8


def test_shutdown_releases_parked_fetch(broker_factory: Callable[..., BrokerProcess]) -> None:
    b = broker_factory()
    with WireClient(b.host, b.port) as c:
        create(c, "bye")
        corr = c.send(FETCH, 12, fetch_body([("bye", 0, 0)], max_wait=30_000))
        time.sleep(0.3)
        assert b.proc is not None
        b.proc.terminate()
        start = time.monotonic()
        resp = codec.to_dict(c.receive(FETCH, 12, corr))  # answered, not left hanging for 30 s
        assert time.monotonic() - start < 10  # far below max_wait (30 s), with room for a loaded machine
        assert resp["responses"][0]["partitions"][0]["error_code"] == 0
    assert b.stop() == 0
    assert b.events("stopped")


def test_every_served_version_answers(wire: WireClient) -> None:
    """One round trip per advertised version of each data-plane API (field sets differ per version)."""
    from rallypoint.protocol.apis import SERVED_APIS

    t = unique("versions")
    tid = create(wire, t)["topic_id"]
    part = {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20, "current_leader_epoch": 0}
    for v in range(SERVED_APIS[PRODUCE].min_version, SERVED_APIS[PRODUCE].max_version + 1):
        body = {
            "transactional_id": None,
            "acks": -1,
            "timeout": 5000,
            "topic_data": [{"name": t, "topic_id": tid, "partition_data": [{"index": 0, "records": batch(1)}]}],
        }
        r = codec.to_dict(wire.call(PRODUCE, v, body))["responses"][0]["partition_responses"][0]
        assert (r["error_code"], r["base_offset"]) == (0, v - 3), v
    n = SERVED_APIS[PRODUCE].max_version - 2
    for v in range(SERVED_APIS[FETCH].min_version, SERVED_APIS[FETCH].max_version + 1):
        body = fetch_body([(t, 0, 0)])
        body["topics"] = [{"topic": t, "topic_id": tid, "partitions": [part]}]
        resp = codec.to_dict(wire.call(FETCH, v, body))
        p = resp["responses"][0]["partitions"][0]
        assert p["error_code"] == 0 and len(records_of(p["records"])) == n, v
    for v in range(SERVED_APIS[LIST_OFFSETS].min_version, SERVED_APIS[LIST_OFFSETS].max_version + 1):
        assert list_offset(wire, t, -1, version=v)["offset"] == n, v
    for v in range(SERVED_APIS[INIT_PID].min_version, SERVED_APIS[INIT_PID].max_version + 1):
        body = {"transactional_id": None, "transaction_timeout": 1000, "producer_id": -1, "producer_epoch": -1}
        assert codec.to_dict(wire.call(INIT_PID, v, body))["error_code"] == 0, v
    for v in range(SERVED_APIS[OFFSET_FOR_EPOCH].min_version, SERVED_APIS[OFFSET_FOR_EPOCH].max_version + 1):
        body = {"replica_id": -1, "topics": [{"topic": t, "partitions": [{"partition": 0, "leader_epoch": 0}]}]}
        assert codec.to_dict(wire.call(OFFSET_FOR_EPOCH, v, body))["topics"][0]["partitions"][0]["end_offset"] == n
    for v in range(SERVED_APIS[CREATE_TOPICS].min_version, SERVED_APIS[CREATE_TOPICS].max_version + 1):
        assert create(wire, unique("cv"), version=v)["error_code"] == 0, v
    for v in range(SERVED_APIS[CREATE_PARTITIONS].min_version, SERVED_APIS[CREATE_PARTITIONS].max_version + 1):
        body = {"topics": [{"name": t, "count": v + 2, "assignments": None}], "timeout": 1000, "validate_only": False}
        assert codec.to_dict(wire.call(CREATE_PARTITIONS, v, body))["results"][0]["error_code"] == 0, v
    for v in range(SERVED_APIS[DELETE_TOPICS].min_version, SERVED_APIS[DELETE_TOPICS].max_version + 1):
        name = unique("dv")
        create(wire, name)
        body = {"topic_names": [name], "topics": [{"name": name, "topic_id": uuid.UUID(int=0)}], "timeout": 1000}
        assert codec.to_dict(wire.call(DELETE_TOPICS, v, body))["responses"][0]["error_code"] == 0, v


def test_metadata_answers_are_cached_until_topics_change(wire: WireClient) -> None:
    """A repeated Metadata question gets the same bytes (the cached answer); creating a topic,
    adding partitions and deleting a topic each change the answer at once; a question naming a
    missing topic is never cached (docs/BENCHMARKS.md, hot paths; handlers/metadata.py)."""
    t = unique("cached")
    create(wire, t, 1)

    def ask(names: list[str] | None) -> dict[str, Any]:
        body = {"topics": None if names is None else [{"name": n} for n in names], "allow_auto_topic_creation": False}
        return codec.to_dict(wire.call(METADATA, 12, body))

    first, second = ask([t]), ask([t])
    assert first == second and len(first["topics"][0]["partitions"]) == 1
    grow = {"topics": [{"name": t, "count": 3, "assignments": None}], "timeout_ms": 5000, "validate_only": False}
    assert codec.to_dict(wire.call(CREATE_PARTITIONS, 3, grow))["results"][0]["error_code"] == E.NONE
    assert len(ask([t])["topics"][0]["partitions"]) == 3
    every = {x["name"] for x in ask(None)["topics"]}
    u = unique("cached-new")
    create(wire, u, 1)
    assert {x["name"] for x in ask(None)["topics"]} == every | {u}
    missing = unique("missing")
    assert ask([missing])["topics"][0]["error_code"] == E.UNKNOWN_TOPIC_OR_PARTITION
    create(wire, missing, 1)
    assert ask([missing])["topics"][0]["error_code"] == E.NONE
    wire.call(DELETE_TOPICS, 5, {"topic_names": [u], "timeout": 1000})
    assert u not in {x["name"] for x in ask(None)["topics"]}


def test_the_metadata_cache_keeps_answers_only_while_the_store_is_unchanged() -> None:
    from rallypoint.handlers.metadata import _Cache
    from rallypoint.protocol.codec import Encoded

    c = _Cache()
    answer = Encoded(b"x")
    assert c.get(5, ("k",)) is None
    c.put(5, ("k",), answer)
    assert c.get(5, ("k",)) is answer
    c.put(4, ("other",), answer)  # built before a change: not kept
    assert c.get(5, ("other",)) is None
    assert c.get(6, ("k",)) is None and c.answers == {} and c.bytes == 0  # the store changed: everything goes
    huge = Encoded(bytes(2 * 1024 * 1024))
    c.put(6, ("huge",), huge)  # over a quarter of the budget: not kept
    assert c.get(6, ("huge",)) is None
    quarter = Encoded(bytes(1024 * 1024))
    for i in range(5):  # the fifth would pass the 4 MiB budget: the cache empties first
        c.put(6, (i,), quarter)
    assert list(c.answers) == [(4,)] and c.bytes == 1024 * 1024
