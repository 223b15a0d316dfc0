"""librdkafka's mock cluster as a peer broker, in its own process.

confluent-kafka starts the mock cluster in-process when a client gets
``test.mock.num.brokers``; its broker listens on a real 127.0.0.1 port that other processes
can use.  This script starts it, prints ``BOOTSTRAP host:port`` and keeps it alive until its
stdin closes (or it is killed).
"""

from __future__ import annotations

import sys

from confluent_kafka import Producer


def main() -> int:
    producer = Producer({"test.mock.num.brokers": 1, "bootstrap.servers": "", "log_level": 0})
    md = producer.list_topics(timeout=10)
    broker = next(iter(md.brokers.values()))
    print(f"BOOTSTRAP {broker.host}:{broker.port}", flush=True)
    sys.stdin.read()  # until the parent closes our stdin
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
