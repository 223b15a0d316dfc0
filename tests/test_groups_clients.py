"""Consumer groups with real clients against a real broker process.

Each member is a separate process (tests.support.Member: tests/support/consumer_member.py for
kafka-python, aiokafka and confluent-kafka; tests/js/group_member.js for kafkajs) reporting its assignment as JSON
lines.  Session timeouts are Kafka's minimum (6 s), heartbeats every second; every wait is
bounded and every process is stopped or killed at the end.  When a wait times out, the message
carries each member's last events, its log and thread stacks, and the broker's group events.

The SIGKILL, static-membership and initial-delay scenarios use confluent-kafka.  kafka-python
3.0.12 drops a JoinGroup that outlasts one poll() when a leader rejoined because its metadata
snapshot changed and its own assignment ends the need to rejoin: heartbeats stay disabled and
its session expires (the client-side sequence is in tests/support/consumer_member.py; other
joins keep need_rejoin() true until they finish).  Such a join waits about one heartbeat
interval for the other members, so kafka-python members poll with a 3 s timeout; they take part
in the three-consumer and mixed-client scenarios.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rallypoint.protocol import codec

from tests.support import BrokerProcess, Member, WireClient, ensure_topics, explain_members, wait_until

pytestmark = pytest.mark.clients

TOPICS = ("t1", "t2")
ALL = frozenset((t, p) for t in TOPICS for p in range(6))
TP = tuple[str, int]


@pytest.fixture
def members() -> Iterator[list[Member]]:
    started: list[Member] = []
    yield started
    for m in started:
        m.kill()


@pytest.fixture
def six(broker_factory: Callable[..., BrokerProcess]) -> Callable[..., BrokerProcess]:
    """A broker whose topics t1 and t2 have 6 partitions each."""

    def make(**config: str) -> BrokerProcess:
        b = broker_factory(config={"num.partitions": "6", **config})
        assert ensure_topics(b, *TOPICS) == {t: 6 for t in TOPICS}
        return b

    return make


def covering(ms: list[Member]) -> bool:
    """Every member owns something, nothing is owned twice, everything is owned."""
    sets = [m.assignment for m in ms]
    if any(not s for s in sets):
        return False
    owned = [tp for s in sets if s for tp in s]
    return len(owned) == len(set(owned)) and set(owned) == ALL


def describe(b: BrokerProcess, group: str) -> dict[str, Any]:
    with WireClient(b.host, b.port) as c:
        return codec.to_dict(c.call(15, 5, {"groups": [group], "include_authorized_operations": False}))["groups"][0]


def transitions(b: BrokerProcess, group: str) -> list[dict[str, Any]]:
    return [e for e in b.events("group state transition") if e["group"] == group]


def explain(ms: list[Member], b: BrokerProcess | None = None, group: str | None = None) -> Callable[[], str]:
    return lambda: explain_members(ms, b, group)


def wait_covering(ms: list[Member], timeout: float, what: str, b: BrokerProcess, group: str) -> None:
    wait_until(lambda: covering(ms), timeout, what, step=0.1, explain=explain(ms, b, group))


# ------------------------------------------------------------------------------------ 1


@pytest.mark.parametrize("client", ["kafka-python", "confluent", "aiokafka"])
def test_three_consumers_share_two_topics(
    client: str, six: Callable[..., BrokerProcess], members: list[Member]
) -> None:
    b = six()
    for i in range(3):
        members.append(Member(client, b, "g3", TOPICS, client_id=f"{client}-{i}"))
    # A kafka-python leader may rejoin once right after its first assignment (its metadata
    # snapshot changed while it assigned), as it would against Kafka: wait for the group to
    # settle rather than sample it once.
    wait_until(
        lambda: covering(members) and describe(b, "g3")["group_state"] == "Stable",
        60,
        "a Stable group with disjoint assignments covering 12 partitions",
        explain=explain(members, b, "g3"),
    )
    assert sorted(len(m.assignment or ()) for m in members) == [4, 4, 4]
    g = describe(b, "g3")
    assert len(g["members"]) == 3 and g["protocol_type"] == "consumer"
    for m in members:
        m.begin_stop()
    for m in members:
        m.stop()
    wait_until(lambda: transitions(b, "g3") and transitions(b, "g3")[-1]["to"] == "Empty", 20, "group to go Empty")


# ------------------------------------------------------------------------------------ 2


def test_killed_consumer_is_expelled_after_the_session_timeout(
    six: Callable[..., BrokerProcess], members: list[Member]
) -> None:
    b = six()
    for name in ("survivor-a", "survivor-b", "victim"):
        members.append(Member("confluent", b, "gk", TOPICS, client_id=name))
    wait_covering(members, 60, "initial assignment", b, "gk")
    victim_id = next(m["member_id"] for m in describe(b, "gk")["members"] if m["client_id"] == "victim")
    victim = members[2]
    killed_at = time.monotonic()
    victim.kill()  # SIGKILL: no LeaveGroup
    survivors = members[:2]
    wait_until(lambda: covering(survivors), 40, "survivors to own every partition")
    took = time.monotonic() - killed_at
    assert took >= 4.0, f"rebalanced after {took:.1f} s, before the 6 s session could expire"
    removed = [e for e in b.events("member removed") if e["member"] == victim_id]
    assert removed and removed[0]["reason"] == "session timeout expired"


# ------------------------------------------------------------------------------------ 3


def test_static_member_restart_within_session_keeps_the_generation(
    six: Callable[..., BrokerProcess], members: list[Member]
) -> None:
    b = six()
    a = Member("confluent", b, "gs", TOPICS, client_id="static-a", instance="inst-a", session_ms=15000)
    bb = Member("confluent", b, "gs", TOPICS, client_id="static-b", instance="inst-b", session_ms=15000)
    members += [a, bb]
    wait_covering([a, bb], 60, "initial assignment", b, "gs")
    wait_until(lambda: transitions(b, "gs")[-1]["to"] == "Stable", 10, "Stable")
    generation = transitions(b, "gs")[-1]["generation"]
    seen = len(transitions(b, "gs"))
    old_ids = {m["client_id"]: m["member_id"] for m in describe(b, "gs")["members"]}
    owned_by_a = a.assignment
    a.stop()  # a static member does not send LeaveGroup
    a2 = Member("confluent", b, "gs", TOPICS, client_id="static-a", instance="inst-a", session_ms=15000)
    members.append(a2)
    wait_until(lambda: a2.assignment, 30, "the restarted member's assignment")
    assert a2.assignment == owned_by_a
    assert len(transitions(b, "gs")) == seen, "no rebalance"
    g = describe(b, "gs")
    new_ids = {m["client_id"]: m["member_id"] for m in g["members"]}
    assert g["group_state"] == "Stable" and len(g["members"]) == 2
    assert new_ids["static-a"] != old_ids["static-a"] and new_ids["static-a"].startswith("inst-a-")
    assert new_ids["static-b"] == old_ids["static-b"]
    # stopped for longer than the session timeout: the member is expelled and the group rebalances
    stopped_at = time.monotonic()
    a2.stop()
    wait_until(lambda: covering([bb]), 60, "the remaining member to own everything")
    assert time.monotonic() - stopped_at >= 12.0
    later = transitions(b, "gs")[seen:]
    assert later[0]["from"] == "Stable" and later[0]["to"] == "PreparingRebalance"
    assert later[0]["reason"].startswith("session timeout expired")
    assert later[-1]["to"] == "Stable" and later[-1]["generation"] == generation + 1


# ------------------------------------------------------------------------------------ 4


def test_initial_rebalance_delay_gathers_staggered_consumers_in_one_generation(
    six: Callable[..., BrokerProcess], members: list[Member]
) -> None:
    b = six(**{"group.initial.rebalance.delay.ms": "3000"})
    for i in range(3):
        members.append(Member("confluent", b, "gd", TOPICS, client_id=f"late-{i}"))
        time.sleep(1.0)
    wait_covering(members, 60, "one generation with every member", b, "gd")
    ts = transitions(b, "gd")
    assert [(t["from"], t["to"], t["generation"]) for t in ts] == [
        ("Empty", "PreparingRebalance", 0),
        ("PreparingRebalance", "CompletingRebalance", 1),
        ("CompletingRebalance", "Stable", 1),
    ]
    assert ts[1]["members"] == 3


# ------------------------------------------------------------------------------------ 5


def _serves(b: BrokerProcess, api_key: int) -> bool:
    with WireClient(b.host, b.port) as c:
        r = c.call(18, 3, {"client_software_name": "t", "client_software_version": "1"})
        return any(k.api_key == api_key for k in r.api_keys)


def replay_covers(timeline: list[tuple[float, str, frozenset[TP]]], names: set[str]) -> bool:
    """Was there a moment when every named member had reported a non-empty assignment and
    the latest reports were disjoint and covered every partition?"""
    latest: dict[str, frozenset[TP]] = {}
    for _t, name, parts in sorted(timeline, key=lambda x: x[0]):
        latest[name] = parts
        if set(latest) == names and all(latest.values()):
            owned = [tp for v in latest.values() for tp in v]
            if len(owned) == len(set(owned)) and set(owned) == ALL:
                return True
    return False


def test_mixed_clients_agree_on_a_protocol(
    six: Callable[..., BrokerProcess],
    members: list[Member],
    node_js: Callable[..., subprocess.CompletedProcess[str]],
    tmp_path: Path,
) -> None:
    """kafka-python (range, roundrobin), aiokafka (roundrobin), confluent-kafka (range,
    roundrobin) and kafkajs (its round robin under the name "roundrobin") in one group: the
    vote picks the only protocol they all support, and the leader - whichever library it is -
    hands out every partition.  Kafka's default initial rebalance delay (3 s) gathers the four
    processes, which start within a second or two, in the first generation."""
    b = six(**{"group.initial.rebalance.delay.ms": "3000"})
    data_plane = _serves(b, 1) and _serves(b, 2)
    events, stop = tmp_path / "kafkajs.jsonl", tmp_path / "stop"
    js_result: list[subprocess.CompletedProcess[str]] = []
    js = threading.Thread(
        target=lambda: js_result.append(
            node_js("group_member.js", b.bootstrap, "gm", ",".join(TOPICS), str(events), str(stop), "90", timeout=120)
        ),
        daemon=True,
    )
    js.start()
    members.append(Member("kafka-python", b, "gm", TOPICS, client_id="kafka-python-m"))
    members.append(Member("aiokafka", b, "gm", TOPICS, client_id="aiokafka-m"))
    members.append(Member("confluent", b, "gm", TOPICS, client_id="confluent-m"))
    names = {"kafka-python-m", "aiokafka-m", "confluent-m", "kafkajs"}

    def js_events() -> list[dict[str, Any]]:
        if not events.exists():
            return []
        return [json.loads(x) for x in events.read_text().splitlines() if x.strip()]

    def timeline() -> list[tuple[float, str, frozenset[TP]]]:
        out = [(t, m.name, s) for m in members for t, s in m.history()]
        out += [
            (e["t"], "kafkajs", frozenset((t, p) for t, p in e["partitions"]))
            for e in js_events()
            if e["event"] == "assignment"
        ]
        return out

    try:
        wait_until(
            lambda: replay_covers(timeline(), names),
            90,
            "four client libraries to share the partitions",
            explain=lambda: f"{js_events()}\n{explain_members(members)}",
        )
        assert {e["protocol"] for e in js_events() if e["event"] == "assignment"} == {"roundrobin"}
        four = [t for t in transitions(b, "gm") if t["to"] == "CompletingRebalance" and t["members"] == 4]
        assert four, transitions(b, "gm")
        if data_plane:
            # with Fetch and ListOffsets served every member stays: one Stable group of four
            def settled() -> bool:
                g = describe(b, "gm")
                return g["group_state"] == "Stable" and len(g["members"]) == 4

            wait_until(settled, 30, "a Stable group of four")
            g = describe(b, "gm")
            assert g["protocol_data"] == "roundrobin"
            assert {m["client_id"] for m in g["members"]} == names - {"kafkajs"} | {"kafkajs-member"}
    finally:
        stop.touch()
        js.join(60)
    assert js_result and js_result[0].returncode == 0, js_result


# ------------------------------------------------------------------------------------ 6


def test_cooperative_sticky_incremental_rebalance(six: Callable[..., BrokerProcess], members: list[Member]) -> None:
    b = six()
    for i in range(2):
        members.append(Member("confluent", b, "gc", TOPICS, client_id=f"coop-{i}", assignor="cooperative-sticky"))
    wait_until(lambda: covering(members), 60, "two cooperative members")
    before = {m.name: m.assignment for m in members}
    seen = len(transitions(b, "gc"))
    members.append(Member("confluent", b, "gc", TOPICS, client_id="coop-2", assignor="cooperative-sticky"))
    wait_until(
        lambda: covering(members) and all(len(m.assignment or ()) == 4 for m in members),
        60,
        "balance",
        explain=explain(members),
    )
    later = [t for t in transitions(b, "gc")[seen:] if t["to"] == "Stable"]
    # KIP-429: the old members first give up what moves (one rebalance), then it is handed
    # to the new member (a second one)
    assert len(later) >= 2, transitions(b, "gc")[seen:]
    g = describe(b, "gc")
    assert g["protocol_data"] == "cooperative-sticky" and len(g["members"]) == 3
    # sticky: the old members kept 4 of their 6 partitions and never lost the rest in between
    for m in members[:2]:
        kept = m.assignment or frozenset()
        assert kept <= (before[m.name] or frozenset())
        after_join = [s for _t, s in m.history() if _t >= members[2].events[0]["t"]]
        assert all(kept <= s for s in after_join)
    # No partition was ever owned by two members at once.  The rebalance callbacks are
    # incremental in cooperative mode and run in the member's process when ownership changes:
    # replay them in time order.
    callbacks = sorted(
        (e["t"], m.name, e["event"], e["partitions"])
        for m in members
        for e in m.events
        if e["event"] in ("assign", "revoke")
    )
    owner: dict[str, set[TP]] = {m.name: set() for m in members}
    for _t, name, kind, parts in callbacks:
        tps = {(t, p) for t, p in parts}
        if kind == "assign":
            owner[name] |= tps
        else:
            owner[name] -= tps
        owned = [tp for v in owner.values() for tp in v]
        assert len(owned) == len(set(owned)), (name, kind, owner)
    assert {n: frozenset(v) for n, v in owner.items()} == {m.name: m.assignment for m in members}
    # the old members revoked only what moved (2 partitions each), never everything
    joined_at = members[2].events[0]["t"]
    revoked = [
        e["partitions"]
        for m in members[:2]
        for e in m.events
        if e["event"] == "revoke" and e["t"] >= joined_at and e["partitions"]
    ]
    assert revoked and all(len(r) < 6 for r in revoked), revoked
