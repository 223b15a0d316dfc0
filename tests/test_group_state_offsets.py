"""Offsets in the group coordinator (docs/groups.md: "OffsetCommit", "OffsetFetch", "OffsetDelete",
"Offsets retention", "Records written"), loading ("Loading and unloading") and while-loading answers
("Request pre-checks")."""

from __future__ import annotations

import sys

import pytest
from rallypoint.groups.events import DeleteGroupsResult, OffsetDeleteRequest
from rallypoint.groups.model import GroupConfig, GroupState
from rallypoint.protocol.errors import ErrorCode
from rallypoint.protocol.offsets_schema import (
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadata,
    OffsetCommitKey,
    OffsetCommitValue,
    partition_for,
)

from tests.group_harness import Harness, meta_for

pytestmark = pytest.mark.unit

E = ErrorCode
S = GroupState
DAY = 24 * 3600 * 1000


def h(**cfg: int) -> Harness:
    return Harness(GroupConfig(**cfg))


# --------------------------------------------------------------------- OffsetCommit


def test_generation_minus_one_on_a_missing_group_creates_a_simple_group() -> None:
    x = h()
    t = x.commit("simple", {("t", 0): 42, ("t", 1): 7}, metadata="m")
    assert x.commit_errors(t) == {("t", 0): E.NONE, ("t", 1): E.NONE}
    g = x.m.groups["simple"]
    assert g.state == S.EMPTY and g.protocol_type is None
    assert x.fetched(x.fetch("simple", {"t": [0, 1, 2]})) == {
        ("t", 0): (42, "m", E.NONE),
        ("t", 1): (7, "m", E.NONE),
        ("t", 2): (-1, "", E.NONE),
    }
    (batch,) = [p for p in x.persisted if p.records and isinstance(p.records[0][0], OffsetCommitKey)]
    assert len(batch.records) == 2  # one batch per request
    assert batch.partition == partition_for("simple", 50)
    key, value = batch.records[0]
    assert key == OffsetCommitKey("simple", "t", 0)
    assert isinstance(value, OffsetCommitValue)
    assert (value.offset, value.metadata, value.commit_timestamp, value.expire_timestamp) == (42, "m", x.now, None)


def test_missing_group_with_a_generation_is_illegal_generation_before_v9() -> None:
    x = h()
    assert set(x.commit_errors(x.commit("g", {("t", 0): 1}, generation=3, member_id="m", version=8)).values()) == {
        E.ILLEGAL_GENERATION
    }
    assert set(x.commit_errors(x.commit("g", {("t", 0): 1}, generation=3, member_id="m", version=9)).values()) == {
        E.GROUP_ID_NOT_FOUND
    }
    assert "g" not in x.m.groups


def test_commit_validation_against_the_member_and_generation() -> None:
    x = h()
    _ids, leader, gen = x.stable_group(2)
    ok = x.commit("g", {("t", 0): 1}, generation=gen, member_id=leader)
    assert x.commit_errors(ok) == {("t", 0): E.NONE}
    bad_gen = x.commit("g", {("t", 0): 1}, generation=gen + 1, member_id=leader)
    assert x.commit_errors(bad_gen) == {("t", 0): E.ILLEGAL_GENERATION}
    stranger = x.commit("g", {("t", 0): 1}, generation=gen, member_id="stranger")
    assert x.commit_errors(stranger) == {("t", 0): E.UNKNOWN_MEMBER_ID}
    anonymous = x.commit("g", {("t", 0): 1})  # gen -1, no member: only on Empty groups
    assert x.commit_errors(anonymous) == {("t", 0): E.UNKNOWN_MEMBER_ID}


def test_completing_rebalance_refuses_preparing_rebalance_accepts_the_old_generation() -> None:
    x = h()
    ids, leader, gen = x.stable_group(2, session=10_000)
    x.join(member_id=leader)  # -> PreparingRebalance, the generation is still `gen`
    follower = ids[1]
    x.advance(9_000)
    t = x.commit("g", {("t", 0): 5}, generation=gen, member_id=follower)
    assert x.commit_errors(t) == {("t", 0): E.NONE}
    x.advance(9_000)  # the commit refreshed the follower's session
    assert follower in x.m.groups["g"].members
    x.join(member_id=follower)  # everybody joined: CompletingRebalance, generation gen+1
    assert x.state() == S.COMPLETING_REBALANCE
    t = x.commit("g", {("t", 0): 6}, generation=gen + 1, member_id=follower)
    assert x.commit_errors(t) == {("t", 0): E.REBALANCE_IN_PROGRESS}


