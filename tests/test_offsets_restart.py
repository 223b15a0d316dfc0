"""Committed offsets and groups survive broker restarts, with real clients.

* Consumers of three clients (kafka-python, confluent-kafka, aiokafka) consume in groups and
  commit; a manually-assigned consumer commits into a "simple" group; the broker is stopped
  with SIGTERM and restarted on the same data directory; every committed offset (and its
  metadata) is back, the groups are listed Empty with their protocol type, and a consumer
  resumes exactly after its commit.
* A commit storm of real clients against ``rallypoint.offsets.flush=always`` is cut by SIGKILL;
  after a restart every commit a client saw acknowledged is there.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka.structs import OffsetAndMetadata as AioOffsetAndMetadata
from aiokafka.structs import TopicPartition as AioTopicPartition
from confluent_kafka import Consumer as CkConsumer
from confluent_kafka import KafkaException
from confluent_kafka import TopicPartition as CkTopicPartition
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.structs import OffsetAndMetadata
from rallypoint.protocol import codec
from rallypoint.protocol.offsets_schema import OffsetCommitKey, OffsetCommitValue, partition_for
from rallypoint.storage.recovery import replay_partition
from rallypoint.storage.segments import partition_dir

from tests.support import BrokerProcess, WireClient, create_topic, wait_until
from tests.support.offsets_synth import old_partition_for, write_old_layout

pytestmark = pytest.mark.clients

TOPIC = "orders"
PARTITIONS = 3
PER_PARTITION = 10
DEADLINE_S = 60.0


def produce(broker: BrokerProcess, per_partition: int, tag: str) -> None:
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, linger_ms=0)
    try:
        for p in range(PARTITIONS):
            for i in range(per_partition):
                producer.send(TOPIC, value=f"{tag}-{p}-{i}".encode(), partition=p)
        producer.flush(timeout=20)
    finally:
        producer.close(timeout=5)


def consume_kafka_python(broker: BrokerProcess, group: str, want: int) -> KafkaConsumer:
    c = KafkaConsumer(
        TOPIC,
        bootstrap_servers=broker.bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=10000,
        heartbeat_interval_ms=1000,
    )
    got = 0
    deadline = time.monotonic() + DEADLINE_S
    while got < want and time.monotonic() < deadline:
        for recs in c.poll(timeout_ms=500).values():
            got += len(recs)
    assert got == want, f"kafka-python consumed {got} of {want}"
    return c


def consume_confluent(broker: BrokerProcess, group: str, want: int) -> CkConsumer:
    c = CkConsumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 10000,
        }
    )
    c.subscribe([TOPIC])
    got = 0
    deadline = time.monotonic() + DEADLINE_S
    while got < want and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got += 1
    assert got == want, f"confluent-kafka consumed {got} of {want}"
    return c


async def aiokafka_commit(broker: BrokerProcess, group: str, want: int, offsets: dict[int, tuple[int, str]]) -> None:
    c = AIOKafkaConsumer(
        TOPIC,
        bootstrap_servers=broker.bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        session_timeout_ms=10000,
    )
    await c.start()
    try:
        got = 0
        deadline = time.monotonic() + DEADLINE_S
        while got < want and time.monotonic() < deadline:
            for recs in (await c.getmany(timeout_ms=500)).values():
                got += len(recs)
        assert got == want, f"aiokafka consumed {got} of {want}"
        await c.commit({AioTopicPartition(TOPIC, p): AioOffsetAndMetadata(o, m) for p, (o, m) in offsets.items()})
    finally:
        await c.stop()


def committed(broker: BrokerProcess, group: str) -> dict[int, tuple[int, str]]:
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=10000)
    try:
        got = admin.list_group_offsets({group: None})[group]  # OffsetFetch, all partitions
    finally:
        admin.close()
    return {tp.partition: (om.offset, om.metadata) for tp, om in got.items() if tp.topic == TOPIC and om.offset >= 0}


def describe(broker: BrokerProcess, groups: list[str]) -> dict[str, tuple[str, str]]:
    with WireClient(broker.host, broker.port) as c:
        resp = codec.to_dict(c.call(15, 5, {"groups": groups, "include_authorized_operations": False}))
    return {g["group_id"]: (g["group_state"], g["protocol_type"]) for g in resp["groups"]}


def test_committed_offsets_survive_sigterm_restart(broker_factory: Callable[..., BrokerProcess]) -> None:
    broker = broker_factory(config={"offsets.topic.num.partitions": "10"})
    create_topic(broker, TOPIC, PARTITIONS)
    produce(broker, PER_PARTITION, "before")
    total = PARTITIONS * PER_PARTITION
    want: dict[str, dict[int, tuple[int, str]]] = {}

    # kafka-python: consume everything, commit what it consumed (positions) with metadata
    kp = consume_kafka_python(broker, "kp-group", total)
    kp.commit({TopicPartition(TOPIC, p): OffsetAndMetadata(PER_PARTITION, f"kp-{p}", -1) for p in range(PARTITIONS)})
    want["kp-group"] = {p: (PER_PARTITION, f"kp-{p}") for p in range(PARTITIONS)}
    kp.close()

    # confluent-kafka: commit partial progress (different offsets per partition)
    ck = consume_confluent(broker, "ck-group", total)
    ck.commit(offsets=[CkTopicPartition(TOPIC, p, 3 + p) for p in range(PARTITIONS)], asynchronous=False)
    want["ck-group"] = {p: (3 + p, "") for p in range(PARTITIONS)}
    ck.close()

    # aiokafka
    aio_offsets = {p: (7, f"aio-{p}") for p in range(PARTITIONS)}
    asyncio.run(aiokafka_commit(broker, "aio-group", total, aio_offsets))
    want["aio-group"] = aio_offsets

    # a manually assigned consumer: a "simple" group (generation -1, no member)
    simple = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id="simple-group", enable_auto_commit=False)
    simple.assign([TopicPartition(TOPIC, 1)])
    simple.commit({TopicPartition(TOPIC, 1): OffsetAndMetadata(5, "manual", -1)})
    simple.close()
    want["simple-group"] = {1: (5, "manual")}

    for group, offsets in want.items():
        assert committed(broker, group) == offsets, group

    assert broker.stop() == 0  # SIGTERM
    broker.start()
    assert broker.events("offsets_log.recovered")[-1]["records"] > 0

    for group, offsets in want.items():
        assert committed(broker, group) == offsets, f"{group} after restart"
    described = describe(broker, list(want))
    assert described["kp-group"] == ("Empty", "consumer")
    assert described["ck-group"] == ("Empty", "consumer")
    assert described["aio-group"] == ("Empty", "consumer")
    assert described["simple-group"][0] == "Empty"

    # the kafka-python group resumes right after its commit: only new messages arrive
    produce(broker, 2, "after")
    c = KafkaConsumer(
        TOPIC, bootstrap_servers=broker.bootstrap, group_id="kp-group", enable_auto_commit=False,
        auto_offset_reset="earliest", session_timeout_ms=10000,
    )  # fmt: skip
    try:
        values: list[bytes] = []
        deadline = time.monotonic() + DEADLINE_S
        while len(values) < 2 * PARTITIONS and time.monotonic() < deadline:
            for recs in c.poll(timeout_ms=500).values():
                values += [r.value for r in recs]
        assert sorted(values) == sorted(f"after-{p}-{i}".encode() for p in range(PARTITIONS) for i in range(2))
    finally:
        c.close()


def test_sigkill_mid_commit_storm_keeps_every_acknowledged_commit(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    broker = broker_factory(config={"rallypoint.offsets.flush": "always", "offsets.topic.num.partitions": "8"})
    create_topic(broker, TOPIC, PARTITIONS)
    acked: dict[tuple[str, int], int] = {}
    attempted: dict[tuple[str, int], int] = {}
    lock = threading.Lock()
    stop = threading.Event()
    counts = {"acked": 0}

    def record(group: str, n: int, table: dict[tuple[str, int], int]) -> None:
        with lock:
            for p in range(PARTITIONS):
                table[(group, p)] = n
            if table is acked:
                counts["acked"] += 1

    def kafka_python_committer(group: str) -> None:
        c = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=group, enable_auto_commit=False)
        c.assign([TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
        n = 0
        try:
            while not stop.is_set():
                n += 1
                record(group, n, attempted)
                c.commit({TopicPartition(TOPIC, p): OffsetAndMetadata(n, "", -1) for p in range(PARTITIONS)}, 3000)
                record(group, n, acked)
        except Exception:
            pass  # the broker died under it
        finally:
            c.close(autocommit=False, timeout_ms=1000)

    def confluent_committer(group: str) -> None:
        c = CkConsumer(
            {"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False, "log_level": 0}
        )
        n = 0
        try:
            while not stop.is_set():
                n += 1
                record(group, n, attempted)
                # blocks while the coordinator is down: released by the last restart below
                c.commit(offsets=[CkTopicPartition(TOPIC, p, n) for p in range(PARTITIONS)], asynchronous=False)
                record(group, n, acked)
        except KafkaException:
            pass
        finally:
            c.close()

    groups = [f"storm-kp-{i}" for i in range(6)] + [f"storm-ck-{i}" for i in range(6)]
    threads = [
        threading.Thread(
            target=kafka_python_committer if g.startswith("storm-kp") else confluent_committer, args=(g,), daemon=True
        )
        for g in groups
    ]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: counts["acked"] >= 1500, DEADLINE_S, "1500 acknowledged commits", step=0.02)
    finally:
        broker.kill()  # SIGKILL, commits in flight
        stop.set()
    with lock:
        acked_before_kill = dict(acked)
        n_acked = counts["acked"]
    assert n_acked >= 1500, f"only {n_acked} commits acknowledged in {DEADLINE_S} s"

    # Restart on another port, so that clients retrying a commit cut by the kill cannot reach
    # it (their retries would hide a lost commit), and read what survived.
    old_port = broker.port
    broker.requested_port = 0
    broker.start()
    lost = {}
    for group in groups:
        got = committed(broker, group)
        for p in range(PARTITIONS):
            want = acked_before_kill.get((group, p), 0)
            have = got.get(p, (0, ""))[0]
            if not want <= have <= attempted[(group, p)]:
                lost[(group, p)] = (want, have)
    assert not lost, f"acknowledged commits missing after SIGKILL (acked, recovered): {lost}"

    # Release the clients still retrying against the old port, then let every thread end.
    broker.stop()
    broker.requested_port = old_port
    broker.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)


def test_a_data_dir_written_before_the_partition_fix_loads_and_moves_its_groups(
    broker_factory: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    """Before following Kafka's ``Utils.abs``, rallypoint put a group with a negative Java hash
    in the wrong ``__consumer_offsets`` partition.  Such a data dir starts: the group's offsets
    are read, rewritten into its partition (tombstones where they were), fetched by a real client,
    and a commit after the restart lands in the right partition and survives another restart."""
    data = tmp_path / "old-layout"
    group = "grp-rhcbom"  # Java hash -680362085: partition 35 of 50; the old code used 13
    assert (old_partition_for(group, 50), partition_for(group, 50)) == (13, 35)
    write_old_layout(
        data,
        50,
        {13: [(OffsetCommitKey(group, TOPIC, p), OffsetCommitValue(40 + p, f"old-{p}", 1000)) for p in range(3)]},
    )
    broker = broker_factory(data_dir=data)
    moved = broker.events("offsets_log.groups_moved")
    assert moved and moved[-1]["groups"] == 1 and moved[-1]["records"] == 3
    create_topic(broker, TOPIC, PARTITIONS)
    with WireClient(broker.host, broker.port) as c:  # the first FindCoordinator creates __consumer_offsets
        c.call(10, 3, {"key": group, "key_type": 0})
    assert committed(broker, group) == {p: (40 + p, f"old-{p}") for p in range(PARTITIONS)}

    simple = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id=group, enable_auto_commit=False)
    simple.assign([TopicPartition(TOPIC, 1)])
    simple.commit({TopicPartition(TOPIC, 1): OffsetAndMetadata(77, "new", -1)})
    simple.close()
    assert broker.stop() == 0
    broker.start()
    assert not broker.events("offsets_log.groups_moved")  # nothing left to move
    assert committed(broker, group) == {0: (40, "old-0"), 1: (77, "new"), 2: (42, "old-2")}
    old = replay_partition(partition_dir(data, 13), 13, repair=False).state
    home = replay_partition(partition_dir(data, 35), 35, repair=False).state
    assert old.offsets == {} and {k.partition: v.offset for k, v in home.offsets.items()} == {0: 40, 1: 77, 2: 42}
