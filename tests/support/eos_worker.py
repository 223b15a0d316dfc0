"""A consume-transform-produce client for the exactly-once tests (confluent-kafka, run as its own
process so a test can SIGKILL it).

usage: python eos_worker.py BOOTSTRAP IN_TOPIC OUT_TOPIC GROUP TRANSACTIONAL_ID [PAUSE_AFTER]

Reads IN_TOPIC (read_committed, every partition, from the group's committed offsets), writes
``T:<value>`` to OUT_TOPIC with the same key and partition, and commits the input offsets in the
same transaction.  With PAUSE_AFTER it stops for good inside the transaction after that many
commits (records produced, offsets sent, not committed) and prints ``paused``.  Prints one line
per commit: ``committed N``.
"""

from __future__ import annotations

import sys
import time

from confluent_kafka import Consumer, Producer, TopicPartition


def main() -> None:
    bootstrap, in_topic, out_topic, group, txn_id = sys.argv[1:6]
    pause_after = int(sys.argv[6]) if len(sys.argv) > 6 else -1
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 5})
    producer.init_transactions(60)  # fences a previous instance and aborts its open transaction
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        }
    )
    meta = consumer.list_topics(in_topic, timeout=30)
    consumer.assign([TopicPartition(in_topic, p) for p in meta.topics[in_topic].partitions])
    commits = 0
    while True:
        msgs = [m for m in consumer.consume(500, timeout=1.0) if m.error() is None]
        if not msgs:
            continue
        producer.begin_transaction()
        for m in msgs:
            producer.produce(out_topic, key=m.key(), value=b"T:" + m.value(), partition=m.partition())
        producer.send_offsets_to_transaction(
            consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 30
        )
        if commits == pause_after:
            producer.flush(30)
            print("paused", flush=True)
            time.sleep(3600)
        producer.commit_transaction(30)
        commits += 1
        print(f"committed {commits}", flush=True)


if __name__ == "__main__":
    main()
