"""Writes in flight: records are applied when appended and undone when their write fails
(docs/groups.md, "Records are applied when appended" and "When a write fails"), and an event
that raises leaves no group half-changed (docs/groups.md, "Internal errors").

``Harness.disk()`` replays the writes the log acknowledged, in order: what a restart would
load.  Every race below ends with memory and that "disk" agreeing.
"""

from __future__ import annotations

import pytest
from rallypoint.groups.events import JoinKey, OffsetDeleteRequest
from rallypoint.groups.model import ClassicGroup, GroupConfig, GroupState
from rallypoint.protocol.errors import ErrorCode
from rallypoint.protocol.offsets_schema import GroupMetadataKey, OffsetCommitKey

from tests.group_harness import Harness, fail_once

pytestmark = pytest.mark.unit

E = ErrorCode
S = GroupState
DAY = 24 * 3600 * 1000


def h(**cfg: int) -> Harness:
    return Harness(GroupConfig(**cfg))


def delete_offsets(x: Harness, group: str, topics: dict[str, list[int]]) -> int:
    t = x.token()
    req = OffsetDeleteRequest(group, tuple((n, tuple(p)) for n, p in topics.items()))
    x.apply(x.m.delete_offsets(t, req, x.now))
    return t


def fetched_offsets(x: Harness, group: str, topics: dict[str, list[int]]) -> dict[tuple[str, int], int]:
    return {tp: off for tp, (off, _meta, _err) in x.fetched(x.fetch(group, topics)).items()}


# ------------------------------------------------------------------ the races (issue 13)


def test_race_retention_keeps_a_group_whose_first_commit_is_being_written() -> None:
    """The commit that creates a simple group is in flight when the retention pass runs: the
    group is not Empty-without-offsets (the commit is applied already), so it stays, and the
    acknowledged commit can be fetched."""
    x = h(retention_ms=DAY, retention_check_interval_ms=60_000)
    x.hold_persists = True
    t = x.commit("s", {("t", 0): 5})
    x.advance(60_000)  # the retention pass, while the commit is being written
    x.complete_persists()
    assert x.commit_errors(t) == {("t", 0): E.NONE}
    assert "s" in x.m.groups and x.state("s") == S.EMPTY
    assert fetched_offsets(x, "s", {"t": [0]}) == {("t", 0): 5}
    assert x.disk_offsets("s") == {("t", 0): 5}
    assert GroupMetadataKey("s") not in {k for p in x.persisted for k, _ in p.records}


def test_race_delete_groups_tombstones_a_commit_still_being_written() -> None:
    x = h()
    x.commit("s", {("t", 0): 1})
    x.hold_persists = True
    tc = x.commit("s", {("t", 1): 2})  # in flight
    td = x.delete_groups("s")
    tombstones = {k for k, v in x.pending[-1].records if v is None}
    assert tombstones == {OffsetCommitKey("s", "t", 0), OffsetCommitKey("s", "t", 1), GroupMetadataKey("s")}
    x.complete_persists()
    assert x.commit_errors(tc) == {("t", 1): E.NONE}
    assert x.result(td).results == (("s", E.NONE),)
    assert x.disk_offsets("s") == {} and "s" not in x.disk()[0]
    assert fetched_offsets(x, "s", {"t": [0, 1]}) == {("t", 0): -1, ("t", 1): -1}
    assert "s" not in x.m.groups


def test_race_offset_delete_tombstones_a_commit_still_being_written() -> None:
    x = h()
    x.hold_persists = True
    tc = x.commit("s", {("t", 0): 2})  # creates the simple group; in flight
    td = delete_offsets(x, "s", {"t": [0]})
    x.complete_persists()
    assert x.commit_errors(tc) == {("t", 0): E.NONE}
    assert x.result(td).error == E.NONE and x.result(td).topics[0].partitions == ((0, E.NONE),)
    assert x.disk_offsets("s") == {}
    assert fetched_offsets(x, "s", {"t": [0]}) == {("t", 0): -1}


def test_race_topic_deletion_tombstones_a_commit_still_being_written() -> None:
    x = h()
    x.commit("s", {("kept", 0): 1})
    x.hold_persists = True
    tc = x.commit("s", {("doomed", 0): 3})  # in flight
    x.apply(x.m.topics_deleted(["doomed"], x.now))
    x.complete_persists()
    assert x.commit_errors(tc) == {("doomed", 0): E.NONE}
    assert x.disk_offsets("s") == {("kept", 0): 1}
    assert fetched_offsets(x, "s", {"doomed": [0], "kept": [0]}) == {("doomed", 0): -1, ("kept", 0): 1}


