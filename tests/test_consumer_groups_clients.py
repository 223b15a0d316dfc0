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
                if msg is None:
                    continue
                if msg.error():
                    self.errors.append(str(msg.error()))
                    if msg.error().fatal():
                        break
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
    wait_until(lambda: all(len(m.owned()) == 2 for m in members), 60, "2 partitions each")
    wait_until(lambda: sum(len(m.messages) for m in members) == 60, 60, "all 60 messages")
    consumed = [(t, p, o) for m in members for t, p, o in m.messages]
    assert len(consumed) == len(set(consumed)) == 60  # every message once
    members[2].close()
    wait_until(lambda: sorted(len(m.owned()) for m in members[:2]) == [3, 3], 60, "3 partitions each")
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


def _assign_events(own: Ownership) -> int:
    return len(own.owner)


def test_static_member_leaves_and_returns_and_duplicate_is_refused(
    fast_broker: BrokerProcess, members: list[Member]
) -> None:
    create_topic(fast_broker, "cg-s", 6)
    own = Ownership()
    group = f"g-{uuid.uuid4().hex[:8]}"
    a = Member(fast_broker, group, ["cg-s"], "a", own, **{"group.instance.id": "ia"})
    b = Member(fast_broker, group, ["cg-s"], "b", own, **{"group.instance.id": "ib"})
    members += [a, b]
    wait_until(lambda: len(a.owned()) == 3 and len(b.owned()) == 3, 60, "3 partitions each")
    a_parts, b_parts = a.owned(), b.owned()
    a.close()  # leaves with epoch -2: its partitions stay reserved for its return
    time.sleep(1.5)
    assert b.owned() == b_parts
    a2 = Member(fast_broker, group, ["cg-s"], "a2", own, **{"group.instance.id": "ia"})
    members.append(a2)
    wait_until(lambda: a2.owned() == a_parts, 60, "the returning static member's old partitions")
    assert b.owned() == b_parts
    # a second live member with b's instance id is refused (fatal for librdkafka)
    dup = Member(fast_broker, group, ["cg-s"], "dup", own, **{"group.instance.id": "ib"})
    members.append(dup)
    # UNRELEASED_INSTANCE_ID, in librdkafka's words
    wait_until(lambda: any("instance id is still used" in e.lower() for e in dup.errors), 60, "the refusal")
    assert b.owned() == b_parts and own.violations == []


def test_range_assignor_static_members_two_topics(fast_broker: BrokerProcess, members: list[Member]) -> None:
    create_topic(fast_broker, "cg-r1", 3)
    create_topic(fast_broker, "cg-r2", 3)
    own = Ownership()
    group = f"g-{uuid.uuid4().hex[:8]}"
    conf = {"group.remote.assignor": "range"}
    # instance ids in the opposite order of joining: Kafka orders static members by instance id
    late = Member(fast_broker, group, ["cg-r1", "cg-r2"], "z", own, **conf, **{"group.instance.id": "i-2"})
    members.append(late)
    wait_until(lambda: len(late.owned()) == 6, 60, "the first member's 6 partitions")
    early = Member(fast_broker, group, ["cg-r1", "cg-r2"], "a", own, **conf, **{"group.instance.id": "i-1"})
    members.append(early)
    expect_first = {("cg-r1", 0), ("cg-r1", 1), ("cg-r2", 0), ("cg-r2", 1)}
    expect_second = {("cg-r1", 2), ("cg-r2", 2)}
    wait_until(lambda: early.owned() == expect_first and late.owned() == expect_second, 60, "Kafka's range result")
    # heterogeneous: a third static member subscribed to one topic only
    third = Member(fast_broker, group, ["cg-r1"], "m", own, **conf, **{"group.instance.id": "i-3"})
    members.append(third)
    wait_until(
        lambda: (
            early.owned() == {("cg-r1", 0), ("cg-r2", 0), ("cg-r2", 1)}
            and late.owned() == {("cg-r1", 1), ("cg-r2", 2)}
            and third.owned() == {("cg-r1", 2)}
        ),
        30,
        "range over subscribers per topic",
    )
    assert own.violations == []