def test_metadata_too_large_is_per_partition_java_string_length() -> None:
    x = h(metadata_max_bytes=4)
    t = x.commit("g", {("t", 0): 1}, metadata="abcd")
    assert x.commit_errors(t) == {("t", 0): E.NONE}
    t = x.commit("g", {("t", 0): 1}, metadata="😀😀😀")  # 3 code points, 6 UTF-16 units
    assert x.commit_errors(t) == {("t", 0): E.OFFSET_METADATA_TOO_LARGE}
    # mixed: the valid partition is written, the other refused
    from rallypoint.groups.events import CommitPartition, CommitRequest, CommitTopic

    tok = x.token()
    req = CommitRequest(
        "g",
        -1,
        "",
        None,
        -1,
        (CommitTopic("t", (CommitPartition(0, 10, -1, "ok"), CommitPartition(1, 11, -1, "too long"))),),
        8,
    )
    x.apply(x.m.commit_offsets(tok, req, x.now))
    assert x.commit_errors(tok) == {("t", 0): E.NONE, ("t", 1): E.OFFSET_METADATA_TOO_LARGE}
    assert len(x.persisted[-1].records) == 1
    assert x.fetched(x.fetch("g", {"t": [0, 1]})) == {("t", 0): (10, "ok", E.NONE), ("t", 1): (-1, "", E.NONE)}


def test_null_metadata_is_stored_as_empty_and_retention_time_sets_expire_timestamp() -> None:
    x = h()
    x.commit("g", {("t", 0): 1}, metadata=None, version=2, retention=60_000)
    value = x.persisted[-1].records[0][1]
    assert isinstance(value, OffsetCommitValue)
    assert value.metadata == "" and value.expire_timestamp == x.now + 60_000


def test_commit_is_visible_only_after_the_append_and_failures_map_errors() -> None:
    x = h()
    x.hold_persists = True
    t = x.commit("g", {("t", 0): 1})
    assert not x.answered(t)
    assert x.fetched(x.fetch("g", {"t": [0]})) == {("t", 0): (-1, "", E.NONE)}
    x.complete_persists()
    assert x.commit_errors(t) == {("t", 0): E.NONE}
    assert x.fetched(x.fetch("g", {"t": [0]}))[("t", 0)][0] == 1
    t = x.commit("g", {("t", 0): 2})
    x.complete_persists(E.KAFKA_STORAGE_ERROR)
    assert x.commit_errors(t) == {("t", 0): E.NOT_COORDINATOR}
    assert x.fetched(x.fetch("g", {"t": [0]}))[("t", 0)][0] == 1  # unchanged
    t = x.commit("g", {("t", 0): 3})
    x.complete_persists(E.MESSAGE_TOO_LARGE)
    assert x.commit_errors(t) == {("t", 0): E.UNKNOWN_SERVER_ERROR}


def test_require_stable_fetch_waits_for_pending_commits() -> None:
    x = h()
    x.commit("g", {("t", 0): 1})
    x.hold_persists = True
    x.commit("g", {("t", 0): 2})
    plain = x.fetch("g", {"t": [0]})
    stable = x.fetch("g", {"t": [0]}, require_stable=True)
    assert x.fetched(plain)[("t", 0)][0] == 1
    assert not x.answered(stable)
    x.complete_persists()
    assert x.fetched(stable) == {("t", 0): (2, "", E.NONE)}
    # nothing pending: answered at once
    assert x.answered(x.fetch("g", {"t": [0]}, require_stable=True))


# ----------------------------------------------------------------------- OffsetFetch


def test_offset_fetch_unknown_group() -> None:
    x = h()
    assert x.fetched(x.fetch("nope", {"t": [0, 3]})) == {("t", 0): (-1, "", E.NONE), ("t", 3): (-1, "", E.NONE)}
    (g,) = x.responses[x.fetch("nope")].groups
    assert (g.error, g.topics) == (E.NONE, ())


