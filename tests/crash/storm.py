"""The commit storm: real clients committing offsets in groups, and producing, until stopped.

Committers (one consumer per group, so each group has one commit in flight at a time):

* kafka-python ``KafkaConsumer`` subscribed to the commit topic (group-managed: JoinGroup,
  SyncGroup, Heartbeat, then OffsetCommit with its generation), plus one manually assigned
  kafka-python consumer committing into a "simple" group (generation -1);
* aiokafka ``AIOKafkaConsumer`` subscribed likewise, all on one event loop;
* confluent-kafka (librdkafka) ``Consumer`` subscribed likewise.

Each commits offset n, n+1, ... for every partition it holds, as fast as the broker answers.

Producers (idempotence off, so a retried batch gets new offsets rather than the same ones):
kafka-python with acks=all, aiokafka with acks=1, confluent-kafka with acks=all.

Every client survives the broker's deaths: errors are swallowed and retried, since what the
broker acknowledged is read off the wire by the tap (tests/crash/tap.py), not from the clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

COMMIT_TOPIC = "storm-commits"
PRODUCE_TOPIC = "storm-produce"
PARTITIONS = 3  # of each topic

# Clients reconnect quickly after a restart (kafka-python waits up to 30 s by default).
RECONNECT_MAX_MS = 500


@dataclass
class StormConfig:
    kafka_python: int = 2
    aiokafka: int = 2
    confluent: int = 1
    simple: int = 1  # manually assigned kafka-python committers (no group membership)
    producers: bool = True
    produce_pause_s: float = 0.004  # between sends of one producer


@dataclass
class Storm:
    bootstrap: str
    config: StormConfig = field(default_factory=StormConfig)
    stop_event: threading.Event = field(default_factory=threading.Event)
    client_commits: dict[str, int] = field(default_factory=dict)  # commits a client saw succeed
    client_errors: dict[str, int] = field(default_factory=dict)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _log_levels: dict[str, int] = field(default_factory=dict)  # restored by stop()

    @property
    def groups(self) -> list[str]:
        c = self.config
        return (
            [f"storm-kp-{i}" for i in range(c.kafka_python)]
            + [f"storm-simple-{i}" for i in range(c.simple)]
            + [f"storm-aio-{i}" for i in range(c.aiokafka)]
            + [f"storm-ck-{i}" for i in range(c.confluent)]
        )

    def start(self) -> None:
        # the clients' own loggers report every broker death at ERROR; keep the run's output readable
        for name in ("kafka", "aiokafka"):
            self._log_levels.setdefault(name, logging.getLogger(name).level)
            logging.getLogger(name).setLevel(logging.CRITICAL)
        c = self.config
        targets: list[tuple[str, Callable[..., None], tuple[Any, ...]]] = []
        targets += [
            (f"storm-kp-{i}", self._kafka_python_committer, (f"storm-kp-{i}", False)) for i in range(c.kafka_python)
        ]
        targets += [
            (f"storm-simple-{i}", self._kafka_python_committer, (f"storm-simple-{i}", True)) for i in range(c.simple)
        ]
        targets += [(f"storm-ck-{i}", self._confluent_committer, (f"storm-ck-{i}",)) for i in range(c.confluent)]
        if c.aiokafka or c.producers:
            targets.append(("storm-aiokafka", self._aiokafka_thread, ()))
        if c.producers:
            targets += [
                ("storm-producer-kp", self._kafka_python_producer, ()),
                ("storm-producer-ck", self._confluent_producer, ()),
            ]
        for name, fn, args in targets:
            t = threading.Thread(target=fn, args=args, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self, timeout: float = 60.0) -> list[str]:
        """Stop every client; returns the names of threads still alive after ``timeout``."""
        self.stop_event.set()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.1, deadline - time.monotonic()))
        for name, level in self._log_levels.items():  # later tests in this process read these loggers
            logging.getLogger(name).setLevel(level)
        return [t.name for t in self._threads if t.is_alive()]

    def _ok(self, who: str) -> None:
        with self._lock:
            self.client_commits[who] = self.client_commits.get(who, 0) + 1

    def _err(self, who: str) -> None:
        with self._lock:
            self.client_errors[who] = self.client_errors.get(who, 0) + 1

    def _pause(self, s: float) -> None:
        self.stop_event.wait(s)

    # ------------------------------------------------------------------ kafka-python

    def _kafka_python_committer(self, group: str, simple: bool) -> None:
        from kafka import KafkaConsumer, TopicPartition
        from kafka.structs import OffsetAndMetadata

        consumer: Any = None
        n = 0
        while not self.stop_event.is_set():
            try:
                if consumer is None:
                    consumer = KafkaConsumer(
                        bootstrap_servers=self.bootstrap,
                        group_id=group,
                        enable_auto_commit=False,
                        session_timeout_ms=10000,
                        heartbeat_interval_ms=1000,
                        reconnect_backoff_max_ms=RECONNECT_MAX_MS,
                        request_timeout_ms=5000,
                    )
                    if simple:
                        consumer.assign([TopicPartition(COMMIT_TOPIC, p) for p in range(PARTITIONS)])
                    else:
                        consumer.subscribe([COMMIT_TOPIC])
                if not simple:
                    consumer.poll(timeout_ms=20)  # drives joining and heartbeats
                parts = sorted(consumer.assignment(), key=lambda tp: tp.partition)
                if not parts:
                    continue
                n += 1
                consumer.commit({tp: OffsetAndMetadata(n, "", -1) for tp in parts})
                self._ok(group)
            except Exception:
                self._err(group)
                self._pause(0.05)
        if consumer is not None:
            with contextlib.suppress(Exception):
                consumer.close(autocommit=False, timeout_ms=2000)

    def _kafka_python_producer(self) -> None:
        from kafka import KafkaProducer

        producer: Any = None
        i = 0
        while not self.stop_event.is_set():
            try:
                if producer is None:
                    producer = KafkaProducer(
                        bootstrap_servers=self.bootstrap,
                        acks="all",
                        enable_idempotence=False,
                        linger_ms=5,
                        reconnect_backoff_max_ms=RECONNECT_MAX_MS,
                        max_block_ms=2000,
                        request_timeout_ms=5000,
                    )
                i += 1
                producer.send(PRODUCE_TOPIC, value=b"kp-%d" % i, partition=i % PARTITIONS)
                self._pause(self.config.produce_pause_s)
            except Exception:
                self._err("producer-kp")
                self._pause(0.05)
        if producer is not None:
            with contextlib.suppress(Exception):
                producer.close(timeout=2)

    # ------------------------------------------------------------------ confluent-kafka

    def _confluent_committer(self, group: str) -> None:
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": group,
                "enable.auto.commit": False,
                "session.timeout.ms": 10000,
                "reconnect.backoff.max.ms": RECONNECT_MAX_MS,
                "log_level": 0,
            }
        )
        consumer.subscribe([COMMIT_TOPIC])
        n = 0
        try:
            while not self.stop_event.is_set():
                try:
                    consumer.poll(0.02)
                    parts = sorted(consumer.assignment(), key=lambda tp: tp.partition)
                    if not parts:
                        continue
                    n += 1
                    consumer.commit(
                        offsets=[TopicPartition(COMMIT_TOPIC, tp.partition, n) for tp in parts], asynchronous=False
                    )
                    self._ok(group)
                except Exception:
                    self._err(group)
                    self._pause(0.05)
        finally:
            with contextlib.suppress(Exception):
                consumer.close()

    def _confluent_producer(self) -> None:
        from confluent_kafka import Producer

        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "acks": "all",
                "enable.idempotence": False,
                "linger.ms": 5,
                "reconnect.backoff.max.ms": RECONNECT_MAX_MS,
                "log_level": 0,
            }
        )
        i = 0
        while not self.stop_event.is_set():
            i += 1
            try:
                producer.produce(PRODUCE_TOPIC, value=b"ck-%d" % i, partition=i % PARTITIONS)
            except BufferError:
                self._err("producer-ck")
            producer.poll(0)
            self._pause(self.config.produce_pause_s)
        producer.flush(2)

    # ------------------------------------------------------------------ aiokafka

    def _aiokafka_thread(self) -> None:
        asyncio.run(self._aiokafka_main())

    async def _aiokafka_main(self) -> None:
        tasks = [self._aiokafka_committer(f"storm-aio-{i}") for i in range(self.config.aiokafka)]
        if self.config.producers:
            tasks.append(self._aiokafka_producer())
        await asyncio.gather(*tasks)

    async def _stopped(self, s: float) -> bool:
        await asyncio.sleep(s)
        return self.stop_event.is_set()

    async def _aiokafka_committer(self, group: str) -> None:
        from aiokafka import AIOKafkaConsumer

        consumer: Any = None
        n = 0
        while not self.stop_event.is_set():
            try:
                if consumer is None:
                    c = AIOKafkaConsumer(
                        COMMIT_TOPIC,
                        bootstrap_servers=self.bootstrap,
                        group_id=group,
                        enable_auto_commit=False,
                        session_timeout_ms=10000,
                        heartbeat_interval_ms=1000,
                        retry_backoff_ms=100,
                        request_timeout_ms=5000,
                    )
                    await c.start()
                    consumer = c
                await consumer.getmany(timeout_ms=20)
                parts = sorted(consumer.assignment(), key=lambda tp: tp.partition)
                if not parts:
                    continue
                n += 1
                await consumer.commit({tp: n for tp in parts})
                self._ok(group)
            except Exception:
                self._err(group)
                await self._stopped(0.05)
        if consumer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(consumer.stop(), 5)

    async def _aiokafka_producer(self) -> None:
        from aiokafka import AIOKafkaProducer

        producer: Any = None
        i = 0
        pending: set[asyncio.Future[Any]] = set()
        while not self.stop_event.is_set():
            try:
                if producer is None:
                    p = AIOKafkaProducer(
                        bootstrap_servers=self.bootstrap,
                        acks=1,
                        enable_idempotence=False,
                        linger_ms=5,
                        retry_backoff_ms=100,
                        request_timeout_ms=5000,
                    )
                    await p.start()
                    producer = p
                i += 1
                fut = await producer.send(PRODUCE_TOPIC, value=b"aio-%d" % i, partition=i % PARTITIONS)
                pending.add(fut)
                fut.add_done_callback(pending.discard)
                fut.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved: no warning
                await asyncio.sleep(self.config.produce_pause_s)
            except Exception:
                self._err("producer-aio")
                await self._stopped(0.05)
        if producer is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(producer.stop(), 5)
