"""ConsumerGroupHeartbeat / ConsumerGroupDescribe and the group APIs' answers for consumer groups,
as raw frames over a real socket (docs/consumer-groups.md)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from rallypoint.protocol import codec
from rallypoint.protocol.errors import ErrorCode as E

from tests.support import BrokerProcess, WireClient

pytestmark = pytest.mark.wire

FAST = {
    "group.consumer.heartbeat.interval.ms": "300",
    "group.consumer.min.heartbeat.interval.ms": "100",
    "group.consumer.session.timeout.ms": "6000",
    "group.consumer.min.session.timeout.ms": "1000",
    "group.consumer.assignment.interval.ms": "0",
}


def d(msg: Any) -> dict[str, Any]:
    return codec.to_dict(msg)


@pytest.fixture
def b(broker_factory: Callable[..., BrokerProcess]) -> BrokerProcess:
    return broker_factory(config=dict(FAST))


def make_topic(c: WireClient, name: str, partitions: int = 3) -> uuid.UUID:
    r = d(
        c.call(
            19, 5, {"topics": [{"name": name, "num_partitions": partitions, "replication_factor": 1}], "timeout": 5000}
        )
    )
    assert r["topics"][0]["error_code"] == 0, r
    md = d(c.call(3, 12, {"topics": [{"name": name}], "allow_auto_topic_creation": False}))
    tid = md["topics"][0]["topic_id"]
    return tid if isinstance(tid, uuid.UUID) else uuid.UUID(str(tid))


def join(c: WireClient, group: str, member: str, topics: list[str], **kw: Any) -> dict[str, Any]:
    body = {
        "group_id": group,
        "member_id": member,
        "member_epoch": 0,
        "rebalance_timeout": 30000,
        "subscribed_topic_names": topics,
        "subscribed_topic_regex": "",
        "topic_partitions": [],
        **kw,
    }
    return d(c.call(68, 1, body))


def test_advertised_versions(b: BrokerProcess) -> None:
    with WireClient(b.host, b.port) as c:
        r = d(c.call(18, 3, {"client_software_name": "t", "client_software_version": "1"}))
        keys = {a["api_key"]: (a["min_version"], a["max_version"]) for a in r["api_keys"]}
        assert keys[68] == (0, 1) and keys[69] == (0, 1)


def test_heartbeat_join_assignment_and_leave(b: BrokerProcess) -> None:
    with WireClient(b.host, b.port) as c:
        tid = make_topic(c, "w1", 3)
        r = join(c, "wg", "m1", ["w1"])
        assert r["error_code"] == 0 and r["member_id"] == "m1" and r["member_epoch"] == 2
        assert r["heartbeat_interval"] == 300
        assert r["assignment"]["topic_partitions"] == [{"topic_id": tid, "partitions": [0, 1, 2]}]
        steady = d(c.call(68, 1, {"group_id": "wg", "member_id": "m1", "member_epoch": 2, "rebalance_timeout": -1}))
        assert steady["error_code"] == 0 and steady["assignment"] is None
        bad = join(c, "wg", "", ["w1"])
        assert (bad["error_code"], bad["error_message"]) == (E.INVALID_REQUEST, "MemberId can't be empty.")
        unsupported = join(c, "wg", "m2", ["w1"], server_assignor="sticky")
        assert unsupported["error_code"] == E.UNSUPPORTED_ASSIGNOR
        rx = join(c, "wg", "m3", [], subscribed_topic_regex="(unclosed")
        assert rx["error_code"] == E.INVALID_REGULAR_EXPRESSION
        left = d(c.call(68, 1, {"group_id": "wg", "member_id": "m1", "member_epoch": -1, "rebalance_timeout": -1}))
        assert (left["error_code"], left["member_id"], left["member_epoch"]) == (0, "m1", -1)


def test_describe_list_and_classic_apis_on_a_consumer_group(b: BrokerProcess) -> None:
    with WireClient(b.host, b.port) as c:
        tid = make_topic(c, "w2", 2)
        assert join(c, "cg", "m1", ["w2"], instance_id="i1", rack_id="r")["member_epoch"] == 2
        r = d(c.call(69, 1, {"group_ids": ["cg", "missing"], "include_authorized_operations": True}))
        g, missing = r["groups"]
        assert (g["error_code"], g["group_state"], g["group_epoch"], g["assignment_epoch"]) == (0, "Stable", 2, 2)
        assert g["assignor_name"] == "uniform" and g["authorized_operations"] != -2147483648
        (m,) = g["members"]
        assert (m["member_id"], m["instance_id"], m["rack_id"], m["member_epoch"], m["member_type"]) == (
            "m1",
            "i1",
            "r",
            2,
            1,
        )
        assert m["client_host"] == "/127.0.0.1" and m["subscribed_topic_names"] == ["w2"]
        assert m["assignment"]["topic_partitions"] == [{"topic_id": tid, "topic_name": "w2", "partitions": [0, 1]}]
        assert m["target_assignment"] == m["assignment"]
        assert missing["error_code"] == E.GROUP_ID_NOT_FOUND
        # DescribeGroups: not a classic group
        v5 = d(c.call(15, 5, {"groups": ["cg"]}))["groups"][0]
        assert (v5["error_code"], v5["group_state"], v5["members"]) == (0, "Dead", [])
        v6 = d(c.call(15, 6, {"groups": ["cg"]}))["groups"][0]
        assert (v6["error_code"], v6["group_state"]) == (E.GROUP_ID_NOT_FOUND, "Dead")
        # ListGroups v5 with the type filter
        lg = d(c.call(16, 5, {"states_filter": [], "types_filter": ["consumer"]}))
        assert [(x["group_id"], x["protocol_type"], x["group_state"], x["group_type"]) for x in lg["groups"]] == [
            ("cg", "consumer", "Stable", "consumer")
        ]
        assert d(c.call(16, 5, {"states_filter": [], "types_filter": ["classic"]}))["groups"] == []
        # DeleteGroups: not while it has members
        dg = d(c.call(42, 2, {"groups_names": ["cg"]}))
        assert dg["results"] == [{"group_id": "cg", "error_code": E.NON_EMPTY_GROUP}]


def test_offset_commit_and_fetch_member_checks(b: BrokerProcess) -> None:
    with WireClient(b.host, b.port) as c:
        make_topic(c, "w3", 1)
        join(c, "og", "m1", ["w3"])

        def commit(version: int, epoch: int, member: str = "m1") -> int:
            body = {
                "group_id": "og",
                "generation_id_or_member_epoch": epoch,
                "member_id": member,
                "topics": [{"name": "w3", "partitions": [{"partition_index": 0, "committed_offset": 5}]}],
            }
            return int(d(c.call(8, version, body))["topics"][0]["partitions"][0]["error_code"])

        assert commit(8, 2) == E.UNSUPPORTED_VERSION
        assert commit(9, 3) == E.STALE_MEMBER_EPOCH
        assert commit(9, 2, "nobody") == E.UNKNOWN_MEMBER_ID
        assert commit(9, 2) == 0

        def fetch(member: str | None, epoch: int) -> dict[str, Any]:
            body = {
                "groups": [{"group_id": "og", "member_id": member, "member_epoch": epoch, "topics": None}],
                "require_stable": True,
            }
            return d(c.call(9, 9, body))["groups"][0]

        ok = fetch(None, -1)
        assert ok["error_code"] == 0 and ok["topics"][0]["partitions"][0]["committed_offset"] == 5
        assert fetch("m1", 2)["error_code"] == 0
        assert fetch("m1", 1)["error_code"] == E.STALE_MEMBER_EPOCH
        assert fetch("zz", 2)["error_code"] == E.UNKNOWN_MEMBER_ID
        # ListGroups shows the consumer group once (not its offsets-only classic entry)
        lg = d(c.call(16, 5, {"states_filter": [], "types_filter": []}))
        assert [(x["group_id"], x["group_type"]) for x in lg["groups"]] == [("og", "consumer")]
        # once empty it can be deleted, offsets included
        d(c.call(68, 1, {"group_id": "og", "member_id": "m1", "member_epoch": -1, "rebalance_timeout": -1}))
        assert d(c.call(42, 2, {"groups_names": ["og"]}))["results"] == [{"group_id": "og", "error_code": 0}]
        gone = fetch(None, -1)
        assert gone["topics"] == [] or gone["topics"][0]["partitions"][0]["committed_offset"] == -1
        assert d(c.call(69, 0, {"group_ids": ["og"]}))["groups"][0]["error_code"] == E.GROUP_ID_NOT_FOUND


def test_consumer_group_describe_of_a_classic_group_is_not_found(b: BrokerProcess) -> None:
    from tests.test_groups_wire import join_stable

    with WireClient(b.host, b.port) as c:
        join_stable(c, "classic-g")
        r = d(c.call(69, 0, {"group_ids": ["classic-g"]}))["groups"][0]
        assert r["error_code"] == E.GROUP_ID_NOT_FOUND
        # a consumer heartbeat cannot take over a live classic group whose assignment is not a
        # ConsumerProtocol assignment (Kafka's fromClassicGroup fails: GROUP_ID_NOT_FOUND)
        assert join(c, "classic-g", "m", [])["error_code"] == E.GROUP_ID_NOT_FOUND


def test_online_upgrade_of_a_live_classic_group(b: BrokerProcess) -> None:
    """A consumer-protocol join into a Stable classic group (docs/consumer-groups.md, "Classic
    groups"): the group becomes a consumer group at the classic generation, the classic member
    stays (STABLE, its partitions), the joiner bumps the epoch; the classic member is told to
    rejoin; after a restart the log replays the consumer group, not the classic one."""
    from rallypoint.protocol.consumer_protocol import (
        Assignment,
        Subscription,
        TopicPartitions,
        encode_assignment,
        encode_subscription,
    )

    with WireClient(b.host, b.port) as c:
        make_topic(c, "up-t", 4)
        sub = encode_subscription(Subscription(1, ("up-t",)))
        body = {
            "group_id": "up-g",
            "session_timeout": 10_000,
            "rebalance_timeout": 10_000,
            "member_id": "",
            "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": sub}],
        }
        r = d(c.call(11, 5, body))
        body["member_id"] = r["member_id"]
        r = d(c.call(11, 5, body))
        classic_id, generation = r["member_id"], r["generation_id"]
        everything = encode_assignment(Assignment(1, (TopicPartitions("up-t", (0, 1, 2, 3)),)))
        s = d(
            c.call(
                14,
                3,
                {
                    "group_id": "up-g",
                    "generation_id": generation,
                    "member_id": classic_id,
                    "assignments": [{"member_id": classic_id, "assignment": everything}],
                },
            )
        )
        assert s["error_code"] == 0
        new_id = str(uuid.uuid4())
        h = join(c, "up-g", new_id, ["up-t"])
        assert h["error_code"] == 0, h
        assert h["member_epoch"] == generation + 1  # the upgrade kept the generation; the join bumped it
        described = d(c.call(69, 0, {"group_ids": ["up-g"]}))["groups"][0]
        assert described["error_code"] == 0 and described["group_epoch"] == generation + 1
        assert {m["member_id"] for m in described["members"]} == {classic_id, new_id}
        # the classic member must rejoin to give partitions up
        hb = d(c.call(12, 3, {"group_id": "up-g", "generation_id": generation, "member_id": classic_id}))
        assert hb["error_code"] == E.REBALANCE_IN_PROGRESS
        listed = d(c.call(16, 5, {"states_filter": [], "types_filter": []}))["groups"]
        assert [g["group_type"] for g in listed if g["group_id"] == "up-g"] == ["consumer"]
    assert len(b.events("consumer_group.upgraded")) == 1
    b.restart()
    with WireClient(b.host, b.port) as c:
        described = d(c.call(69, 0, {"group_ids": ["up-g"]}))["groups"][0]
        assert described["error_code"] == 0 and described["group_epoch"] == generation + 1
        assert len(described["members"]) == 2
        # DescribeGroups answers for a consumer group as Kafka does (Dead, no members), not with
        # the classic group the log held before the upgrade
        classic = d(c.call(15, 5, {"groups": ["up-g"]}))["groups"][0]
        assert (classic["error_code"], classic["group_state"], classic["members"]) == (0, "Dead", [])


def test_a_groups_own_heartbeat_interval_set_through_incremental_alter_configs(b: BrokerProcess) -> None:
    """IncrementalAlterConfigs on resource type GROUP (32) sets consumer.heartbeat.interval.ms
    for that group only: its next heartbeat answer carries it; other groups keep the broker's."""
    with WireClient(b.host, b.port) as c:
        make_topic(c, "gc", 1)
        alter = {
            "resources": [
                {
                    "resource_type": 32,
                    "resource_name": "tuned",
                    "configs": [{"name": "consumer.heartbeat.interval.ms", "config_operation": 0, "value": "200"}],
                }
            ],
            "validate_only": False,
        }
        r = d(c.call(44, 1, alter))
        assert r["responses"][0]["error_code"] == 0, r
        assert join(c, "tuned", "m1", ["gc"])["heartbeat_interval"] == 200
        assert join(c, "other", "m2", ["gc"])["heartbeat_interval"] == 300


def test_offset_commit_and_fetch_v10_name_topics_by_id(b: BrokerProcess) -> None:
    """OffsetCommit/OffsetFetch v10 (topic ids instead of names): known ids are committed and
    fetched, echoing the id; an unknown id gets UNKNOWN_TOPIC_ID; a fetch-all answer carries each
    topic's id; the id is stored with the offset (value v4) and checked after a restart."""
    with WireClient(b.host, b.port) as c:
        tid = make_topic(c, "v10-t", 2)
        ghost = uuid.uuid4()
        r = d(
            c.call(
                8,
                10,
                {
                    "group_id": "v10-g",
                    "generation_id_or_member_epoch": -1,
                    "member_id": "",
                    "topics": [
                        {"topic_id": tid, "partitions": [{"partition_index": 0, "committed_offset": 7}]},
                        {"topic_id": ghost, "partitions": [{"partition_index": 3, "committed_offset": 1}]},
                    ],
                },
            )
        )
        assert [
            (t["topic_id"], [(p["partition_index"], p["error_code"]) for p in t["partitions"]]) for t in r["topics"]
        ] == [
            (ghost, [(3, E.UNKNOWN_TOPIC_ID)]),  # errors found before the coordinator come first
            (tid, [(0, 0)]),
        ]

        def fetch(topics: Any) -> list[Any]:
            body = {"groups": [{"group_id": "v10-g", "topics": topics}], "require_stable": False}
            return d(c.call(9, 10, body))["groups"][0]["topics"]

        got = fetch([{"topic_id": ghost, "partition_indexes": [0]}, {"topic_id": tid, "partition_indexes": [0, 1]}])
        assert [(t["topic_id"], [(p["committed_offset"], p["error_code"]) for p in t["partitions"]]) for t in got] == [
            (ghost, [(-1, E.UNKNOWN_TOPIC_ID)]),
            (tid, [(7, 0), (-1, 0)]),
        ]
        assert [(t["topic_id"], len(t["partitions"])) for t in fetch(None)] == [(tid, 1)]
        # v9 still names topics and sees the same offset
        v9 = d(c.call(9, 9, {"groups": [{"group_id": "v10-g", "topics": None}], "require_stable": False}))
        assert v9["groups"][0]["topics"][0]["name"] == "v10-t"
    b.restart()
    with WireClient(b.host, b.port) as c:
        body = {"groups": [{"group_id": "v10-g", "topics": [{"topic_id": tid, "partition_indexes": [0]}]}]}
        [t] = d(c.call(9, 10, body))["groups"][0]["topics"]
        assert t["partitions"][0]["committed_offset"] == 7
