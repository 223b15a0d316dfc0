"""The group APIs on the wire, version by version, against a real broker process (raw protocol
client): what each version puts where (docs/groups.md, "JoinGroup" through "DescribeGroups and
ListGroups")."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from rallypoint.protocol import codec
from rallypoint.protocol.errors import ErrorCode
from rallypoint.protocol.offsets_schema import partition_for

from tests.support import BrokerProcess, WireClient, ensure_topics, wait_until

pytestmark = pytest.mark.wire

E = ErrorCode
META = b"\x00\x01\x00\x00\x00\x01\x00\x01t\xff\xff\xff\xff"


def d(msg: Any) -> dict[str, Any]:
    return codec.to_dict(msg)


def find_coordinator(c: WireClient, group: str) -> dict[str, Any]:
    for _ in range(5):
        r = d(c.call(10, 3, {"key": group, "key_type": 0}))
        if r["error_code"] == 0:
            return r
    raise AssertionError(r)


def join_stable(c: WireClient, group: str, version: int = 5, session: int = 10_000) -> tuple[str, int]:
    """A one-member group through the real protocol: (member id, generation)."""
    body = {
        "group_id": group,
        "session_timeout": session,
        "rebalance_timeout": session,
        "member_id": "",
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": META}],
    }
    r = c.call(11, version, body)
    if int(r.error_code) == E.MEMBER_ID_REQUIRED:
        body["member_id"] = r.member_id
        r = c.call(11, version, body)
    assert int(r.error_code) == 0, r
    s = c.call(
        14,
        3,
        {
            "group_id": group,
            "generation_id": r.generation_id,
            "member_id": r.member_id,
            "assignments": [{"member_id": r.member_id, "assignment": b"ASSIGNED"}],
        },
    )
    assert int(s.error_code) == 0 and s.assignment == b"ASSIGNED"
    return r.member_id, r.generation_id


def test_find_coordinator_versions(broker_factory: Callable[..., BrokerProcess]) -> None:
    b = broker_factory(config={"offsets.topic.num.partitions": "7"})
    with WireClient(b.host, b.port) as c:
        # first use creates __consumer_offsets and answers COORDINATOR_NOT_AVAILABLE, like Kafka
        # (every group key of that request)
        first4 = d(c.call(10, 4, {"key_type": 0, "coordinator_keys": ["x", "y"]}))
        assert [k["error_code"] for k in first4["coordinators"]] == [E.COORDINATOR_NOT_AVAILABLE] * 2
        md = d(c.call(3, 12, {"topics": [{"name": "__consumer_offsets"}], "allow_auto_topic_creation": False}))
        (topic,) = md["topics"]
        assert topic["is_internal"] and len(topic["partitions"]) == 7
        ok = d(c.call(10, 0, {"key": "g"}))
        assert ok == {"error_code": 0, "node_id": 1, "host": "127.0.0.1", "port": b.port}
        v1 = d(c.call(10, 1, {"key": "", "key_type": 0}))  # no key validation in FindCoordinator
        assert (v1["error_code"], v1["error_message"], v1["port"]) == (0, "NONE", b.port)
        txn = d(c.call(10, 2, {"key": "tx", "key_type": 1}))
        assert txn["error_code"] == E.COORDINATOR_NOT_AVAILABLE and txn["node_id"] == -1
        assert txn["error_message"] == "The coordinator is not available."
        v4 = d(c.call(10, 4, {"key_type": 0, "coordinator_keys": ["a", "b"]}))
        assert [
            (x["key"], x["error_code"], x["node_id"], x["port"], x["error_message"]) for x in v4["coordinators"]
        ] == [
            ("a", 0, 1, b.port, None),
            ("b", 0, 1, b.port, None),
        ]
        v6 = d(c.call(10, 6, {"key_type": 2, "coordinator_keys": ["s"]}))
        assert v6["coordinators"][0]["error_code"] == E.INVALID_REQUEST


def test_join_sync_heartbeat_leave_across_versions(broker: BrokerProcess) -> None:
    with WireClient(broker.host, broker.port) as c:
        find_coordinator(c, "g")
        base = {
            "group_id": "g",
            "session_timeout": 10_000,
            "rebalance_timeout": 10_000,
            "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": META}],
        }
        # v4+: MEMBER_ID_REQUIRED; v6 sends "" for the missing protocol name, v7 null
        r6 = c.call(11, 6, {**base, "member_id": ""})
        assert int(r6.error_code) == E.MEMBER_ID_REQUIRED and r6.protocol_name == "" and r6.generation_id == -1
        r7 = c.call(11, 7, {**base, "member_id": ""})
        assert int(r7.error_code) == E.MEMBER_ID_REQUIRED and r7.protocol_name is None and r7.protocol_type is None
        # v0 has no rebalance timeout: the session timeout is used
        r0 = c.call(
            11,
            0,
            {
                "group_id": "v0",
                **{k: v for k, v in base.items() if k not in ("group_id", "rebalance_timeout")},
                "member_id": "",
            },
        )
        assert int(r0.error_code) == 0 and r0.generation_id == 1 and r0.member_id.startswith("wire-test-")
        assert [m.member_id for m in r0.members] == [r0.member_id] and r0.members[0].metadata == META
        # the full flow at v9, SyncGroup v5 with protocol type and name
        r = c.call(11, 9, {**base, "member_id": r7.member_id, "reason": "test"})
        assert int(r.error_code) == 0 and (r.protocol_type, r.protocol_name) == ("consumer", "range")
        s = c.call(
            14,
            5,
            {
                "group_id": "g",
                "generation_id": r.generation_id,
                "member_id": r.member_id,
                "protocol_type": "consumer",
                "protocol_name": "range",
                "assignments": [{"member_id": r.member_id, "assignment": b"\x01\x02"}],
            },
        )
        assert (int(s.error_code), s.assignment, s.protocol_name) == (0, b"\x01\x02", "range")
        missing = c.call(
            14, 5, {"group_id": "g", "generation_id": r.generation_id, "member_id": r.member_id, "assignments": []}
        )
        assert int(missing.error_code) == E.INCONSISTENT_GROUP_PROTOCOL
        hb = c.call(12, 4, {"group_id": "g", "generation_id": r.generation_id, "member_id": r.member_id})
        assert int(hb.error_code) == 0
        assert int(c.call(12, 0, {"group_id": "g", "generation_id": 99, "member_id": r.member_id}).error_code) == (
            E.ILLEGAL_GENERATION
        )
        assert (
            int(c.call(12, 1, {"group_id": "", "generation_id": 1, "member_id": "x"}).error_code) == E.INVALID_GROUP_ID
        )
        # LeaveGroup v0-2 fold the member error into the top-level error
        assert int(c.call(13, 0, {"group_id": "g", "member_id": "stranger"}).error_code) == E.UNKNOWN_MEMBER_ID
        assert int(c.call(13, 2, {"group_id": "nope", "member_id": "x"}).error_code) == E.UNKNOWN_MEMBER_ID
        v3 = d(
            c.call(
                13,
                3,
                {
                    "group_id": "g",
                    "members": [
                        {"member_id": "stranger", "group_instance_id": None},
                        {"member_id": r.member_id, "group_instance_id": None},
                    ],
                },
            )
        )
        assert v3["error_code"] == 0
        assert [(m["member_id"], m["error_code"]) for m in v3["members"]] == [
            ("stranger", E.UNKNOWN_MEMBER_ID),
            (r.member_id, 0),
        ]

    # The broker's log is read by another thread: wait (bounded) for the last transition to arrive.
    def transitions_so_far() -> list[tuple[str, str, str, int]]:
        return [(e["group"], e["from"], e["to"], e["generation"]) for e in broker.events("group state transition")]

    wait_until(
        lambda: ("g", "Stable", "PreparingRebalance", 1) in transitions_so_far(),
        10,
        "the leave to start a rebalance",
        explain=lambda: str(transitions_so_far()),
    )
    transitions = transitions_so_far()
    assert ("g", "Empty", "PreparingRebalance", 0) in transitions
    assert ("g", "CompletingRebalance", "Stable", 1) in transitions
    # the leaving member sends the group from Stable back to PreparingRebalance (generation 1)
    assert transitions.index(("g", "Stable", "PreparingRebalance", 1)) > transitions.index(
        ("g", "CompletingRebalance", "Stable", 1)
    )
    # (the join does not complete yet: the member id handed out by the v6 MEMBER_ID_REQUIRED
    # is still pending and blocks it until its session timeout, F2)


def test_offsets_across_versions(broker: BrokerProcess) -> None:
    with WireClient(broker.host, broker.port) as c:
        ensure_topics(c, "topic-a")
        member, gen = join_stable(c, "og")
        commit = d(
            c.call(
                8,
                8,
                {
                    "group_id": "og",
                    "generation_id_or_member_epoch": gen,
                    "member_id": member,
                    "topics": [
                        {
                            "name": "topic-a",
                            "partitions": [
                                {
                                    "partition_index": 0,
                                    "committed_offset": 17,
                                    "committed_leader_epoch": 3,
                                    "committed_metadata": "meta",
                                },
                                {"partition_index": 9, "committed_offset": 1},
                            ],
                        },
                        {"name": "no-such-topic", "partitions": [{"partition_index": 0, "committed_offset": 1}]},
                    ],
                },
            )
        )
        assert [
            (t["name"], [(p["partition_index"], p["error_code"]) for p in t["partitions"]]) for t in commit["topics"]
        ] == [
            ("topic-a", [(9, E.UNKNOWN_TOPIC_OR_PARTITION), (0, 0)]),
            ("no-such-topic", [(0, E.UNKNOWN_TOPIC_OR_PARTITION)]),
        ]
        # v2 with a member of a missing group and a generation: ILLEGAL_GENERATION; v9: GROUP_ID_NOT_FOUND
        for version, code in ((2, E.ILLEGAL_GENERATION), (9, E.GROUP_ID_NOT_FOUND)):
            r = d(
                c.call(
                    8,
                    version,
                    {
                        "group_id": "missing",
                        "generation_id_or_member_epoch": 1,
                        "member_id": "m",
                        "topics": [{"name": "topic-a", "partitions": [{"partition_index": 0, "committed_offset": 1}]}],
                    },
                )
            )
            assert r["topics"][0]["partitions"][0]["error_code"] == code
        # OffsetFetch: v1 per partition, v5 leader epoch, v7 require_stable, v8 many groups, unknown group
        v1 = d(c.call(9, 1, {"group_id": "og", "topics": [{"name": "topic-a", "partition_indexes": [0, 1]}]}))
        assert [
            (p["partition_index"], p["committed_offset"], p["metadata"], p["error_code"])
            for p in v1["topics"][0]["partitions"]
        ] == [
            (0, 17, "meta", 0),
            (1, -1, "", 0),
        ]
        v7 = d(c.call(9, 7, {"group_id": "og", "topics": None, "require_stable": True}))
        assert v7["error_code"] == 0
        assert [
            (t["name"], p["committed_offset"], p["committed_leader_epoch"])
            for t in v7["topics"]
            for p in t["partitions"]
        ] == [("topic-a", 17, 3)]
        v8 = d(
            c.call(
                9,
                8,
                {
                    "groups": [
                        {"group_id": "og", "topics": [{"name": "topic-a", "partition_indexes": [0]}]},
                        {"group_id": "unknown", "topics": None},
                    ],
                    "require_stable": False,
                },
            )
        )
        assert [(g["group_id"], g["error_code"], len(g["topics"])) for g in v8["groups"]] == [
            ("og", 0, 1),
            ("unknown", 0, 0),
        ]
        # OffsetDelete on a Stable group subscribed to topic "t": topic-a is not subscribed -> deleted
        ensure_topics(c, "t")
        od = d(
            c.call(
                47,
                0,
                {
                    "group_id": "og",
                    "topics": [
                        {"name": "t", "partitions": [{"partition_index": 0}]},
                        {"name": "topic-a", "partitions": [{"partition_index": 0}]},
                    ],
                },
            )
        )
        assert od["error_code"] == 0
        assert {t["name"]: t["partitions"][0]["error_code"] for t in od["topics"]} == {
            "t": E.GROUP_SUBSCRIBED_TO_TOPIC,
            "topic-a": 0,
        }
        assert d(c.call(47, 0, {"group_id": "nope", "topics": []}))["error_code"] == E.GROUP_ID_NOT_FOUND
        v2 = d(c.call(9, 2, {"group_id": "og", "topics": [{"name": "topic-a", "partition_indexes": [0]}]}))
        assert v2["topics"][0]["partitions"][0]["committed_offset"] == -1


def test_describe_list_delete(broker: BrokerProcess) -> None:
    with WireClient(broker.host, broker.port) as c:
        find_coordinator(c, "dg")
        member, _gen = join_stable(c, "dg")
        v5 = d(c.call(15, 5, {"groups": ["dg", "ghost"], "include_authorized_operations": True}))
        live, ghost = v5["groups"]
        assert (live["group_state"], live["protocol_type"], live["protocol_data"]) == ("Stable", "consumer", "range")
        (m,) = live["members"]
        assert (m["member_id"], m["client_id"], m["client_host"]) == (member, "wire-test", "/127.0.0.1")
        assert (m["member_metadata"], m["member_assignment"]) == (META, b"ASSIGNED")
        assert live["authorized_operations"] == (1 << 3) | (1 << 6) | (1 << 8)
        assert (ghost["error_code"], ghost["group_state"], ghost["members"]) == (0, "Dead", [])
        v6 = d(c.call(15, 6, {"groups": ["ghost"], "include_authorized_operations": False}))
        assert v6["groups"][0]["error_code"] == E.GROUP_ID_NOT_FOUND
        assert v6["groups"][0]["error_message"] == "Group ghost not found."
        d(c.call(8, 8, {"group_id": "simple", "generation_id_or_member_epoch": -1, "member_id": "", "topics": []}))
        ensure_topics(c, "x")
        d(
            c.call(
                8,
                8,
                {
                    "group_id": "simple",
                    "generation_id_or_member_epoch": -1,
                    "member_id": "",
                    "topics": [{"name": "x", "partitions": [{"partition_index": 0, "committed_offset": 5}]}],
                },
            )
        )
        lg = d(c.call(16, 5, {"states_filter": [], "types_filter": []}))
        assert {(g["group_id"], g["protocol_type"], g["group_state"], g["group_type"]) for g in lg["groups"]} == {
            ("dg", "consumer", "Stable", "classic"),
            ("simple", "", "Empty", "classic"),
        }
        assert [g["group_id"] for g in d(c.call(16, 4, {"states_filter": ["stable"]}))["groups"]] == ["dg"]
        assert d(c.call(16, 5, {"states_filter": [], "types_filter": ["consumer"]}))["groups"] == []
        dl = d(c.call(42, 2, {"groups_names": ["simple", "dg", "ghost"]}))
        assert [(r["group_id"], r["error_code"]) for r in dl["results"]] == [
            ("simple", 0),
            ("dg", E.NON_EMPTY_GROUP),
            ("ghost", E.GROUP_ID_NOT_FOUND),
        ]
        gone = d(c.call(9, 1, {"group_id": "simple", "topics": [{"name": "x", "partition_indexes": [0]}]}))
        assert gone["topics"][0]["partitions"][0]["committed_offset"] == -1
    created = [e for e in broker.events("group created") if e["group"] == "dg"]
    assert created and created[0]["partition"] == partition_for("dg", 50)


def test_parked_join_is_answered_not_coordinator_on_shutdown(broker: BrokerProcess) -> None:
    """A JoinGroup parked in PreparingRebalance is answered when the broker stops
    (NOT_COORDINATOR, as Kafka's coordinator answers parked joins when it unloads a group)."""
    group = f"sd-{uuid.uuid4().hex[:6]}"
    with WireClient(broker.host, broker.port) as c, WireClient(broker.host, broker.port) as c2:
        _member, _gen = join_stable(c, group, session=60_000)
        # a second member joins: the group rebalances and its JoinGroup parks, waiting for `member`
        body = {
            "group_id": group,
            "session_timeout": 60_000,
            "rebalance_timeout": 60_000,
            "member_id": "",
            "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": META}],
        }
        corr = c2.send(11, 3, body)
        wait_until(
            lambda: [
                e
                for e in broker.events("group state transition")
                if e["group"] == group and e["to"] == "PreparingRebalance"
            ],
            5,
            "the second join to start a rebalance",
        )
        assert broker.stop() == 0
        r = c2.receive(11, 3, corr)
        assert int(r.error_code) == E.NOT_COORDINATOR


