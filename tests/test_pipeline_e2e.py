"""End to end: real clients write an offsets log through rallypoint, the Spark pipeline reads it.

kafka-python and confluent-kafka consumers (each in its own process: this module run with ``-m``,
committing from its poll loop when told) make a log with commits, rebalances (a member joining,
one leaving, the group emptying), a static member rejoining under a new member id, a deleted
group and a simple (assign-only) group.
The broker is stopped, the pipeline runs over its data dir, and ``offsets_latest`` must equal what
the restarted broker answers to OffsetFetch (confluent-kafka's AdminClient).
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rallypoint.pipeline import job

from tests.support import BrokerProcess, wait_until
from tests.support.members import EventProcess
from tests.test_pipeline_spark import spark  # noqa: F401  (the shared session fixture)

pytestmark = [pytest.mark.spark, pytest.mark.clients]

TOPIC = "orders"
PARTS = 4
ALL = frozenset((TOPIC, p) for p in range(PARTS))


class Member(EventProcess):
    """A real consumer in its own process (this file run as a script, see ``member_main``):
    it reports its assignment and obeys ``commit BASE`` / ``close`` lines on stdin."""

    def __init__(self, client: str, bootstrap: str, group: str, instance: str | None = None) -> None:
        self.client, self.group = client, group
        super().__init__([sys.executable, "-m", "tests.test_pipeline_e2e", client, bootstrap, group, instance or ""])

    def _send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def commit(self, base: int, timeout: float = 30) -> list[tuple[str, int]]:
        """Commit offset ``base + partition`` for every assigned partition (retrying over rebalances)."""
        deadline = time.monotonic() + timeout
        while True:
            seen = len(self.events)
            self._send(f"commit {base}")
            e = wait_until(
                lambda seen=seen: next(  # type: ignore[misc]
                    (e for e in self.events[seen:] if e["event"] in ("committed", "commit_failed")), None
                ),
                timeout,
                f"{self.client} {self.group} to answer a commit",
                explain=self.log,
            )
            if e["event"] == "committed" and e["partitions"]:
                return [(t, p) for t, p in e["partitions"]]
            if time.monotonic() > deadline:
                raise AssertionError(f"commit kept failing: {e}\n{self.log()}")
            time.sleep(0.2)

    def close(self, timeout: float = 20) -> None:
        if self.proc.poll() is None:
            try:
                self._send("close")
                self.proc.wait(timeout)
            except (subprocess.TimeoutExpired, BrokenPipeError, OSError):
                self.kill()

    def log(self, tail: int = int(os.environ.get("E2E_LOG_TAIL", "3000"))) -> str:
        return super().log(tail)


def member_main(client: str, bootstrap: str, group: str, instance: str) -> None:
    """The member process: poll, report the assignment, commit or close when told on stdin."""
    import logging

    logging.basicConfig(level=os.environ.get("E2E_LOG_LEVEL", "WARNING"), stream=sys.stderr)
    commands: queue.Queue[str] = queue.Queue()

    def read_stdin() -> None:
        for line in sys.stdin:
            commands.put(line.strip())
        commands.put("close")

    threading.Thread(target=read_stdin, daemon=True).start()

    def emit(event: str, **fields: Any) -> None:
        print(json.dumps({"event": event, **fields}), flush=True)

    if client == "kafka-python":
        from kafka import KafkaConsumer, OffsetAndMetadata, TopicPartition

        kw: dict[str, Any] = dict(
            bootstrap_servers=bootstrap,
            group_id=group,
            client_id=f"e2e-{group}",
            enable_auto_commit=False,
            session_timeout_ms=6000,
            heartbeat_interval_ms=500,
            metadata_max_age_ms=1000,  # see the topic soon if it was unknown at the first join
            auto_offset_reset="earliest",
        )
        if instance:
            kw["group_instance_id"] = instance
        c: Any = KafkaConsumer(**kw)

        def poll() -> None:
            c.poll(timeout_ms=100)

        def commit(parts: list[tuple[str, int]], base: int) -> None:
            c.commit({TopicPartition(t, p): OffsetAndMetadata(base + p, "e2e", -1) for t, p in parts})
    else:
        from confluent_kafka import Consumer
        from confluent_kafka import TopicPartition as CTP

        conf: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "client.id": f"e2e-{group}",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
            "topic.metadata.refresh.interval.ms": 1000,
            "auto.offset.reset": "earliest",
        }
        if instance:
            conf["group.instance.id"] = instance
        c = Consumer(conf)

        def poll() -> None:
            c.poll(0.1)

        def commit(parts: list[tuple[str, int]], base: int) -> None:
            c.commit(offsets=[CTP(t, p, base + p, metadata="e2e") for t, p in parts], asynchronous=False)

    # Know the topic before joining: a kafka-python leader that assigns before its metadata has the
    # topic rejoins at once, and that second rebalance now and then leaves it without heartbeats
    # until its session expires (kafka-python 3.0.12; seen in about 1 run in 5).
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        known = c.partitions_for_topic(TOPIC) if client == "kafka-python" else c.list_topics(TOPIC, 5).topics
        if known:
            break
        time.sleep(0.1)
    c.subscribe([TOPIC])
    last: list[list[Any]] | None = None
    while True:
        poll()
        now = sorted([tp.topic, tp.partition] for tp in c.assignment())
        if now != last:
            emit("assignment", partitions=now)
            last = now
        try:
            cmd = commands.get_nowait()
        except queue.Empty:
            continue
        if cmd == "close":
            c.close()
            emit("closed")
            return
        parts = [(t, p) for t, p in now]
        try:
            commit(parts, int(cmd.split()[1]))
            emit("committed", partitions=now)
        except Exception as e:  # a rebalance in between: the test retries
            emit("commit_failed", error=repr(e))


@pytest.fixture
def members() -> Iterator[list[Member]]:
    started: list[Member] = []
    yield started
    for m in started:
        m.kill()


def exactly_covering(ms: list[Member]) -> bool:
    sets = [m.assignment or frozenset() for m in ms]
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

    def why(group: str) -> Callable[[], str]:
        def explain() -> str:
            logs = [f"{m.client} {m.group}: {m.log()}" for m in members if m.group == group]
            return "\n".join([*logs, *(line for line in b.log_lines[-400:] if group in line)])

        return explain

    # g-dyn: a member, a second joins, the second leaves, the first leaves (the group is Empty)
    m1 = member("kafka-python", "g-dyn")
    wait_until(lambda: m1.assignment == ALL, 30, "m1 owns every partition", explain=why("g-dyn"))
    m1.commit(100)
    m2 = member("confluent", "g-dyn")
    wait_until(lambda: exactly_covering([m1, m2]), 30, "m1 and m2 share the partitions", explain=why("g-dyn"))
    m1.commit(200)
    m2.commit(200)
    m2.close()
    wait_until(lambda: m1.assignment == ALL, 30, "m1 owns every partition again", explain=why("g-dyn"))
    m1.commit(300)
    m1.close()

    # g-static: a static member leaves without LeaveGroup; its successor (same group.instance.id,
    # new member id, same client so the selected protocol stays) takes its place in the same
    # generation (GroupCoordinator.updateStaticMemberAndRebalance: storeGroup, no rebalance)
    s1 = member("kafka-python", "g-static", instance="static-a")
    wait_until(lambda: s1.assignment == ALL, 30, "the static member owns every partition", explain=why("g-static"))
    s1.commit(10)
    s1.close()
    s2 = member("kafka-python", "g-static", instance="static-a")
    wait_until(lambda: s2.assignment == ALL, 30, "the static successor owns every partition", explain=why("g-static"))
    s2.commit(20)
    s2.close()

    # g-deleted: commits, the member leaves, DeleteGroups
    d = member("kafka-python", "g-deleted")
    wait_until(lambda: d.assignment == ALL, 30, "the member owns every partition", explain=why("g-deleted"))
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
    every = [(g["generation"], g["member_count"], g["reason"]) for g in dyn]
    assert [g for g, _m, _r in every] == sorted({g for g, _m, _r in every}), every
    # A leader that sends JoinGroup to a Stable group starts a rebalance (Kafka's coordinator does
    # so for the leader; kafka-python's leader rejoins, for one, when a heartbeat answer from the
    # rebalance just finished arrives late).  That makes a generation with exactly the members of
    # the one before, which the pipeline must call "same_members"; it can follow any rebalance.
    # Those rows are checked member by member and set aside; the rest of the history is exact.
    seq = []
    previous: list[str] | None = None
    for g in dyn:
        ids = sorted(m["member_id"] for m in g["members"])
        if g["reason"] == "same_members":
            assert previous is not None and ids == previous and ids, every
        else:
            assert ids != previous, every
            seq.append((g["generation"], g["member_count"], g["reason"]))
        previous = ids
    # Kafka's new coordinator (and rallypoint) store an Empty generation-0 record when JoinGroup
    # creates the group (GroupMetadataManager, Java); the Scala one starts at the first completed rebalance.
    if dyn[0]["member_count"] == 0:
        assert seq[0] == (0, 0, "first"), every
        assert [r for _g, _m, r in seq[1:]] == ["join", "join", "leave", "empty"], every
    else:
        assert [r for _g, _m, r in seq] == ["first", "join", "leave", "empty"], every
    assert [m for _g, m, _r in seq][-4:] == [1, 2, 1, 0], every
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


if __name__ == "__main__":
    member_main(*sys.argv[1:5])
