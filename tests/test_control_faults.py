"""Fault rules: parsing (400s) and which request a rule applies to (coordinator/control/faults.py)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from rallypoint.control.faults import BadRequest, FaultRule, FaultTable
from rallypoint.control.shapes import Target
from rallypoint.protocol import codec
from rallypoint.protocol.errors import ErrorCode

pytestmark = pytest.mark.unit

HEARTBEAT, OFFSET_COMMIT, DESCRIBE_GROUPS, PRODUCE = 12, 8, 15, 0


def table(*rules: dict[str, Any]) -> FaultTable:
    t = FaultTable(node_id=1, namer=lambda _tid: None)
    for r in rules:
        t.add(r)
    return t


def heartbeat(group: str = "g") -> Any:
    return codec.build_request(HEARTBEAT, 4, {"group_id": group, "generation_id": 1, "member_id": "m"})


def commit(group: str = "g", topics: tuple[str, ...] = ("t",)) -> Any:
    body = {
        "group_id": group,
        "generation_id_or_member_epoch": 1,
        "member_id": "m",
        "topics": [{"name": t, "partitions": [{"partition_index": 0, "committed_offset": 1}]} for t in topics],
    }
    return codec.build_request(OFFSET_COMMIT, 8, body)


def hb(t: FaultTable, client: str | None = "c", version: int = 4, group: str = "g") -> int | None:
    hit = t.match(HEARTBEAT, version, client, heartbeat(group))
    return hit.rule.id if hit is not None else None


# ------------------------------------------------------------------------------- parsing


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ([], "JSON object"),
        ({"error": "NOT_COORDINATOR"}, "api is required"),
        ({"api": "NoSuchApi", "error": 16}, "unknown or unserved API"),
        ({"api": 1000, "error": 16}, "not served"),
        ({"api": True, "error": 16}, "API name or key"),
        ({"api": "Heartbeat", "error": "NOT_AN_ERROR"}, "unknown error name"),
        ({"api": "Heartbeat", "error": 99999}, "unknown error code"),
        ({"api": "Heartbeat", "error": "NONE"}, "NONE is not an error"),
        ({"api": "Heartbeat"}, "give error, delay_ms or action"),
        ({"api": "Heartbeat", "error": 16, "action": "explode"}, "action must be one of"),
        ({"api": "Heartbeat", "action": "error"}, "needs an error"),
        ({"api": "Heartbeat", "error": 16, "action": "hold"}, "only for action error"),
        ({"api": "Heartbeat", "error": 16, "count": 0}, "count must be in"),
        ({"api": "Heartbeat", "error": 16, "count": "2"}, "count must be an integer"),
        ({"api": "Heartbeat", "error": 16, "count": 1.5}, "count must be an integer"),
        ({"api": "Heartbeat", "error": 16, "versions": [3]}, "versions must be"),
        ({"api": "Heartbeat", "error": 16, "versions": [4, 2]}, "min <= max"),
        ({"api": "Heartbeat", "error": 16, "probability": 1.5}, "probability must be in"),
        ({"api": "Heartbeat", "error": 16, "probability": "x"}, "probability must be a number"),
        ({"api": "Heartbeat", "error": 16, "delay_ms": -1}, "delay_ms must be in"),
        ({"api": "Heartbeat", "error": 16, "group": 5}, "group must be a string"),
        ({"api": "Heartbeat", "error": 16, "colour": "red"}, "unknown field(s): colour"),
    ],
)
def test_bad_rules_are_refused_with_a_message(body: object, message: str) -> None:
    t = table()
    with pytest.raises(BadRequest, match=message.replace("(", r"\(").replace(")", r"\)")):
        t.add(body)
    assert t.rules == {} and t.live == 0  # nothing changed


def test_defaults_and_names() -> None:
    r = FaultRule.parse(1, {"api": "offsetcommit", "error": 16})
    assert (r.api_key, r.action, r.error, r.count, r.after, r.probability) == (
        8,
        "error",
        ErrorCode.NOT_COORDINATOR,
        1,
        0,
        1.0,
    )
    assert FaultRule.parse(2, {"api": 12, "delay_ms": 500}).action == "delay"
    assert FaultRule.parse(3, {"api": "Heartbeat", "error": "rebalance_in_progress"}).error == 27
    assert FaultRule.parse(4, {"api": "Fetch", "action": "disconnect"}).action == "disconnect"
    assert FaultRule.parse(5, {"api": "Fetch", "error": 6, "count": None}).count is None
    j = FaultRule.parse(6, {"api": "Heartbeat", "error": 27}).to_json()
    assert (j["api"], j["error"], j["hits"], j["remaining"]) == ("Heartbeat", "REBALANCE_IN_PROGRESS", 0, 1)


# ------------------------------------------------------------------------------- matching


def test_count_is_used_up_and_the_rule_stays_listed() -> None:
    t = table({"api": "Heartbeat", "error": 27, "count": 2})
    assert [hb(t) for _ in range(4)] == [1, 1, None, None]
    rule = t.rules[1]
    assert (rule.hits, rule.remaining, t.live) == (2, 0, 0)
    assert rule.to_json()["remaining"] == 0


def test_count_null_lasts_until_deleted() -> None:
    t = table({"api": "Heartbeat", "error": 27, "count": None})
    assert [hb(t) for _ in range(50)] == [1] * 50
    assert t.rules[1].remaining is None
    t.delete(1)
    assert hb(t) is None


def test_after_lets_the_first_matches_pass_and_they_are_not_hits() -> None:
    t = table({"api": "Heartbeat", "error": 27, "after": 3, "count": 2})
    assert [hb(t) for _ in range(7)] == [None, None, None, 1, 1, None, None]
    assert t.rules[1].hits == 2


def test_first_rule_in_creation_order_applies_and_a_passing_rule_leaves_it_to_the_next() -> None:
    t = table(
        {"api": "Heartbeat", "error": 27, "after": 1},
        {"api": "Heartbeat", "error": 25, "count": None},
    )
    # the first heartbeat passes rule 1 (after) and is taken by rule 2; then rule 1, then rule 2
    assert [hb(t) for _ in range(3)] == [2, 1, 2]


def test_probability_with_a_seed_is_reproducible() -> None:
    def run(seed: int) -> list[int | None]:
        t = table({"api": "Heartbeat", "error": 27, "count": None, "probability": 0.3, "seed": seed})
        return [hb(t) for _ in range(200)]

    a, b, c = run(7), run(7), run(8)
    assert a == b and a != c
    assert 30 <= sum(1 for x in a if x) <= 90
    never = table({"api": "Heartbeat", "error": 27, "count": None, "probability": 0.0})
    assert all(hb(never) is None for _ in range(50))


def test_filters_client_versions_node() -> None:
    t = table({"api": "Heartbeat", "error": 27, "count": None, "client_id": "a", "versions": [3, 4], "node": 1})
    assert hb(t, client="a", version=4) == 1
    assert hb(t, client="b", version=4) is None
    assert hb(t, client=None, version=4) is None
    assert hb(t, client="a", version=2) is None
    other_node = table({"api": "Heartbeat", "error": 27, "node": 2})
    assert hb(other_node) is None
    assert t.match(OFFSET_COMMIT, 8, "a", commit()) is None  # another API


def test_group_rule_on_a_request_about_that_group_applies_to_all_of_it() -> None:
    t = table({"api": "Heartbeat", "error": 27, "count": None, "group": "g1"})
    assert hb(t, group="g2") is None
    hit = t.match(HEARTBEAT, 4, "c", heartbeat("g1"))
    assert hit is not None and hit.target is None


def test_group_rule_on_a_multi_group_request_targets_that_entry() -> None:
    t = table({"api": "DescribeGroups", "error": 16, "count": None, "group": "b"})
    req = codec.build_request(DESCRIBE_GROUPS, 5, {"groups": ["a", "b"]})
    hit = t.match(DESCRIBE_GROUPS, 5, "c", req)
    assert hit is not None and hit.target == Target(frozenset({"b"}), None)
    assert t.match(DESCRIBE_GROUPS, 5, "c", codec.build_request(DESCRIBE_GROUPS, 5, {"groups": ["a"]})) is None


def test_topic_rule_targets_that_topics_partitions() -> None:
    t = table({"api": "OffsetCommit", "error": 3, "count": None, "topic": "x"})
    assert t.match(OFFSET_COMMIT, 8, "c", commit(topics=("y",))) is None
    hit = t.match(OFFSET_COMMIT, 8, "c", commit(topics=("x", "y")))
    assert hit is not None and hit.target == Target(None, frozenset({"x"}))
    both = table({"api": "OffsetCommit", "error": 3, "group": "g", "topic": "x"})
    assert both.match(OFFSET_COMMIT, 8, "c", commit(group="h", topics=("x",))) is None
    hit = both.match(OFFSET_COMMIT, 8, "c", commit(group="g", topics=("x",)))
    assert hit is not None and hit.target == Target(None, frozenset({"x"}))


def test_topic_rule_finds_topics_named_by_id() -> None:
    tid = uuid.uuid4()
    t = FaultTable(1, lambda x: "x" if x == tid else None)
    t.add({"api": "Produce", "error": 6})
    t.add({"api": "Produce", "error": 6, "topic": "x"})
    t.delete(1)
    body = {"acks": -1, "timeout": 1000, "topic_data": [{"topic_id": tid, "partition_data": [{"index": 0}]}]}
    hit = t.match(PRODUCE, 13, "c", codec.build_request(PRODUCE, 13, body))
    assert hit is not None and hit.rule.id == 2


async def test_hold_parks_until_released_and_keeps_holding_new_matches() -> None:
    t = table({"api": "Heartbeat", "action": "hold", "count": None})
    rule = t.rules[1]
    first = asyncio.create_task(rule.park())
    second = asyncio.create_task(rule.park())
    await asyncio.sleep(0.01)
    assert rule.parked == 2 and not first.done()
    assert rule.release() == 2
    await asyncio.wait_for(asyncio.gather(first, second), 1)
    third = asyncio.create_task(rule.park())
    await asyncio.sleep(0.01)
    assert not third.done() and rule.parked == 1
    t.delete(1)  # deleting a rule lets its parked requests go
    await asyncio.wait_for(third, 1)
