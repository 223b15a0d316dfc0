"""Metadata as real clients see it: kafka-python, aiokafka, confluent-kafka, kcat, kafkajs.

Each client bootstraps from a broker process started by the fixture, and must see that broker
(node id, host, port), its cluster id, and a topic created beforehand with its partitions.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import subprocess
from collections.abc import Callable
from typing import Any

import pytest

from tests.support import BrokerProcess, ensure_topics

pytestmark = pytest.mark.clients

PARTITIONS = 3
WAIT_S = 10


@pytest.fixture
def rp(broker_factory: Callable[..., BrokerProcess]) -> BrokerProcess:
    return broker_factory(config={"num.partitions": str(PARTITIONS)})


def cluster_id(broker: BrokerProcess) -> str:
    return str(broker.events("listening")[0]["cluster_id"])


def user_topics(names: Any) -> set[str]:
    """Topic names without internal ones (``__consumer_offsets`` appears once groups are used)."""
    return {n for n in names if not n.startswith("__")}


def create_topic(broker: BrokerProcess, name: str) -> None:
    """Auto-create ``name`` with a Metadata request (v12, allow_auto_topic_creation)."""
    assert ensure_topics(broker, name) == {name: PARTITIONS}


def test_kafka_python_admin(rp: BrokerProcess) -> None:
    from kafka.admin import KafkaAdminClient

    logging.getLogger("kafka").setLevel(logging.WARNING)
    create_topic(rp, "kp-topic")
    admin = KafkaAdminClient(
        bootstrap_servers=rp.bootstrap, request_timeout_ms=WAIT_S * 1000, bootstrap_timeout_ms=WAIT_S * 1000
    )
    try:
        assert user_topics(admin.list_topics()) == {"kp-topic"}
        cluster = admin.describe_cluster()  # a Metadata request for no topics
        described = admin.describe_topics(["kp-topic"])
    finally:
        admin.close()
    assert cluster["cluster_id"] == cluster_id(rp)
    assert cluster["controller_id"] == 1
    assert [(b["broker_id"], b["host"], b["port"]) for b in cluster["brokers"]] == [(1, rp.host, rp.port)]
    assert [(t["name"], t["error_code"], len(t["partitions"])) for t in described] == [("kp-topic", 0, PARTITIONS)]
    assert {p["leader_id"] for p in described[0]["partitions"]} == {1}


def test_aiokafka_client_and_admin(rp: BrokerProcess) -> None:
    from aiokafka import AIOKafkaClient
    from aiokafka.admin import AIOKafkaAdminClient

    create_topic(rp, "aio-topic")

    async def run() -> tuple[Any, Any]:
        client = AIOKafkaClient(bootstrap_servers=rp.bootstrap, request_timeout_ms=WAIT_S * 1000)
        try:
            await asyncio.wait_for(client.bootstrap(), WAIT_S)
            md = await asyncio.wait_for(client.fetch_all_metadata(), WAIT_S)
        finally:
            await client.close()
        admin = AIOKafkaAdminClient(bootstrap_servers=rp.bootstrap, request_timeout_ms=WAIT_S * 1000)
        try:
            await asyncio.wait_for(admin.start(), WAIT_S)
            cluster = await asyncio.wait_for(admin.describe_cluster(), WAIT_S)
        finally:
            await admin.close()
        return md, cluster

    md, cluster = asyncio.run(run())
    assert [(b.nodeId, b.host, b.port) for b in md.brokers()] == [(1, rp.host, rp.port)]
    assert user_topics(md.topics()) == {"aio-topic"}
    assert md.partitions_for_topic("aio-topic") == set(range(PARTITIONS))
    assert cluster["cluster_id"] == cluster_id(rp)
    assert [(b["node_id"], b["host"], b["port"]) for b in cluster["brokers"]] == [(1, rp.host, rp.port)]


def test_confluent_kafka_admin(rp: BrokerProcess) -> None:
    from confluent_kafka.admin import AdminClient

    create_topic(rp, "ck-topic")
    admin = AdminClient({"bootstrap.servers": rp.bootstrap, "socket.timeout.ms": WAIT_S * 1000})
    md = admin.list_topics(timeout=WAIT_S)
    assert md.cluster_id == cluster_id(rp)
    assert md.controller_id == 1
    assert {k: (v.host, v.port) for k, v in md.brokers.items()} == {1: (rp.host, rp.port)}
    assert user_topics(md.topics) == {"ck-topic"}
    assert sorted(md.topics["ck-topic"].partitions) == list(range(PARTITIONS))
    assert md.topics["ck-topic"].error is None
    one = admin.list_topics(topic="ck-topic", timeout=WAIT_S)
    assert one.topics["ck-topic"].partitions[0].leader == 1


def test_kcat_list(rp: BrokerProcess, kcat: str) -> None:
    create_topic(rp, "kcat-topic")
    proc = subprocess.run(
        [kcat, "-L", "-J", "-b", rp.bootstrap, "-m", str(WAIT_S), "-X", "debug=metadata"],
        capture_output=True,
        text=True,
        timeout=WAIT_S * 3,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    md = json.loads(proc.stdout)
    assert md["brokers"] == [{"id": 1, "name": rp.bootstrap}]
    assert md["controllerid"] == 1
    assert md["originating_broker"] == {"id": 1, "name": f"{rp.bootstrap}/1"}
    topics = {t["topic"]: len(t["partitions"]) for t in md["topics"] if t["topic"] in user_topics([t["topic"]])}
    assert topics == {"kcat-topic": PARTITIONS}
    # librdkafka logs the cluster id it read from the Metadata response
    assert set(re.findall(r"ClusterId: ([^,\s]+)", proc.stderr)) == {cluster_id(rp)}


def test_kafkajs_admin(rp: BrokerProcess, node_js: Callable[..., subprocess.CompletedProcess[str]]) -> None:
    create_topic(rp, "js-topic")
    proc = node_js("metadata.js", rp.bootstrap, "js-topic", timeout=WAIT_S * 6)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["cluster"] == {
        "brokers": [{"nodeId": 1, "host": rp.host, "port": rp.port}],
        "controller": 1,
        "clusterId": cluster_id(rp),
    }
    [topic] = out["topics"]
    assert topic["name"] == "js-topic"
    assert sorted(p["partitionId"] for p in topic["partitions"]) == list(range(PARTITIONS))
    assert {p["leader"] for p in topic["partitions"]} == {1}
