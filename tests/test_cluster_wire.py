"""Several brokers in one process, as raw frames (docs/cluster.md): who answers what, and the
errors a client gets from the wrong node."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from rallypoint.protocol import codec
from rallypoint.protocol.errors import ErrorCode as E
from rallypoint.protocol.offsets_schema import partition_for
from rallypoint.protocol.records import build_batch

from tests.support import BrokerProcess, WireClient

pytestmark = pytest.mark.wire


def d(msg: Any) -> dict[str, Any]:
    return codec.to_dict(msg)


@pytest.fixture
def b(broker_factory: Callable[..., BrokerProcess]) -> BrokerProcess:
    return broker_factory(config={"rallypoint.brokers": "3"})


def group_on(node: int, prefix: str = "g") -> str:
    return next(f"{prefix}{i}" for i in range(1000) if partition_for(f"{prefix}{i}", 50) % 3 + 1 == node)


def test_metadata_and_find_coordinator_name_every_node(b: BrokerProcess) -> None:
    node_ports = b.node_ports()
    assert sorted(node_ports) == [1, 2, 3] and len(set(node_ports.values())) == 3
    for port in node_ports.values():  # every node answers the same about the cluster
        with WireClient(b.host, port) as c:
            r = d(
                c.call(
                    19, 5, {"topics": [{"name": "mw", "num_partitions": 6, "replication_factor": 1}], "timeout": 5000}
                )
            )
            md = d(c.call(3, 12, {"topics": [{"name": "mw"}], "allow_auto_topic_creation": False}))
            assert {(x["node_id"], x["port"]) for x in md["brokers"]} == set(node_ports.items())
            leaders = [
                p["leader_id"] for p in sorted(md["topics"][0]["partitions"], key=lambda p: p["partition_index"])
            ]
            assert sorted(leaders) == [1, 1, 2, 2, 3, 3]
            assert all(leaders[i] % 3 + 1 == leaders[(i + 1) % 6] for i in range(6))  # round-robin
            # DescribeTopicPartitions names the same leader and replicas as Metadata, on every node
            body = {"topics": [{"name": "mw"}], "response_partition_limit": 100, "cursor": None}
            dtp = d(c.call(75, 0, body))["topics"][0]["partitions"]
            assert [(p["leader_id"], p["replica_nodes"], p["isr_nodes"]) for p in dtp] == [
                (leader, [leader], [leader]) for leader in leaders
            ]
            assert r["topics"][0]["error_code"] in (0, E.TOPIC_ALREADY_EXISTS)
            for want in (1, 2, 3):
                g = group_on(want)
                fc = d(c.call(10, 4, {"key_type": 0, "coordinator_keys": [g]}))["coordinators"][0]
                if fc["error_code"] == E.COORDINATOR_NOT_AVAILABLE:  # __consumer_offsets created now
                    fc = d(c.call(10, 4, {"key_type": 0, "coordinator_keys": [g]}))["coordinators"][0]
                assert (fc["error_code"], fc["node_id"], fc["port"]) == (0, want, node_ports[want])
            dc = d(c.call(60, 0, {"include_cluster_authorized_operations": False}))
            assert sorted(x["broker_id"] for x in dc["brokers"]) == [1, 2, 3]
            assert md["controller_id"] == dc["controller_id"] == 1


def test_group_requests_to_the_wrong_node_get_not_coordinator(b: BrokerProcess) -> None:
    node_ports = b.node_ports()
    home, away = group_on(2, "h"), group_on(3, "a")
    join = {
        "group_id": home,
        "session_timeout": 10000,
        "rebalance_timeout": 10000,
        "member_id": "",
        "group_instance_id": None,
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b""}],
        "reason": None,
    }
    with WireClient(b.host, node_ports[1]) as wrong, WireClient(b.host, node_ports[2]) as right:
        r = d(wrong.call(11, 9, join))
        assert (r["error_code"], r["member_id"]) == (E.NOT_COORDINATOR, "")
        assert d(right.call(11, 9, join))["error_code"] == E.MEMBER_ID_REQUIRED
        commit = {
            "group_id": home,
            "generation_id_or_member_epoch": -1,
            "member_id": "",
            "group_instance_id": None,
            "topics": [{"name": "x", "partitions": [{"partition_index": 0, "committed_offset": 1}]}],
        }
        r = d(wrong.call(8, 8, commit))
        assert r["topics"][0]["partitions"][0]["error_code"] == E.NOT_COORDINATOR
        # a DescribeGroups naming a group of this node and one of another: only that one refused
        r = d(right.call(15, 5, {"groups": [home, away], "include_authorized_operations": False}))
        codes = {g["group_id"]: g["error_code"] for g in r["groups"]}
        assert codes == {home: 0, away: E.NOT_COORDINATOR}
        assert [g["group_id"] for g in r["groups"]] == [home, away]  # request order
        # ListGroups: each node lists the groups it coordinates
        listed = {
            n: {g["group_id"] for g in d(c.call(16, 4, {"states_filter": []}))["groups"]}
            for n, c in ((1, wrong), (2, right))
        }
        assert home in listed[2] and home not in listed[1]


def test_data_requests_to_a_non_leader_get_not_leader_with_the_leader(b: BrokerProcess) -> None:
    node_ports = b.node_ports()
    with WireClient(b.host, node_ports[1]) as c:
        c.call(19, 5, {"topics": [{"name": "nl", "num_partitions": 3, "replication_factor": 1}], "timeout": 5000})
        md = d(c.call(3, 12, {"topics": [{"name": "nl"}], "allow_auto_topic_creation": False}))
        leader = {p["partition_index"]: p["leader_id"] for p in md["topics"][0]["partitions"]}
    p = next(p for p, n in leader.items() if n != 1)
    batch = build_batch(0, [(None, b"v")], int(time.time() * 1000))
    produce = {
        "transactional_id": None,
        "acks": -1,
        "timeout": 5000,
        "topic_data": [{"name": "nl", "partition_data": [{"index": p, "records": batch}]}],
    }
    with WireClient(b.host, node_ports[1]) as wrong:
        r = d(wrong.call(0, 10, produce))
        part = r["responses"][0]["partition_responses"][0]
        assert part["error_code"] == E.NOT_LEADER_OR_FOLLOWER
        assert part["current_leader"]["leader_id"] == leader[p]
        assert [(n["node_id"], n["port"]) for n in r["node_endpoints"]] == [(leader[p], node_ports[leader[p]])]
        lo = d(
            wrong.call(
                2,
                7,
                {
                    "replica_id": -1,
                    "isolation_level": 0,
                    "topics": [{"name": "nl", "partitions": [{"partition_index": p, "timestamp": -1}]}],
                },
            )
        )
        assert lo["topics"][0]["partitions"][0]["error_code"] == E.NOT_LEADER_OR_FOLLOWER
    with WireClient(b.host, node_ports[leader[p]]) as right:
        r = d(right.call(0, 10, produce))
        assert r["responses"][0]["partition_responses"][0]["error_code"] == 0


def test_advertised_listeners_per_node(broker_factory: Callable[..., BrokerProcess]) -> None:
    b = broker_factory(
        config={"rallypoint.brokers": "3", "rallypoint.advertised.listeners": "n1.test:9192,n2.test:9193,n3.test:9194"}
    )
    with WireClient(b.host, b.port) as c:
        md = d(c.call(3, 12, {"topics": [], "allow_auto_topic_creation": False}))
    assert sorted((x["node_id"], x["host"], x["port"]) for x in md["brokers"]) == [
        (1, "n1.test", 9192),
        (2, "n2.test", 9193),
        (3, "n3.test", 9194),
    ]


def test_fault_rules_and_the_request_log_by_node(broker_factory: Callable[..., BrokerProcess]) -> None:
    from tests.control_support import Control, control_url

    b = broker_factory(config={"rallypoint.brokers": "3"}, extra_args=["--control-port", "0"])
    control = Control(control_url(b))
    node_ports = b.node_ports()
    control.fault(api="ApiVersions", error="BROKER_NOT_AVAILABLE", node=2, count=None)
    body = {"client_software_name": "t", "client_software_version": "1"}
    for node in (1, 2, 3):
        with WireClient(b.host, node_ports[node]) as c:
            code = int(c.call(18, 3, body).error_code)
            assert code == (E.BROKER_NOT_AVAILABLE if node == 2 else 0), node
    assert {e["node"] for e in control.requests(api="ApiVersions")} == {1, 2, 3}
    [only] = control.requests(api="ApiVersions", node="2")
    assert only["errors"] == ["BROKER_NOT_AVAILABLE"]


def test_cluster_endpoints_refuse_bad_input_and_change_nothing(broker_factory: Callable[..., BrokerProcess]) -> None:
    from tests.control_support import Control, control_url

    b = broker_factory(config={"rallypoint.brokers": "3"}, extra_args=["--control-port", "0"])
    control = Control(control_url(b))
    with WireClient(b.host, b.port) as c:
        c.call(19, 5, {"topics": [{"name": "ce", "num_partitions": 1, "replication_factor": 1}], "timeout": 5000})
    before = control.get("/v1/brokers")
    cases = [
        ("/v1/brokers/9/stop", {}, 404),
        ("/v1/brokers/x/stop", {}, 400),
        ("/v1/brokers/2/stop", {"offline": "yes"}, 400),
        ("/v1/brokers/2/stop", {"nope": 1}, 400),
        ("/v1/brokers/2/start", {}, 409),  # running already
        ("/v1/partitions/ce/0/leader", {}, 400),
        ("/v1/partitions/ce/0/leader", {"node": 7}, 400),
        ("/v1/partitions/ce/5/leader", {"node": 2}, 404),
        ("/v1/partitions/nope/0/leader", {"node": 2}, 404),
        ("/v1/groups/g/coordinator", {"node": "2"}, 400),
    ]
    for path, body, status in cases:
        r = control.call("POST", path, body)
        assert r.status == status, (path, body, r.status, r.body)
        assert r.body and r.body.get("error"), (path, r.body)
    assert control.get("/v1/brokers") == before
    control.post("/v1/brokers/2/stop", {})
    control.post("/v1/brokers/3/stop", {})
    r = control.call("POST", "/v1/brokers/1/stop", {})
    assert r.status == 409 and "last" in r.body["error"]
    assert control.call("POST", "/v1/partitions/ce/0/leader", {"node": 2}).status == 409  # not running


def test_one_broker_refuses_cluster_moves(broker_factory: Callable[..., BrokerProcess]) -> None:
    from tests.control_support import Control, control_url

    b = broker_factory(extra_args=["--control-port", "0"])
    control = Control(control_url(b))
    assert [x["node"] for x in control.get("/v1/brokers")["brokers"]] == [1]
    r = control.call("POST", "/v1/groups/g/coordinator", {"node": 1})
    assert r.status == 400 and "--brokers" in r.body["error"]
    assert control.call("POST", "/v1/brokers/1/stop", {}).status == 400