def test_regex_subscription_picks_up_a_new_topic(fast_broker: BrokerProcess, members: list[Member]) -> None:
    create_topic(fast_broker, "rp-one", 2)
    create_topic(fast_broker, "other", 2)
    own = Ownership()
    m = Member(fast_broker, f"g-{uuid.uuid4().hex[:8]}", ["^rp-.*"], "rx", own)
    members.append(m)
    wait_until(lambda: m.owned() == {("rp-one", 0), ("rp-one", 1)}, 60, "the matching topic")
    create_topic(fast_broker, "rp-two", 3)
    wait_until(lambda: len(m.owned()) == 5, 60, "the topic created later")
    assert all(t.startswith("rp-") for t, _ in m.owned())


def test_restart_replays_the_group_without_a_rebalance(
    broker_factory: Callable[..., BrokerProcess], members: list[Member]
) -> None:
    broker = broker_factory(config=dict(FAST, **{"group.consumer.session.timeout.ms": "15000"}))
    create_topic(broker, "cg-x", 6)
    produce(broker, "cg-x", 60)
    own = Ownership()
    group = f"g-{uuid.uuid4().hex[:8]}"
    a, b = Member(broker, group, ["cg-x"], "a", own), Member(broker, group, ["cg-x"], "b", own)
    members += [a, b]
    wait_until(lambda: sum(len(m.messages) for m in members) == 60, 60, "the first 60 messages")
    wait_until(lambda: len(a.owned()) == 3 and len(b.owned()) == 3, 60, "3 partitions each")
    before = _describe(broker, group)
    parts = (a.owned(), b.owned())
    broker.restart()
    after = _describe(broker, group)
    assert (after.state, _epochs(after)) == (before.state, _epochs(before))
    produce(broker, "cg-x", 60)
    wait_until(lambda: sum(len(m.messages) for m in members) == 120, 60, "60 more messages")
    consumed = [(t, p, o) for m in members for t, p, o in m.messages]
    assert len(consumed) == len(set(consumed)) == 120  # nothing twice
    assert (a.owned(), b.owned()) == parts and own.violations == []
    final = _describe(broker, group)
    assert _epochs(final) == _epochs(before)
    # replayed from the log (not rebuilt by rejoining members), and no rebalance happened
    loaded = [e for e in broker.events("consumer_group.loaded") if e["group"] == group]
    assert len(loaded) == 1 and loaded[0]["members"] == 2 and loaded[0]["state"] == "Stable"
    for name in ("consumer_group.member_added", "consumer_group.target_assignment", "consumer_group.member_removed"):
        assert not [e for e in broker.events(name) if e["group"] == group], name
    for m in members:
        m.close()


def _describe(broker: BrokerProcess, group: str) -> Any:
    a = admin_mod.AdminClient({"bootstrap.servers": broker.bootstrap})
    return a.describe_consumer_groups([group])[group].result(15)


def _epochs(d: Any) -> list[tuple[str, str]]:
    return sorted(
        (m.member_id, ",".join(sorted(f"{tp.topic}-{tp.partition}" for tp in m.assignment.topic_partitions)))
        for m in d.members
    )


