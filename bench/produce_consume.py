"""Throughput: confluent-kafka produces N messages to a fresh broker, then consumes them (assign mode).

    python -m bench.produce_consume [--messages 200000] [--size 100] [--partitions 4]
                                              [--compression none] [--acks all]

Starts its own broker process (127.0.0.1, free port, temp data dir) and prints msgs/s and MB/s.
``python -m bench`` runs it with durable topic data (the default) and memory-only data, and
times a restart on 1 GiB of topic data (``restart_rows``).
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


def unbounded_broker(data_dir: Path, storage: str = "disk") -> BrokerProcess:
    """A started broker that keeps every produced byte (no per-partition retention bound)."""
    return BrokerProcess(
        data_dir=data_dir, config={"log.retention.bytes": "-1", "rallypoint.log.storage": storage}
    ).start()


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
            # librdkafka pauses fetching a partition for fetch.queue.backoff.ms (1 s) when its
            # local queue is over its thresholds; that pause, not the broker, made this figure
            # bimodal (a 1 s gap before the last Fetch in some runs, against every broker)
            "fetch.queue.backoff.ms": 10,
        }
    )
    c.assign([TopicPartition(topic, i, OFFSET_BEGINNING) for i in range(args.partitions)])
    got = 0
    start = time.perf_counter()
    deadline = start + 300
    while got < args.messages and time.perf_counter() < deadline:
        # never ask for more than are left: consume() waits its whole timeout for a batch it
        # cannot fill, which made the figure bimodal (about 1 s more whenever the last batch
        # fell short of 10,000), for every broker alike
        for m in c.consume(min(10_000, args.messages - got), 1.0):
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
    for compression, storage in (("none", "disk"), ("none", "memory"), ("zstd", "disk")):
        args = argparse.Namespace(
            messages=50_000 if quick else 200_000, size=100, partitions=4, compression=compression, acks="all"
        )
        prod, cons = [], []
        for _ in range(2 if quick else 3):
            with tempfile.TemporaryDirectory() as tmp, unbounded_broker(Path(tmp), storage) as broker:
                p, c = measure(broker, args)
            prod.append(p)
            cons.append(c)
        label = (
            f"{args.messages:,} × {args.size} B, 4 partitions, acks=all, compression {compression}, "
            f"{'durable' if storage == 'disk' else 'memory-only'} data"
        )
        rows.append({"name": f"produce (confluent-kafka), {label}", "unit": "msgs/s", "stats": summarize(prod)})
        rows.append({"name": f"consume (confluent-kafka), {label}", "unit": "msgs/s", "stats": summarize(cons)})
    for kind in ("produce", "consume"):
        disk = next(r for r in rows if r["name"].startswith(kind) and "none, durable" in r["name"])
        mem = next(r for r in rows if r["name"].startswith(kind) and "none, memory-only" in r["name"])
        rows.append(
            {
                "name": f"{kind}: durable / memory-only (medians, compression none)",
                "unit": "ratio",
                "stats": summarize([disk["stats"]["median"] / mem["stats"]["median"]]),
            }
        )
    rows.extend(restart_rows(quick))
    return rows


def write_topic_data(
    data_dir: Path, topic: str, partitions: int, total_bytes: int, batch_bytes: int = 64 * 1024
) -> int:
    """Append ``total_bytes`` of record batches (``batch_bytes`` each, 1 KiB records) straight
    into the segment files of an existing topic of a stopped broker, as the broker writes them
    (1 GiB segments); returns the batches written."""
    from rallypoint.protocol.records import Record, encode_batch
    from rallypoint.topics.segment_files import partition_dir_name

    value = b"v" * 1000
    per_batch = max(1, batch_bytes // 1024)
    batches = 0
    for p in range(partitions):
        pdir = data_dir / partition_dir_name(topic, p)
        seg = next(iter(sorted(pdir.glob("*.log"))))
        offset = 1  # after the one record the broker wrote
        with open(seg, "ab") as f:
            written = 0
            while written < total_bytes // partitions:
                recs = [Record(offset + i, 1_700_000_000_000 + offset + i, None, value) for i in range(per_batch)]
                b = encode_batch(recs, base_offset=offset)
                f.write(b)
                written += len(b)
                offset += per_batch
                batches += 1
    return batches


def restart_rows(quick: bool) -> list[dict[str, Any]]:
    """Time to the first answer of a broker restarting on 1 GiB of topic data (4 partitions,
    64 KiB batches), after a clean shutdown and after a kill (CRCs checked then)."""
    from bench.startup import _api_versions_answered
    from tests.support import wait_until

    size = (256 if quick else 1024) * 1024 * 1024
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        broker = BrokerProcess(data_dir=data, config={"log.retention.bytes": "-1"}).start()
        create_topic(broker, "big", 4)
        p = Producer({"bootstrap.servers": broker.bootstrap})
        for i in range(4):
            p.produce("big", b"first", partition=i)  # opens each partition's first segment
        assert p.flush(30) == 0
        del p
        broker.stop()
        batches = write_topic_data(data, "big", 4, size)
        (data / ".kafka_cleanshutdown").unlink(missing_ok=True)
        for label in ("after a kill (CRCs checked)", "after a clean shutdown"):
            samples: list[float] = []
            load_ms: list[float] = []
            for _ in range(1 if quick else 3):
                broker = BrokerProcess(data_dir=data, config={"log.retention.bytes": "-1"}, start_timeout_s=120)
                t0 = time.perf_counter()
                broker.start()
                wait_until(lambda b=broker: _api_versions_answered(b.port), 120, "an answer", step=0.001)
                samples.append((time.perf_counter() - t0) * 1000)
                [loaded] = broker.events("topic data loaded")
                assert loaded["batches"] >= batches, loaded
                load_ms.append(loaded["ms"])
                if label.startswith("after a kill"):
                    broker.kill()
                else:
                    broker.stop()
            if label.startswith("after a kill"):
                broker = BrokerProcess(data_dir=data, config={"log.retention.bytes": "-1"}).start()
                broker.stop()  # leaves the clean-shutdown marker for the next rows
            rows.append(
                {
                    "name": f"restart to first answer, {size >> 20} MiB of topic data, {label}",
                    "unit": "ms",
                    "stats": summarize(samples),
                }
            )
            rows.append(
                {
                    "name": f"… of which loading the {batches:,} batches' headers ({label})",
                    "unit": "ms",
                    "stats": summarize(load_ms),
                }
            )
    return rows


if __name__ == "__main__":
    main()
