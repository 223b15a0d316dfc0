"""One member of the fuzz run's Stable group: a confluent-kafka (librdkafka) consumer.

    python -m tests.fuzz.stable_member --bootstrap H:P --group G --topic T [--session-ms 10000]

Prints one JSON object per line: ``{"event": "assign"|"revoke", "partitions": [...]}`` from the
rebalance callbacks, ``{"event": "error", ...}`` for consumer errors, ``{"event": "closed"}``.
It stops (closing the consumer, so it leaves the group) when its stdin reaches EOF.  A separate
process, so the fuzzer's own CPU use cannot make it miss a heartbeat.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from typing import Any


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "t": time.time(), **fields}), flush=True)


def main() -> None:
    from confluent_kafka import Consumer

    p = argparse.ArgumentParser()
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--session-ms", type=int, default=10000)
    a = p.parse_args()
    stop = threading.Event()

    def watch_stdin() -> None:
        for _ in sys.stdin:
            pass
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    c = Consumer(
        {
            "bootstrap.servers": a.bootstrap,
            "group.id": a.group,
            "client.id": "fuzz-stable-member",
            "session.timeout.ms": a.session_ms,
            "heartbeat.interval.ms": 1000,
            "enable.auto.commit": True,
            "auto.commit.interval.ms": 1000,
            "auto.offset.reset": "earliest",
            "topic.metadata.refresh.interval.ms": 5000,
        }
    )

    def parts(ps: Any) -> list[list[Any]]:
        return sorted([tp.topic, tp.partition] for tp in ps)

    c.subscribe(
        [a.topic],
        on_assign=lambda _c, ps: emit("assign", partitions=parts(ps)),
        on_revoke=lambda _c, ps: emit("revoke", partitions=parts(ps)),
    )
    emit("started")
    while not stop.is_set():
        m = c.poll(0.2)
        if m is not None and m.error() is not None:
            emit("error", error=str(m.error()))
    c.close()
    emit("closed")


if __name__ == "__main__":
    main()