def test_deleting_a_topic_drops_its_committed_offsets(broker: BrokerProcess) -> None:
    """Kafka's coordinator removes a deleted topic's offsets (tombstones); other topics keep theirs."""
    with WireClient(broker.host, broker.port) as c:
        ensure_topics(c, "doomed")
        ensure_topics(c, "kept")
        commit = {
            "group_id": "dt",
            "generation_id_or_member_epoch": -1,
            "member_id": "",
            "topics": [
                {"name": t, "partitions": [{"partition_index": 0, "committed_offset": 7, "committed_metadata": "m"}]}
                for t in ("doomed", "kept")
            ],
        }
        assert all(int(p.error_code) == 0 for t in c.call(8, 8, commit).topics for p in t.partitions)

        def fetched() -> dict[str, int]:
            r = d(
                c.call(
                    9,
                    7,
                    {
                        "group_id": "dt",
                        "topics": [
                            {"name": "doomed", "partition_indexes": [0]},
                            {"name": "kept", "partition_indexes": [0]},
                        ],
                    },
                )
            )
            return {t["name"]: t["partitions"][0]["committed_offset"] for t in r["topics"]}

        assert fetched() == {"doomed": 7, "kept": 7}
        resp = d(c.call(20, 6, {"topics": [{"name": "doomed", "topic_id": None}], "timeout": 5000}))
        assert resp["responses"][0]["error_code"] == 0, resp
        assert fetched() == {"doomed": -1, "kept": 7}
