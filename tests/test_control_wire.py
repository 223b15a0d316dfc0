"""Fault actions as a client sees them on the wire (raw Kafka requests against a broker process):
hold/release with in-order answers, no-response, delay, disconnect, partial (group / topic) errors,
acks=0."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.control_support import Control, control_url
from tests.support import BrokerProcess, WireClient

pytestmark = pytest.mark.wire

HEARTBEAT, API_VERSIONS, DESCRIBE_GROUPS, OFFSET_COMMIT, OFFSET_FETCH, PRODUCE, METADATA = 12, 18, 15, 8, 9, 0, 3


@pytest.fixture
def broker(broker_factory: Callable[..., BrokerProcess]) -> BrokerProcess:
    return broker_factory(config={"num.partitions": "2"}, extra_args=["--control-port", "0"])


def heartbeat_body(group: str = "nobody") -> dict[str, Any]:
    return {"group_id": group, "generation_id": 1, "member_id": "m"}


def api_versions(c: WireClient) -> int:
    return c.send(API_VERSIONS, 3, {"client_software_name": "t", "client_software_version": "1"})


def test_hold_parks_until_release_and_answers_stay_in_order(broker: BrokerProcess) -> None:
    ctl = Control.of(broker)
    fid = ctl.fault(api="Heartbeat", action="hold", count=1)
    with WireClient(broker.host, broker.port) as held, WireClient(broker.host, broker.port) as other:
        first = held.send(HEARTBEAT, 4, heartbeat_body())
        second = api_versions(held)  # pipelined behind the held request
        time.sleep(0.3)
        # another connection is not held up
        assert int(other.call(HEARTBEAT, 4, heartbeat_body()).error_code) == 25
        held.sock.settimeout(0.3)
        with pytest.raises(TimeoutError):
            held.recv_frame()
        assert ctl.get(f"/v1/faults/{fid}")["held"] == 1
        released = ctl.post(f"/v1/faults/{fid}/release")
        assert released["released"] == 1
        held.sock.settimeout(10)
        assert int(held.receive(HEARTBEAT, 4, first).error_code) == 25
        assert int(held.receive(API_VERSIONS, 3, second).error_code) == 0
    entry = next(e for e in ctl.requests(api="Heartbeat") if e["fault"] == fid)
    assert entry["latency_ms"] >= 250


def test_no_response_swallows_one_answer_and_later_ones_come(broker: BrokerProcess) -> None:
    ctl = Control.of(broker)
    fid = ctl.fault(api="Heartbeat", action="no-response")
    with WireClient(broker.host, broker.port) as c:
        c.send(HEARTBEAT, 4, heartbeat_body())
        later = api_versions(c)
        assert int(c.receive(API_VERSIONS, 3, later).error_code) == 0  # the heartbeat's answer never came
    (entry,) = [e for e in ctl.requests(api="Heartbeat") if e["fault"] == fid]
    assert entry["answered"] is False and entry["errors"] == ["UNKNOWN_MEMBER_ID"]  # it was processed


def test_delay_and_disconnect(broker: BrokerProcess) -> None:
    ctl = Control.of(broker)
    ctl.fault(api="Heartbeat", delay_ms=400)
    with WireClient(broker.host, broker.port) as c:
        t = time.monotonic()
        assert int(c.call(HEARTBEAT, 4, heartbeat_body()).error_code) == 25
        assert time.monotonic() - t >= 0.4
    ctl.fault(api="ApiVersions", action="disconnect", delay_ms=100)
    with WireClient(broker.host, broker.port) as c:
        api_versions(c)
        assert c.is_closed_by_peer(5)
    with WireClient(broker.host, broker.port) as c:  # a new connection is fine
        assert int(c.receive(API_VERSIONS, 3, api_versions(c)).error_code) == 0


def test_error_with_a_delay(broker: BrokerProcess) -> None:
    ctl = Control.of(broker)
    ctl.fault(api="Heartbeat", error="COORDINATOR_LOAD_IN_PROGRESS", delay_ms=300)
    with WireClient(broker.host, broker.port) as c:
        t = time.monotonic()
        assert int(c.call(HEARTBEAT, 4, heartbeat_body()).error_code) == 14
        assert time.monotonic() - t >= 0.3


def test_group_rule_errors_only_that_group_of_a_describe(broker: BrokerProcess) -> None:
    ctl = Control.of(broker)
    ctl.fault(api="DescribeGroups", error="COORDINATOR_NOT_AVAILABLE", group="b")
    with WireClient(broker.host, broker.port) as c:
        resp = c.call(DESCRIBE_GROUPS, 5, {"groups": ["a", "b", "c"], "include_authorized_operations": False})
    got = {g.group_id: (int(g.error_code), g.group_state) for g in resp.groups}
    assert got == {"a": (0, "Dead"), "b": (15, ""), "c": (0, "Dead")}


def test_topic_rule_errors_only_that_topics_partitions_and_leaves_them_unprocessed(broker: BrokerProcess) -> None:
    ctl = Control.of(broker)
    with WireClient(broker.host, broker.port) as c:
        c.call(METADATA, 12, {"topics": [{"name": "x"}, {"name": "y"}], "allow_auto_topic_creation": True})
        ctl.fault(api="OffsetCommit", error="UNKNOWN_TOPIC_OR_PARTITION", topic="x")
        parts = [{"partition_index": p, "committed_offset": 5 + p, "committed_metadata": ""} for p in (0, 1)]
        commit = {
            "group_id": "g",
            "generation_id_or_member_epoch": -1,
            "member_id": "",
            "topics": [{"name": "x", "partitions": parts}, {"name": "y", "partitions": parts}],
        }
        resp = c.call(OFFSET_COMMIT, 8, commit)
        got = {(t.name, p.partition_index): int(p.error_code) for t in resp.topics for p in t.partitions}
        assert got == {("x", 0): 3, ("x", 1): 3, ("y", 0): 0, ("y", 1): 0}
        fetched = c.call(OFFSET_FETCH, 8, {"groups": [{"group_id": "g", "topics": None}], "require_stable": False})
    committed = {
        (t.name, p.partition_index): p.committed_offset for g in fetched.groups for t in g.topics for p in t.partitions
    }
    assert committed == {("y", 0): 5, ("y", 1): 6}  # x was not committed


def test_acks_zero_produce_error_closes_the_connection(broker: BrokerProcess) -> None:
    ctl = Control.of(broker)
    ctl.fault(api="Produce", error="NOT_LEADER_OR_FOLLOWER")
    with WireClient(broker.host, broker.port) as c:
        body = {
            "acks": 0,
            "timeout": 1000,
            "topic_data": [{"name": "z", "partition_data": [{"index": 0, "records": None}]}],
        }
        c.send(PRODUCE, 9, body)
        assert c.is_closed_by_peer(5)


def test_shutdown_releases_held_requests(broker: BrokerProcess) -> None:
    ctl = Control.of(broker)
    ctl.fault(api="Heartbeat", action="hold")
    answers: list[int] = []
    with WireClient(broker.host, broker.port) as c:
        corr = c.send(HEARTBEAT, 4, heartbeat_body())
        time.sleep(0.2)

        def read() -> None:
            try:
                answers.append(int(c.receive(HEARTBEAT, 4, corr).error_code))
            except (ConnectionError, OSError):
                pass

        t = threading.Thread(target=read)
        t.start()
        assert broker.stop() == 0  # SIGTERM: graceful
        t.join(10)
    # answered, not dropped: UNKNOWN_MEMBER_ID, or COORDINATOR_NOT_AVAILABLE once the coordinator unloaded
    assert answers and answers[0] in (25, 15), answers


def test_events_end_when_the_broker_stops(broker: BrokerProcess) -> None:
    stream = Control.of(broker).events()
    broker.stop()
    stream.sock.settimeout(10)
    data = stream.buf  # what the reader already holds past the response head
    try:
        while chunk := stream.sock.recv(65536):
            data += chunk
    except (TimeoutError, ConnectionError):
        pass
    assert b": rallypoint control events" in data
    assert data.endswith(b"0\r\n\r\n"), data[-200:]  # the chunked stream was ended, not cut


def test_consumer_groups_are_shown_with_their_epochs(broker: BrokerProcess) -> None:
    """A KIP-848 group in GET /v1/groups: type consumer, the group and assignment epochs, each
    member's epoch, type and partitions; a wait on its epoch (docs/control.md, "Consumer groups")."""
    import uuid

    from tests.test_consumer_groups_wire import join, make_topic

    control = Control(control_url(broker))
    member = str(uuid.uuid4())
    with WireClient(broker.host, broker.port) as c:
        make_topic(c, "cv-t", 3)
        r = join(c, "cv-g", member, ["cv-t"])
        assert r["error_code"] == 0
        epoch = r["member_epoch"]
        view = control.post("/v1/groups/cv-g/wait", {"state": "Stable", "min_generation": epoch, "timeout_ms": 10000})
    assert (view["type"], view["state"], view["epoch"], view["assignment_epoch"]) == (
        "consumer",
        "Stable",
        epoch,
        epoch,
    )
    [m] = view["members"]
    assert (m["member_id"], m["member_type"], m["member_epoch"]) == (member, "consumer", epoch)
    assert m["assignment"] == m["target_assignment"] == [{"topic": "cv-t", "partitions": [0, 1, 2]}]
    assert view["transitions"] and view["transitions"][-1]["to"] == "Stable"
    listed = control.get("/v1/groups")
    assert [(g["group_id"], g["type"]) for g in listed if g["group_id"] == "cv-g"] == [("cv-g", "consumer")]