def test_admin_list_and_describe_with_type_filter_and_classic_fallback(
    fast_broker: BrokerProcess, members: list[Member]
) -> None:
    create_topic(fast_broker, "cg-a", 2)
    own = Ownership()
    cgroup = f"cg-{uuid.uuid4().hex[:8]}"
    members.append(Member(fast_broker, cgroup, ["cg-a"], "c", own))
    wait_until(lambda: len(members[0].owned()) == 2, 60, "the consumer-protocol member's partitions")
    classic_group = f"classic-{uuid.uuid4().hex[:8]}"
    classic = ck.Consumer(
        {"bootstrap.servers": fast_broker.bootstrap, "group.id": classic_group, "session.timeout.ms": 6000}
    )
    try:
        classic.subscribe(["cg-a"])
        deadline = time.monotonic() + 30
        while not classic.assignment() and time.monotonic() < deadline:
            classic.poll(0.1)
        assert classic.assignment()
        a = admin_mod.AdminClient({"bootstrap.servers": fast_broker.bootstrap})
        listed = a.list_consumer_groups().result(15)
        kinds = {g.group_id: (str(g.type), str(g.state)) for g in listed.valid}
        assert kinds[cgroup][0].endswith("CONSUMER") and kinds[cgroup][1].endswith("STABLE")
        assert kinds[classic_group][0].endswith("CLASSIC")
        only = a.list_consumer_groups(types={ck.ConsumerGroupType.CONSUMER}).result(15)
        assert {g.group_id for g in only.valid} == {cgroup}
        only = a.list_consumer_groups(types={ck.ConsumerGroupType.CLASSIC}).result(15)
        assert cgroup not in {g.group_id for g in only.valid} and classic_group in {g.group_id for g in only.valid}
        d = a.describe_consumer_groups([cgroup, classic_group])
        cd, kd = d[cgroup].result(15), d[classic_group].result(15)
        assert str(cd.type).endswith("CONSUMER") and len(cd.members) == 1
        assert {(tp.topic, tp.partition) for tp in cd.members[0].assignment.topic_partitions} == {
            ("cg-a", 0),
            ("cg-a", 1),
        }
        # the classic group through the DescribeGroups fallback (ConsumerGroupDescribe said GROUP_ID_NOT_FOUND)
        assert str(kd.type).endswith("CLASSIC") and str(kd.state).endswith("STABLE") and len(kd.members) == 1
    finally:
        classic.close()
    members[0].close()
    a = admin_mod.AdminClient({"bootstrap.servers": fast_broker.bootstrap})
    wait_until(
        lambda: str(a.describe_consumer_groups([cgroup])[cgroup].result(15).state).endswith("EMPTY"),
        30,
        "an Empty consumer group",
    )


def test_classic_member_in_a_consumer_group(fast_broker: BrokerProcess, members: list[Member]) -> None:
    """A classic-protocol consumer (JoinGroup/SyncGroup) joins a group that a consumer-protocol
    member created: it becomes a classic member of the consumer group, partitions are shared by
    the server assignor and never owned twice (docs/consumer-groups.md, "Classic members")."""
    create_topic(fast_broker, "cg-m", 6)
    produce(fast_broker, "cg-m", 60)
    own = Ownership()
    group = f"g-{uuid.uuid4().hex[:8]}"
    new = Member(fast_broker, group, ["cg-m"], "new", own)
    members.append(new)
    wait_until(lambda: len(new.owned()) == 6, 60, "the consumer-protocol member's 6 partitions")
    old = Member(
        fast_broker,
        group,
        ["cg-m"],
        "old",
        own,
        **{"group.protocol": "classic", "session.timeout.ms": 6000, "heartbeat.interval.ms": 300},
    )
    members.append(old)
    wait_until(lambda: len(new.owned()) == 3 and len(old.owned()) == 3, 60, "3 partitions each")
    wait_until(lambda: sum(len(m.messages) for m in members) == 60, 60, "all 60 messages")
    consumed = [(t, p, o) for m in members for t, p, o in m.messages]
    assert len(consumed) == len(set(consumed)) == 60
    d = _describe(fast_broker, group)
    assert str(d.type).endswith("CONSUMER") and len(d.members) == 2
    added = [e["protocol"] for e in fast_broker.events("consumer_group.member_added") if e["group"] == group]
    assert sorted(added) == ["classic", "consumer"]
    new.close()
    wait_until(lambda: len(old.owned()) == 6, 60, "the classic member takes over all 6")
    assert own.violations == []
    old.close()
    assert all(not m.errors for m in members), [m.errors for m in members]


# a classic-protocol confluent consumer with the range assignor (no assignor user data)
CLASSIC_RANGE = {
    "group.protocol": "classic",
    "partition.assignment.strategy": "range",
    "session.timeout.ms": 6000,
    "heartbeat.interval.ms": 300,
}


