"""The cluster model (docs/cluster.md, "Leadership"): preferred leaders, moves, stopped and
offline nodes, endpoints."""

from __future__ import annotations

import pytest
from rallypoint.cluster import CURRENT_LISTENER, CURRENT_NODE, Cluster
from rallypoint.security.listeners import Listener, ListenerError, per_node

pytestmark = pytest.mark.unit


def test_preferred_leaders_are_round_robin_and_internal_topics_start_at_the_first_node() -> None:
    c = Cluster.of(1, 3)
    assert [c.leader("__consumer_offsets", p) for p in range(6)] == [1, 2, 3, 1, 2, 3]
    leaders = [c.leader("orders", p) for p in range(6)]
    assert sorted(leaders) == [1, 1, 2, 2, 3, 3]
    assert all(leaders[i] % 3 + 1 == leaders[i + 1] for i in range(5))
    assert Cluster.of(5, 1).leader("orders", 7) == 5


def test_moves_stops_and_offline_nodes() -> None:
    c = Cluster.of(1, 3)
    v = c.version
    c.move("orders", 0, 3)
    assert c.leader("orders", 0) == 3 and c.version > v
    c.stop(3)
    assert c.leader("orders", 0) == 1  # the next running node after 3, in node order
    assert c.leader("__consumer_offsets", 2) == 1
    c.start(3)
    assert c.leader("orders", 0) == 3
    c.stop(2, offline=True)
    assert c.leader("__consumer_offsets", 1) is None and c.group_coordinator(1) is None
    c.start(2)
    assert c.group_coordinator(1) == 2
    with pytest.raises(ValueError):
        c.move("orders", 0, 9)


def test_the_current_node_and_listener_pick_endpoints() -> None:
    c = Cluster.of(1, 2)
    c.endpoints = {1: {"A": ("h1", 1), "B": ("h1", 11)}, 2: {"A": ("h2", 2), "B": ("h2", 12)}}
    t1, t2 = CURRENT_NODE.set(2), CURRENT_LISTENER.set("B")
    try:
        assert c.current() == 2
        assert c.leads("__consumer_offsets", 1) and not c.leads("__consumer_offsets", 0)
        assert c.live_brokers() == [(1, "h1", 11), (2, "h2", 12)]
    finally:
        CURRENT_NODE.reset(t1)
        CURRENT_LISTENER.reset(t2)
    c.stop(1)
    assert c.live_brokers() == [(2, "h2", 2)]


def test_listeners_per_node() -> None:
    base = [Listener("PLAINTEXT", "PLAINTEXT", "0.0.0.0", 9092, "kafka", 19092), Listener("SSL", "SSL", "", 0)]
    out = per_node(base, [1, 2], "")
    assert [(x.name, x.port, x.advertised_port, x.node_id) for x in out] == [
        ("PLAINTEXT", 9092, 19092, 1),
        ("SSL", 0, None, 1),
        ("PLAINTEXT", 9093, 19093, 2),
        ("SSL", 0, None, 2),
    ]
    out = per_node(base[:1], [1, 2], "a:1, b:2")
    assert [(x.advertised_host, x.advertised_port) for x in out] == [("a", 1), ("b", 2)]
    with pytest.raises(ListenerError):
        per_node(base[:1], [1, 2], "a:1")