# ------------------------------------------------------------------ failed writes revert


@pytest.mark.parametrize("failing", [0, 1])
def test_a_failed_commit_is_undone_without_undoing_a_later_or_earlier_one(failing: int) -> None:
    x = h()
    x.commit("s", {("t", 0): 1})
    x.hold_persists = True
    x.commit("s", {("t", 0): 2})
    x.commit("s", {("t", 0): 3})
    assert x.offsets("s")[("t", 0)].offset == 3  # both applied already
    assert fetched_offsets(x, "s", {"t": [0]}) == {("t", 0): 1}  # neither acknowledged
    x.answer_persist(failing, E.KAFKA_STORAGE_ERROR)
    x.complete_persists()
    want = 3 if failing == 0 else 2
    assert x.offsets("s")[("t", 0)].offset == want
    assert fetched_offsets(x, "s", {"t": [0]}) == {("t", 0): want}
    assert x.disk_offsets("s") == {("t", 0): want}


def test_a_failed_offset_delete_keeps_the_offset() -> None:
    x = h()
    x.commit("s", {("t", 0): 1})
    x.fail_persists_with = E.NOT_ENOUGH_REPLICAS
    t = delete_offsets(x, "s", {"t": [0]})
    assert x.result(t).error == E.COORDINATOR_NOT_AVAILABLE
    x.fail_persists_with = None
    assert x.offsets("s")[("t", 0)].offset == 1
    assert fetched_offsets(x, "s", {"t": [0]}) == {("t", 0): 1}
    # a later deletion still finds it (memory was not ahead of the log)
    t = delete_offsets(x, "s", {"t": [0]})
    assert x.result(t).error == E.NONE and x.disk_offsets("s") == {}


def test_a_failed_delete_groups_brings_the_group_and_its_offsets_back() -> None:
    x = h()
    x.commit("s", {("t", 0): 1})
    x.fail_persists_with = E.KAFKA_STORAGE_ERROR
    t = x.delete_groups("s")
    assert x.result(t).results == (("s", E.NOT_COORDINATOR),)
    x.fail_persists_with = None
    assert x.state("s") == S.EMPTY
    assert x.transitions_of("s") == [("Empty", "Dead")]  # undone, not a transition back
    assert x.describe("s").groups[0].state == "Empty"
    assert fetched_offsets(x, "s", {"t": [0]}) == {("t", 0): 1}
    t = x.delete_groups("s")
    assert x.result(t).results == (("s", E.NONE),) and "s" not in x.m.groups and x.disk_offsets("s") == {}


def test_a_failed_expiry_tombstone_brings_the_group_back_and_the_next_pass_retries() -> None:
    x = h(retention_ms=DAY, retention_check_interval_ms=DAY)
    x.commit("s", {("t", 0): 1})
    x.fail_persists_with = E.KAFKA_STORAGE_ERROR
    x.advance(DAY)
    assert x.state("s") == S.EMPTY and x.offsets("s")[("t", 0)].offset == 1
    assert any(n.event == "failed to write expiry tombstones" for n in x.notes)
    x.fail_persists_with = None
    x.advance(DAY)
    assert "s" not in x.m.groups and x.disk_offsets("s") == {} and "s" not in x.disk()[0]


def test_a_failed_first_commit_reverts_the_simple_group_it_created() -> None:
    """Kafka creates the simple group in its timeline: a failed write reverts it."""
    x = h()
    x.fail_persists_with = E.NOT_ENOUGH_REPLICAS
    t = x.commit("s", {("t", 0): 1})
    assert x.commit_errors(t) == {("t", 0): E.COORDINATOR_NOT_AVAILABLE}
    assert "s" not in x.m.groups
    assert x.list_groups().groups == ()


