"""Server assignors ``uniform`` and ``range`` (docs/consumer-groups.md, "Assignors")."""

from __future__ import annotations

import time
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rallypoint.groups.assignors import GroupSpec, MemberSpec, RangeAssignor, UniformAssignor, range_order

pytestmark = pytest.mark.unit

T1 = uuid.UUID(int=1)
T2 = uuid.UUID(int=2)
T3 = uuid.UUID(int=3)


def spec(members: dict[str, set[uuid.UUID]], parts: dict[uuid.UUID, int], current=None, static=None) -> GroupSpec:
    current = current or {}
    static = static or {}
    ms = {
        m: MemberSpec(m, static.get(m), None, frozenset(subs), {t: frozenset(p) for t, p in current.get(m, {}).items()})
        for m, subs in members.items()
    }
    homogeneous = len({frozenset(s) for s in members.values()}) <= 1
    return GroupSpec(ms, homogeneous, parts)


def flat(a: dict) -> list[tuple[uuid.UUID, int]]:
    return [(t, p) for t, ps in a.items() for p in ps]


def check_valid(s: GroupSpec, result: dict) -> None:
    seen = [tp for a in result.values() for tp in flat(a)]
    assert len(seen) == len(set(seen)), "a partition assigned twice"
    subscribed = {
        (t, p) for m in s.members.values() for t in m.subscribed if t in s.partitions for p in range(s.partitions[t])
    }
    assert set(seen) == subscribed, "not every subscribed partition assigned"
    for mid, a in result.items():
        assert set(a) <= s.members[mid].subscribed, "a member got a topic it does not subscribe to"


# ------------------------------------------------------------------------------- uniform


def test_uniform_homogeneous_balanced_and_sticky() -> None:
    s = spec({"a": {T1}, "b": {T1}, "c": {T1}}, {T1: 6})
    r = UniformAssignor().assign(s)
    check_valid(s, r)
    assert sorted(len(flat(a)) for a in r.values()) == [2, 2, 2]
    # c leaves: a and b keep what they had and take c's
    s2 = spec({"a": {T1}, "b": {T1}}, {T1: 6}, current={"a": r["a"], "b": r["b"]})
    r2 = UniformAssignor().assign(s2)
    check_valid(s2, r2)
    assert set(flat(r["a"])) <= set(flat(r2["a"])) and set(flat(r["b"])) <= set(flat(r2["b"]))
    # a new member takes only what balance requires
    s3 = spec({"a": {T1}, "b": {T1}, "d": {T1}}, {T1: 6}, current={"a": r2["a"], "b": r2["b"]})
    r3 = UniformAssignor().assign(s3)
    assert len(set(flat(r2["a"])) & set(flat(r3["a"]))) == 2 and len(set(flat(r2["b"])) & set(flat(r3["b"]))) == 2


def test_uniform_heterogeneous() -> None:
    s = spec({"a": {T1, T2}, "b": {T1}, "c": {T3}}, {T1: 4, T2: 4, T3: 1})
    r = UniformAssignor().assign(s)
    check_valid(s, r)
    assert len(flat(r["a"])) in (4, 5) and len(flat(r["b"])) in (3, 4)
    assert flat(r["c"]) == [(T3, 0)]


def test_uniform_drops_unsubscribed_and_missing_topics() -> None:
    s = spec({"a": {T1}, "b": {T1, T2}}, {T1: 2, T2: 2}, current={"a": {T2: {0, 1}, T3: {0}}})
    r = UniformAssignor().assign(s)
    check_valid(s, r)


# --------------------------------------------------------------------------------- range


def test_range_contiguous_with_extra_to_the_first() -> None:
    s = spec({"a": {T1}, "b": {T1}, "c": {T1}}, {T1: 7})
    r = RangeAssignor().assign(s)
    assert r["a"] == {T1: frozenset({0, 1, 2})}
    assert r["b"] == {T1: frozenset({3, 4})}
    assert r["c"] == {T1: frozenset({5, 6})}


def test_range_co_partitions_and_orders_static_first() -> None:
    s = spec(
        {"dyn": {T1, T2}, "s-b": {T1, T2}, "s-a": {T1, T2}},
        {T1: 3, T2: 3},
        static={"s-b": "i-1", "s-a": "i-2"},
    )
    assert range_order(s.members) == ["s-b", "s-a", "dyn"]
    r = RangeAssignor().assign(s)
    assert r["s-b"] == {T1: frozenset({0}), T2: frozenset({0})}
    assert r["s-a"] == {T1: frozenset({1}), T2: frozenset({1})}
    assert r["dyn"] == {T1: frozenset({2}), T2: frozenset({2})}


def test_range_heterogeneous_counts_subscribers_per_topic() -> None:
    s = spec({"a": {T1, T2}, "b": {T1}}, {T1: 3, T2: 3}, static={"a": "1", "b": "2"})
    r = RangeAssignor().assign(s)
    assert r["a"] == {T1: frozenset({0, 1}), T2: frozenset({0, 1, 2})}
    assert r["b"] == {T1: frozenset({2})}


# ---------------------------------------------------------------------------- properties

topic_ids = st.sampled_from([T1, T2, T3])


@st.composite
def group_specs(draw: st.DrawFn) -> GroupSpec:
    parts = {t: draw(st.integers(1, 8)) for t in draw(st.sets(topic_ids, min_size=1))}
    n = draw(st.integers(1, 6))
    homogeneous = draw(st.booleans())
    common = draw(st.sets(topic_ids, min_size=1))
    members = {}
    current = {}
    for i in range(n):
        subs = common if homogeneous else draw(st.sets(topic_ids, min_size=1))
        members[f"m{i}"] = subs
        current[f"m{i}"] = {
            t: set(draw(st.sets(st.integers(0, 9), max_size=4))) for t in draw(st.sets(topic_ids, max_size=2))
        }
    return spec(members, parts, current=current)


@given(group_specs())
@settings(max_examples=300, deadline=None)
def test_uniform_property(s: GroupSpec) -> None:
    r = UniformAssignor().assign(s)
    check_valid(s, r)
    if s.homogeneous:
        sizes = [len(flat(r.get(m, {}))) for m in s.members]
        assert max(sizes) - min(sizes) <= 1
        # a balanced result assigned again is unchanged (sticky)
        again = UniformAssignor().assign(
            GroupSpec(
                {m: MemberSpec(m, None, None, ms.subscribed, r.get(m, {})) for m, ms in s.members.items()},
                True,
                s.partitions,
            )
        )
        assert again == r


@given(group_specs())
@settings(max_examples=300, deadline=None)
def test_range_property(s: GroupSpec) -> None:
    r = RangeAssignor().assign(s)
    check_valid(s, r)
    for a in r.values():
        for ps in a.values():
            assert sorted(ps) == list(range(min(ps), max(ps) + 1)), "ranges are contiguous"


def test_uniform_1000_members_1000_partitions_is_fast() -> None:
    members = {f"m{i:04d}": {T1} for i in range(1000)}
    s = spec(members, {T1: 1000})
    t0 = time.perf_counter()
    r = UniformAssignor().assign(s)
    assert time.perf_counter() - t0 < 5.0
    assert all(len(flat(a)) == 1 for a in r.values())
