"""Latency from a produce being acknowledged to a parked long-poll fetch returning the data.

    python -m bench.fetch_wakeup [--rounds 300]

A consumer connection parks a Fetch (max_wait 5 s, min_bytes 1) at the log end; a producer
connection then produces one small batch with acks=1.  Measured per round: produce send → ack,
and ack → fetch response received (the wake-up), on a broker process started here.
"""

from __future__ import annotations

import argparse
import select
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from kafka.record.default_records import DefaultRecordBatchBuilder
from rallypoint.protocol import codec

from bench.common import summarize
from tests.support import BrokerProcess, WireClient, create_topic


def batch() -> bytes:
    b = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    b.append(0, None, b"k", b"hello", [])
    return bytes(b.build())


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=300)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, BrokerProcess(data_dir=Path(tmp), config={}).start() as broker:
        measure(broker, args.rounds)


def measure(broker: BrokerProcess, rounds: int) -> tuple[list[float], list[float]]:
    """(produce ack ms, ack → fetch answered ms) per round, warm-up round excluded."""
    data = batch()
    acks: list[float] = []
    wakeups: list[float] = []
    with WireClient(broker.host, broker.port) as prod, WireClient(broker.host, broker.port) as cons:
        create_topic(prod, "wake")
        for offset in range(rounds + 1):
            fetch = {
                "max_wait": 5000,
                "min_bytes": 1,
                "max_bytes": 1 << 20,
                "isolation_level": 0,
                "session_id": 0,
                "session_epoch": -1,
                "topics": [
                    {
                        "topic": "wake",
                        "partitions": [{"partition": 0, "fetch_offset": offset, "partition_max_bytes": 1 << 20}],
                    }
                ],
                "forgotten_topics_data": [],
                "rack_id": "",
            }
            corr = cons.send(1, 12, fetch)
            # make sure the fetch is parked before producing
            ready, _, _ = select.select([cons.sock], [], [], 0.02)
            assert not ready
            body = {
                "transactional_id": None,
                "acks": 1,
                "timeout": 5000,
                "topic_data": [{"name": "wake", "partition_data": [{"index": 0, "records": data}]}],
            }
            t0 = time.perf_counter()
            resp = prod.call(0, 9, body)
            t1 = time.perf_counter()
            assert int(resp.responses[0].partition_responses[0].error_code) == 0
            got = codec.to_dict(cons.receive(1, 12, corr))
            t2 = time.perf_counter()
            assert got["responses"][0]["partitions"][0]["records"], "fetch returned without data"
            acks.append((t1 - t0) * 1000)
            wakeups.append((t2 - t1) * 1000)
    print(f"rounds={rounds} (first round, warm-up: ack {acks[0]:.3f} ms, wake-up {wakeups[0]:.3f} ms; excluded)")
    for name, xs in (("produce ack", acks[1:]), ("ack -> fetch answered", wakeups[1:])):
        print(f"{name:>22}: p50 {statistics.median(xs):.3f} ms  p99 {pct(xs, 0.99):.3f} ms  max {max(xs):.3f} ms")
    return acks[1:], wakeups[1:]


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Entry point for ``python -m bench``."""
    rounds = 100 if quick else 300
    with tempfile.TemporaryDirectory() as tmp, BrokerProcess(data_dir=Path(tmp), config={}).start() as broker:
        acks, wakeups = measure(broker, rounds)
    return [
        {
            "name": "produce (acks=1) → ack",
            "unit": "ms",
            "stats": summarize(acks),
            "note": f"produce ack p99 {pct(acks, 0.99):.3f} ms over {len(acks)} rounds",
        },
        {
            "name": "ack → parked long-poll Fetch answered (wake-up)",
            "unit": "ms",
            "stats": summarize(wakeups),
            "note": f"wake-up p99 {pct(wakeups, 0.99):.3f} ms (the Fetch waits with max_wait 5 s, min_bytes 1)",
        },
    ]


if __name__ == "__main__":
    main()