def test_a_failed_group_creation_record_reverts_the_group_and_answers_the_parked_join() -> None:
    """GroupMetadataManager.classicGroupJoinToClassicGroup: the empty GroupMetadata record of
    a group JoinGroup created fails -> the group is gone and the parked join gets the error."""
    x = h(initial_rebalance_delay_ms=3000)
    x.hold_persists = True
    t = x.join(version=3)  # v3: added at once and parked in the initial delayed join
    assert not x.answered(t) and x.state() == S.PREPARING_REBALANCE
    (creation,) = x.pending
    assert creation.records == ((GroupMetadataKey("g"), creation.records[0][1]),)
    x.complete_persists(E.NOT_ENOUGH_REPLICAS)
    r = x.result(t)
    assert (r.error, r.member_id, r.generation_id) == (E.COORDINATOR_NOT_AVAILABLE, "", -1)
    assert "g" not in x.m.groups
    assert x.transitions_of()[-1] == ("PreparingRebalance", "Dead")
    assert not [k for k in x.m.deadlines if getattr(k, "group_id", None) == "g"]
    x.hold_persists = False
    x.advance(3000)  # nothing left to fire for the reverted group
    _ids, _leader, gen = x.stable_group(1)  # and the id can be used again
    assert gen == 1


def test_a_failed_group_creation_record_after_member_id_required_drops_the_pending_member() -> None:
    x = h()
    x.fail_persists_with = E.NOT_ENOUGH_REPLICAS
    r = x.result(x.join())  # MEMBER_ID_REQUIRED was answered before the record failed
    assert r.error == E.MEMBER_ID_REQUIRED
    assert "g" not in x.m.groups
    x.fail_persists_with = None
    assert x.result(x.join(member_id=r.member_id)).error == E.UNKNOWN_MEMBER_ID


# ------------------------------------------------------------------- internal errors


def test_an_exception_in_the_join_timer_does_not_wedge_the_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runtime used to crash inside the join timer and leave the group PreparingRebalance
    for good.  Now the group is rebuilt from its record, its parked requests are answered, and
    it works again."""
    x = h()
    x.expect_internal_errors = True
    t, _member = x.join_dynamic()
    monkeypatch.setattr(ClassicGroup, "select_protocol", fail_once(ClassicGroup, "select_protocol"))
    x.advance(0)  # the join timer fires and raises
    (err,) = x.internal_errors
    assert err.event == "timer join" and err.groups == ("g",) and isinstance(err.error, RuntimeError)
    assert x.result(t).error == E.NOT_COORDINATOR  # the parked join is answered
    # rebuilt from its last record (the empty one written when the group was created)
    assert x.state() == S.EMPTY and x.m.groups["g"].generation == 0 and not x.m.groups["g"].members
    assert JoinKey("g") not in x.m.deadlines
    _ids, _leader, gen = x.stable_group(2)
    assert gen == 1


def test_an_exception_in_a_request_answers_it_unknown_server_error(monkeypatch: pytest.MonkeyPatch) -> None:
    x = h()
    x.expect_internal_errors = True
    ids, leader, gen = x.stable_group(2)

    def broken(*_args: object) -> None:
        raise KeyError("bug")

    monkeypatch.setattr(x.m.classic, "_heartbeat", broken)
    t = x.token()
    from rallypoint.groups.events import HeartbeatRequest

    x.apply(x.m.heartbeat(t, HeartbeatRequest("g", gen, leader), x.now))
    assert x.result(t).error == E.UNKNOWN_SERVER_ERROR
    # the group was rebuilt from its last record: Stable, same generation and assignments
    g = x.m.groups["g"]
    assert g.state == S.STABLE and g.generation == gen and set(g.members) == set(ids)
    assert {m.assignment for m in g.members.values()} == {f"assign-{i}".encode() for i in ids}
    monkeypatch.undo()
    assert x.heartbeat("g", leader, gen) == E.NONE


def test_an_exception_after_a_write_was_appended_takes_the_write_back(monkeypatch: pytest.MonkeyPatch) -> None:
    x = h()
    x.expect_internal_errors = True
    x.commit("s", {("t", 0): 1})
    written = len(x.persisted)
    real = x.m.ctx.append_then_respond

    def append_then_raise(*args: object, **kwargs: object) -> int:
        real(*args, **kwargs)  # type: ignore[arg-type]
        raise RuntimeError("after the append")

    monkeypatch.setattr(x.m.ctx, "append_then_respond", append_then_raise)
    t = x.commit("s", {("t", 0): 2})
    assert x.commit_errors(t) == {("t", 0): E.UNKNOWN_SERVER_ERROR}
    assert len(x.persisted) == written  # the batch never reached the log
    assert x.offsets("s")[("t", 0)].offset == 1 and x.state("s") == S.EMPTY