def test_offset_fetch_all_topics() -> None:
    x = h()
    x.commit("g", {("a", 0): 1, ("a", 1): 2, ("b", 0): 3})
    assert x.fetched(x.fetch("g")) == {
        ("a", 0): (1, "", E.NONE),
        ("a", 1): (2, "", E.NONE),
        ("b", 0): (3, "", E.NONE),
    }


def test_a_commit_by_topic_id_is_stored_with_it_and_fetched_only_by_it() -> None:
    """OffsetCommit v10 stores the topic id with the offset (value v4); an OffsetFetch v10 naming
    another id for the topic (deleted and recreated meanwhile) gets no offset, one without ids
    (v9 and older) gets it (Kafka's OffsetMetadataManager.fetchOffsets)."""
    import uuid

    from rallypoint.groups.events import (
        CommitPartition,
        CommitRequest,
        CommitTopic,
        OffsetFetchGroupRequest,
        OffsetFetchRequest,
    )
    from rallypoint.protocol.offsets_schema import decode_offset_commit_value, encode_offset_commit_value

    x = h()
    old, new = uuid.uuid4(), uuid.uuid4()
    tok = x.token()
    req = CommitRequest("g", -1, "", None, -1, (CommitTopic("t", (CommitPartition(0, 10),), old),), 10)
    x.apply(x.m.commit_offsets(tok, req, x.now))
    assert x.commit_errors(tok) == {("t", 0): E.NONE}
    value = x.persisted[-1].records[0][1]
    assert isinstance(value, OffsetCommitValue) and value.topic_id == old
    assert decode_offset_commit_value(encode_offset_commit_value(value)) == value  # v4, tagged id

    def fetch_as(topic_id: uuid.UUID | None) -> int:
        tok = x.token()
        ids = None if topic_id is None else {"t": topic_id}
        x.apply(x.m.fetch_offsets(tok, OffsetFetchRequest((OffsetFetchGroupRequest("g", (("t", (0,)),), ids),)), x.now))
        return x.fetched(tok)[("t", 0)][0]

    assert (fetch_as(old), fetch_as(new), fetch_as(None)) == (10, -1, 10)


# ---------------------------------------------------------------------- OffsetDelete
# ---------------------------------------------------------------------- OffsetDelete


def delete_offsets(x: Harness, group: str, topics: dict[str, list[int]]) -> object:
    t = x.token()
    x.apply(x.m.delete_offsets(t, OffsetDeleteRequest(group, tuple((n, tuple(p)) for n, p in topics.items())), x.now))
    return x.responses[t]


def test_offset_delete() -> None:
    x = h()
    assert delete_offsets(x, "", {"t": [0]}).error == E.INVALID_GROUP_ID  # type: ignore[attr-defined]
    assert delete_offsets(x, "nope", {"t": [0]}).error == E.GROUP_ID_NOT_FOUND  # type: ignore[attr-defined]
    x.commit("simple", {("t", 0): 1, ("t", 1): 2})
    res = delete_offsets(x, "simple", {"t": [0]})
    assert res.error == E.NONE and res.topics[0].partitions == ((0, E.NONE),)  # type: ignore[attr-defined]
    assert x.persisted[-1].records == ((OffsetCommitKey("simple", "t", 0), None),)
    assert x.fetched(x.fetch("simple", {"t": [0, 1]})) == {("t", 0): (-1, "", E.NONE), ("t", 1): (2, "", E.NONE)}


def test_offset_delete_on_an_active_group() -> None:
    x = h()
    _ids, leader, gen = x.stable_group(1, protocols=(("range", meta_for("sub")),))
    x.commit("g", {("sub", 0): 1, ("other", 0): 2}, generation=gen, member_id=leader)
    res = delete_offsets(x, "g", {"sub": [0], "other": [0]})
    assert res.error == E.NONE  # type: ignore[attr-defined]
    assert [(t.name, t.partitions) for t in res.topics] == [  # type: ignore[attr-defined]
        ("sub", ((0, E.GROUP_SUBSCRIBED_TO_TOPIC),)),
        ("other", ((0, E.NONE),)),
    ]
    y = h()
    y.stable_group(1, protocol_type="connect")
    assert delete_offsets(y, "g", {"t": [0]}).error == E.NON_EMPTY_GROUP  # type: ignore[attr-defined]


