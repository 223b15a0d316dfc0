"""End to end: real clients write an offsets log through rallypoint, the Spark pipeline reads it.

kafka-python and confluent-kafka consumers (each in its own thread, committing from its poll
loop) make a log with commits, rebalances (a member joining, one leaving, the group emptying), a
static member rejoining under a new member id, a deleted group and a simple (assign-only) group.
The broker is stopped, the pipeline runs over its data dir, and ``offsets_latest`` must equal what
the restarted broker answers to OffsetFetch (confluent-kafka's AdminClient).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline import job
from protocol.apis import served
from tests.support import ROOT, BrokerProcess
from tests.test_pipeline_spark import spark  # noqa: F401  (the shared session fixture)

pytestmark = [pytest.mark.spark, pytest.mark.clients]

# Needs the group coordinator (branch ``groups``) and the offsets log (branch ``offsets``) in the
# same tree; until both are merged this test cannot run (it runs everywhere once they are).
_GROUPS_SERVED = served(11) is not None and served(9) is not None
_LOG_WIRED = "OffsetsLog" in (ROOT / "coordinator" / "assemble.py").read_text()
needs_groups_and_log = pytest.mark.skipif(
    not (_GROUPS_SERVED and _LOG_WIRED), reason="group coordinator and offsets log are not both merged yet"
)

TOPIC = "orders"
PARTS = 4
ALL = frozenset((TOPIC, p) for p in range(PARTS))


def wait_until(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


class Member(threading.Thread):
    """A real consumer in a thread; commits and closes are done by its own poll loop."""

    def __init__(self, client: str, bootstrap: str, group: str, instance: str | None = None) -> None:
        super().__init__(daemon=True)
        self.client, self.bootstrap, self.group, self.instance = client, bootstrap, group, instance
        self.assignment: frozenset[tuple[str, int]] = frozenset()
        self.commands: queue.Queue[tuple[str, Any, threading.Event, list[Any]]] = queue.Queue()
        self.error: BaseException | None = None
        self.start()

    def _consumer(self) -> Any:
        if self.client == "kafka-python":
            from kafka import KafkaConsumer

            kw: dict[str, Any] = dict(
                bootstrap_servers=self.bootstrap,
                group_id=self.group,
                client_id=f"e2e-{self.group}",
                enable_auto_commit=False,
                session_timeout_ms=6000,
                heartbeat_interval_ms=500,
                metadata_max_age_ms=1000,  # see the topic soon if it was unknown at the first join
                auto_offset_reset="earliest",
            )
            if self.instance:
                kw["group_instance_id"] = self.instance
            c = KafkaConsumer(**kw)
            c.subscribe([TOPIC])
            return c
        from confluent_kafka import Consumer

        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            "group.id": self.group,
            "client.id": f"e2e-{self.group}",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
            "topic.metadata.refresh.interval.ms": 1000,
            "auto.offset.reset": "earliest",
        }
        if self.instance:
            conf["group.instance.id"] = self.instance
        c = Consumer(conf)
        c.subscribe([TOPIC])
        return c

    def _poll(self, c: Any) -> None:
        if self.client == "kafka-python":
            c.poll(timeout_ms=100)
            self.assignment = frozenset((tp.topic, tp.partition) for tp in c.assignment())
        else:
            c.poll(0.1)
            self.assignment = frozenset((tp.topic, tp.partition) for tp in c.assignment())

    def _commit(self, c: Any, base: int) -> None:
        parts = sorted(self.assignment)
        if self.client == "kafka-python":
            from kafka import OffsetAndMetadata, TopicPartition

            c.commit({TopicPartition(t, p): OffsetAndMetadata(base + p, "e2e", -1) for t, p in parts})
        else:
            from confluent_kafka import TopicPartition as CTP

            c.commit(offsets=[CTP(t, p, base + p, metadata="e2e") for t, p in parts], asynchronous=False)

    def run(self) -> None:
        c = None
        try:
            c = self._consumer()
            while True:
                try:
                    cmd, arg, done, result = self.commands.get_nowait()
                except queue.Empty:
                    self._poll(c)
                    continue
                if cmd == "close":
                    c.close()
                    c = None
                    done.set()
                    return
                try:
                    self._commit(c, arg)
                    result.append(sorted(self.assignment))
                except Exception as e:  # a rebalance in between: report, the test retries
                    result.append(e)
                done.set()
        except BaseException as e:
            self.error = e
        finally:
            if c is not None:
                c.close()

    def _call(self, cmd: str, arg: Any = None, timeout: float = 30) -> Any:
        done, result = threading.Event(), []
        self.commands.put((cmd, arg, done, result))
        assert done.wait(timeout), f"{cmd} did not finish (thread error: {self.error!r})"
        return result[0] if result else None

    def commit(self, base: int, timeout: float = 30) -> list[tuple[str, int]]:
        """Commit offset ``base + partition`` for every assigned partition (retrying over rebalances)."""
        deadline = time.monotonic() + timeout
        while True:
            r = self._call("commit", base)
            if not isinstance(r, Exception) and r:
                return list(r)
            if time.monotonic() > deadline:
                raise AssertionError(f"commit kept failing: {r!r}")
            time.sleep(0.2)

    def close(self) -> None:
        if self.is_alive():
            self._call("close")
        self.join(10)


@pytest.fixture
def members() -> Iterator[list[Member]]:
    started: list[Member] = []
    yield started
    for m in started:
        if m.is_alive():
            try:
                m.close()
            except AssertionError:
                pass


def exactly_covering(ms: list[Member]) -> bool:
    sets = [m.assignment for m in ms]
    owned = [tp for s in sets for tp in s]
    return all(sets) and len(owned) == len(set(owned)) and set(owned) == ALL


def fetch_all(bootstrap: str, groups: list[str]) -> dict[tuple[str, str, int], int]:
    """OffsetFetch (all partitions) for each group, through confluent-kafka's AdminClient."""
    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    out: dict[tuple[str, str, int], int] = {}
    for g in groups:
        res = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(g)], request_timeout=15)[g].result()
        for tp in res.topic_partitions:
            if tp.offset >= 0:
                out[(g, tp.topic, tp.partition)] = tp.offset
    return out


