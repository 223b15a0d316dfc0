"""Side-by-side figures: rallypoint vs librdkafka's mock cluster, same load generator, one run.

python -m bench.compare [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

from bench.common import Endpoint, side_by_side
from bench.loadgen import run_load


def group_round_trips(ep: Endpoint, api: str, seconds: float, connections: int = 32, depth: int = 8) -> float:
    result = asyncio.run(run_load(ep.host, ep.port, api, connections=connections, depth=depth, seconds=seconds))
    if result.errors:
        raise RuntimeError(f"{api} load against {ep.name} had {result.errors} errors")
    return result.per_second


def first_assignment_seconds(ep: Endpoint) -> float:
    """One confluent-kafka consumer: subscribe → first partitions assigned."""
    from confluent_kafka import Consumer

    topic = f"bench-assign-{uuid.uuid4().hex[:8]}"
    _ensure_topic(ep, topic)
    assigned: list[float] = []
    consumer = Consumer(
        {
            "bootstrap.servers": ep.bootstrap,
            "group.id": f"bench-first-{uuid.uuid4().hex[:8]}",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    try:
        start = time.perf_counter()
        consumer.subscribe([topic], on_assign=lambda c, parts: assigned.append(time.perf_counter()))
        deadline = start + 30
        while not assigned and time.perf_counter() < deadline:
            consumer.poll(0.01)
        if not assigned:
            raise RuntimeError(f"no assignment from {ep.name} within 30 s")
        return assigned[0] - start
    finally:
        consumer.close()


def _ensure_topic(ep: Endpoint, topic: str, partitions: int = 1) -> None:
    """Create a topic through Metadata requests with auto-creation (both brokers support it),
    until one answers it without error (a broker may first answer LEADER_NOT_AVAILABLE)."""
    from tests.support import WireClient, wait_until

    with WireClient(ep.host, ep.port) as c:

        def created() -> bool:
            md = c.call(3, 4, {"topics": [{"name": topic}], "allow_auto_topic_creation": True})
            return all(int(t.error_code) == 0 and len(t.partitions) > 0 for t in md.topics)

        wait_until(created, 10, f"topic {topic} on {ep.name}")


def produce_consume_msgs_per_s(ep: Endpoint, n: int, size: int = 100) -> float:
    """confluent-kafka: produce n messages, then consume them all (assign mode); msgs/s end to end."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    topic = f"bench-pc-{uuid.uuid4().hex[:8]}"
    _ensure_topic(ep, topic)
    payload = b"x" * size
    start = time.perf_counter()
    producer = Producer({"bootstrap.servers": ep.bootstrap, "linger.ms": 5, "log_level": 0})
    for i in range(n):
        while True:
            try:
                producer.produce(topic, payload, key=str(i).encode())
                break
            except BufferError:
                producer.poll(0.01)
    producer.flush(60)
    consumer = Consumer(
        {
            "bootstrap.servers": ep.bootstrap,
            "group.id": "bench-pc",
            "enable.auto.commit": False,
            "log_level": 0,
            # no 1 s client-side pause when its queue is over its thresholds (bench/produce_consume.py)
            "fetch.queue.backoff.ms": 10,
        }
    )
    parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    consumer.assign([TopicPartition(topic, p, 0) for p in parts])
    got = 0
    deadline = time.perf_counter() + 120
    while got < n and time.perf_counter() < deadline:
        for m in consumer.consume(min(10000, n - got), 0.5):  # no wait for a batch that cannot fill
            if m.error() is None:
                got += 1
    consumer.close()
    if got < n:
        raise RuntimeError(f"consumed {got}/{n} from {ep.name}")
    return n / (time.perf_counter() - start)


NO_FSYNC = {"rallypoint.offsets.flush": "never"}

# produce→consume: the first run against a fresh broker, rallypoint's or the mock's, is 2-3
# times slower than the next ones (mostly the client's first use: connections, metadata,
# buffers), so one discarded run comes first, against each broker alike.
WARMUP = {"produce→consume": 1}

MEASUREMENTS: list[tuple[str, str, Callable[[Endpoint, bool], float], bool, dict[str, str]]] = [
    # (name, unit, fn(endpoint, quick), higher_is_better, rallypoint config)
    ("heartbeat round trips/s", "rt/s", lambda ep, q: group_round_trips(ep, "heartbeat", 1.5 if q else 4.0), True, {}),
    (
        "offset-commit round trips/s (rallypoint durable: fsync before each answer, group commit)",
        "rt/s",
        lambda ep, q: group_round_trips(ep, "commit", 1.5 if q else 4.0),
        True,
        {},
    ),
    (
        "offset-commit round trips/s (rallypoint.offsets.flush=never, like the mock: no fsync)",
        "rt/s",
        lambda ep, q: group_round_trips(ep, "commit", 1.5 if q else 4.0),
        True,
        NO_FSYNC,
    ),
    ("time to first assignment (one consumer, delay 0)", "s", lambda ep, q: first_assignment_seconds(ep), False, {}),
    ("produce→consume", "msgs/s", lambda ep, q: produce_consume_msgs_per_s(ep, 20000 if q else 50000), True, {}),
]


def run(quick: bool = False) -> list[dict[str, Any]]:
    runs = 2 if quick else 3
    rows: list[dict[str, Any]] = []
    for name, unit, fn, higher, rp_config in MEASUREMENTS:
        measure = partial(lambda f, ep: f(ep, quick), fn)
        rows.append(
            side_by_side(
                name,
                unit,
                measure,
                runs,
                rallypoint_config=rp_config,
                higher_is_better=higher,
                warmup=WARMUP.get(name, 0),
            )
        )
    return rows


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    run(p.parse_args().quick)