# ---------------------------------------------------------------------- retention


def test_retention_of_an_empty_consumer_group_counts_from_when_it_became_empty() -> None:
    x = h(retention_ms=DAY, retention_check_interval_ms=60_000)
    _ids, leader, gen = x.stable_group(1, session=1_800_000)
    x.commit("g", {("t", 0): 1}, generation=gen, member_id=leader)
    for _ in range(26):  # half a day, heartbeating
        x.advance(1_700_000)
        assert x.heartbeat("g", leader, gen) == E.NONE
    x.leave("g", (leader, None))  # Empty now
    assert x.state() == S.EMPTY
    x.advance(DAY - 60_000)  # commit is 1.5 days old, but the group has been empty < 1 day
    assert x.state() == S.EMPTY and x.offsets("g")
    x.advance(120_000)  # the next checks (every minute) find it a day empty
    assert "g" not in x.m.groups
    records = x.persisted[-1].records
    assert (OffsetCommitKey("g", "t", 0), None) in records and (GroupMetadataKey("g"), None) in records
    assert x.transitions_of()[-1] == ("Empty", "Dead")


def test_retention_of_a_stable_group_expires_only_unsubscribed_topics() -> None:
    x = h(retention_ms=DAY, retention_check_interval_ms=600_000)
    _ids, leader, gen = x.stable_group(1, protocols=(("range", meta_for("sub")),), session=60_000)
    x.commit("g", {("sub", 0): 1, ("gone", 0): 2}, generation=gen, member_id=leader)
    for _ in range(DAY // 50_000 + 13):
        x.advance(50_000)
        x.heartbeat("g", leader, gen)
    assert x.state() == S.STABLE
    assert set(x.offsets("g")) == {("sub", 0)}


def test_retention_of_a_simple_group_and_explicit_expire_timestamps() -> None:
    x = h(retention_ms=DAY, retention_check_interval_ms=3_600_000)
    x.commit("s", {("t", 0): 1})
    x.commit("s", {("t", 1): 1}, version=2, retention=3_600_000)  # explicit: 1 hour
    x.advance(3_600_000)
    assert set(x.offsets("s")) == {("t", 0)}
    x.advance(DAY)
    assert "s" not in x.m.groups


def test_retention_never_expires_an_offset_whose_commit_is_being_written() -> None:
    x = h(retention_ms=DAY, retention_check_interval_ms=DAY)
    x.commit("s", {("t", 0): 1})
    x.advance(DAY - 1)
    x.hold_persists = True
    x.commit("s", {("t", 0): 2})
    x.advance(1)  # retention check: the old value is expired but a commit is pending
    assert "s" in x.m.groups
    x.complete_persists()
    assert x.offsets("s")[("t", 0)].offset == 2


def test_empty_group_without_offsets_is_removed_by_the_retention_check() -> None:
    x = h(retention_check_interval_ms=1000)
    _ids, leader, _gen = x.stable_group(1)
    x.leave("g", (leader, None))
    x.advance(1000)
    assert "g" not in x.m.groups


# --------------------------------------------------------- while loading


def test_answers_while_the_partition_is_loading() -> None:
    x = h()
    _ids, leader, gen = x.stable_group(1)
    x.m.begin_load(partition_for("g", 50))
    assert x.heartbeat("g", leader, gen) == E.NONE
    assert x.result(x.sync("g", leader, gen)).error == E.COORDINATOR_LOAD_IN_PROGRESS
    assert x.result(x.join("g")).error == E.COORDINATOR_LOAD_IN_PROGRESS
    assert x.leave("g", (leader, None)).error == E.COORDINATOR_LOAD_IN_PROGRESS
    assert set(x.commit_errors(x.commit("g", {("t", 0): 1})).values()) == {E.COORDINATOR_LOAD_IN_PROGRESS}
    (g,) = x.responses[x.fetch("g", {"t": [0]})].groups
    assert g.error == E.COORDINATOR_LOAD_IN_PROGRESS
    assert x.describe("g").groups[0].error == E.COORDINATOR_LOAD_IN_PROGRESS
    assert x.list_groups().error == E.COORDINATOR_LOAD_IN_PROGRESS
    res: DeleteGroupsResult = x.result(x.delete_groups("g"))
    assert res.results == (("g", E.COORDINATOR_LOAD_IN_PROGRESS),)
    assert delete_offsets(x, "g", {"t": [0]}).error == E.COORDINATOR_LOAD_IN_PROGRESS  # type: ignore[attr-defined]
    # validation before the partition state, as in GroupCoordinatorService
    assert x.result(x.join("g", session=1)).error == E.INVALID_SESSION_TIMEOUT
    x.apply(x.m.load(partition_for("g", 50), {}, {}, x.now))
    assert x.heartbeat("g", leader, gen) == E.NONE and x.list_groups().error == E.NONE


# --------------------------------------------------------------- loading


def test_loaded_groups_come_up_stable_or_empty_with_fresh_session_timers() -> None:
    x = h()
    members = (
        MemberMetadata("m1", None, "c1", "/10.0.0.1", 30_000, 10_000, meta_for("t"), b"A1"),
        MemberMetadata("m2", "inst", "c2", "/10.0.0.2", 30_000, 20_000, meta_for("t"), b"A2"),
    )
    groups = {
        "live": GroupMetadataValue("consumer", 7, "range", "m1", 123, members),
        "idle": GroupMetadataValue("consumer", 3, None, None, 456, ()),
    }
    offsets = {
        OffsetCommitKey("live", "t", 0): OffsetCommitValue(10, "x", 100),
        OffsetCommitKey("orphan", "t", 0): OffsetCommitValue(5, "", 100),
    }
    x.apply(x.m.load(7, groups, offsets, x.now))
    live, idle, orphan = x.m.groups["live"], x.m.groups["idle"], x.m.groups["orphan"]
    assert (live.state, live.generation, live.protocol_name, live.leader_id) == (S.STABLE, 7, "range", "m1")
    assert live.static_members == {"inst": "m2"} and live.subscribed_topics == frozenset({"t"})
    assert (idle.state, idle.generation, idle.protocol_type) == (S.EMPTY, 3, "consumer")
    assert (orphan.state, orphan.protocol_type) == (S.EMPTY, None)
    assert x.fetched(x.fetch("orphan", {"t": [0]})) == {("t", 0): (5, "", E.NONE)}
    # stored assignments survive; members must heartbeat within their session
    assert x.result(x.sync("live", "m1", 7)).assignment == b"A1"
    x.advance(9_999)
    assert x.heartbeat("live", "m2", 7, instance="inst") == E.NONE
    x.advance(1)
    assert "m1" not in live.members  # m1 never heartbeated after the load
    assert live.state == S.PREPARING_REBALANCE


def test_a_loaded_group_over_capacity_rebalances() -> None:
    x = h(max_size=1)
    members = tuple(MemberMetadata(f"m{i}", None, "c", "/h", 30_000, 10_000, b"", b"") for i in range(2))
    x.apply(x.m.load(0, {"big": GroupMetadataValue("consumer", 1, "range", "m0", -1, members)}, {}, x.now))
    assert x.m.groups["big"].state == S.PREPARING_REBALANCE


# ------------------------------------------------------ partition choice


def test_coordinator_partition_is_kafkas_hash() -> None:
    # Java: "hello".hashCode() == 99162322; "polygenelubricants".hashCode() == Integer.MIN_VALUE
    assert partition_for("hello", 50) == 99162322 % 50
    assert partition_for("polygenelubricants", 50) == 0
    x = h()
    x.commit("hello", {("t", 0): 1})
    assert x.m.groups["hello"].partition == 22 and x.persisted[-1].partition == 22


def test_groups_with_one_subscription_share_it_and_synced_groups_keep_no_grown_sets() -> None:
    """Memory per member (docs/BENCHMARKS.md, item 22): equal subscribed-topic sets are one
    object, and a Stable group's emptied pending sets hold no table grown for its members."""
    h = Harness()
    for g in ("a", "b"):
        h.stable_group(10, g)
    a, b = h.m.groups["a"], h.m.groups["b"]
    assert a.subscribed_topics == frozenset({"topic"}) and a.subscribed_topics is b.subscribed_topics
    assert not a.pending_members and not a.pending_sync
    assert sys.getsizeof(a.pending_sync) == sys.getsizeof(set())  # cleared once empty
    assert sys.getsizeof(a.pending_members) == sys.getsizeof(set())
