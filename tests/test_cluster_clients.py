"""Several brokers in one process (docs/cluster.md) with real clients: groups whose coordinators
are on nodes 1, 2 and 3, topics whose partitions are led by different nodes; kafka-python,
aiokafka, confluent-kafka and kafkajs consumers join, consume everything and commit.
Every wait is bounded; each client is closed by its test."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rallypoint.protocol.offsets_schema import partition_for

from tests.support import BrokerProcess
from tests.support.topics import create_topic

ck = pytest.importorskip("confluent_kafka")
admin_mod = pytest.importorskip("confluent_kafka.admin")

pytestmark = pytest.mark.clients

NODES = (1, 2, 3)
MESSAGES = 60


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[BrokerProcess]:
    with BrokerProcess(tmp_path / "data", {"rallypoint.brokers": "3", "num.partitions": "3"}).start() as b:
        yield b


def group_on(node: int, prefix: str) -> str:
    """A fresh group id whose coordinator is ``node`` (offsets partition p is led by node p mod 3)."""
    while True:
        gid = f"{prefix}-{uuid.uuid4().hex[:8]}"
        if NODES[partition_for(gid, 50) % 3] == node:
            return gid


def committed(b: BrokerProcess, group: str, topic: str) -> dict[int, int]:
    a = admin_mod.AdminClient({"bootstrap.servers": b.bootstrap})
    req = ck.ConsumerGroupTopicPartitions(group, [ck.TopicPartition(topic, p) for p in range(3)])
    [fut] = a.list_consumer_group_offsets([req]).values()
    return {tp.partition: tp.offset for tp in fut.result(10).topic_partitions}


def run_kafka_python(bootstrap: str, group: str, topic: str) -> int:
    from kafka import KafkaConsumer

    c = KafkaConsumer(
        bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False
    )
    # kafka-python's leader assigns nothing when its JoinGroup answer beats its first metadata
    # of the topic ("No partition metadata for topic"), and does not rejoin when the metadata
    # comes (its snapshot is taken after): fetch the topic's metadata before subscribing.
    c.partitions_for_topic(topic)
    c.subscribe([topic])
    n, deadline = 0, time.monotonic() + 40
    while n < MESSAGES and time.monotonic() < deadline:
        n += sum(len(v) for v in c.poll(timeout_ms=300).values())
    c.commit()
    c.close()
    return n


def run_aiokafka(bootstrap: str, group: str, topic: str) -> int:
    from aiokafka import AIOKafkaConsumer

    async def go() -> int:
        c = AIOKafkaConsumer(
            topic, bootstrap_servers=bootstrap, group_id=group, auto_offset_reset="earliest", enable_auto_commit=False
        )
        await c.start()
        try:
            n, deadline = 0, time.monotonic() + 40
            while n < MESSAGES and time.monotonic() < deadline:
                got = await c.getmany(timeout_ms=300)
                n += sum(len(v) for v in got.values())
            await c.commit()
            return n
        finally:
            await c.stop()

    return asyncio.run(go())


def run_confluent(bootstrap: str, group: str, topic: str) -> int:
    c = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.subscribe([topic])
    n, deadline = 0, time.monotonic() + 40
    while n < MESSAGES and time.monotonic() < deadline:
        m = c.poll(0.3)
        if m is not None and m.error() is None:
            n += 1
    c.commit(asynchronous=False)
    c.close()
    return n


RUNNERS: dict[str, Callable[[str, str, str], int]] = {
    "kafka-python": run_kafka_python,
    "aiokafka": run_aiokafka,
    "confluent": run_confluent,
}


def test_groups_with_coordinators_on_every_node_consume_and_commit(
    cluster: BrokerProcess, node_js: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    # kafka-python once raised its own RebalanceInProgressError on commit() here (a rejoin the
    # run did not explain): its coordinator's INFO lines (why it rejoins) go with a failure report
    caplog.set_level(logging.INFO, logger="kafka.coordinator")
    topic = f"ct-{uuid.uuid4().hex[:8]}"
    create_topic(cluster, topic, 3)
    md = admin_mod.AdminClient({"bootstrap.servers": cluster.bootstrap}).list_topics(timeout=10)
    assert sorted(md.brokers) == list(NODES)
    assert sorted(p.leader for p in md.topics[topic].partitions.values()) == list(NODES)  # one each
    p = ck.Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 5})
    for i in range(MESSAGES):
        p.produce(topic, value=b"m%d" % i, partition=i % 3)
    assert p.flush(15) == 0

    groups = {
        "kafka-python": group_on(1, "kp"),
        "aiokafka": group_on(2, "aio"),
        "confluent": group_on(3, "ck"),
        "kafkajs": group_on(1, "js"),
    }
    counts: dict[str, int] = {}
    errors: list[BaseException] = []

    def run(name: str) -> None:
        try:
            counts[name] = RUNNERS[name](cluster.bootstrap, groups[name], topic)
        except BaseException as e:  # reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(name,)) for name in RUNNERS]
    for t in threads:
        t.start()
    js = node_js("consume.js", cluster.bootstrap, topic, groups["kafkajs"], str(MESSAGES), "40000", timeout=60)
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert js.returncode == 0, js.stderr
    counts["kafkajs"] = len(json.loads(js.stdout)["messages"])
    assert counts == dict.fromkeys(groups, MESSAGES)
    expected = dict.fromkeys(range(3), MESSAGES // 3)
    for name, group in groups.items():
        deadline = time.monotonic() + 15  # kafkajs commits after its batches, on its own schedule
        got = committed(cluster, group, topic)
        while got != expected and time.monotonic() < deadline:
            time.sleep(0.3)
            got = committed(cluster, group, topic)
        assert got == expected, (name, group, got)


def test_a_transaction_whose_coordinators_are_on_other_nodes_commits(cluster: BrokerProcess) -> None:
    """A transactional producer whose transaction coordinator is node 2 sends offsets of a group
    coordinated by node 3 and writes to partitions led by every node; read_committed sees it."""
    topic = f"tx-{uuid.uuid4().hex[:8]}"
    create_topic(cluster, topic, 3)
    txn_id = next(f"tx-{i}" for i in range(1000) if partition_for(f"tx-{i}", 50) % 3 == 1)  # node 2
    group = group_on(3, "txg")
    p = ck.Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": txn_id})
    p.init_transactions(20)
    p.begin_transaction()
    for i in range(30):
        p.produce(topic, value=b"t%d" % i, partition=i % 3)
    member = ck.Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group})
    meta = member.consumer_group_metadata()
    member.close()
    p.send_offsets_to_transaction([ck.TopicPartition(topic, 0, 5)], meta, 20)
    p.commit_transaction(20)
    c = ck.Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": f"rc-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    c.subscribe([topic])
    n, deadline = 0, time.monotonic() + 30
    while n < 30 and time.monotonic() < deadline:
        m = c.poll(0.3)
        if m is not None and m.error() is None:
            n += 1
    c.close()
    assert n == 30
    assert committed(cluster, group, topic)[0] == 5