GROUPS = ["g-dyn", "g-static", "g-deleted", "g-simple"]


def workload(b: BrokerProcess, members: list[Member]) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic
    from kafka import KafkaConsumer, OffsetAndMetadata, TopicPartition

    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(TOPIC, PARTS, 1)])[TOPIC].result(15)

    def member(client: str, group: str, instance: str | None = None) -> Member:
        m = Member(client, b.bootstrap, group, instance)
        members.append(m)
        return m

    # g-dyn: a member, a second joins, the second leaves, the first leaves (the group is Empty)
    m1 = member("kafka-python", "g-dyn")
    wait_until(lambda: m1.assignment == ALL, 30, "m1 owns every partition")
    m1.commit(100)
    m2 = member("confluent", "g-dyn")
    wait_until(lambda: exactly_covering([m1, m2]), 30, "m1 and m2 share the partitions")
    m1.commit(200)
    m2.commit(200)
    m2.close()
    wait_until(lambda: m1.assignment == ALL, 30, "m1 owns every partition again")
    m1.commit(300)
    m1.close()

    # g-static: a static member leaves without LeaveGroup; its successor (same group.instance.id,
    # new member id, same client so the selected protocol stays) takes its place in the same
    # generation (GroupCoordinator.updateStaticMemberAndRebalance: storeGroup, no rebalance)
    s1 = member("kafka-python", "g-static", instance="static-a")
    wait_until(lambda: s1.assignment == ALL, 30, "the static member owns every partition")
    s1.commit(10)
    s1.close()
    s2 = member("kafka-python", "g-static", instance="static-a")
    wait_until(lambda: s2.assignment == ALL, 30, "the static successor owns every partition")
    s2.commit(20)
    s2.close()

    # g-deleted: commits, the member leaves, DeleteGroups
    d = member("kafka-python", "g-deleted")
    wait_until(lambda: d.assignment == ALL, 30, "the member owns every partition")
    d.commit(7)
    d.close()
    wait_until(
        lambda: admin.delete_consumer_groups(["g-deleted"], request_timeout=10)["g-deleted"].exception(15) is None,
        30,
        "DeleteGroups succeeds once the group is Empty",
    )

    # g-simple: assign() and commit, no group membership (a "simple" group)
    simple = KafkaConsumer(bootstrap_servers=b.bootstrap, group_id="g-simple", enable_auto_commit=False)
    simple.assign([TopicPartition(TOPIC, 0), TopicPartition(TOPIC, 1)])
    simple.commit({TopicPartition(TOPIC, p): OffsetAndMetadata(42 + p, "simple", -1) for p in (0, 1)})
    simple.close(autocommit=False)


