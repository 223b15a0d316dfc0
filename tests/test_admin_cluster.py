"""DescribeCluster (60), DescribeTopicPartitions (75) and DeleteRecords (21): raw requests of
every version, and the admin clients of confluent-kafka and kafka-python, kcat -L
(docs/configs.md, "Cluster and topic descriptions", "DeleteRecords")."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from typing import Any

import pytest
from rallypoint.protocol.errors import ErrorCode

from tests.support import BrokerProcess, WireClient, create_topic

pytestmark = pytest.mark.clients

E = ErrorCode


@pytest.fixture
def broker(broker_factory: Callable[..., BrokerProcess]) -> BrokerProcess:
    return broker_factory()


def test_describe_cluster_every_version_and_the_wrong_endpoint_type(broker: BrokerProcess) -> None:
    for version in range(3):
        with WireClient(broker.host, broker.port) as c:
            resp = c.call(60, version, {"include_cluster_authorized_operations": True, "endpoint_type": 1})
        assert int(resp.error_code) == 0 and resp.controller_id == 1 and len(resp.cluster_id) == 22
        (b,) = resp.brokers
        assert (b.broker_id, b.host, b.port, b.rack) == (1, broker.host, broker.port, None)
        assert resp.cluster_authorized_operations != -(2**31)
    with WireClient(broker.host, broker.port) as c:
        resp = c.call(60, 1, {"include_cluster_authorized_operations": False, "endpoint_type": 2})
    assert int(resp.error_code) == E.MISMATCHED_ENDPOINT_TYPE and resp.brokers == ()
    assert "endpoint of type CONTROLLER" in resp.error_message


def test_describe_cluster_with_admin_clients(broker: BrokerProcess) -> None:
    from confluent_kafka.admin import AdminClient
    from kafka.admin import KafkaAdminClient

    ck = AdminClient({"bootstrap.servers": broker.bootstrap})  # kept alive until the result is in
    desc = ck.describe_cluster().result(30)
    assert [(n.id, n.host, n.port) for n in desc.nodes] == [(1, broker.host, broker.port)]
    assert desc.controller.id == 1 and desc.cluster_id
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        got = admin.describe_cluster()
    finally:
        admin.close()
    assert got["controller_id"] == 1 and [b["broker_id"] for b in got["brokers"]] == [1]


def _dtp(broker: BrokerProcess, topics: list[str], limit: int, cursor: dict[str, Any] | None = None) -> Any:
    with WireClient(broker.host, broker.port) as c:
        body = {"topics": [{"name": t} for t in topics], "response_partition_limit": limit, "cursor": cursor}
        return c.call(75, 0, body)


def test_describe_topic_partitions_pages_with_a_cursor(broker: BrokerProcess) -> None:
    create_topic(broker, "dtp-a", 3)
    create_topic(broker, "dtp-b", 2)
    first = _dtp(broker, ["dtp-b", "dtp-a", "dtp-missing"], 4)
    assert [(t.name, [p.partition_index for p in t.partitions]) for t in first.topics] == [
        ("dtp-a", [0, 1, 2]),
        ("dtp-b", [0]),
    ]
    assert (first.next_cursor.topic_name, first.next_cursor.partition_index) == ("dtp-b", 1)
    cursor = {"topic_name": "dtp-b", "partition_index": 1}
    rest = _dtp(broker, ["dtp-b", "dtp-a", "dtp-missing"], 4, cursor)
    assert [(t.name, int(t.error_code), [p.partition_index for p in t.partitions]) for t in rest.topics] == [
        ("dtp-b", 0, [1]),
        ("dtp-missing", E.UNKNOWN_TOPIC_OR_PARTITION, []),
    ]
    assert rest.next_cursor is None
    p = first.topics[0].partitions[0]
    assert (p.leader_id, p.replica_nodes, p.isr_nodes, p.eligible_leader_replicas) == (1, (1,), (1,), ())
    bad = _dtp(broker, ["dtp-a"], 10, {"topic_name": "dtp-b", "partition_index": 0})
    assert [(t.name, int(t.error_code)) for t in bad.topics] == [("dtp-a", E.INVALID_REQUEST)]
    everything = _dtp(broker, [], 100)
    assert {"dtp-a", "dtp-b"} <= {t.name for t in everything.topics}


def test_kafka_python_describe_topic_partitions_paged_and_kcat_lists(broker: BrokerProcess, kcat: str) -> None:
    from kafka.admin import KafkaAdminClient

    create_topic(broker, "kp-dtp", 5)
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        page = admin.describe_topic_partitions(["kp-dtp"], response_partition_limit=3)
        assert [p["partition_index"] for p in page["topics"][0]["partitions"]] == [0, 1, 2]
        assert page["next_cursor"] == {"topic_name": "kp-dtp", "partition_index": 3}
        rest = admin.describe_topic_partitions(["kp-dtp"], cursor=page["next_cursor"])
        assert [p["partition_index"] for p in rest["topics"][0]["partitions"]] == [3, 4]
    finally:
        admin.close()
    out = subprocess.run(
        [kcat, "-b", broker.bootstrap, "-L", "-t", "kp-dtp"], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    assert 'topic "kp-dtp" with 5 partitions' in out.stdout and "1 brokers" in out.stdout


def _produce(broker: BrokerProcess, topic: str, n: int) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for i in range(n):
        p.produce(topic, value=b"v%d" % i, partition=0)
    assert p.flush(30) == 0


def test_delete_records_moves_the_start_for_consumers_and_list_offsets(broker: BrokerProcess) -> None:
    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient

    create_topic(broker, "dr", 1)
    _produce(broker, "dr", 100)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    (fut,) = admin.delete_records([TopicPartition("dr", 0, 50)]).values()
    assert fut.result(30).low_watermark == 50
    with WireClient(broker.host, broker.port) as c:
        lo = c.call(
            2,
            7,
            {
                "replica_id": -1,
                "isolation_level": 0,
                "topics": [{"name": "dr", "partitions": [{"partition_index": 0, "timestamp": -2}]}],
            },
        )
        fetch = c.call(
            1,
            11,
            {
                "replica_id": -1,
                "max_wait": 0,
                "min_bytes": 1,
                "max_bytes": 1 << 20,
                "isolation_level": 0,
                "session_id": 0,
                "session_epoch": -1,
                "topics": [
                    {
                        "topic": "dr",
                        "partitions": [{"partition": 0, "fetch_offset": 10, "partition_max_bytes": 1 << 20}],
                    }
                ],
                "forgotten_topics_data": [],
                "rack_id": "",
            },
        )
    assert lo.topics[0].partitions[0].offset == 50
    assert int(fetch.responses[0].partitions[0].error_code) == E.OFFSET_OUT_OF_RANGE
    c2 = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "dr-g", "auto.offset.reset": "earliest"})
    try:
        c2.assign([TopicPartition("dr", 0, -2)])  # OFFSET_BEGINNING
        got: list[int] = []
        deadline = time.monotonic() + 30
        while len(got) < 50 and time.monotonic() < deadline:
            m = c2.poll(0.5)
            if m is not None and m.error() is None:
                got.append(m.offset())
    finally:
        c2.close()
    assert got[0] == 50 and got == list(range(50, 100))
    with WireClient(broker.host, broker.port) as c:  # beyond the high watermark; unknown partition
        resp = c.call(
            21,
            2,
            {
                "topics": [
                    {
                        "name": "dr",
                        "partitions": [{"partition_index": 0, "offset": 500}, {"partition_index": 9, "offset": 1}],
                    }
                ],
                "timeout": 1000,
            },
        )
    assert [(int(p.error_code), p.low_watermark) for p in resp.topics[0].partitions] == [
        (E.OFFSET_OUT_OF_RANGE, -1),
        (E.UNKNOWN_TOPIC_OR_PARTITION, -1),
    ]
    with WireClient(broker.host, broker.port) as c:  # -1: up to the high watermark; never back
        resp = c.call(
            21,
            0,
            {
                "topics": [
                    {
                        "name": "dr",
                        "partitions": [
                            {"partition_index": 0, "offset": -1},
                        ],
                    }
                ],
                "timeout": 1000,
            },
        )
        back = c.call(
            21, 1, {"topics": [{"name": "dr", "partitions": [{"partition_index": 0, "offset": 20}]}], "timeout": 1000}
        )
    assert resp.topics[0].partitions[0].low_watermark == 100 and back.topics[0].partitions[0].low_watermark == 100


def test_kafka_python_delete_records(broker: BrokerProcess) -> None:
    from kafka import TopicPartition
    from kafka.admin import KafkaAdminClient

    create_topic(broker, "kp-dr", 1)
    _produce(broker, "kp-dr", 10)
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        result = admin.delete_records({TopicPartition("kp-dr", 0): 4})
    finally:
        admin.close()
    (meta,) = result.values()
    assert (meta["low_watermark"] if isinstance(meta, dict) else meta.low_watermark) == 4, result


def test_describe_log_dirs_and_elect_leaders(broker: BrokerProcess) -> None:
    create_topic(broker, "ld", 2)
    _produce(broker, "ld", 5)
    for version in range(1, 5):
        with WireClient(broker.host, broker.port) as c:
            resp = c.call(
                35,
                version,
                {"topics": [{"topic": "ld", "partitions": [0, 1, 7]}, {"topic": "nope", "partitions": [0]}]},
            )
        (d,) = resp.results
        assert int(d.error_code) == 0 and d.log_dir == str(broker.data_dir.resolve())
        (t,) = d.topics
        sizes = {p.partition_index: p.partition_size for p in t.partitions}
        assert t.name == "ld" and set(sizes) == {0, 1} and sizes[0] > 0 and sizes[1] == 0
        if version >= 4:
            assert d.total_bytes > 0 and 0 <= d.usable_bytes <= d.total_bytes
    with WireClient(broker.host, broker.port) as c:
        every = c.call(35, 2, {"topics": None})
        named = c.call(
            43, 2, {"election_type": 0, "topic_partitions": [{"topic": "ld", "partitions": [0, 9]}], "timeout": 1000}
        )
        everywhere = c.call(43, 1, {"election_type": 1, "topic_partitions": None, "timeout": 1000})
    assert "ld" in {t.name for t in every.results[0].topics}
    (r,) = named.replica_election_results
    assert [(p.partition_id, int(p.error_code)) for p in r.partition_result] == [
        (0, E.ELECTION_NOT_NEEDED),
        (9, E.UNKNOWN_TOPIC_OR_PARTITION),
    ]
    assert int(everywhere.error_code) == 0 and everywhere.replica_election_results == ()


def test_kafka_python_describe_log_dirs_and_confluent_elect_leaders(broker: BrokerProcess) -> None:
    from confluent_kafka import ElectionType, TopicPartition
    from confluent_kafka.admin import AdminClient
    from kafka.admin import KafkaAdminClient

    create_topic(broker, "ld2", 1)
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        dirs = admin.describe_log_dirs()
    finally:
        admin.close()
    assert "ld2" in str(dirs)
    ck = AdminClient({"bootstrap.servers": broker.bootstrap})
    fut = ck.elect_leaders(ElectionType.PREFERRED, [TopicPartition("ld2", 0)])
    result = fut.result(30)
    (err,) = result.values()
    assert err is not None and "ELECTION_NOT_NEEDED" in str(err), result
