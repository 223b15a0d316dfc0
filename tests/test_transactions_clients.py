"""Transactions with real clients against a broker process (docs/transactions.md):
confluent-kafka, kafka-python and aiokafka transactional producers committing and aborting with
offsets, read_committed and read_uncommitted consumers of the three libraries, fencing by a
second producer, and a transaction aborted by its timeout."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.support import BrokerProcess, create_topic

pytestmark = pytest.mark.clients

FAST = {
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "100",
    "group.initial.rebalance.delay.ms": "0",
}


@pytest.fixture
def broker(broker_factory: Callable[..., BrokerProcess]) -> BrokerProcess:
    return broker_factory(config=dict(FAST))


def _confluent_read(bootstrap: str, topic: str, isolation: str, want: int, timeout: float = 15) -> list[bytes]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"read-{time.monotonic_ns()}", "isolation.level": isolation}
    )
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        out: list[bytes] = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and len(out) < want:
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                out.append(m.value())
        if len(out) >= want:  # nothing more may come: poll a little longer
            for _ in range(3):
                m = c.poll(0.2)
                if m is not None and m.error() is None:
                    out.append(m.value())
        return out
    finally:
        c.close()


def _kafka_python_read(bootstrap: str, topic: str, isolation: str, want: int) -> list[bytes]:
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation, enable_auto_commit=False)
    try:
        tp = TopicPartition(topic, 0)
        c.assign([tp])
        c.seek(tp, 0)
        out: list[bytes] = []
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and len(out) < want:
            for records in c.poll(timeout_ms=200).values():
                out.extend(r.value for r in records)
        for records in c.poll(timeout_ms=500).values():
            out.extend(r.value for r in records)
        return out
    finally:
        c.close()


def _aiokafka_read(bootstrap: str, topic: str, isolation: str, want: int) -> list[bytes]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    async def run() -> list[bytes]:
        c = AIOKafkaConsumer(bootstrap_servers=bootstrap, isolation_level=isolation, enable_auto_commit=False)
        await c.start()
        try:
            tp = TopicPartition(topic, 0)
            c.assign([tp])
            c.seek(tp, 0)
            out: list[bytes] = []
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and len(out) < want:
                for records in (await c.getmany(timeout_ms=200)).values():
                    out.extend(r.value for r in records if r.value is not None)
            for records in (await c.getmany(timeout_ms=500)).values():
                out.extend(r.value for r in records if r.value is not None)
            return out
        finally:
            await c.stop()

    return asyncio.run(run())


READERS: dict[str, Callable[[str, str, str, int], list[bytes]]] = {
    "confluent-kafka": _confluent_read,
    "kafka-python": _kafka_python_read,
    "aiokafka": _aiokafka_read,
}


def _committed(bootstrap: str, group: str, topic: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        (tp,) = c.committed([TopicPartition(topic, 0)], timeout=10)
        return int(tp.offset)
    finally:
        c.close()


def test_confluent_commit_and_abort_with_offsets_seen_by_every_client(broker: BrokerProcess) -> None:
    """Committed records and offsets are visible, aborted ones are not to read_committed
    consumers (confluent-kafka, kafka-python, aiokafka), and are to read_uncommitted ones; the
    aborted transaction's offsets are not committed."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    create_topic(broker, "tx-in", 1)
    create_topic(broker, "tx-out", 1)
    p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "conf-1", "linger.ms": 0})
    p.init_transactions(30)
    group = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "tx-group"})
    try:
        meta = group.consumer_group_metadata()
        p.begin_transaction()
        for i in range(5):
            p.produce("tx-out", value=b"committed-%d" % i, partition=0)
        p.send_offsets_to_transaction([TopicPartition("tx-in", 0, 42)], meta, 30)
        p.commit_transaction(30)
        p.begin_transaction()
        for i in range(3):
            p.produce("tx-out", value=b"aborted-%d" % i, partition=0)
        p.send_offsets_to_transaction([TopicPartition("tx-in", 0, 99)], meta, 30)
        p.flush(30)
        p.abort_transaction(30)
    finally:
        group.close()
    assert _committed(broker.bootstrap, "tx-group", "tx-in") == 42
    committed = [b"committed-%d" % i for i in range(5)]
    for name, read in READERS.items():
        assert read(broker.bootstrap, "tx-out", "read_committed", 5) == committed, name
        seen = read(broker.bootstrap, "tx-out", "read_uncommitted", 8)
        assert seen == committed + [b"aborted-%d" % i for i in range(3)], name


def test_read_committed_stops_at_an_open_transaction(broker: BrokerProcess) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition

    create_topic(broker, "tx-open", 1)
    p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "conf-open", "linger.ms": 0})
    plain = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce("tx-open", value=b"in-txn", partition=0)
    p.flush(30)
    plain.produce("tx-open", value=b"after", partition=0)
    assert plain.flush(30) == 0
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "probe", "isolation.level": "read_committed"})
    try:
        # ListOffsets LATEST under read_committed is the LSO (the open transaction's first offset)
        low, high = c.get_watermark_offsets(TopicPartition("tx-open", 0), timeout=10, cached=False)
        assert (low, high) == (0, 0)
        assert _confluent_read(broker.bootstrap, "tx-open", "read_committed", 1, timeout=2) == []
        p.commit_transaction(30)
        assert _confluent_read(broker.bootstrap, "tx-open", "read_committed", 2) == [b"in-txn", b"after"]
    finally:
        c.close()