def test_rolling_upgrade_of_a_classic_group(fast_broker: BrokerProcess, members: list[Member]) -> None:
    """Two classic confluent consumers (range, no user data); one is restarted with
    ``group.protocol=consumer``: the live classic group becomes a consumer group at once
    (Kafka's online upgrade: the classic member stays, through the classic protocol), everyone
    keeps consuming, no partition is owned twice, and the group stays a consumer group when the
    last classic member leaves (docs/consumer-groups.md, "Classic groups")."""
    create_topic(fast_broker, "cg-up", 6)
    produce(fast_broker, "cg-up", 60)
    own = Ownership()
    group = f"g-{uuid.uuid4().hex[:8]}"
    a = Member(fast_broker, group, ["cg-up"], "a", own, **CLASSIC_RANGE)
    b = Member(fast_broker, group, ["cg-up"], "b", own, **CLASSIC_RANGE)
    members += [a, b]
    wait_until(lambda: len(a.owned()) == 3 and len(b.owned()) == 3, 60, "a classic 3 + 3")
    assert str(_describe(fast_broker, group).type).endswith("CLASSIC")
    wait_until(lambda: sum(len(m.messages) for m in members) == 60, 60, "the first 60 messages")
    b.close()  # b restarts with the consumer protocol, before its session times out
    b2 = Member(fast_broker, group, ["cg-up"], "b2", own)
    members.append(b2)
    wait_until(lambda: str(_describe(fast_broker, group).type).endswith("CONSUMER"), 60, "a consumer group")
    upgraded = [e for e in fast_broker.events("consumer_group.upgraded") if e["group"] == group]
    assert len(upgraded) == 1
    wait_until(lambda: len(a.owned()) + len(b2.owned()) == 6 and b2.owned(), 60, "all 6 owned, b2 among the owners")
    produce(fast_broker, "cg-up", 60)
    wait_until(lambda: sum(len(m.messages) for m in members) == 120, 60, "the next 60 messages")
    consumed = [(t, p, o) for m in members for t, p, o in m.messages]
    assert len(consumed) == len(set(consumed)) == 120  # nothing read twice across the upgrade
    a.close()  # the last classic member leaves: the group stays a consumer group
    wait_until(lambda: len(b2.owned()) == 6, 60, "b2 takes over all 6")
    d = _describe(fast_broker, group)
    assert str(d.type).endswith("CONSUMER") and len(d.members) == 1
    assert own.violations == []
    b2.close()
    assert all(not m.errors for m in members), [m.errors for m in members]


def test_online_downgrade_when_the_last_consumer_protocol_member_leaves(
    fast_broker: BrokerProcess, members: list[Member]
) -> None:
    """The reverse of the rolling upgrade: a classic group upgraded by a consumer-protocol
    member becomes a classic group again when that member leaves and only classic members
    remain (Kafka's online downgrade, policy ``bidirectional``); it rebalances, the classic
    member gets every partition, nothing is consumed twice and no partition is owned twice."""
    create_topic(fast_broker, "cg-down", 6)
    produce(fast_broker, "cg-down", 60)
    own = Ownership()
    group = f"g-{uuid.uuid4().hex[:8]}"
    a = Member(fast_broker, group, ["cg-down"], "a", own, **CLASSIC_RANGE)
    members.append(a)
    wait_until(lambda: len(a.owned()) == 6, 60, "the classic member's 6 partitions")
    n = Member(fast_broker, group, ["cg-down"], "n", own)
    members.append(n)
    wait_until(lambda: len(n.owned()) == 3 and len(a.owned()) == 3, 60, "3 + 3 after the upgrade")
    assert str(_describe(fast_broker, group).type).endswith("CONSUMER")
    wait_until(lambda: sum(len(m.messages) for m in members) == 60, 60, "the first 60 messages")
    n.close()  # the last consumer-protocol member leaves
    wait_until(lambda: str(_describe(fast_broker, group).type).endswith("CLASSIC"), 60, "a classic group again")
    assert [e["group"] for e in fast_broker.events("consumer_group.downgraded")].count(group) == 1
    wait_until(lambda: len(a.owned()) == 6, 60, "the classic member takes every partition")
    produce(fast_broker, "cg-down", 60)
    wait_until(lambda: sum(len(m.messages) for m in members) == 120, 60, "the next 60 messages")
    consumed = [(t, p, o) for m in members for t, p, o in m.messages]
    assert len(consumed) == len(set(consumed)) == 120
    assert own.violations == []
    a.close()
    assert all(not m.errors for m in members), [m.errors for m in members]
