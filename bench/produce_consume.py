"""Throughput: confluent-kafka produces N messages to a fresh broker, then consumes them (assign mode).

    python -m bench.produce_consume [--messages 200000] [--size 100] [--partitions 4]
                                              [--compression none] [--acks all]

Starts its own broker process (127.0.0.1, free port, temp data dir) and prints msgs/s and MB/s.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from bench.common import summarize
from tests.support import BrokerProcess, create_topic


def unbounded_broker(data_dir: Path) -> BrokerProcess:
    """A started broker that keeps every produced byte (no per-partition retention bound)."""
    return BrokerProcess(data_dir=data_dir, config={"log.retention.bytes": "-1"}).start()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--compression", default="none")
    ap.add_argument("--acks", default="all")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp, unbounded_broker(Path(tmp)) as broker:
        measure(broker, args)


def measure(
    broker: BrokerProcess,
    args: argparse.Namespace,
    bootstrap: str | None = None,
    client_conf: dict[str, str] | None = None,
    topic: str = "bench",
) -> tuple[float, float]:
    """(produce msgs/s, consume msgs/s); ``bootstrap``/``client_conf``: another listener and its
    security settings (bench.security)."""
    create_topic(broker, topic, args.partitions)
    payload = b"x" * args.size
    conf = {"bootstrap.servers": bootstrap or broker.bootstrap, **(client_conf or {})}
    p = Producer(
        {
            **conf,
            "acks": args.acks,
            "compression.type": args.compression,
            "linger.ms": 5,
            "batch.size": 1_000_000,
        }
    )
    start = time.perf_counter()
    for i in range(args.messages):
        while True:
            try:
                p.produce(topic, payload, partition=i % args.partitions)
                break
            except BufferError:
                p.poll(0.01)
        if i % 10_000 == 0:
            p.poll(0)
    left = p.flush(120)
    produce_s = time.perf_counter() - start
    assert left == 0, f"{left} messages not delivered"

    c = Consumer(
        {
            **conf,
            "group.id": "bench",
            "enable.auto.commit": False,
            "fetch.max.bytes": 52428800,
        }
    )
    c.assign([TopicPartition(topic, i, OFFSET_BEGINNING) for i in range(args.partitions)])
    got = 0
    start = time.perf_counter()
    deadline = start + 300
    while got < args.messages and time.perf_counter() < deadline:
        for m in c.consume(10_000, 1.0):
            if m.error() is None:
                got += 1
    consume_s = time.perf_counter() - start
    c.close()

    mb = args.messages * args.size / 1e6
    print(
        f"messages={args.messages} size={args.size}B partitions={args.partitions} "
        f"compression={args.compression} acks={args.acks}"
    )
    print(f"produce: {args.messages / produce_s:,.0f} msgs/s  {mb / produce_s:,.1f} MB/s  ({produce_s:.2f} s)")
    print(f"consume: {got / consume_s:,.0f} msgs/s  {mb / consume_s:,.1f} MB/s  ({consume_s:.2f} s, {got} messages)")
    assert got == args.messages, f"consumed {got} of {args.messages}"
    return args.messages / produce_s, got / consume_s


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Entry point for ``python -m bench``."""
    rows = []
    for compression in ("none", "zstd"):
        args = argparse.Namespace(
            messages=50_000 if quick else 200_000, size=100, partitions=4, compression=compression, acks="all"
        )
        prod, cons = [], []
        for _ in range(2 if quick else 3):
            with tempfile.TemporaryDirectory() as tmp, unbounded_broker(Path(tmp)) as broker:
                p, c = measure(broker, args)
            prod.append(p)
            cons.append(c)
        label = f"{args.messages:,} × {args.size} B, 4 partitions, acks=all, compression {compression}"
        rows.append({"name": f"produce (confluent-kafka), {label}", "unit": "msgs/s", "stats": summarize(prod)})
        rows.append({"name": f"consume (confluent-kafka), {label}", "unit": "msgs/s", "stats": summarize(cons)})
    return rows


if __name__ == "__main__":
    main()
