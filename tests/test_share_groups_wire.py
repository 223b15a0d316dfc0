"""ShareGroupHeartbeat, ShareGroupDescribe, ShareFetch and ShareAcknowledge as raw frames over
real sockets (docs/share-groups.md): session epochs and their errors, per-partition
acknowledgement errors, connection close releasing records."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from rallypoint.protocol import codec
from rallypoint.protocol.errors import ErrorCode as E
from rallypoint.protocol.records import build_batch

from tests.support import BrokerProcess, WireClient

pytestmark = pytest.mark.wire


def d(msg: Any) -> dict[str, Any]:
    return codec.to_dict(msg)


@pytest.fixture
def b(broker_factory: Callable[..., BrokerProcess]) -> BrokerProcess:
    return broker_factory(config={"group.share.min.record.lock.duration.ms": "1000"})


def setup_topic(c: WireClient, name: str, group: str, messages: int) -> uuid.UUID:
    r = d(c.call(19, 5, {"topics": [{"name": name, "num_partitions": 1, "replication_factor": 1}], "timeout": 5000}))
    assert r["topics"][0]["error_code"] == 0, r
    md = d(c.call(3, 12, {"topics": [{"name": name}], "allow_auto_topic_creation": False}))
    tid = uuid.UUID(str(md["topics"][0]["topic_id"]))
    batch = build_batch(0, [(None, b"v%d" % i) for i in range(messages)], int(time.time() * 1000))
    pr = d(
        c.call(
            0,
            9,
            {
                "transactional_id": None,
                "acks": -1,
                "timeout": 5000,
                "topic_data": [{"name": name, "partition_data": [{"index": 0, "records": batch}]}],
            },
        )
    )
    assert pr["responses"][0]["partition_responses"][0]["error_code"] == 0, pr
    r = d(
        c.call(
            44,
            1,
            {
                "resources": [
                    {
                        "resource_type": 32,
                        "resource_name": group,
                        "configs": [{"name": "share.auto.offset.reset", "config_operation": 0, "value": "earliest"}],
                    }
                ],
                "validate_only": False,
            },
        )
    )
    assert r["responses"][0]["error_code"] == 0, r
    return tid


def heartbeat(c: WireClient, group: str, member: str, epoch: int, topics: list[str] | None) -> dict[str, Any]:
    body = {
        "group_id": group,
        "member_id": member,
        "member_epoch": epoch,
        "rack_id": None,
        "subscribed_topic_names": topics,
    }
    return d(c.call(76, 1, body))


def share_fetch(
    c: WireClient,
    group: str,
    member: str,
    epoch: int,
    tid: uuid.UUID,
    acks: list[dict[str, Any]] | None = None,
    partitions: bool = True,
    max_wait: int = 0,
) -> dict[str, Any]:
    topics = [{"topic_id": tid, "partitions": [{"partition_index": 0, "acknowledgement_batches": acks or []}]}]
    body = {
        "group_id": group,
        "member_id": member,
        "share_session_epoch": epoch,
        "max_wait": max_wait,
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "max_records": 500,
        "batch_size": 500,
        "topics": topics if partitions else [],
        "forgotten_topics_data": [],
    }
    return d(c.call(78, 1, body))


def share_ack(
    c: WireClient, group: str, member: str, epoch: int, tid: uuid.UUID, acks: list[dict[str, Any]]
) -> dict[str, Any]:
    body = {
        "group_id": group,
        "member_id": member,
        "share_session_epoch": epoch,
        "topics": [{"topic_id": tid, "partitions": [{"partition_index": 0, "acknowledgement_batches": acks}]}],
    }
    return d(c.call(79, 1, body))


def acquired(r: dict[str, Any]) -> list[tuple[int, int, int]]:
    return [
        (a["first_offset"], a["last_offset"], a["delivery_count"])
        for t in r["responses"]
        for p in t["partitions"]
        for a in p["acquired_records"]
    ]


def test_session_epochs_and_errors(b: BrokerProcess) -> None:
    with WireClient(b.host, b.port) as c:
        tid = setup_topic(c, "sw1", "g1", 3)
        assert heartbeat(c, "g1", "m1", 0, ["sw1"])["error_code"] == 0
        assert share_fetch(c, "g1", "m1", 1, tid)["error_code"] == E.SHARE_SESSION_NOT_FOUND
        assert share_ack(c, "g1", "m1", 0, tid, [])["error_code"] == E.INVALID_SHARE_SESSION_EPOCH
        initial_with_acks = share_fetch(
            c, "g1", "m1", 0, tid, [{"first_offset": 0, "last_offset": 0, "acknowledge_types": [1]}]
        )
        assert initial_with_acks["error_code"] == E.INVALID_REQUEST
        r = share_fetch(c, "g1", "m1", 0, tid)
        assert r["error_code"] == 0 and r["acquisition_lock_timeout"] == 30000
        assert acquired(r) == [(0, 2, 1)]
        assert r["node_endpoints"][0]["port"] == b.port
        assert share_fetch(c, "g1", "m1", 5, tid)["error_code"] == E.INVALID_SHARE_SESSION_EPOCH
        # nothing more to acquire: an empty answer, immediately with max_wait 0
        r = share_fetch(c, "g1", "m1", 1, tid, [{"first_offset": 0, "last_offset": 0, "acknowledge_types": [1]}])
        part = r["responses"][0]["partitions"][0]
        assert (part["error_code"], part["acknowledge_error_code"], part["records"]) == (0, 0, b"")
        # ShareAcknowledge shares the epoch: 2 now, then 3
        r = share_ack(c, "g1", "m1", 2, tid, [{"first_offset": 1, "last_offset": 1, "acknowledge_types": [2]}])
        assert r["error_code"] == 0 and r["responses"][0]["partitions"][0]["error_code"] == 0
        r = share_fetch(c, "g1", "m1", 3, tid)
        assert acquired(r) == [(1, 1, 2)]
        # a final fetch may not fetch; a final acknowledge closes and releases
        assert share_fetch(c, "g1", "m1", -1, tid)["error_code"] == E.INVALID_REQUEST
        r = share_ack(c, "g1", "m1", -1, tid, [{"first_offset": 1, "last_offset": 1, "acknowledge_types": [1]}])
        assert r["error_code"] == 0 and r["responses"][0]["partitions"][0]["error_code"] == 0
        assert share_ack(c, "g1", "m1", -1, tid, [])["error_code"] == E.SHARE_SESSION_NOT_FOUND
        # offset 2 was released when the session closed: the next session gets it again
        r = share_fetch(c, "g1", "m1", 0, tid)
        assert acquired(r) == [(2, 2, 2)]


def test_acknowledging_records_held_by_another_member(b: BrokerProcess) -> None:
    with WireClient(b.host, b.port) as c1, WireClient(b.host, b.port) as c2:
        tid = setup_topic(c1, "sw2", "g2", 4)
        assert acquired(share_fetch(c1, "g2", "a", 0, tid)) == [(0, 3, 1)]
        share_fetch(c2, "g2", "b", 0, tid)
        bad = [{"first_offset": 0, "last_offset": 3, "acknowledge_types": [1]}]
        r = share_ack(c2, "g2", "b", 1, tid, bad)
        assert r["error_code"] == 0
        assert r["responses"][0]["partitions"][0]["error_code"] == E.INVALID_RECORD_STATE
        r = share_ack(c2, "g2", "b", 2, tid, [{"first_offset": 0, "last_offset": 3, "acknowledge_types": [1, 2]}])
        assert r["responses"][0]["partitions"][0]["error_code"] == E.INVALID_REQUEST
        r = share_ack(c1, "g2", "a", 1, tid, bad)
        assert r["responses"][0]["partitions"][0]["error_code"] == 0


def test_closing_the_connection_releases_its_records(b: BrokerProcess) -> None:
    with WireClient(b.host, b.port) as c2:
        c1 = WireClient(b.host, b.port)
        tid = setup_topic(c1, "sw3", "g3", 2)
        assert acquired(share_fetch(c1, "g3", "a", 0, tid)) == [(0, 1, 1)]
        assert acquired(share_fetch(c2, "g3", "b", 0, tid)) == []
        c1.close()
        deadline = time.monotonic() + 10
        got: list[tuple[int, int, int]] = []
        epoch = 1
        while not got and time.monotonic() < deadline:
            r = share_fetch(c2, "g3", "b", epoch, tid, max_wait=500)
            epoch += 1
            got = acquired(r)
        assert got == [(0, 1, 2)]


def test_long_poll_wakes_on_produce_and_unknown_topic_id(b: BrokerProcess) -> None:
    with WireClient(b.host, b.port) as c:
        tid = setup_topic(c, "sw4", "g4", 1)
        share_fetch(c, "g4", "a", 0, tid)
        t0 = time.monotonic()
        r = share_fetch(c, "g4", "a", 1, tid, max_wait=400)
        assert acquired(r) == [] and time.monotonic() - t0 >= 0.35
        unknown = uuid.uuid4()
        r = share_fetch(c, "g4", "a", 2, unknown)
        part = r["responses"][0]["partitions"][0]
        assert r["responses"][0]["topic_id"] == unknown and part["error_code"] == E.UNKNOWN_TOPIC_ID


def test_describe(b: BrokerProcess) -> None:
    with WireClient(b.host, b.port) as c:
        tid = setup_topic(c, "sw5", "g5", 1)
        r = heartbeat(c, "g5", "m1", 0, ["sw5"])
        assert r["member_epoch"] == 1
        assert r["assignment"]["topic_partitions"] == [{"topic_id": tid, "partitions": [0]}]
        r = d(c.call(77, 1, {"group_ids": ["g5", "nope"], "include_authorized_operations": False}))
        g5, nope = r["groups"]
        assert (g5["error_code"], g5["group_state"], g5["group_epoch"], g5["assignor_name"]) == (
            0,
            "Stable",
            1,
            "simple",
        )
        assert g5["members"][0]["assignment"]["topic_partitions"][0]["topic_name"] == "sw5"
        assert nope["error_code"] == E.GROUP_ID_NOT_FOUND
        assert heartbeat(c, "g5", "m1", -1, None)["member_epoch"] == -1
        r = d(c.call(77, 1, {"group_ids": ["g5"], "include_authorized_operations": False}))
        assert r["groups"][0]["group_state"] == "Empty"


def test_membership_survives_a_restart_and_is_in_the_offsets_log(b: BrokerProcess) -> None:
    """Share-group records (types 10-14) go to __consumer_offsets before the heartbeat is
    answered; after a restart the member carries on at its epoch (docs/share-groups.md,
    "Records")."""
    import json
    import subprocess
    import sys

    from tests.support import ROOT

    with WireClient(b.host, b.port) as c:
        setup_topic(c, "sw6", "g6", 1)
        r = heartbeat(c, "g6", "m1", 0, ["sw6"])
        assert (r["error_code"], r["member_epoch"]) == (0, 1)
    b.kill()  # no clean shutdown: what the answer promised is already written
    b.start()
    with WireClient(b.host, b.port) as c:
        r = heartbeat(c, "g6", "m1", 1, None)
        assert (r["error_code"], r["member_epoch"], r["assignment"]) == (0, 1, None)
        r = d(c.call(77, 1, {"group_ids": ["g6"], "include_authorized_operations": False}))
        assert [m["member_id"] for m in r["groups"][0]["members"]] == ["m1"]
    b.stop()
    out = subprocess.run(
        [sys.executable, "-m", "rallypoint", "dump-log", "--json", str(b.data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr
    types = {json.loads(line).get("type") for line in out.stdout.splitlines() if line.startswith("{")}
    assert {
        "share_group_member_metadata",
        "share_group_metadata",
        "share_group_target_assignment_metadata",
        "share_group_target_assignment_member",
        "share_group_current_member_assignment",
    } <= types


def test_list_delete_and_other_kinds_of_group_on_a_share_group_id(b: BrokerProcess) -> None:
    with WireClient(b.host, b.port) as c:
        setup_topic(c, "sw7", "g7", 1)
        assert heartbeat(c, "g7", "m1", 0, ["sw7"])["error_code"] == 0
        listed = d(c.call(16, 5, {"states_filter": [], "types_filter": ["share"]}))["groups"]
        assert [(g["group_id"], g["group_state"], g["group_type"], g["protocol_type"]) for g in listed] == [
            ("g7", "Stable", "share", "share")
        ]
        assert d(c.call(16, 5, {"states_filter": [], "types_filter": ["consumer"]}))["groups"] == []
        # a classic join and a consumer-group heartbeat on the id: Kafka's answers
        join = {
            "group_id": "g7",
            "session_timeout": 10000,
            "rebalance_timeout": 10000,
            "member_id": "",
            "group_instance_id": None,
            "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b""}],
            "reason": None,
        }
        assert d(c.call(11, 9, join))["error_code"] == E.INCONSISTENT_GROUP_PROTOCOL
        cg = {
            "group_id": "g7",
            "member_id": "x" * 22,
            "member_epoch": 0,
            "rebalance_timeout": 30000,
            "subscribed_topic_names": ["sw7"],
            "subscribed_topic_regex": None,
            "topic_partitions": [],
        }
        r = d(c.call(68, 1, cg))
        assert (r["error_code"], r["error_message"]) == (E.GROUP_ID_NOT_FOUND, "Group g7 is not a consumer group")
        # DeleteGroups: only an Empty share group
        assert d(c.call(42, 2, {"groups_names": ["g7"]}))["results"][0]["error_code"] == E.NON_EMPTY_GROUP
        heartbeat(c, "g7", "m1", -1, None)
        assert d(c.call(42, 2, {"groups_names": ["g7"]}))["results"][0]["error_code"] == 0
        assert d(c.call(16, 5, {"states_filter": [], "types_filter": ["share"]}))["groups"] == []