@needs_groups_and_log
def test_pipeline_over_logs_written_by_real_clients(
    broker_factory: Callable[..., BrokerProcess],
    members: list[Member],
    spark: Any,  # noqa: F811  (the fixture imported above)
    tmp_path: Path,
) -> None:
    """Two brokers, the same client workload: ``full`` keeps one segment per partition (the whole
    history); ``compacted`` rolls 1 KiB segments, which its cleaner compacts as it goes."""
    full = broker_factory(config={"offsets.topic.num.partitions": "3"})
    compacted = broker_factory(config={"offsets.topic.num.partitions": "3", "offsets.topic.segment.bytes": "1024"})
    before = {}
    for name, b in (("full", full), ("compacted", compacted)):
        workload(b, members)
        before[name] = fetch_all(b.bootstrap, GROUPS)
        assert b.stop() == 0

    out = tmp_path / "out"
    counters = job.run(spark, job.parse_inputs([f"full={full.data_dir}", f"compacted={compacted.data_dir}"]), out)

    def table(name: str) -> list[dict[str, Any]]:
        return [r.asDict(recursive=True) for r in spark.read.parquet(str(out / name)).collect()]

    latest = table("offsets_latest")
    for name, b in (("full", full), ("compacted", compacted)):
        b.start()  # the same data dir: the broker loads its log again
        after = fetch_all(b.bootstrap, GROUPS)
        assert after == before[name]
        assert {k[0] for k in after} == {"g-dyn", "g-static", "g-simple"}
        ours = {(r["group"], r["topic"], r["partition"]): r["offset"] for r in latest if r["broker"] == name}
        assert ours == after, name
        assert ours[("g-dyn", TOPIC, 3)] == 303 and ours[("g-simple", TOPIC, 1)] == 43

    segs = table("segments")
    assert all(s["status"] == "ok" for s in segs)
    assert len([s for s in segs if s["broker"] == "compacted"]) > len([s for s in segs if s["broker"] == "full"])
    assert counters["damaged_segments"] == 0 and counters["bad_records"] == 0

    # the full history (one segment per partition is never cleaned)
    commits = [c for c in table("commits") if c["broker"] == "full"]
    # confluent-kafka (librdkafka) sends the metadata string with its C terminator: "e2e\x00"
    assert {c["metadata"].rstrip("\x00") for c in commits} == {"e2e", "simple"}
    assert "e2e\x00" in {c["metadata"] for c in commits}
    assert sorted({c["offset"] - c["partition"] for c in commits if c["group"] == "g-dyn"}) == [100, 200, 300]

    gens = sorted(
        (g for g in table("generations") if g["broker"] == "full"), key=lambda g: (g["group"], g["log_offset"])
    )
    dyn = [g for g in gens if g["group"] == "g-dyn"]
    seq = [(g["generation"], g["member_count"], g["reason"]) for g in dyn]
    # Kafka's new coordinator (and rallypoint) store an Empty generation-0 record when JoinGroup
    # creates the group (spec §B.2); the Scala one starts at the first completed rebalance.
    if dyn[0]["member_count"] == 0:
        assert seq[0] == (0, 0, "first"), seq
        assert [r for _g, _m, r in seq[1:]] == ["join", "join", "leave", "empty"], seq
    else:
        assert [r for _g, _m, r in seq] == ["first", "join", "leave", "empty"], seq
    assert [m for _g, m, _r in seq][-4:] == [1, 2, 1, 0], seq
    assert [g for g, _m, _r in seq] == sorted({g for g, _m, _r in seq}), seq
    assert dyn[-1]["state"] == "Empty"
    assert {m["client_id"] for g in dyn for m in g["members"]} == {"e2e-g-dyn"}
    for g in dyn:  # the consumer-protocol assignments decode and cover the topic
        if g["member_count"]:
            owned = [(a["topic"], p) for m in g["members"] for a in m["assigned"] for p in a["partitions"]]
            assert sorted(owned) == sorted(ALL), g
            assert all(m["subscribed_topics"] == [TOPIC] for m in g["members"])

    static = [g for g in gens if g["group"] == "g-static"]
    assert any(g["reason"] == "static_replacement" for g in static), [(g["generation"], g["reason"]) for g in static]
    assert all(m["group_instance_id"] == "static-a" for g in static for m in g["members"])

    summary = {(s["broker"], s["group"]): s for s in table("group_summary")}
    for name in ("full", "compacted"):
        gone = summary[(name, "g-deleted")]
        assert (gone["state"], gone["deleted"], gone["committed_partitions"]) == ("Dead", True, 0)
        assert (summary[(name, "g-simple")]["state"], summary[(name, "g-simple")]["generations"]) == ("Empty", 0)
        assert summary[(name, "g-simple")]["committed_partitions"] == 2
        assert summary[(name, "g-dyn")]["state"] == "Empty"
        assert summary[(name, "g-static")]["static_members_seen"] == 1
    f = summary[("full", "g-deleted")]
    assert f["group_tombstones"] == 1 and f["offset_tombstones"] == PARTS
    assert summary[("full", "g-static")]["reason_static_replacement"] >= 1
    assert summary[("full", "g-dyn")]["rebalances"] >= 3 and summary[("full", "g-dyn")]["dynamic_members_seen"] == 2

    inv = table("invariants")
    assert all(i["passed"] for i in inv), [i for i in inv if not i["passed"]]
    assert {i["group"] for i in inv if i["broker"] == "full"} >= {"g-dyn", "g-static", "g-deleted"}
    assert (out / "report.html").stat().st_size > 10_000
