"""Share groups (KIP-932) with confluent-kafka's ShareConsumer (librdkafka 2.16) against a real
broker process over real sockets (docs/share-groups.md).

Every wait is bounded; consumers are closed (or their processes killed) by each test.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import BrokerProcess
from tests.support.paths import ROOT
from tests.support.topics import create_topic

ck = pytest.importorskip("confluent_kafka")
admin_mod = pytest.importorskip("confluent_kafka.admin")

pytestmark = pytest.mark.clients

FAST = {
    "group.share.heartbeat.interval.ms": "500",
    "group.share.min.heartbeat.interval.ms": "100",
    "group.share.session.timeout.ms": "6000",
    "group.share.min.session.timeout.ms": "1000",
    "group.share.min.record.lock.duration.ms": "1000",
}

Rec = tuple[int, int]  # (partition, offset)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    with BrokerProcess(tmp_path / "data", dict(FAST)).start() as b:
        yield b


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def produce(b: BrokerProcess, topic: str, count: int, partitions: int) -> None:
    p = ck.Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 5})
    for i in range(count):
        p.produce(topic, value=f"m{i}".encode(), partition=i % partitions)
    assert p.flush(15) == 0


def set_group_configs(b: BrokerProcess, group: str, **configs: str) -> None:
    a = admin_mod.AdminClient({"bootstrap.servers": b.bootstrap})
    entries = [
        admin_mod.ConfigEntry(k.replace("_", "."), v, incremental_operation=admin_mod.AlterConfigOpType.SET)
        for k, v in configs.items()
    ]
    res = admin_mod.ConfigResource(admin_mod.ResourceType.GROUP, group, incremental_configs=entries)
    for f in a.incremental_alter_configs([res]).values():
        f.result(10)


def share_consumer(b: BrokerProcess, group: str, topic: str, **conf: str) -> ck.ShareConsumer:
    c = ck.ShareConsumer({"bootstrap.servers": b.bootstrap, "group.id": group, **conf})
    c.subscribe([topic])
    return c


def poll_records(c: ck.ShareConsumer, timeout: float) -> list[ck.Message]:
    return [m for m in c.poll(timeout) if m.error() is None]


def test_three_consumers_on_two_partitions_each_message_accepted_exactly_once(broker: BrokerProcess) -> None:
    """Implicit mode: everything a poll returned is accepted with the next poll; more consumers
    than partitions still share the work (Done-when 1)."""
    topic, group = _name("sq"), _name("sg")
    create_topic(broker, topic, 2)
    set_group_configs(broker, group, share_auto_offset_reset="earliest")
    total = 3 * 3000
    consumers = [share_consumer(broker, group, topic) for _ in range(3)]
    seen: Counter[Rec] = Counter()
    per_consumer = [0, 0, 0]
    try:
        for c in consumers:  # all three join before the data arrives
            c.poll(0.2)
        produce(broker, topic, total, 2)
        deadline = time.monotonic() + 90
        while len(seen) < total and time.monotonic() < deadline:
            for i, c in enumerate(consumers):
                for m in poll_records(c, 0.1):
                    seen[(m.partition(), m.offset())] += 1
                    per_consumer[i] += 1
        for c in consumers:  # implicit mode: commit_sync accepts what the last poll returned
            c.commit_sync(10)
    finally:
        for c in consumers:
            c.close()
    assert len(seen) == total, f"{len(seen)} of {total} delivered"
    assert max(seen.values()) == 1, [k for k, v in seen.items() if v > 1][:10]
    assert min(per_consumer) > 0, per_consumer  # three consumers, two partitions: all worked
    # Nothing is left to deliver: a new consumer of the group gets nothing.
    late = share_consumer(broker, group, topic)
    try:
        end = time.monotonic() + 3
        extra: list[ck.Message] = []
        while time.monotonic() < end:
            extra += poll_records(late, 0.5)
        assert extra == []
    finally:
        late.close()


def test_explicit_release_reject_and_delivery_limit(broker: BrokerProcess) -> None:
    """RELEASE redelivers with delivery count 2; REJECT never again; a record released five
    times is archived (Done-when 2)."""
    topic, group = _name("sx"), _name("sg")
    create_topic(broker, topic, 1)
    set_group_configs(broker, group, share_auto_offset_reset="earliest")
    produce(broker, topic, 3, 1)
    c = share_consumer(broker, group, topic, **{"share.acknowledgement.mode": "explicit"})
    A = ck.AcknowledgeType
    try:
        deliveries: dict[int, list[int]] = {0: [], 1: [], 2: []}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            msgs = poll_records(c, 0.5)
            for m in msgs:
                deliveries[m.offset()].append(m.delivery_count())
                if m.offset() == 0:
                    c.acknowledge(m, A.ACCEPT if m.delivery_count() == 2 else A.RELEASE)
                elif m.offset() == 1:
                    c.acknowledge(m, A.REJECT)
                else:
                    c.acknowledge(m, A.RELEASE)  # forever: archived after the fifth delivery
            if msgs:
                c.commit_sync(10)
            if len(deliveries[0]) >= 2 and len(deliveries[2]) >= 5 and not msgs:
                break
        # settle: nothing more is delivered
        for _ in range(4):
            assert poll_records(c, 0.5) == []
    finally:
        c.close()
    assert deliveries[0] == [1, 2]
    assert deliveries[1] == [1]
    assert deliveries[2] == [1, 2, 3, 4, 5]


def _start_worker(b: BrokerProcess, group: str, topic: str) -> tuple[subprocess.Popen[str], list[Rec]]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.share_worker", b.bootstrap, group, topic],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the worker gives up after 30 s and prints what it has
    held = json.loads(line)["held"]
    assert held, "the worker acquired nothing"
    assert all(dc == 1 for _, _, dc in held)
    return proc, [(p, o) for p, o, _ in held]


def test_killed_consumer_releases_its_records_to_another(broker: BrokerProcess) -> None:
    """A consumer killed while holding records: its connection and share session go, its
    records are released at once, and another consumer gets them with delivery count 2
    (Done-when 3, first half)."""
    topic, group = _name("sk"), _name("sg")
    create_topic(broker, topic, 1)
    set_group_configs(broker, group, share_auto_offset_reset="earliest", share_record_lock_duration_ms="60000")
    produce(broker, topic, 20, 1)
    proc, held = _start_worker(broker, group, topic)
    other = share_consumer(broker, group, topic)
    try:
        time.sleep(0.5)
        proc.kill()
        proc.wait(10)
        got: dict[Rec, int] = {}
        deadline = time.monotonic() + 20  # far below the 60 s lock: released by the session close
        while not set(held) <= set(got) and time.monotonic() < deadline:
            for m in poll_records(other, 0.5):
                got[(m.partition(), m.offset())] = m.delivery_count()
        assert set(held) <= set(got)
        assert {got[r] for r in held} == {2}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        other.close()


def test_lock_expiry_moves_records_of_a_silent_live_consumer(broker: BrokerProcess) -> None:
    """A live consumer that holds records and stops acknowledging loses them when the lock
    expires (not before), and they go to another consumer (Done-when 3, second half)."""
    topic, group = _name("sl"), _name("sg")
    create_topic(broker, topic, 1)
    lock_s = 4
    set_group_configs(
        broker, group, share_auto_offset_reset="earliest", share_record_lock_duration_ms=str(lock_s * 1000)
    )
    produce(broker, topic, 10, 1)
    holder = share_consumer(broker, group, topic, **{"share.acknowledgement.mode": "explicit"})
    other = None
    try:
        held: list[Rec] = []
        deadline = time.monotonic() + 20
        while not held and time.monotonic() < deadline:
            held = [(m.partition(), m.offset()) for m in poll_records(holder, 0.5)]
        acquired_at = time.monotonic()
        assert held
        other = share_consumer(broker, group, topic)
        got: dict[Rec, tuple[int, float]] = {}
        deadline = time.monotonic() + lock_s + 15
        while not set(held) <= set(got) and time.monotonic() < deadline:
            for m in poll_records(other, 0.2):
                got.setdefault((m.partition(), m.offset()), (m.delivery_count(), time.monotonic()))
        assert set(held) <= set(got)
        assert all(got[r][0] == 2 for r in held)
        first = min(got[r][1] for r in held)
        assert first - acquired_at >= lock_s - 0.5, f"released after {first - acquired_at:.2f} s, lock {lock_s} s"
    finally:
        holder.close()
        if other is not None:
            other.close()


@pytest.mark.parametrize("reset", ["earliest", "latest"])
def test_auto_offset_reset_decides_whether_old_messages_are_delivered(broker: BrokerProcess, reset: str) -> None:
    """share.auto.offset.reset set with the admin client's incremental alter configs vs the
    default latest (Done-when 4)."""
    topic, group = _name("sr"), _name("sg")
    create_topic(broker, topic, 1)
    produce(broker, topic, 5, 1)  # before the group exists
    if reset == "earliest":
        set_group_configs(broker, group, share_auto_offset_reset="earliest")
    c = share_consumer(broker, group, topic)
    try:
        offsets: list[int] = []
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            offsets += [m.offset() for m in poll_records(c, 0.5)]
        produce(broker, topic, 3, 1)  # after: always delivered
        deadline = time.monotonic() + 20
        while 7 not in offsets and time.monotonic() < deadline:
            offsets += [m.offset() for m in poll_records(c, 0.5)]
    finally:
        c.close()
    expected = list(range(8)) if reset == "earliest" else [5, 6, 7]
    assert sorted(offsets) == expected


@pytest.mark.parametrize("how", ["stop", "kill"])
def test_restart_keeps_acknowledgements_and_redelivers_acquired(tmp_path: Path, how: str) -> None:
    """Acknowledged records are not delivered again after a restart (clean or kill -9);
    acquired but unacknowledged ones are (Done-when 5)."""
    topic, group = _name("sp"), _name("sg")
    b = BrokerProcess(tmp_path / "data", dict(FAST)).start()
    try:
        create_topic(b, topic, 1)
        set_group_configs(b, group, share_auto_offset_reset="earliest")
        produce(b, topic, 10, 1)
        c = share_consumer(b, group, topic, **{"share.acknowledgement.mode": "explicit"})
        try:
            msgs: list[ck.Message] = []
            deadline = time.monotonic() + 20
            while len(msgs) < 10 and time.monotonic() < deadline:
                msgs = poll_records(c, 0.5) or msgs
            assert len(msgs) == 10
            for m in msgs[:6]:
                c.acknowledge(m, ck.AcknowledgeType.ACCEPT)
            result = c.commit_sync(10)
            assert all(e is None for e in result.values()), result
            if how == "kill":
                b.kill()
            else:
                b.stop()
        finally:
            c.close()
        b.restart()
        c2 = share_consumer(b, group, topic)
        try:
            got: dict[int, int] = {}
            deadline = time.monotonic() + 20
            while len(got) < 4 and time.monotonic() < deadline:
                for m in poll_records(c2, 0.5):
                    got[m.offset()] = m.delivery_count()
            end = time.monotonic() + 2
            while time.monotonic() < end:
                for m in poll_records(c2, 0.5):
                    got[m.offset()] = m.delivery_count()
        finally:
            c2.close()
        assert sorted(got) == [6, 7, 8, 9]
        assert set(got.values()) == {2}
    finally:
        b.stop()