def test_kafka_python_transactional_producer_commits_and_aborts(broker: BrokerProcess) -> None:
    from kafka import KafkaProducer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    create_topic(broker, "kp-in", 1)
    create_topic(broker, "kp-out", 1)
    p = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="kp-1")
    try:
        p.init_transactions()
        p.begin_transaction()
        p.send("kp-out", b"kp-committed", partition=0)
        p.send_offsets_to_transaction({TopicPartition("kp-in", 0): OffsetAndMetadata(7, "", -1)}, "kp-group")
        p.commit_transaction()
        p.begin_transaction()
        p.send("kp-out", b"kp-aborted", partition=0)
        p.send_offsets_to_transaction({TopicPartition("kp-in", 0): OffsetAndMetadata(9, "", -1)}, "kp-group")
        p.abort_transaction()
    finally:
        p.close(timeout=10)
    assert _confluent_read(broker.bootstrap, "kp-out", "read_committed", 1) == [b"kp-committed"]
    assert _committed(broker.bootstrap, "kp-group", "kp-in") == 7


def test_aiokafka_transactional_producer_commits_and_aborts(broker: BrokerProcess) -> None:
    from aiokafka import AIOKafkaProducer, TopicPartition

    create_topic(broker, "aio-in", 1)
    create_topic(broker, "aio-out", 1)

    async def run() -> None:
        p = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id="aio-1")
        await p.start()
        try:
            async with p.transaction():
                await p.send_and_wait("aio-out", b"aio-committed", partition=0)
                await p.send_offsets_to_transaction({TopicPartition("aio-in", 0): 11}, "aio-group")
            await p.begin_transaction()
            await p.send_and_wait("aio-out", b"aio-aborted", partition=0)
            await p.send_offsets_to_transaction({TopicPartition("aio-in", 0): 13}, "aio-group")
            await p.abort_transaction()
        finally:
            await p.stop()

    asyncio.run(run())
    assert _confluent_read(broker.bootstrap, "aio-out", "read_committed", 1) == [b"aio-committed"]
    assert _committed(broker.bootstrap, "aio-group", "aio-in") == 11


def test_a_second_producer_fences_the_first_and_its_transaction_is_aborted(broker: BrokerProcess) -> None:
    from confluent_kafka import KafkaError, KafkaException, Producer

    create_topic(broker, "fence-out", 1)
    conf: dict[str, Any] = {"bootstrap.servers": broker.bootstrap, "transactional.id": "fenced", "linger.ms": 0}
    first = Producer(conf)
    first.init_transactions(30)
    first.begin_transaction()
    first.produce("fence-out", value=b"zombie", partition=0)
    first.flush(30)
    second = Producer(conf)
    second.init_transactions(30)  # fences the first: its open transaction is aborted
    second.begin_transaction()
    second.produce("fence-out", value=b"winner", partition=0)
    second.commit_transaction(30)
    with pytest.raises(KafkaException) as e:
        first.commit_transaction(30)
    err: KafkaError = e.value.args[0]
    assert err.fatal() and err.code() in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED), err
    assert _confluent_read(broker.bootstrap, "fence-out", "read_committed", 1) == [b"winner"]


def test_a_transaction_left_open_past_its_timeout_is_aborted_and_fenced(broker: BrokerProcess) -> None:
    from confluent_kafka import KafkaException, Producer

    create_topic(broker, "slow-out", 1)
    p = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "transactional.id": "slow",
            "transaction.timeout.ms": 1000,
            "linger.ms": 0,
        }
    )
    p.init_transactions(30)
    p.begin_transaction()
    p.produce("slow-out", value=b"too-late", partition=0)
    p.flush(30)
    time.sleep(2)  # the coordinator aborts it (checked every 100 ms here)
    with pytest.raises(KafkaException):
        p.commit_transaction(30)
    assert _confluent_read(broker.bootstrap, "slow-out", "read_committed", 1, timeout=2) == []
    assert _confluent_read(broker.bootstrap, "slow-out", "read_uncommitted", 1) == [b"too-late"]


