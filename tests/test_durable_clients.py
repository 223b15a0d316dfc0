"""Durable topic data with real clients: a kill -9 of the broker while idempotent producers
(confluent-kafka and kafka-python, acks=all) send, then a restart on the same data directory.
Every acknowledged message must be there exactly once, at its acknowledged offset, in order per
producer, with no holes; a consumer group resumes from its committed offsets."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.support import BrokerProcess, create_topic

pytestmark = [pytest.mark.clients, pytest.mark.slow]

PER_PRODUCER = 3000
PARTITIONS = 3
TOPIC = "durable"


def _confluent_producer(bootstrap: str, acked: dict[bytes, tuple[int, int]], errors: list[str]) -> threading.Thread:
    from confluent_kafka import Producer

    def run() -> None:
        p = Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 2,
                "message.timeout.ms": 120_000,
                "reconnect.backoff.max.ms": 200,
            }
        )

        def report(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(f"confluent: {err}")
            else:
                acked[msg.value()] = (msg.partition(), msg.offset())

        for i in range(PER_PRODUCER):
            while True:
                try:
                    p.produce(TOPIC, value=b"ck-%05d" % i, partition=i % PARTITIONS, on_delivery=report)
                    break
                except BufferError:
                    p.poll(0.05)
            p.poll(0)
            if i % 50 == 0:
                time.sleep(0.005)  # spread the sends over the kill
        if p.flush(150) != 0:
            errors.append("confluent: messages left unflushed")

    return threading.Thread(target=run, name="ck-producer")


def _kafka_python_producer(bootstrap: str, acked: dict[bytes, tuple[int, int]], errors: list[str]) -> threading.Thread:
    from kafka import KafkaProducer

    def run() -> None:
        p = KafkaProducer(
            bootstrap_servers=bootstrap,
            enable_idempotence=True,
            acks="all",
            linger_ms=2,
            retries=2**31 - 1,
            delivery_timeout_ms=120_000,
            request_timeout_ms=10_000,
            reconnect_backoff_max_ms=200,
        )
        futures = []
        for i in range(PER_PRODUCER):
            value = b"kp-%05d" % i
            futures.append((value, p.send(TOPIC, value=value, partition=i % PARTITIONS)))
            if i % 50 == 0:
                time.sleep(0.005)
        for value, f in futures:
            try:
                md = f.get(150)
                acked[value] = (md.partition, md.offset)
            except Exception as e:
                errors.append(f"kafka-python: {value!r}: {e!r}")
        p.close(10)

    return threading.Thread(target=run, name="kp-producer")


def _read_all(bootstrap: str) -> dict[int, list[tuple[int, bytes]]]:
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, consumer_timeout_ms=3000)
    tps = [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]
    c.assign(tps)
    c.seek_to_beginning(*tps)
    ends = c.end_offsets(tps)
    out: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(PARTITIONS)}
    deadline = time.monotonic() + 60
    while any(c.position(tp) < ends[tp] for tp in tps) and time.monotonic() < deadline:
        for tp, msgs in c.poll(1000, max_records=5000).items():
            out[tp.partition].extend((m.offset, m.value) for m in msgs)
    c.close()
    return out


def test_acknowledged_messages_survive_a_kill9_exactly_once(broker_factory: Callable[..., BrokerProcess]) -> None:
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    broker = broker_factory()
    create_topic(broker, TOPIC, PARTITIONS)
    acked: dict[bytes, tuple[int, int]] = {}
    errors: list[str] = []
    producers = [
        _confluent_producer(broker.bootstrap, acked, errors),
        _kafka_python_producer(broker.bootstrap, acked, errors),
    ]
    for t in producers:
        t.start()
    deadline = time.monotonic() + 60
    while len(acked) < 1500 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(acked) >= 1500, f"only {len(acked)} acknowledged before the kill; errors: {errors[:3]}"
    # a group commits what it has seen on partition 0 so far
    tp0 = TopicPartition(TOPIC, 0)
    committed = max(o for p, o in list(acked.values()) if p == 0) + 1
    group = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id="durable-g", enable_auto_commit=False)
    group.assign([tp0])
    group.commit({tp0: OffsetAndMetadata(committed, "", -1)})
    group.close()
    broker.kill()  # SIGKILL in the middle of the sends
    time.sleep(0.5)
    broker.start()
    for t in producers:
        t.join(200)
        assert not t.is_alive()
    assert not errors, errors[:5]
    assert len(acked) == 2 * PER_PRODUCER

    logs = _read_all(broker.bootstrap)
    for p, entries in logs.items():
        offsets = [o for o, _v in entries]
        assert offsets == list(range(len(offsets))), f"partition {p}: holes or repeats"
    where = {v: (p, o) for p, entries in logs.items() for o, v in entries}
    assert sum(len(e) for e in logs.values()) == len(where) == 2 * PER_PRODUCER  # exactly once
    assert where == acked  # every acknowledged message at its acknowledged offset
    for p, entries in logs.items():  # each producer's messages in order within a partition
        for prefix in (b"ck-", b"kp-"):
            mine = [v for _o, v in entries if v.startswith(prefix)]
            assert mine == sorted(mine), (p, prefix)
    events = broker.events("topic data loaded")
    assert events and events[-1]["clean_shutdown"] is False

    # the group resumes from its commit, never below it
    again = KafkaConsumer(
        bootstrap_servers=broker.bootstrap, group_id="durable-g", enable_auto_commit=False, auto_offset_reset="earliest"
    )
    again.assign([tp0])
    assert again.committed(tp0) == committed
    assert again.position(tp0) == committed
    first = again.poll(5000, max_records=1)
    assert first and next(iter(first.values()))[0].offset == committed
    again.close()
