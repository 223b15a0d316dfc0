"""Compacted topics and time-based retention with real clients against a broker process
(docs/configs.md, "Retention and compaction"): small segment and cleaner settings make the
cleaner act within seconds."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from tests.support import BrokerProcess, create_topic

pytestmark = pytest.mark.clients


@pytest.fixture
def broker(broker_factory: Callable[..., BrokerProcess]) -> BrokerProcess:
    return broker_factory(config={"log.cleaner.backoff.ms": "100", "log.retention.check.interval.ms": "100"})


def _read_all(bootstrap: str, topic: str) -> list[tuple[int, bytes | None, bytes | None]]:
    """Every record of partition 0 from the log start to the high watermark, with a fresh
    consumer (offsets from the beginning, no group commits)."""
    from confluent_kafka import Consumer, TopicPartition

    group = f"read-{time.monotonic_ns()}"
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        out: list[tuple[int, bytes | None, bytes | None]] = []
        if low == high:
            return out
        c.assign([TopicPartition(topic, 0, low)])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (not out or out[-1][0] < high - 1):
            m = c.poll(0.2)
            if m is not None and m.error() is None:
                out.append((m.offset(), m.key(), m.value()))
        return out
    finally:
        c.close()


def test_a_compacted_topic_keeps_the_latest_value_per_key_and_drops_deleted_keys(broker: BrokerProcess) -> None:
    from confluent_kafka import Producer

    create_topic(
        broker,
        "compacted",
        1,
        configs={
            "cleanup.policy": "compact",
            "segment.ms": "200",
            "min.cleanable.dirty.ratio": "0.01",
            "delete.retention.ms": "1000",
        },
    )
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    keys = [f"k{i}".encode() for i in range(10)]
    for r in range(5):
        for k in keys:
            p.produce("compacted", key=k, value=b"%s-%d" % (k, r), partition=0)
        assert p.flush(30) == 0
        time.sleep(0.25)  # the next round opens a new segment
    p.produce("compacted", key=b"k0", value=None, partition=0)  # a tombstone
    assert p.flush(30) == 0
    produced = 5 * len(keys) + 1

    expected = {k: b"%s-4" % k for k in keys[1:]}
    deadline = time.monotonic() + 60
    records: list[tuple[int, bytes | None, bytes | None]] = []
    while time.monotonic() < deadline:
        time.sleep(0.3)
        p.produce("compacted", key=b"filler", value=b"%d" % time.monotonic_ns(), partition=0)  # rolls the segment
        assert p.flush(30) == 0
        records = _read_all(broker.bootstrap, "compacted")
        data = [(k, v) for _o, k, v in records if k != b"filler"]
        if sorted(data, key=repr) == sorted(expected.items(), key=repr):  # tombstones have None values
            break
    else:
        pytest.fail(f"not compacted within 60 s: {records}")
    offsets = [o for o, _k, _v in records]
    assert offsets == sorted(offsets) and offsets[0] >= 0
    assert len(records) < produced  # the log really shrank; the offsets kept their values
    assert all(o >= 41 for o, k, _v in records if k != b"filler")  # the last round started at offset 40


def test_a_compacted_topic_refuses_records_without_a_key(broker: BrokerProcess) -> None:
    from confluent_kafka import KafkaError, Producer

    create_topic(broker, "keys-only", 1, configs={"cleanup.policy": "compact"})
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0, "retries": 0})
    errors: list[KafkaError | None] = []
    p.produce("keys-only", value=b"no key", partition=0, on_delivery=lambda err, msg: errors.append(err))
    p.flush(30)
    p.produce("keys-only", key=b"k", value=b"keyed", partition=0, on_delivery=lambda err, msg: errors.append(err))
    assert p.flush(30) == 0
    assert len(errors) == 2 and errors[0] is not None and errors[1] is None, errors
    assert errors[0].code() == KafkaError.INVALID_RECORD


def test_retention_ms_moves_the_log_start_offset(broker: BrokerProcess) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition

    create_topic(broker, "short-lived", 1, configs={"retention.ms": "1000"})
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    for i in range(20):
        p.produce("short-lived", value=b"%d" % i, partition=0)
    assert p.flush(30) == 0
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "retention-probe"})
    try:
        tp = TopicPartition("short-lived", 0)
        assert c.get_watermark_offsets(tp, timeout=10) == (0, 20)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and c.get_watermark_offsets(tp, timeout=10) != (20, 20):
            time.sleep(0.2)
        assert c.get_watermark_offsets(tp, timeout=10) == (20, 20)
    finally:
        c.close()