def test_broker_sigkill_during_a_transaction(broker: BrokerProcess) -> None:
    """SIGKILL with a transaction open, restart on the same data dir: the same transactional id
    initialises again (the open transaction is fenced and aborted), its pending offsets never
    become committed ones, the committed offsets stay, and no offset is handed out twice."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    create_topic(broker, "crash-in", 1)
    create_topic(broker, "crash-out", 1)
    conf: dict[str, Any] = {"bootstrap.servers": broker.bootstrap, "transactional.id": "crashy", "linger.ms": 0}
    p = Producer(conf)
    p.init_transactions(30)
    group = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "crash-g"})
    meta = group.consumer_group_metadata()
    group.close()
    p.begin_transaction()
    p.produce("crash-out", value=b"one", partition=0)
    p.send_offsets_to_transaction([TopicPartition("crash-in", 0, 5)], meta, 30)
    p.commit_transaction(30)
    p.begin_transaction()
    offsets: list[int] = []
    p.produce("crash-out", value=b"lost", partition=0, on_delivery=lambda err, msg: offsets.append(msg.offset()))
    p.send_offsets_to_transaction([TopicPartition("crash-in", 0, 9)], meta, 30)
    p.flush(30)
    broker.kill()
    del p  # the old instance is gone with its broker
    broker.start()
    again = Producer({**conf, "bootstrap.servers": broker.bootstrap})
    again.init_transactions(60)
    again.begin_transaction()
    new: list[int] = []
    again.produce("crash-out", value=b"two", partition=0, on_delivery=lambda err, msg: new.append(msg.offset()))
    again.commit_transaction(30)
    assert _committed(broker.bootstrap, "crash-g", "crash-in") == 5
    assert new and offsets and new[0] > offsets[0]
    got = _confluent_read(broker.bootstrap, "crash-out", "read_committed", 1)
    assert b"lost" not in got and got[-1:] == [b"two"]


def test_kafkajs_read_committed_skips_an_aborted_transaction(
    broker: BrokerProcess, node_js: Callable[..., Any]
) -> None:
    """kafkajs consumers read committed data only by default: an aborted transaction written
    before two committed records is skipped (its records come first in the log)."""
    import base64
    import json

    from confluent_kafka import Producer

    create_topic(broker, "js-tx", 1)
    p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "js-1", "linger.ms": 0})
    p.init_transactions(30)
    p.begin_transaction()
    for i in range(3):
        p.produce("js-tx", value=b"aborted-%d" % i, partition=0)
    p.flush(30)
    p.abort_transaction(30)
    p.begin_transaction()
    for i in range(2):
        p.produce("js-tx", value=b"committed-%d" % i, partition=0)
    p.commit_transaction(30)
    out = node_js("consume.js", broker.bootstrap, "js-tx", "js-reader", "2", "20000", timeout=40)
    assert out.returncode == 0, out.stderr
    values = [base64.b64decode(m["value"]) for m in json.loads(out.stdout)["messages"]]
    assert values == [b"committed-0", b"committed-1"]


def test_consume_transform_produce_is_exactly_once_across_a_sigkill(broker: BrokerProcess) -> None:
    """10,000 input records, a confluent-kafka consume-transform-produce client SIGKILLed inside
    an open transaction, then restarted with the same transactional id: the output read with
    read_committed holds every input exactly once and the committed offsets are the input's end."""
    import os
    import signal
    import subprocess
    import sys

    from confluent_kafka import Consumer, Producer, TopicPartition

    from tests.support.paths import ROOT

    create_topic(broker, "eos-in", 2)
    create_topic(broker, "eos-out", 2)
    src = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for i in range(10_000):
        src.produce("eos-in", key=b"%d" % i, value=b"%d" % i, partition=i % 2)
    assert src.flush(60) == 0
    script = str(ROOT / "tests" / "support" / "eos_worker.py")
    args = [sys.executable, script, broker.bootstrap, "eos-in", "eos-out", "eos-g", "eos-worker"]

    def worker(*extra: str) -> subprocess.Popen[str]:
        return subprocess.Popen([*args, *extra], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    first = worker("3")
    try:
        assert first.stdout is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = first.stdout.readline()
            if line.strip() == "paused" or not line:
                break
        assert line.strip() == "paused", "the first worker never paused inside a transaction"
    finally:
        os.kill(first.pid, signal.SIGKILL)
        first.wait(10)
    second = worker()
    try:
        probe = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "eos-g"})
        try:
            tps = [TopicPartition("eos-in", p) for p in (0, 1)]
            deadline = time.monotonic() + 120
            done = False
            while time.monotonic() < deadline and not done:
                done = [tp.offset for tp in probe.committed(tps, timeout=10)] == [5000, 5000]
                if not done:
                    time.sleep(0.5)
            assert done, probe.committed(tps, timeout=10)
        finally:
            probe.close()
    finally:
        second.kill()
        second.wait(10)
    out: list[bytes] = []
    reader = Consumer(
        {"bootstrap.servers": broker.bootstrap, "group.id": "eos-check", "isolation.level": "read_committed"}
    )
    try:
        reader.assign([TopicPartition("eos-out", p, 0) for p in (0, 1)])
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(out) < 10_000:
            for m in reader.consume(1000, timeout=0.5):
                if m.error() is None:
                    out.append(m.value())
        out.extend(m.value() for m in reader.consume(1000, timeout=1.0) if m.error() is None)
    finally:
        reader.close()
    assert len(out) == 10_000 and set(out) == {b"T:%d" % i for i in range(10_000)}
