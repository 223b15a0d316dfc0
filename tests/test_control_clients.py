"""The control plane steering real clients (confluent-kafka, kafka-python) on real sockets.

One test per "done when" item of the control-plane issue: injected errors the clients recover
from, delays and disconnects without message loss, expelling a stopped member at once (by
``expire`` and by moving the clock), offsets and lag, bad input; and a share group's in-flight
records held by a ShareConsumer, released by moving the clock.  Every wait is bounded; member
processes are killed (SIGKILL ends stopped ones too) at the end.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from tests.control_support import Control
from tests.support import BrokerProcess, Member

pytestmark = pytest.mark.clients

T = TypeVar("T")


def wait_until(cond: Callable[[], T], timeout: float, what: str, step: float = 0.05) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(step)


def start(broker_factory: Callable[..., BrokerProcess], **config: str) -> tuple[BrokerProcess, Control]:
    b = broker_factory(config=config, extra_args=["--control-port", "0"])
    return b, Control.of(b)


def create_topic(b: BrokerProcess, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(15)


def produce(b: BrokerProcess, topic: str, values: list[tuple[int, str]]) -> None:
    """(partition, value) pairs, acknowledged."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": b.bootstrap, "linger.ms": 0})
    errors: list[Any] = []
    for part, value in values:
        p.produce(
            topic, value.encode(), partition=part, on_delivery=lambda err, _m: errors.append(err) if err else None
        )
    assert p.flush(20) == 0 and not errors, errors


def confluent_consumer(b: BrokerProcess, group: str, **extra: Any) -> Any:
    from confluent_kafka import Consumer

    conf = {
        "bootstrap.servers": b.bootstrap,
        "group.id": group,
        "client.id": extra.pop("client_id", "cc"),
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": 10000,
        "heartbeat.interval.ms": 500,
        "topic.metadata.refresh.interval.ms": 2000,
        **extra,
    }
    return Consumer(conf)


def consume(c: Any, count: int, timeout: float) -> list[Any]:
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        msg = c.poll(0.2)
        if msg is not None and not msg.error():
            got.append(msg)
    return got


@pytest.fixture
def members() -> Iterator[list[Member]]:
    started: list[Member] = []
    yield started
    for m in started:
        m.kill()


# ------------------------------------------------------------------------------------ 1


