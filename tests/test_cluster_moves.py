"""Moving things in a running cluster of several brokers (docs/cluster.md, "Moving things"),
with real clients: a Stable group's coordinator moved while its members consume and commit;
the node leading a partition stopped while a producer and a consumer carry on; and the same
moves as raw frames.  Every wait is bounded; every client is closed by its test."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rallypoint.protocol import codec
from rallypoint.protocol.errors import ErrorCode as E
from rallypoint.protocol.offsets_schema import partition_for

from tests.control_support import Control, control_url
from tests.support import BrokerProcess, WireClient
from tests.support.topics import create_topic

ck = pytest.importorskip("confluent_kafka")

pytestmark = pytest.mark.clients

CONFIG = {
    "rallypoint.brokers": "3",
    "num.partitions": "3",
    "group.initial.rebalance.delay.ms": "0",
}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[BrokerProcess]:
    with BrokerProcess(tmp_path / "data", dict(CONFIG), extra_args=["--control-port", "0"]).start() as b:
        yield b


def coordinator_of(group: str) -> int:
    return partition_for(group, 50) % 3 + 1


def d(msg: Any) -> dict[str, Any]:
    return codec.to_dict(msg)


class Committer(threading.Thread):
    """A consumer that polls and commits synchronously after every batch, records every
    offset it committed and every assignment change."""

    def __init__(self, kind: str, bootstrap: str, group: str, topic: str) -> None:
        super().__init__(daemon=True)
        self.kind, self.bootstrap, self.group, self.topic = kind, bootstrap, group, topic
        self.stop = threading.Event()
        self.assignments: list[tuple[float, frozenset[int]]] = []
        self.commits: list[dict[int, int]] = []
        self.errors: list[str] = []

    def run(self) -> None:
        try:
            if self.kind == "confluent":
                self._confluent()
            else:
                self._kafka_python()
        except Exception as e:  # reported by the test
            self.errors.append(repr(e))

    def _confluent(self) -> None:
        c = ck.Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": self.group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "session.timeout.ms": 10000,
                "heartbeat.interval.ms": 500,
            }
        )

        def on_assign(_c: Any, parts: list[Any]) -> None:
            self.assignments.append((time.monotonic(), frozenset(p.partition for p in parts)))

        c.subscribe([self.topic], on_assign=on_assign)
        try:
            while not self.stop.is_set():
                msgs = c.consume(100, 0.2)
                last: dict[int, int] = {}
                for m in msgs:
                    if m.error() is None:
                        last[m.partition()] = m.offset() + 1
                if last:
                    c.commit(offsets=[ck.TopicPartition(self.topic, p, o) for p, o in last.items()], asynchronous=False)
                    self.commits.append(last)
        finally:
            c.close()

    def _kafka_python(self) -> None:
        from kafka import ConsumerRebalanceListener, KafkaConsumer, OffsetAndMetadata, TopicPartition

        outer = self

        class Listener(ConsumerRebalanceListener):  # type: ignore[misc]
            def on_partitions_revoked(self, revoked: Any) -> None:
                pass

            def on_partitions_assigned(self, assigned: Any) -> None:
                outer.assignments.append((time.monotonic(), frozenset(tp.partition for tp in assigned)))

        c = KafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=self.group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=10000,
            heartbeat_interval_ms=500,
        )
        c.partitions_for_topic(self.topic)  # metadata before joining: see tests/test_cluster_clients.py
        c.subscribe([self.topic], listener=Listener())
        try:
            while not self.stop.is_set():
                got = c.poll(timeout_ms=200)
                last = {tp.partition: recs[-1].offset + 1 for tp, recs in got.items() if recs}
                if last:
                    c.commit({TopicPartition(self.topic, p): OffsetAndMetadata(o, "", -1) for p, o in last.items()})
                    self.commits.append(last)
        finally:
            c.close()


def test_moving_a_stable_groups_coordinator_keeps_it_stable_and_offsets_forward(cluster: BrokerProcess) -> None:
    """Done when 2 and 4: two confluent-kafka members and one kafka-python member consume and
    commit; the coordinator moves; all find the new one, no committed offset goes back, the
    group is Stable at the same generation with the same assignment, and the request log shows
    NOT_COORDINATOR from the old node and FindCoordinator after it."""
    control = Control(control_url(cluster))
    topic = f"mv-{uuid.uuid4().hex[:8]}"
    create_topic(cluster, topic, 6)
    group = f"mg-{uuid.uuid4().hex[:8]}"
    old = coordinator_of(group)
    new = old % 3 + 1
    producer = ck.Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 2})
    members = [Committer(k, cluster.bootstrap, group, topic) for k in ("confluent", "confluent", "kafka-python")]
    stop_producing = threading.Event()

    def produce() -> None:
        i = 0
        while not stop_producing.is_set():
            producer.produce(topic, value=b"m%d" % i, partition=i % 6)
            i += 1
            if i % 50 == 0:
                producer.flush(5)
                time.sleep(0.02)
        producer.flush(10)

    feeder = threading.Thread(target=produce, daemon=True)
    feeder.start()
    for m in members:
        m.start()
    try:
        view = control.post(f"/v1/groups/{group}/wait", {"state": "Stable", "timeout_ms": 30000})
        deadline = time.monotonic() + 30
        while (len(view["members"]) < 3 or view["state"] != "Stable") and time.monotonic() < deadline:
            time.sleep(0.2)
            view = control.get(f"/v1/groups/{group}")
        assert view["state"] == "Stable" and len(view["members"]) == 3, view
        generation = view["generation"]
        time.sleep(1.5)  # everyone consumes and commits
        assigned = [m.assignments[-1][1] for m in members]
        rebalances = [len(m.assignments) for m in members]
        control.call("DELETE", "/v1/requests")
        moved = control.post(f"/v1/groups/{group}/coordinator", {"node": new})
        assert [(x["from"], x["to"]) for x in moved["coordinators_moved"]] == [(old, new)]
        commits_at_move = [len(m.commits) for m in members]
        deadline = time.monotonic() + 20  # every member commits again, through the new node
        while any(len(m.commits) <= n + 2 for m, n in zip(members, commits_at_move, strict=True)):
            assert time.monotonic() < deadline, [len(m.commits) for m in members]
            time.sleep(0.1)
        view = control.get(f"/v1/groups/{group}")
        assert view["state"] == "Stable" and view["generation"] == generation
        assert [m.assignments[-1][1] for m in members] == assigned  # nobody rebalanced
        assert [len(m.assignments) for m in members] == rebalances
        log = control.requests(node=str(old))
        assert any("NOT_COORDINATOR" in e["errors"] for e in log), log[-10:]
        after = control.requests(api="FindCoordinator")
        assert after, "no client asked FindCoordinator after the move"
    finally:
        stop_producing.set()
        for m in members:
            m.stop.set()
        for m in members:
            m.join(30)
        feeder.join(30)
    for m in members:
        assert not m.errors, m.errors
        # committed offsets never go back, per partition, for what each member committed
        seen: dict[int, int] = {}
        for c in m.commits:
            for p, o in c.items():
                assert o >= seen.get(p, 0), (m.kind, p, o, seen.get(p))
                seen[p] = o


def test_stopping_the_leader_of_a_partition_moves_it_and_nothing_acknowledged_is_lost(cluster: BrokerProcess) -> None:
    """Done when 3: the node leading a partition stops (its leadership moves); a producer and a
    consumer carry on through the new leader; every acknowledged message is consumed; start
    brings the node back."""
    control = Control(control_url(cluster))
    topic = f"st-{uuid.uuid4().hex[:8]}"
    create_topic(cluster, topic, 1)
    with WireClient(cluster.host, cluster.port) as c:
        md = d(c.call(3, 12, {"topics": [{"name": topic}], "allow_auto_topic_creation": False}))
    leader = md["topics"][0]["partitions"][0]["leader_id"]
    if leader == 1:  # stop a node other than the bootstrap one, the clients' only address
        control.post(f"/v1/partitions/{topic}/0/leader", {"node": 2})
        leader = 2
    acked: list[int] = []
    lock = threading.Lock()
    producer = ck.Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 1, "retries": 100})

    def delivered(err: Any, msg: Any) -> None:
        if err is None:
            with lock:
                acked.append(int(msg.value()))

    consumer = ck.Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": f"sg-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    received: set[int] = set()
    try:
        for i in range(200):
            producer.produce(topic, value=str(i).encode(), on_delivery=delivered)
            producer.poll(0)
            if i == 100:
                producer.flush(10)
                stopped = control.post(f"/v1/brokers/{leader}/stop", {})
                assert [b["state"] for b in stopped["brokers"] if b["node"] == leader] == ["stopped"]
            m = consumer.poll(0.01)
            if m is not None and m.error() is None:
                received.add(int(m.value()))
        assert producer.flush(30) == 0
        deadline = time.monotonic() + 30
        while not set(acked) <= received and time.monotonic() < deadline:
            m = consumer.poll(0.2)
            if m is not None and m.error() is None:
                received.add(int(m.value()))
        assert len(acked) == 200
        assert set(acked) <= received, sorted(set(acked) - received)[:10]
        with WireClient(cluster.host, cluster.port) as c:
            md = d(c.call(3, 12, {"topics": [{"name": topic}], "allow_auto_topic_creation": False}))
            assert leader not in {x["node_id"] for x in md["brokers"]}
            assert md["topics"][0]["partitions"][0]["leader_id"] != leader
        started = control.post(f"/v1/brokers/{leader}/start", {})
        assert all(b["state"] == "running" for b in started["brokers"])
        with WireClient(cluster.host, cluster.port) as c:
            md = d(c.call(3, 12, {"topics": [{"name": topic}], "allow_auto_topic_creation": False}))
            assert md["topics"][0]["partitions"][0]["leader_id"] == leader  # the preferred leader again
    finally:
        consumer.close()


def test_coordinator_move_as_raw_frames(cluster: BrokerProcess) -> None:
    """The old node answers NOT_COORDINATOR, FindCoordinator names the new one, which has the
    group Stable at the same generation with its member and offsets; offline stops leave the
    partition without a coordinator until the node starts."""
    control = Control(control_url(cluster))
    ports = cluster.node_ports()
    group = f"rg-{uuid.uuid4().hex[:8]}"
    old = coordinator_of(group)
    new = old % 3 + 1
    with WireClient(cluster.host, ports[old]) as c:
        create_topic(cluster, "rt", 1)
        c.call(10, 4, {"key_type": 0, "coordinator_keys": [group]})  # creates __consumer_offsets
        join = {
            "group_id": group,
            "session_timeout": 30000,
            "rebalance_timeout": 30000,
            "member_id": "",
            "group_instance_id": "static-1",
            "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b""}],
            "reason": None,
        }
        r = d(c.call(11, 9, join))
        mid, gen = r["member_id"], r["generation_id"]
        sync = {
            "group_id": group,
            "generation_id": gen,
            "member_id": mid,
            "group_instance_id": "static-1",
            "protocol_type": "consumer",
            "protocol_name": "range",
            "assignments": [{"member_id": mid, "assignment": b"\x00\x01"}],
        }
        assert d(c.call(14, 5, sync))["error_code"] == 0
        commit = {
            "group_id": group,
            "generation_id_or_member_epoch": gen,
            "member_id": mid,
            "group_instance_id": "static-1",
            "topics": [{"name": "rt", "partitions": [{"partition_index": 0, "committed_offset": 7}]}],
        }
        assert d(c.call(8, 8, commit))["topics"][0]["partitions"][0]["error_code"] == 0
        control.post(f"/v1/groups/{group}/coordinator", {"node": new})
        hb = {"group_id": group, "generation_id": gen, "member_id": mid, "group_instance_id": "static-1"}
        assert d(c.call(12, 4, hb))["error_code"] == E.NOT_COORDINATOR
        fc = d(c.call(10, 4, {"key_type": 0, "coordinator_keys": [group]}))["coordinators"][0]
        assert (fc["node_id"], fc["port"]) == (new, ports[new])
    last = [(t["from"], t["to"], t["reason"]) for t in control.get(f"/v1/groups/{group}")["transitions"][-2:]]
    assert last == [("Stable", "Dead", "coordinator moved"), ("Dead", "Stable", "loaded")]
    with WireClient(cluster.host, ports[new]) as c:
        assert d(c.call(12, 4, hb))["error_code"] == 0
        dg = d(c.call(15, 5, {"groups": [group], "include_authorized_operations": False}))["groups"][0]
        assert (dg["group_state"], [m["member_id"] for m in dg["members"]]) == ("Stable", [mid])
        of = d(c.call(9, 8, {"groups": [{"group_id": group, "topics": None}], "require_stable": False}))
        assert of["groups"][0]["topics"][0]["partitions"][0]["committed_offset"] == 7
    # offline: no coordinator at all until the node is back (node 1 keeps the bootstrap port)
    if new != 1:
        control.post(f"/v1/brokers/{new}/stop", {"offline": True})
        with WireClient(cluster.host, ports[1]) as c:
            fc = d(c.call(10, 4, {"key_type": 0, "coordinator_keys": [group]}))["coordinators"][0]
            assert fc["error_code"] == E.COORDINATOR_NOT_AVAILABLE
        control.post(f"/v1/brokers/{new}/start", {})
        with WireClient(cluster.host, ports[new]) as c:
            assert d(c.call(12, 4, hb))["error_code"] == 0
