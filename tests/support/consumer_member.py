"""A consumer-group member driven by a real client library (run by tests.support.members.Member).

    python tests/support/consumer_member.py --client kafka-python|aiokafka|confluent --bootstrap H:P
        --group G --topics a,b [--instance ID] [--session-ms 6000] [--heartbeat-ms 1000]
        [--max-poll-ms 30000] [--assignor NAME[,NAME...]] [--client-id ID]

Prints one JSON object per line on stdout: {"event": "started"}, then
{"event": "assignment", "partitions": [[topic, partition], ...], "t": <unix time>} whenever its
assignment changes, "assign"/"revoke" events from the rebalance callbacks, and {"event":
"closed"} after a clean close.  It closes the consumer cleanly (LeaveGroup unless static) when
its stdin reaches EOF, and exits.  It imports nothing from the repository (run by path, it
does not pay for importing tests.support), only the client library.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import json
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

stop = threading.Event()


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "t": time.time(), **fields}), flush=True)


def tps(parts: Any) -> list[list[Any]]:
    return sorted([p.topic, p.partition] for p in parts)


def watch_stdin() -> None:
    for _ in sys.stdin:
        pass
    stop.set()


def run_kafka_python(a: argparse.Namespace) -> None:
    from kafka import ConsumerRebalanceListener, KafkaConsumer
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

    assignors = {"range": RangePartitionAssignor, "roundrobin": RoundRobinPartitionAssignor}

    class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
        def on_partitions_revoked(self, revoked: Any) -> None:
            emit("revoke", partitions=tps(revoked))

        def on_partitions_assigned(self, assigned: Any) -> None:
            emit("assign", partitions=tps(assigned))

    kw: dict[str, Any] = dict(
        bootstrap_servers=a.bootstrap,
        group_id=a.group,
        client_id=a.client_id or "kafka-python-member",
        session_timeout_ms=a.session_ms,
        heartbeat_interval_ms=a.heartbeat_ms,
        max_poll_interval_ms=a.max_poll_ms,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    if a.instance:
        kw["group_instance_id"] = a.instance
    if a.assignor:
        kw["partition_assignment_strategy"] = [assignors[n] for n in a.assignor.split(",")]
    c = KafkaConsumer(**kw)
    # Know the topics' partitions before joining: a leader that assigns before its metadata
    # arrives hands out nothing and rejoins at once, a path where kafka-python 3.0.12
    # occasionally stops heartbeating (client-side; seen with the range assignor).
    for topic in a.topics.split(","):
        c.partitions_for_topic(topic)
    c.subscribe(a.topics.split(","), listener=Listener())
    emit("started")
    last = None
    while not stop.is_set():
        try:
            # Poll long enough that no JoinGroup of these scenarios outlasts one poll.  kafka-python
            # 3.0.12 drops a join that does: join_group_async returns on the poll's timeout leaving
            # its join task in flight, and re-awaits it on a later poll only while need_rejoin() is
            # true.  A leader that rejoined because its metadata snapshot changed makes need_rejoin()
            # false itself when it assigns, so the SyncGroup answer is never taken up: heartbeats
            # stay disabled and its session expires (about one run in ten with a 200 ms poll).
            c.poll(timeout_ms=3000)
        except Exception as e:  # the data plane may be missing; membership goes on
            emit("error", error=type(e).__name__)
            time.sleep(0.2)
        now = tps(c.assignment())
        if now != last:
            emit("assignment", partitions=now)
            last = now
    c.close()
    emit("closed")


def run_confluent(a: argparse.Namespace) -> None:
    from confluent_kafka import Consumer

    conf: dict[str, Any] = {
        "bootstrap.servers": a.bootstrap,
        "group.id": a.group,
        "client.id": a.client_id or "confluent-member",
        "session.timeout.ms": a.session_ms,
        "heartbeat.interval.ms": a.heartbeat_ms,
        "max.poll.interval.ms": a.max_poll_ms,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "topic.metadata.refresh.interval.ms": 2000,
    }
    if a.instance:
        conf["group.instance.id"] = a.instance
    if a.assignor:
        conf["partition.assignment.strategy"] = a.assignor
    c = Consumer(conf)

    def on_assign(consumer: Any, parts: Any) -> None:
        emit("assign", partitions=tps(parts))

    def on_revoke(consumer: Any, parts: Any) -> None:
        emit("revoke", partitions=tps(parts))

    c.subscribe(a.topics.split(","), on_assign=on_assign, on_revoke=on_revoke)
    emit("started")
    last = None
    while not stop.is_set():
        msg = c.poll(0.2)
        if msg is not None and msg.error():
            emit("error", error=str(msg.error()))
        now = tps(c.assignment())
        if now != last:
            emit("assignment", partitions=now)
            last = now
    c.close()
    emit("closed")


def run_aiokafka(a: argparse.Namespace) -> None:
    from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
    from aiokafka.coordinator.assignors.range import RangePartitionAssignor
    from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

    assignors = {"range": RangePartitionAssignor, "roundrobin": RoundRobinPartitionAssignor}

    class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
        async def on_partitions_revoked(self, revoked: Any) -> None:
            emit("revoke", partitions=tps(revoked))

        async def on_partitions_assigned(self, assigned: Any) -> None:
            emit("assign", partitions=tps(assigned))

    async def main() -> None:
        kw: dict[str, Any] = dict(
            bootstrap_servers=a.bootstrap,
            group_id=a.group,
            client_id=a.client_id or "aiokafka-member",
            session_timeout_ms=a.session_ms,
            heartbeat_interval_ms=a.heartbeat_ms,
            max_poll_interval_ms=a.max_poll_ms,
            rebalance_timeout_ms=a.max_poll_ms,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        if a.instance:
            kw["group_instance_id"] = a.instance
        if a.assignor:
            kw["partition_assignment_strategy"] = tuple(assignors[n] for n in a.assignor.split(","))
        c = AIOKafkaConsumer(**kw)
        c.subscribe(a.topics.split(","), listener=Listener())
        await c.start()
        emit("started")
        last = None
        while not stop.is_set():
            try:
                await c.getmany(timeout_ms=200)
            except Exception as e:  # the data plane may be missing; membership goes on
                emit("error", error=type(e).__name__)
                await asyncio.sleep(0.2)
            now = tps(c.assignment())
            if now != last:
                emit("assignment", partitions=now)
                last = now
        await c.stop()
        emit("closed")

    asyncio.run(main())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--client", required=True, choices=["kafka-python", "aiokafka", "confluent"])
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--group", required=True)
    p.add_argument("--topics", required=True)
    p.add_argument("--instance")
    p.add_argument("--client-id")
    p.add_argument("--session-ms", type=int, default=6000)
    p.add_argument("--heartbeat-ms", type=int, default=1000)
    p.add_argument("--max-poll-ms", type=int, default=30000)
    p.add_argument("--assignor")
    a = p.parse_args()
    logging.basicConfig(
        level=getattr(logging, os.environ.get("GROUP_CONSUMER_LOG", "WARNING")),
        stream=sys.stderr,
        format="%(asctime)s %(threadName)s %(name)s %(levelname)s %(message)s",
    )
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # tests dump stacks when a member hangs
    threading.Thread(target=watch_stdin, daemon=True).start()
    {"kafka-python": run_kafka_python, "aiokafka": run_aiokafka, "confluent": run_confluent}[a.client](a)


if __name__ == "__main__":
    main()