def test_commit_survives_not_coordinator_twice_and_find_coordinator_is_resent(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    from confluent_kafka import TopicPartition

    b, ctl = start(broker_factory)
    create_topic(b, "orders", 1)
    produce(b, "orders", [(0, f"m{i}") for i in range(5)])
    # retry.backoff.ms: with librdkafka 2.16's default (100 ms) the retried commit is re-queued on
    # the coordinator connection that the client itself closes and reopens at every coordinator
    # re-query (~500 ms, "Closing connection due to nodename change"), so it fails locally until
    # the client's session runs out; a backoff longer than that cycle lets it through
    # (docs/control.md, "Client notes").
    c = confluent_consumer(b, "g-commit", client_id="committer", **{"retry.backoff.ms": 1000})
    try:
        c.subscribe(["orders"])
        assert len(consume(c, 5, 30)) == 5
        fid = ctl.fault(api="OffsetCommit", error="NOT_COORDINATOR", count=2, group="g-commit")
        before = ctl.get("/v1/requests")["last_seq"]
        committed = c.commit(offsets=[TopicPartition("orders", 0, 5)], asynchronous=False)
        assert [(tp.partition, tp.offset, tp.error) for tp in committed] == [(0, 5, None)]
    finally:
        c.close()
    rule = ctl.get(f"/v1/faults/{fid}")
    assert (rule["hits"], rule["remaining"]) == (2, 0)
    log = ctl.requests(since=str(before), client_id="committer")
    commits = [e for e in log if e["api"] == "OffsetCommit"]
    assert [e["errors"] for e in commits[:3]] == [["NOT_COORDINATOR"], ["NOT_COORDINATOR"], []]
    assert all(e["fault"] == fid for e in commits[:2]) and commits[2]["fault"] is None
    first_fault = commits[0]["seq"]
    resent = [e for e in log if e["api"] == "FindCoordinator" and e["seq"] > first_fault]
    assert resent, f"no FindCoordinator after NOT_COORDINATOR: {[(e['seq'], e['api']) for e in log]}"
    assert resent[0]["seq"] < commits[2]["seq"]
    view = ctl.get("/v1/groups/g-commit")
    assert [(o["topic"], o["partition"], o["offset"]) for o in view["offsets"]] == [("orders", 0, 5)]


# ------------------------------------------------------------------------------------ 2


def test_rebalance_in_progress_on_heartbeat_makes_a_kafka_python_member_rejoin(
    broker_factory: Callable[..., BrokerProcess], members: list[Member]
) -> None:
    b, ctl = start(broker_factory)
    create_topic(b, "hb", 2)
    m = Member("kafka-python", b, "g-hb", ["hb"], client_id="kp-member", session_ms=10000, heartbeat_ms=300)
    members.append(m)
    stable = ctl.post("/v1/groups/g-hb/wait", {"state": "Stable", "members": 1, "timeout_ms": 30000})
    generation = stable["generation"]
    wait_until(lambda: m.assignment == {("hb", 0), ("hb", 1)}, 20, "the member's assignment")
    fid = ctl.fault(api="Heartbeat", error="REBALANCE_IN_PROGRESS", count=1, group="g-hb")
    ctl.post(f"/v1/faults/{fid}/wait", {"hits": 1, "timeout_ms": 20000})
    after = ctl.post("/v1/groups/g-hb/wait", {"state": "Stable", "min_generation": generation + 1, "timeout_ms": 30000})
    assert after["generation"] == generation + 1
    assert len(after["members"]) == 1 and after["members"][0]["client_id"] == "kp-member"
    joins = [e for e in ctl.requests(api="JoinGroup", client_id="kp-member") if not e["errors"]]
    assert len(joins) >= 2  # joined, then rejoined after the injected error
    tos = [t["to"] for t in after["transitions"]]
    assert tos[-3:] == ["PreparingRebalance", "CompletingRebalance", "Stable"]


# ------------------------------------------------------------------------------------ 3


@pytest.mark.parametrize("client", ["confluent", "kafka-python"])
def test_delayed_join_and_disconnected_fetches_lose_nothing(
    client: str, broker_factory: Callable[..., BrokerProcess]
) -> None:
    b, ctl = start(broker_factory)
    create_topic(b, "events", 2)
    sent = [(i % 2, f"v{i}") for i in range(40)]
    produce(b, "events", sent)
    join = ctl.fault(api="JoinGroup", delay_ms=2000, count=1, group=f"g-{client}")
    fetch = ctl.fault(api="Fetch", action="disconnect", count=2)
    started = time.monotonic()
    got: list[str] = []
    if client == "confluent":
        c = confluent_consumer(b, f"g-{client}", client_id="recoverer")
        try:
            c.subscribe(["events"])
            got = [m.value().decode() for m in consume(c, 40, 60)]
        finally:
            c.close()
    else:
        from kafka import KafkaConsumer

        kc = KafkaConsumer(
            "events",
            bootstrap_servers=b.bootstrap,
            group_id=f"g-{client}",
            client_id="recoverer",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=10000,
            heartbeat_interval_ms=500,
        )
        try:
            deadline = time.monotonic() + 60
            while len(got) < 40 and time.monotonic() < deadline:
                for records in kc.poll(timeout_ms=200).values():
                    got += [r.value.decode() for r in records]
        finally:
            kc.close()
    took = time.monotonic() - started
    assert sorted(got) == sorted(v for _p, v in sent), f"lost {set(v for _p, v in sent) - set(got)}"
    assert ctl.get(f"/v1/faults/{join}")["hits"] == 1
    assert ctl.get(f"/v1/faults/{fetch}")["hits"] == 2
    assert took >= 2.0
    delayed = [e for e in ctl.requests(api="JoinGroup") if e["fault"] == join]
    assert len(delayed) == 1 and delayed[0]["latency_ms"] >= 2000
    cut = [e for e in ctl.requests(api="Fetch") if e["fault"] == fetch]
    assert len(cut) == 2 and not any(e["answered"] for e in cut)


# ------------------------------------------------------------------------------------ 4


def _three_members(b: BrokerProcess, ctl: Control, members: list[Member], group: str) -> Member:
    create_topic(b, "work", 6)
    for name in ("survivor-a", "survivor-b", "sleeper"):
        members.append(Member("confluent", b, group, ["work"], client_id=name, session_ms=12000, heartbeat_ms=250))
    ctl.post(f"/v1/groups/{group}/wait", {"state": "Stable", "members": 3, "timeout_ms": 60000})
    all_parts = frozenset(("work", p) for p in range(6))
    wait_until(lambda: all(m.assignment for m in members), 30, "every member's first assignment")
    assert frozenset().union(*(m.assignment for m in members)) == all_parts
    return members[2]


def _survivors_own_everything(members: list[Member]) -> bool:
    a, b = members[0].assignment, members[1].assignment
    return bool(a and b and not a & b and a | b == frozenset(("work", p) for p in range(6)))


def test_expire_expels_a_stopped_member_at_once(
    broker_factory: Callable[..., BrokerProcess], members: list[Member]
) -> None:
    b, ctl = start(broker_factory)
    sleeper = _three_members(b, ctl, members, "g-expire")
    view = ctl.get("/v1/groups/g-expire")
    sleeper_id = next(m["member_id"] for m in view["members"] if m["client_id"] == "sleeper")
    assert all(m["session_timeout_ms"] == 12000 for m in view["members"])
    generation = view["generation"]
    sleeper.proc.send_signal(signal.SIGSTOP)
    expired_at = time.monotonic()
    out = ctl.post(f"/v1/groups/g-expire/members/{sleeper_id}/expire")
    assert out["member_id"] == sleeper_id
    assert sleeper_id not in [m["member_id"] for m in out["group"]["members"]]
    try:
        wait_until(lambda: _survivors_own_everything(members), 10, "survivors to be reassigned")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{members[0].log()}\n{members[1].log()}") from None
    took = time.monotonic() - expired_at
    # ~0.6 s on a quiet machine (heartbeats every 250 ms); the bound leaves room for a loaded one
    # and is far below the 12 s the session timeout would take
    assert took < 3.0, f"survivors reassigned {took:.2f} s after expire (session timeout 12 s)"
    after = ctl.post("/v1/groups/g-expire/wait", {"state": "Stable", "members": 2, "timeout_ms": 5000})
    assert after["generation"] == generation + 1
    stream = ctl.events("/v1/events?types=member&last_event_id=0")
    expired = [e["data"] for e in stream.events(1.0) if e["data"]["kind"] == "expired"]
    stream.close()
    assert [(e["member_id"], e["reason"]) for e in expired] == [(sleeper_id, "session timeout expired")]
    print(f"expire → survivors reassigned in {took * 1000:.0f} ms")


def test_clock_advance_expels_a_member_silent_for_a_few_seconds_and_keeps_the_others(
    broker_factory: Callable[..., BrokerProcess], members: list[Member]
) -> None:
    b, ctl = start(broker_factory)
    sleeper = _three_members(b, ctl, members, "g-clock")
    generation = ctl.get("/v1/groups/g-clock")["generation"]
    sleeper.proc.send_signal(signal.SIGSTOP)
    time.sleep(4.0)  # the sleeper's session has ~8 s left, the heartbeating members' ~12 s
    advanced_at = time.monotonic()
    clock = ctl.post("/v1/clock/advance", {"ms": 9000})
    assert clock["skew_ms"] == 9000
    try:
        wait_until(lambda: _survivors_own_everything(members), 10, "survivors to be reassigned")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{members[0].log()}\n{members[1].log()}") from None
    took = time.monotonic() - advanced_at
    assert took < 3.0, f"survivors reassigned {took:.2f} s after the clock moved (session timeout 12 s)"
    after = ctl.post("/v1/groups/g-clock/wait", {"state": "Stable", "members": 2, "timeout_ms": 5000})
    assert sorted(m["client_id"] for m in after["members"]) == ["survivor-a", "survivor-b"]
    assert after["generation"] == generation + 1
    print(f"clock advance → survivors reassigned in {took * 1000:.0f} ms")


# ------------------------------------------------------------------------------------ 5


def test_group_view_shows_committed_offsets_and_lag(broker_factory: Callable[..., BrokerProcess]) -> None:
    from confluent_kafka import TopicPartition
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    b, ctl = start(broker_factory)
    create_topic(b, "lagged", 2)
    produce(b, "lagged", [(0, f"a{i}") for i in range(10)] + [(1, f"b{i}") for i in range(4)])
    c = confluent_consumer(b, "g-lag", client_id="lagger")
    try:
        c.subscribe(["lagged"])
        consume(c, 14, 30)
        c.commit(offsets=[TopicPartition("lagged", 0, 7), TopicPartition("lagged", 1, 4)], asynchronous=False)
        view = ctl.post("/v1/groups/g-lag/wait", {"state": "Stable", "members": 1, "timeout_ms": 10000})
    finally:
        c.close()
    assert [(o["topic"], o["partition"], o["offset"], o["log_end_offset"], o["lag"]) for o in view["offsets"]] == [
        ("lagged", 0, 7, 10, 3),
        ("lagged", 1, 4, 4, 0),
    ]
    (member,) = view["members"]
    assert member["client_id"] == "lagger" and member["session_timeout_ms"] == 10000
    assert sorted(member["assignment"][0]["partitions"]) == [0, 1] and member["assignment"][0]["topic"] == "lagged"
    assert view["type"] == "classic" and view["protocol_type"] == "consumer" and view["protocol"] == "range"
    assert view["leader"] == member["member_id"]
    # another client reads the same committed offsets through Kafka's own API
    kc = KafkaConsumer(bootstrap_servers=b.bootstrap, group_id="g-lag", enable_auto_commit=False)
    try:
        assert [kc.committed(KTP("lagged", p)) for p in (0, 1)] == [7, 4]
    finally:
        kc.close()
    summary = {g["group_id"]: g for g in ctl.get("/v1/groups")}
    assert summary["g-lag"]["offsets"] == ctl.get("/v1/groups/g-lag")["offsets"]
    assert summary["g-lag"]["state"] == "Empty"  # the consumer left


# ------------------------------------------------------------------------------------ 6


def test_bad_control_input_leaves_the_broker_and_clients_alone(broker_factory: Callable[..., BrokerProcess]) -> None:
    b, ctl = start(broker_factory, **{"rallypoint.control.token": "t0ken"})
    anon = Control(f"http://{ctl.host}:{ctl.port}")
    authed = Control(f"http://{ctl.host}:{ctl.port}", token="t0ken")
    create_topic(b, "steady", 1)
    produce(b, "steady", [(0, f"x{i}") for i in range(5)])
    c = confluent_consumer(b, "g-steady", client_id="steady")
    try:
        c.subscribe(["steady"])
        assert len(consume(c, 5, 30)) == 5
        gen = authed.post("/v1/groups/g-steady/wait", {"state": "Stable", "timeout_ms": 10000})["generation"]
        for body in (b"{", b'{"api": "Heartbeat"}', b'{"api": "Heartbeat", "error": 27, "nope": 1}', b"[]"):
            r = authed.raw("POST", "/v1/faults", body, {"Content-Type": "application/json"})
            assert r.status == 400 and r.body["error"], (body, r.status)
        assert authed.call("POST", "/v1/clock/advance", {"ms": "soon"}).status == 400
        assert anon.call("GET", "/v1/groups").status == 401
        assert anon.call("POST", "/v1/faults", {"api": "Heartbeat", "error": 27}).status == 401
        assert anon.call("POST", "/v1/clock/advance", {"ms": 600000}).status == 401
        assert authed.get("/v1/faults") == [] and authed.get("/v1/clock")["skew_ms"] == 0
        produce(b, "steady", [(0, f"y{i}") for i in range(5)])
        assert len(consume(c, 5, 30)) == 5
        after = authed.get("/v1/groups/g-steady")
        assert after["state"] == "Stable" and after["generation"] == gen and len(after["members"]) == 1
    finally:
        c.close()


# ------------------------------------------------------------------------------------ share groups


def test_share_group_in_flight_records_follow_a_share_consumer_and_the_clock(
    broker_factory: Callable[..., BrokerProcess],
) -> None:
    """A confluent-kafka ShareConsumer (explicit acknowledgement) holds records and stops
    polling: the control plane shows the share group, the member and the acquired count; a
    clock advance past the lock duration (30 s, within the 45 s session) makes them Available at
    once — the member stays — and another share consumer then gets them with delivery count 2
    (docs/control.md, "Share groups")."""
    from confluent_kafka import ShareConsumer

    from tests.test_share_groups_clients import set_group_configs

    b, ctl = start(broker_factory)
    create_topic(b, "queued", 1)
    set_group_configs(b, "sg-clock", share_auto_offset_reset="earliest")
    produce(b, "queued", [(0, f"q{i}") for i in range(8)])
    base = {"bootstrap.servers": b.bootstrap, "group.id": "sg-clock"}
    holder = ShareConsumer({**base, "client.id": "holder", "share.acknowledgement.mode": "explicit"})
    other = None
    try:
        holder.subscribe(["queued"])
        held: list[int] = []
        deadline = time.monotonic() + 20
        while not held and time.monotonic() < deadline:
            held = [m.offset() for m in holder.poll(0.5) if m.error() is None]
        assert held, "the share consumer acquired nothing"
        # the holder polls no more: librdkafka fetches only inside poll()
        view = ctl.post("/v1/groups/sg-clock/wait", {"state": "Stable", "members": 1, "timeout_ms": 10000})
        assert (view["type"], view["state"], view["epoch"]) == ("share", "Stable", view["assignment_epoch"])
        [member] = view["members"]
        assert (member["client_id"], member["subscribed_topics"]) == ("holder", ["queued"])
        assert member["member_epoch"] == view["epoch"]
        assert member["assignment"] == [{"topic": "queued", "partitions": [0]}]
        [sp] = view["share_partitions"]
        assert (sp["topic"], sp["partition"], sp["start_offset"], sp["log_end_offset"]) == ("queued", 0, 0, 8)
        in_flight = sp["in_flight"]
        assert in_flight["acquired"] >= len(held) and in_flight["acquired"] == sp["end_offset"]
        assert in_flight["available"] == in_flight["acknowledged"] == in_flight["archived"] == 0

        ctl.post("/v1/clock/advance", {"ms": 30_001})
        after = ctl.get("/v1/groups/sg-clock")
        [sp_after] = after["share_partitions"]
        assert sp_after["in_flight"]["available"] == in_flight["acquired"]
        assert sp_after["in_flight"]["acquired"] == 0
        assert [m["member_id"] for m in after["members"]] == [member["member_id"]]  # its session goes on

        other = ShareConsumer({**base, "client.id": "other"})
        other.subscribe(["queued"])
        counts: dict[int, int] = {}
        deadline = time.monotonic() + 20
        while not set(held) <= set(counts) and time.monotonic() < deadline:
            for m in other.poll(0.5):
                if m.error() is None:
                    counts[m.offset()] = m.delivery_count()
        assert set(held) <= set(counts)
        assert {counts[o] for o in held} == {2}
        view = ctl.post("/v1/groups/sg-clock/wait", {"members": 2, "timeout_ms": 10000})
        assert sorted(m["client_id"] for m in view["members"]) == ["holder", "other"]
    finally:
        holder.close()
        if other is not None:
            other.close()
