"""Consumer groups (KIP-848, ``group.protocol=consumer``) with confluent-kafka (librdkafka 2.16)
against a real broker process over real sockets (docs/consumer-groups.md).

Each consumer runs in its own thread, polling; its rebalance callbacks (incremental with the
consumer protocol) update one shared ownership table that fails the test the moment a
partition would have two owners.  The broker runs with a short heartbeat interval and no
assignment batching so that rebalances take about a second; every wait is bounded.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from tests.support import BrokerProcess

ck = pytest.importorskip("confluent_kafka")
admin_mod = pytest.importorskip("confluent_kafka.admin")

pytestmark = pytest.mark.clients

T = TypeVar("T")

FAST = {
    "group.consumer.heartbeat.interval.ms": "300",
    "group.consumer.min.heartbeat.interval.ms": "100",
    "group.consumer.session.timeout.ms": "6000",
    "group.consumer.min.session.timeout.ms": "1000",
    "group.consumer.assignment.interval.ms": "0",
    "num.partitions": "6",
}


def wait_until(cond: Callable[[], T], timeout: float, what: str, step: float = 0.1) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(step)


class Ownership:
    """Who owns which partition, from the members' rebalance callbacks."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.owner: dict[tuple[str, int], str] = {}
        self.violations: list[str] = []

    def assign(self, member: str, tps: list[tuple[str, int]]) -> None:
        with self.lock:
            for tp in tps:
                cur = self.owner.get(tp)
                if cur is not None and cur != member:
                    self.violations.append(f"{tp} assigned to {member} while {cur} owns it")
                self.owner[tp] = member

    def revoke(self, member: str, tps: list[tuple[str, int]]) -> None:
        with self.lock:
            for tp in tps:
                if self.owner.get(tp) == member:
                    del self.owner[tp]

    def of(self, member: str) -> set[tuple[str, int]]:
        with self.lock:
            return {tp for tp, m in self.owner.items() if m == member}


class Member:
    def __init__(
        self,
        broker: BrokerProcess,
        group: str,
        topics: list[str],
        name: str,
        own: Ownership,
        **conf: Any,
    ) -> None:
        self.name = name
        self.own = own
        self.messages: list[tuple[str, int, int]] = []
        self.errors: list[str] = []
        self.consumer = ck.Consumer(
            {
                "bootstrap.servers": broker.bootstrap,
                "group.id": group,
                "group.protocol": "consumer",
                "client.id": name,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "error_cb": lambda e: self.errors.append(str(e)),
                **conf,
            }
        )
        self.consumer.subscribe(topics, on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_revoke)
        self._stop = threading.Event()
        self._closed = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _on_assign(self, _c: Any, parts: list[Any]) -> None:
        self.own.assign(self.name, [(p.topic, p.partition) for p in parts])

    def _on_revoke(self, _c: Any, parts: list[Any]) -> None:
        self.own.revoke(self.name, [(p.topic, p.partition) for p in parts])

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                msg = self.consumer.poll(0.1)
                if msg is None or msg.error():
                    continue
                self.messages.append((msg.topic(), msg.partition(), msg.offset()))
                self.consumer.commit(message=msg, asynchronous=False)
        except Exception as e:  # surfaced by the test through self.errors
            self.errors.append(repr(e))
        finally:
            self.consumer.close()
            self._closed.set()

    def close(self, timeout: float = 20.0) -> None:
        self._stop.set()
        assert self._closed.wait(timeout), f"{self.name} did not close"

    def owned(self) -> set[tuple[str, int]]:
        return self.own.of(self.name)


@pytest.fixture
def fast_broker(broker_factory: Callable[..., BrokerProcess]) -> BrokerProcess:
    return broker_factory(config=dict(FAST))


@pytest.fixture
def members() -> Iterator[list[Member]]:
    started: list[Member] = []
    yield started
    for m in started:
        if not m._closed.is_set():
            m._stop.set()
            m._closed.wait(20)


def create_topic(broker: BrokerProcess, name: str, partitions: int) -> None:
    a = admin_mod.AdminClient({"bootstrap.servers": broker.bootstrap})
    for f in a.create_topics([admin_mod.NewTopic(name, partitions, 1)]).values():
        f.result(15)


def produce(broker: BrokerProcess, topic: str, n: int) -> None:
    p = ck.Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(n):
        p.produce(topic, value=f"m{i}".encode(), partition=i % 6)
    assert p.flush(15) == 0


def test_three_consumers_uniform_then_one_leaves(fast_broker: BrokerProcess, members: list[Member]) -> None:
    create_topic(fast_broker, "cg-t", 6)
    produce(fast_broker, "cg-t", 60)
    own = Ownership()
    group = f"g-{uuid.uuid4().hex[:8]}"
    for i in range(3):
        members.append(Member(fast_broker, group, ["cg-t"], f"c{i}", own))
    wait_until(lambda: all(len(m.owned()) == 2 for m in members), 30, "2 partitions each")
    wait_until(lambda: sum(len(m.messages) for m in members) == 60, 30, "all 60 messages")
    consumed = [(t, p, o) for m in members for t, p, o in m.messages]
    assert len(consumed) == len(set(consumed)) == 60  # every message once
    members[2].close()
    wait_until(lambda: sorted(len(m.owned()) for m in members[:2]) == [3, 3], 30, "3 partitions each")
    assert own.violations == []
    # committed offsets are where consumption stopped
    c = ck.Consumer({"bootstrap.servers": fast_broker.bootstrap, "group.id": group, "group.protocol": "consumer"})
    try:
        committed = c.committed([ck.TopicPartition("cg-t", p) for p in range(6)], timeout=10)
        assert [tp.offset for tp in committed] == [10] * 6
    finally:
        c.close()
    # the AdminClient sees a consumer group, Stable, with two members and their partitions
    a = admin_mod.AdminClient({"bootstrap.servers": fast_broker.bootstrap})
    d = a.describe_consumer_groups([group])[group].result(15)
    assert str(d.type).endswith("CONSUMER") and str(d.state).endswith("STABLE")
    assert len(d.members) == 2
    assert sorted(len(m.assignment.topic_partitions) for m in d.members) == [3, 3]
    for m in members[:2]:
        m.close()
    assert all(not m.errors for m in members), [m.errors for m in members]