def test_a_topic_rule_on_metadata_merges_into_a_cached_answer(broker: BrokerProcess) -> None:
    """Metadata answers are cached encoded (handlers/metadata.py); a topic fault still errors
    only that topic and the cached answer for the others is merged with it."""
    ctl = Control.of(broker)
    with WireClient(broker.host, broker.port) as c:
        body = {"topics": [{"name": "mx"}, {"name": "my"}], "allow_auto_topic_creation": True}
        c.call(METADATA, 12, body)  # creates both
        c.call(METADATA, 12, {"topics": [{"name": "my"}], "allow_auto_topic_creation": True})  # cached
        ctl.fault(api="Metadata", error="LEADER_NOT_AVAILABLE", topic="mx")
        resp = c.call(METADATA, 12, body)
    got = {t.name: (int(t.error_code), len(t.partitions)) for t in resp.topics}
    assert got == {"mx": (5, 0), "my": (0, 2)}


def test_share_groups_show_members_and_in_flight_records_and_follow_the_clock(broker: BrokerProcess) -> None:
    """A share (KIP-932) group in GET /v1/groups: its epochs, the member, each share partition's
    window and in-flight counts by state; moving the clock past the lock duration makes acquired
    records Available, past the session timeout expires the member — both visible in the very
    next answer; expire, waits and events (docs/control.md, "Share groups")."""
    from tests.test_share_groups_wire import acquired, heartbeat, setup_topic, share_ack, share_fetch

    ctl = Control.of(broker)
    with WireClient(broker.host, broker.port) as c:
        tid = setup_topic(c, "sv-t", "sv-g", 5)
        hb = heartbeat(c, "sv-g", "m1", 0, ["sv-t"])
        assert hb["error_code"] == 0
        epoch = hb["member_epoch"]
        assert acquired(share_fetch(c, "sv-g", "m1", 0, tid)) == [(0, 4, 1)]
        view = ctl.post("/v1/groups/sv-g/wait", {"state": "Stable", "members": 1, "min_generation": epoch})
        assert (view["type"], view["state"], view["epoch"], view["assignment_epoch"]) == (
            "share",
            "Stable",
            epoch,
            epoch,
        )
        assert (view["protocol_type"], view["assignor"], view["offsets"]) == ("share", "simple", [])
        [m] = view["members"]
        assert (m["member_id"], m["member_epoch"], m["subscribed_topics"]) == ("m1", epoch, ["sv-t"])
        assert m["assignment"] == [{"topic": "sv-t", "partitions": [0]}]
        [sp] = view["share_partitions"]
        assert sp == {
            "topic": "sv-t",
            "topic_id": str(tid),
            "partition": 0,
            "start_offset": 0,
            "end_offset": 5,
            "log_end_offset": 5,
            "in_flight": {"available": 0, "acquired": 5, "acknowledged": 0, "archived": 0},
        }
        listed = ctl.get("/v1/groups")
        assert [(g["group_id"], g["type"]) for g in listed if g["group_id"] == "sv-g"] == [("sv-g", "share")]

        # accept 0 and 2, reject 3: the SPSO passes 0; 1 and 4 stay acquired
        acks = [
            {"first_offset": 0, "last_offset": 0, "acknowledge_types": [1]},
            {"first_offset": 2, "last_offset": 2, "acknowledge_types": [1]},
            {"first_offset": 3, "last_offset": 3, "acknowledge_types": [3]},
        ]
        assert share_ack(c, "sv-g", "m1", 1, tid, acks)["responses"][0]["partitions"][0]["error_code"] == 0
        [sp] = ctl.get("/v1/groups/sv-g")["share_partitions"]
        assert (sp["start_offset"], sp["end_offset"]) == (1, 5)
        assert sp["in_flight"] == {"available": 0, "acquired": 2, "acknowledged": 1, "archived": 1}

        # past the 30 s lock (default), within the 45 s session: the locks expire, the member stays
        ctl.post("/v1/clock/advance", {"ms": 30_001})
        view = ctl.get("/v1/groups/sv-g")
        assert view["share_partitions"][0]["in_flight"] == {
            "available": 2,
            "acquired": 0,
            "acknowledged": 1,
            "archived": 1,
        }
        assert [m["member_id"] for m in view["members"]] == ["m1"]
        assert acquired(share_fetch(c, "sv-g", "m1", 2, tid)) == [(1, 1, 2), (4, 4, 2)]

        # past the session timeout: the member is gone in the next answer
        ctl.post("/v1/clock/advance", {"ms": 15_001})
        view = ctl.get("/v1/groups/sv-g")
        assert (view["state"], view["members"]) == ("Empty", [])
        assert view["epoch"] > epoch
        assert view["transitions"][-1]["from"] == "Stable" and view["transitions"][-1]["to"] == "Empty"
        assert ctl.post("/v1/groups/sv-g/wait", {"state": "Empty", "members": 0, "timeout_ms": 0})["state"] == "Empty"

        # expire one member of a share group
        assert heartbeat(c, "sv-g", "m2", 0, ["sv-t"])["error_code"] == 0
        assert [m["member_id"] for m in ctl.get("/v1/groups/sv-g")["members"]] == ["m2"]
        assert ctl.call("POST", "/v1/groups/sv-g/members/nobody/expire").status == 404
        expired = ctl.post("/v1/groups/sv-g/members/m2/expire")
        assert (expired["member_id"], expired["group"]["state"], expired["group"]["members"]) == ("m2", "Empty", [])

    stream = ctl.events("/v1/events?types=group,member&last_event_id=0")
    try:
        seen = []
        for ev in stream.events(timeout=3.0):
            d = ev["data"]
            if d["group_id"] == "sv-g":
                seen.append((ev["event"], d.get("kind") or f"{d['from']}->{d['to']}", d.get("member_id")))
            if len(seen) == 8:
                break
    finally:
        stream.close()
    assert seen == [
        ("member", "joined", "m1"),
        ("group", "Empty->Stable", None),
        ("member", "expired", "m1"),
        ("group", "Stable->Empty", None),
        ("member", "joined", "m2"),
        ("group", "Empty->Stable", None),
        ("member", "expired", "m2"),
        ("group", "Stable->Empty", None),
    ]


def test_consumer_group_members_follow_the_clock_and_can_be_expired(broker: BrokerProcess) -> None:
    """KIP-848 members: ``expire`` runs the session-expiry path, and a clock jump past the
    session timeout expires a member at once (docs/control.md, "Clock")."""
    import uuid

    from tests.test_consumer_groups_wire import join, make_topic

    control = Control(control_url(broker))
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    with WireClient(broker.host, broker.port) as c:
        make_topic(c, "ce-t", 2)
        assert join(c, "ce-g", a, ["ce-t"])["error_code"] == 0
        assert join(c, "ce-g", b, ["ce-t"])["error_code"] == 0
        view = control.post(f"/v1/groups/ce-g/members/{a}/expire", {})
        assert [m["member_id"] for m in view["group"]["members"]] == [b]
        control.post("/v1/clock/advance", {"ms": 46_000})  # past the default 45 s session
        assert control.get("/v1/groups/ce-g")["members"] == []
