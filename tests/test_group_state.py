"""Classic group membership, rule by rule (docs/groups.md: "States and transitions", "JoinGroup",
"Choosing the protocol", "SyncGroup", "Heartbeat and sessions", "LeaveGroup", "Static membership",
"DescribeGroups and ListGroups", "DeleteGroups", "Loading and unloading").

Every test drives the sans-IO coordinator with a FakeClock: timers fire instantly, nothing sleeps.
"""

from __future__ import annotations

import pytest
from rallypoint.groups.events import ArmTimer, CancelTimer, HeartbeatRequest, SessionsKey
from rallypoint.groups.model import (
    DEAD,
    GroupConfig,
    GroupState,
    IllegalTransition,
    assert_transition,
)
from rallypoint.protocol.offsets_schema import GroupMetadataKey, GroupMetadataValue

from tests.group_harness import META, Harness, meta_for

pytestmark = pytest.mark.unit

E = __import__("rallypoint.protocol.errors", fromlist=["ErrorCode"]).ErrorCode
S = GroupState


def h(**cfg: int) -> Harness:
    return Harness(GroupConfig(**cfg))


# -------------------------------------------------------------- "States and transitions"


def test_transition_table_is_kafkas() -> None:
    legal = {
        (S.STABLE, S.PREPARING_REBALANCE),
        (S.COMPLETING_REBALANCE, S.PREPARING_REBALANCE),
        (S.EMPTY, S.PREPARING_REBALANCE),
        (S.PREPARING_REBALANCE, S.COMPLETING_REBALANCE),
        (S.COMPLETING_REBALANCE, S.STABLE),
        (S.PREPARING_REBALANCE, S.EMPTY),
    } | {(s, S.DEAD) for s in S}
    for frm in S:
        for to in S:
            if (frm, to) in legal:
                assert_transition("g", frm, to)
            else:
                with pytest.raises(IllegalTransition):
                    assert_transition("g", frm, to)


def test_first_member_empty_to_preparing_to_completing_to_stable() -> None:
    x = h()
    ids, leader, gen = x.stable_group(1)
    assert gen == 1 and leader == ids[0]
    assert x.transitions_of() == [
        ("Empty", "PreparingRebalance"),
        ("PreparingRebalance", "CompletingRebalance"),
        ("CompletingRebalance", "Stable"),
    ]


# ------------------------------------------------------ the initial delay ("JoinGroup")


def test_single_member_waits_the_full_initial_delay() -> None:
    x = h(initial_rebalance_delay_ms=3000)
    t, _ = x.join_dynamic()
    x.advance(2999)
    assert not x.answered(t)
    assert x.state() == S.PREPARING_REBALANCE
    x.advance(1)
    r = x.result(t)
    assert r.error == E.NONE and r.generation_id == 1
    assert x.state() == S.COMPLETING_REBALANCE


def test_all_members_joined_does_not_complete_the_initial_rebalance_early() -> None:
    x = h(initial_rebalance_delay_ms=3000)
    t1, _ = x.join_dynamic()
    t2, _ = x.join_dynamic()  # everybody has joined ...
    x.advance(2999)
    assert not x.answered(t1) and not x.answered(t2)  # ... and still nobody is answered
    x.advance(1)
    # t2 arrived in the first window: one more window of D
    assert not x.answered(t1)
    x.advance(3000)
    assert x.result(t1).generation_id == x.result(t2).generation_id == 1


def test_new_members_extend_in_d_windows_capped_by_rebalance_timeout() -> None:
    # D = 3000, rebalance timeout 10000: remaining = 7000.
    x = h(initial_rebalance_delay_ms=3000)
    t0, _ = x.join_dynamic(rebalance=10_000)
    start = x.now
    tokens = [t0]
    # a new member in every window, forever
    for _ in range(10):
        x.advance(1000)
        if x.answered(t0):
            break
        tokens.append(x.join_dynamic(rebalance=10_000)[0])
        x.advance(2000)
        if x.answered(t0):
            break
    done_at = x.now - start
    # windows: 3000 (+new) -> 3000 (rem 7000-3000=4000, +new) -> 3000 (rem 1000, +new)
    # -> min(3000, 1000)=1000 (rem 0) -> complete: 10000 in total.
    assert done_at == 10_000
    gens = {x.result(t).generation_id for t in tokens}
    assert gens == {1}


def test_no_new_member_in_a_window_completes() -> None:
    x = h(initial_rebalance_delay_ms=3000)
    t0, _ = x.join_dynamic()
    x.advance(1000)
    t1, _ = x.join_dynamic()
    x.advance(2000)  # end of window 1: a new member came -> window 2
    assert not x.answered(t0)
    x.advance(3000)  # window 2 had no newcomer -> done at 6000
    assert x.result(t0).error == E.NONE and x.result(t1).error == E.NONE


def test_java_rule_initial_delay_applies_to_every_rebalance_from_empty() -> None:
    """previousState == EMPTY (Java), not generation == 0 (Scala): after the group went Empty
    in generation 2, a new first member waits D again and newcomers extend it."""
    x = h(initial_rebalance_delay_ms=3000)
    ids, _leader, _gen = x.stable_group(1)
    x.leave("g", (ids[0], None))  # the last member leaves: the join completes at once, Empty
    assert x.state() == S.EMPTY and x.m.groups["g"].generation == 2
    t0, _ = x.join_dynamic()
    x.advance(1000)
    t1, _ = x.join_dynamic()
    x.advance(2000)
    assert not x.answered(t0)  # extended: newMemberAdded is set although generation != 0
    x.advance(3000)
    assert x.result(t0).generation_id == 3 and x.result(t1).generation_id == 3


def test_delay_zero_still_parks_until_the_timer() -> None:
    x = h(initial_rebalance_delay_ms=0)
    t, _ = x.join_dynamic()
    assert not x.answered(t)  # parked until the 0 ms timer fires (next loop turn)
    x.advance(0)
    assert x.result(t).error == E.NONE


# ---------------------------------------------------- MEMBER_ID_REQUIRED ("JoinGroup")


def test_member_id_required_only_v4_plus_without_instance_id() -> None:
    x = h()
    t = x.join(version=4)
    r = x.result(t)
    assert r.error == E.MEMBER_ID_REQUIRED and r.member_id.startswith("client-")
    assert r.generation_id == -1 and r.leader == "" and r.members == ()
    t3 = x.join(version=3)
    assert not x.answered(t3)  # v3: added at once and parked
    ts = x.join(version=5, instance="i1")
    assert not x.answered(ts)  # static: never MEMBER_ID_REQUIRED
    assert x.m.groups["g"].static_members["i1"].startswith("i1-")


def test_pending_member_expires_after_its_session_timeout() -> None:
    x = h()
    r = x.result(x.join(session=7000))
    g = x.m.groups["g"]
    assert r.member_id in g.pending_members
    x.advance(6999)
    assert r.member_id in g.pending_members
    x.advance(1)
    assert r.member_id not in g.pending_members
    t = x.join(member_id=r.member_id)
    assert x.result(t).error == E.UNKNOWN_MEMBER_ID


def test_pending_members_block_early_join_completion() -> None:
    x = h()
    ids, leader, gen = x.stable_group(2)
    # a third consumer got its id but has not rejoined yet
    pending = x.result(x.join(session=8000)).member_id
    t_leader = x.join(member_id=leader)  # leader rejoin: rebalance
    t_other = x.join(member_id=ids[1])
    assert x.state() == S.PREPARING_REBALANCE
    assert not x.answered(t_leader)  # all members joined, but one is pending
    t_p = x.join(member_id=pending)  # pending rejoins: now everybody is in
    assert x.result(t_leader).error == E.NONE
    assert {x.result(t).generation_id for t in (t_leader, t_other, t_p)} == {gen + 1}


def test_expiry_of_the_pending_member_completes_the_join() -> None:
    x = h()
    _ids, leader, gen = x.stable_group(1)
    x.join(session=8000)  # pending
    t = x.join(member_id=leader)
    assert not x.answered(t)
    x.advance(8000)
    assert x.result(t).generation_id == gen + 1


# ------------------------------------------------------------ JoinGroup in Stable


def test_leader_join_in_stable_always_rebalances() -> None:
    x = h()
    _ids, leader, _gen = x.stable_group(2)
    t = x.join(member_id=leader)
    assert x.state() == S.PREPARING_REBALANCE and not x.answered(t)


def test_follower_with_identical_metadata_gets_current_generation() -> None:
    x = h()
    ids, leader, gen = x.stable_group(2)
    follower = next(i for i in ids if i != leader)
    r = x.result(x.join(member_id=follower))
    assert (r.error, r.generation_id, r.leader, r.members) == (E.NONE, gen, leader, ())
    assert r.protocol_name == "range" and r.protocol_type == "consumer"
    assert x.state() == S.STABLE


@pytest.mark.parametrize(
    "protocols",
    [
        (("range", META + b"x"),),  # different bytes
        (("range", META), ("roundrobin", META)),  # extra protocol
    ],
)
def test_follower_with_changed_metadata_rebalances(protocols: tuple[tuple[str, bytes], ...]) -> None:
    x = h()
    ids, leader, _gen = x.stable_group(2, protocols=(("range", META), ("roundrobin", META)))
    follower = next(i for i in ids if i != leader)
    same = x.result(x.join(member_id=follower, protocols=(("range", META), ("roundrobin", META))))
    assert same.error == E.NONE and x.state() == S.STABLE
    x.join(member_id=follower, protocols=(("roundrobin", META), ("range", META)))  # same set, other order
    assert x.state() == S.PREPARING_REBALANCE
    del protocols


def test_changed_metadata_in_completing_rebalance_rebalances_same_metadata_does_not() -> None:
    x = h()
    t1, _m1 = x.join_dynamic()
    _t2, m2 = x.join_dynamic()
    x.advance(0)
    gen = x.result(t1).generation_id
    assert x.state() == S.COMPLETING_REBALANCE
    leader = x.result(t1).leader
    r = x.result(x.join(member_id=leader))  # lost its response: gets it again, with members
    assert r.generation_id == gen and len(r.members) == 2
    x.join(member_id=m2, protocols=(("range", b"other"),))
    assert x.state() == S.PREPARING_REBALANCE
    assert x.transitions_of()[-1] == ("CompletingRebalance", "PreparingRebalance")


# ------------------------------------------------------ "Choosing the protocol"


def test_protocol_is_chosen_by_vote_not_by_the_leader() -> None:
    x = h()
    a = (("range", META), ("roundrobin", META))  # leader prefers range
    b = (("roundrobin", META), ("range", META))
    t1, _ = x.join_dynamic(protocols=a)
    t2, _ = x.join_dynamic(protocols=b)
    t3, _ = x.join_dynamic(protocols=b)
    x.advance(0)
    assert {x.result(t).protocol_name for t in (t1, t2, t3)} == {"roundrobin"}
    assert x.result(t1).leader == x.result(t1).member_id


def test_only_protocols_common_to_all_members_are_candidates() -> None:
    x = h()
    t1, _ = x.join_dynamic(protocols=(("sticky", META), ("range", META)))
    _t2, _ = x.join_dynamic(protocols=(("cooperative-sticky", META), ("range", META)))
    x.advance(0)
    assert x.result(t1).protocol_name == "range"
    # a member with nothing in common is refused
    r = x.result(x.join(protocols=(("cooperative-sticky", META),)))
    assert r.error == E.INCONSISTENT_GROUP_PROTOCOL and r.member_id == ""
    r = x.result(x.join(protocols=(("range", META),), protocol_type="connect"))
    assert r.error == E.INCONSISTENT_GROUP_PROTOCOL


def test_empty_group_needs_a_protocol_type_and_protocols() -> None:
    x = h()
    assert x.result(x.join(protocol_type="")).error == E.INCONSISTENT_GROUP_PROTOCOL
    assert x.result(x.join(protocols=())).error == E.INCONSISTENT_GROUP_PROTOCOL


def test_leader_metadata_is_relayed_byte_exact() -> None:
    x = h()
    metas = [bytes(range(256)) + bytes([i]) for i in range(3)]
    tokens = [x.join_dynamic(protocols=(("range", m),))[0] for m in metas]
    x.advance(0)
    leader_resp = next(x.result(t) for t in tokens if x.result(t).members)
    assert sorted(m.metadata for m in leader_resp.members) == sorted(metas)
    assert all(x.result(t).members == () for t in tokens if x.result(t) is not leader_resp)


# ------------------------------------------ generation when ending Empty ("States and transitions")


def test_generation_increments_when_the_rebalance_ends_empty_and_a_record_is_written() -> None:
    x = h()
    ids, _leader, gen = x.stable_group(2)
    x.leave("g", (ids[0], None), (ids[1], None))
    x.advance(0)
    g = x.m.groups["g"]
    assert g.state == S.EMPTY and g.generation == gen + 1
    assert g.protocol_name is None and g.leader_id is None
    key, value = x.persisted[-1].records[0]
    assert key == GroupMetadataKey("g")
    assert isinstance(value, GroupMetadataValue)
    assert (value.generation, value.protocol, value.leader, value.members) == (gen + 1, None, None, ())
    assert value.protocol_type == "consumer"
    assert x.transitions_of()[-1] == ("PreparingRebalance", "Empty")


def test_new_group_writes_an_empty_metadata_record_java() -> None:
    x = h()
    x.join()  # MEMBER_ID_REQUIRED, but the group now exists
    (key, value) = x.persisted[0].records[0]
    assert key == GroupMetadataKey("g")
    assert isinstance(value, GroupMetadataValue)
    assert (value.protocol_type, value.generation, value.protocol, value.members) == ("", 0, None, ())


# ---------------------------------------------------------------------------- SyncGroup


def test_followers_wait_for_the_leaders_persisted_assignment() -> None:
    x = h()
    t1, _ = x.join_dynamic()
    t2, _ = x.join_dynamic()
    x.advance(0)
    r1, r2 = x.result(t1), x.result(t2)
    leader = r1.leader
    follower = r2 if r2.member_id != leader else r1
    x.hold_persists = True
    sf = x.sync("g", follower.member_id, follower.generation_id)
    assert not x.answered(sf)
    sl = x.sync("g", leader, follower.generation_id, {leader: b"L", follower.member_id: b"F"})
    assert not x.answered(sf) and not x.answered(sl)  # the record is not written yet
    assert x.state() == S.COMPLETING_REBALANCE
    record = x.pending[-1].records[0][1]
    assert {m.member_id: m.assignment for m in record.members} == {leader: b"L", follower.member_id: b"F"}
    x.complete_persists()
    assert x.result(sf).assignment == b"F" and x.result(sl).assignment == b"L"
    assert x.result(sf).protocol_name == "range"
    assert x.state() == S.STABLE


def test_members_left_out_by_the_leader_get_an_empty_assignment_unknown_ids_ignored() -> None:
    x = h()
    t = [x.join_dynamic()[0] for _ in range(3)]
    x.advance(0)
    rs = [x.result(i) for i in t]
    leader = rs[0].leader
    gen = rs[0].generation_id
    others = [r.member_id for r in rs if r.member_id != leader]
    s = [x.sync("g", o, gen) for o in others]
    x.sync("g", leader, gen, {leader: b"L", others[0]: b"A", "stranger": b"Z"})
    assert x.result(s[0]).assignment == b"A"
    assert x.result(s[1]).assignment == b"" and x.result(s[1]).error == E.NONE
    record = x.persisted[-1].records[0][1]
    assert "stranger" not in {m.member_id for m in record.members}


def test_late_sync_in_stable_returns_the_stored_assignment() -> None:
    x = h()
    t1, _ = x.join_dynamic()
    t2, _ = x.join_dynamic()
    x.advance(0)
    r1, r2 = x.result(t1), x.result(t2)
    leader = r1.leader
    late = r2.member_id if r2.member_id != leader else r1.member_id
    x.sync("g", leader, r1.generation_id, {leader: b"L", late: b"late!"})
    assert x.state() == S.STABLE
    res = x.result(x.sync("g", late, r1.generation_id))
    assert (res.error, res.assignment, res.protocol_type, res.protocol_name) == (E.NONE, b"late!", "consumer", "range")


def test_v5_requires_protocol_type_and_name() -> None:
    x = h()
    _ids, leader, gen = x.stable_group(1)
    assert x.result(x.sync("g", leader, gen, version=5)).error == E.INCONSISTENT_GROUP_PROTOCOL
    assert x.result(x.sync("g", leader, gen, version=5, protocol_type="consumer")).error == (
        E.INCONSISTENT_GROUP_PROTOCOL
    )
    ok = x.result(x.sync("g", leader, gen, version=5, protocol_type="consumer", protocol_name="range"))
    assert ok.error == E.NONE
    bad = x.result(x.sync("g", leader, gen, version=5, protocol_type="consumer", protocol_name="roundrobin"))
    assert bad.error == E.INCONSISTENT_GROUP_PROTOCOL
    assert x.result(x.sync("g", leader, gen, protocol_type="connect")).error == E.INCONSISTENT_GROUP_PROTOCOL


def test_sync_errors_by_state() -> None:
    x = h()
    assert x.result(x.sync("nope", "m", 1)).error == E.UNKNOWN_MEMBER_ID
    x.join()  # Empty group with a pending member
    assert x.result(x.sync("g", "m", 0)).error == E.UNKNOWN_MEMBER_ID
    ids, leader, gen = x.stable_group(2, group="h")
    assert x.result(x.sync("h", "stranger", gen)).error == E.UNKNOWN_MEMBER_ID
    assert x.result(x.sync("h", leader, gen + 1)).error == E.ILLEGAL_GENERATION
    x.join("h", leader)  # -> PreparingRebalance
    assert x.result(x.sync("h", ids[1], gen)).error == E.REBALANCE_IN_PROGRESS


def test_parked_syncs_get_rebalance_in_progress_when_a_rebalance_starts() -> None:
    x = h()
    t1, _ = x.join_dynamic()
    t2, _ = x.join_dynamic()
    x.advance(0)
    r1, r2 = x.result(t1), x.result(t2)
    follower = r2.member_id if r2.member_id != r1.leader else r1.member_id
    s = x.sync("g", follower, r1.generation_id)
    x.join_dynamic()  # a newcomer: CompletingRebalance -> PreparingRebalance
    assert x.result(s).error == E.REBALANCE_IN_PROGRESS and x.result(s).assignment == b""


def test_pending_sync_expiry_evicts_members_including_absent_static_ones() -> None:
    x = h()
    t_static = x.join(instance="s1", rebalance=20_000, session=60_000)
    t_dyn, _ = x.join_dynamic(rebalance=20_000, session=60_000)
    x.advance(0)
    rs, rd = x.result(t_static), x.result(t_dyn)
    assert rs.generation_id == rd.generation_id == 1
    # only the dynamic member syncs; the static one never comes back
    leader = rs.leader
    if leader == rd.member_id:
        x.sync("g", rd.member_id, 1, {rd.member_id: b"a", rs.member_id: b"b"})
    else:
        x.sync("g", rd.member_id, 1)
    x.advance(19_999)
    assert rs.member_id in x.m.groups["g"].members
    x.advance(1)
    g = x.m.groups["g"]
    assert rs.member_id not in g.members and "s1" not in g.static_members
    assert g.state == S.PREPARING_REBALANCE


def test_sync_store_failure_propagates_the_error_and_rebalances() -> None:
    x = h()
    t1, _ = x.join_dynamic()
    t2, _ = x.join_dynamic()
    x.advance(0)
    r1, r2 = x.result(t1), x.result(t2)
    follower = r2.member_id if r2.member_id != r1.leader else r1.member_id
    sf = x.sync("g", follower, 1)
    x.hold_persists = True
    sl = x.sync("g", r1.leader, 1, {r1.leader: b"L", follower: b"F"})
    x.complete_persists(E.KAFKA_STORAGE_ERROR)
    assert x.result(sf).error == x.result(sl).error == E.NOT_COORDINATOR
    assert x.state() == S.PREPARING_REBALANCE


def test_stale_sync_persist_after_a_new_rebalance_does_nothing() -> None:
    x = h()
    t1, _ = x.join_dynamic()
    x.advance(0)
    r1 = x.result(t1)
    x.hold_persists = True
    sl = x.sync("g", r1.member_id, 1, {r1.member_id: b"L"})
    x.join_dynamic()  # rebalance while the leader's record is being written
    assert x.result(sl).error == E.REBALANCE_IN_PROGRESS
    x.complete_persists()
    assert x.state() == S.PREPARING_REBALANCE


# ------------------------------------------------------------ "Heartbeat and sessions"


def test_heartbeat_answers_per_state() -> None:
    x = h()
    assert x.heartbeat("nope", "m", 0) == E.UNKNOWN_MEMBER_ID
    t1, m1 = x.join_dynamic()
    x.advance(0)
    gen = x.result(t1).generation_id
    assert x.heartbeat("g", m1, gen) == E.NONE  # CompletingRebalance
    assert x.heartbeat("g", m1, gen + 1) == E.ILLEGAL_GENERATION
    assert x.heartbeat("g", "stranger", gen) == E.UNKNOWN_MEMBER_ID
    x.sync("g", m1, gen, {m1: b""})
    assert x.heartbeat("g", m1, gen) == E.NONE  # Stable
    x.join_dynamic()  # -> PreparingRebalance
    assert x.heartbeat("g", m1, gen) == E.REBALANCE_IN_PROGRESS


def test_heartbeat_in_preparing_rebalance_still_refreshes_the_session() -> None:
    x = h()
    ids, leader, gen = x.stable_group(2, session=10_000, rebalance=60_000)
    x.join(member_id=leader, session=10_000, rebalance=60_000)  # rebalance; the follower must rejoin
    follower = ids[1]
    for _ in range(5):
        x.advance(8000)
        assert x.heartbeat("g", follower, gen) == E.REBALANCE_IN_PROGRESS
    assert follower in x.m.groups["g"].members  # 40 s > session, still alive


def test_session_expiry_removes_a_silent_member_and_rebalances() -> None:
    x = h()
    ids, leader, gen = x.stable_group(2, session=10_000)
    x.advance(9000)
    x.heartbeat("g", leader, gen)
    x.advance(1000)  # the follower missed its session
    g = x.m.groups["g"]
    assert ids[1] not in g.members and leader in g.members
    assert x.transitions_of()[-1] == ("Stable", "PreparingRebalance")


def test_a_stable_group_keeps_one_sessions_timer_and_heartbeats_arm_nothing() -> None:
    # docs/groups.md, "Timers": members keep their own deadlines; the group has one timer.
    x = h()
    ids, _leader, gen = x.stable_group(10, session=10_000)
    group_timers = [k for k in x.m.deadlines if getattr(k, "group_id", None) == "g"]
    assert group_timers == [SessionsKey("g")]
    assert x.m.deadlines[SessionsKey("g")] == min(m.session_deadline for m in x.m.groups["g"].members.values())
    x.advance(1000)
    effects = x.m.heartbeat(x.token(), HeartbeatRequest("g", gen, ids[3]), x.now)
    assert not [e for e in effects if isinstance(e, (ArmTimer, CancelTimer))], effects
    x.apply(effects)
    assert x.m.groups["g"].members[ids[3]].session_deadline == x.now + 10_000


def test_member_sessions_expire_each_at_its_own_deadline_in_order() -> None:
    x = h()
    ids, _leader, gen = x.stable_group(3, session=10_000, rebalance=600_000)
    start = x.now
    x.advance(4000)
    x.heartbeat("g", ids[1], gen)  # its session now ends at start + 14 s
    x.advance(2000)
    x.heartbeat("g", ids[2], gen)  # ... and this one's at start + 16 s
    members = x.m.groups["g"].members
    x.advance(3999)
    assert set(members) == set(ids)
    x.advance(1)  # start + 10 s: the first member's session is over, the others' are not
    assert set(members) == {ids[1], ids[2]}
    assert x.m.deadlines[SessionsKey("g")] == start + 14_000  # armed again for the next one
    x.advance(3999)
    assert set(members) == {ids[1], ids[2]}
    x.advance(1)
    assert set(members) == {ids[2]}
    x.advance(2000)
    assert set(members) == set()
    removed = [n.fields["member"] for n in x.notes if n.event == "member removed"]
    assert removed == [ids[0], ids[1], ids[2]]
    assert SessionsKey("g") not in x.m.deadlines  # no member left to watch
    assert x.now == start + 16_000


def test_sessions_ending_in_the_same_millisecond_expire_in_member_id_order() -> None:
    x = h()
    ids, _leader, _gen = x.stable_group(3, session=10_000, rebalance=600_000)
    x.advance(10_000)
    removed = [n.fields["member"] for n in x.notes if n.event == "member removed"]
    assert removed == sorted(ids)


def test_members_awaiting_join_are_alive_new_joiners_use_five_minutes() -> None:
    x = h()
    ids, leader, _gen = x.stable_group(2, session=10_000, rebalance=600_000)
    t_leader = x.join(member_id=leader, session=10_000, rebalance=600_000)  # parked, awaiting join
    t_new, new_id = x.join_dynamic(session=10_000, rebalance=600_000)
    x.advance(10_000)  # sessions: the leader is awaiting join (alive); follower silent
    g = x.m.groups["g"]
    assert leader in g.members and ids[1] not in g.members
    assert new_id in g.members  # a new member is not bound by its session timeout ...
    x.advance(290_000)  # ... but by the 5-minute new-member join timeout
    assert x.result(t_new) is not None
    # the join completed when the follower was removed; new member now has a generation
    assert x.result(t_new).error == E.NONE
    assert x.result(t_leader).error == E.NONE


def test_new_member_join_timeout_expires_a_parked_new_member() -> None:
    x = h()
    _ids, leader, gen = x.stable_group(1, session=10_000, rebalance=900_000)
    t_new = x.join(version=3, session=10_000, rebalance=900_000)  # v3: added at once, parked, new
    assert x.state() == S.PREPARING_REBALANCE
    # the old member keeps heartbeating but never rejoins; the join phase waits 900 s
    for _ in range(33):
        x.advance(9_000)
        assert x.heartbeat("g", leader, gen) == E.REBALANCE_IN_PROGRESS
    x.advance(2_999)  # 299.999 s
    assert not x.answered(t_new)
    x.advance(1)  # 300 s: the new-member join timeout, not its 10 s session
    r = x.result(t_new)
    assert r.error == E.UNKNOWN_MEMBER_ID and r.member_id == ""
    assert len(x.m.groups["g"].members) == 1


def test_sync_parked_member_is_alive_and_sessions_rearm_after_propagation() -> None:
    x = h()
    t1, m1 = x.join_dynamic(session=10_000)
    _t2, m2 = x.join_dynamic(session=10_000)
    x.advance(0)
    leader = x.result(t1).leader
    follower = m2 if leader == m1 else m1
    s = x.sync("g", follower, 1)  # parked, waiting for the leader
    x.advance(9_000)
    x.heartbeat("g", leader, 1)
    x.advance(1_000)
    assert follower in x.m.groups["g"].members  # awaiting sync counts as alive
    x.sync("g", leader, 1, {leader: b"", follower: b"f"})
    assert x.result(s).assignment == b"f"
    x.heartbeat("g", leader, 1)
    x.advance(10_000)  # follower's session restarted at propagation, and it stayed silent
    assert follower not in x.m.groups["g"].members


# ------------------------------------------------------------------ "Static membership"


def static_group(x: Harness, n: int = 2, version: int = 5, session: int = 10_000) -> tuple[list[str], str, int]:
    tokens = [x.join(instance=f"i{k}", version=version, session=session) for k in range(n)]
    x.advance(0)
    rs = [x.result(t) for t in tokens]
    gen, leader = rs[0].generation_id, rs[0].leader
    ids = [r.member_id for r in rs]
    for r in rs:
        x.sync("g", r.member_id, gen, {i: f"a-{i[:2]}".encode() for i in ids} if r.member_id == leader else None)
    assert x.state() == S.STABLE
    return ids, leader, gen


def test_static_rejoin_in_stable_without_protocol_change_does_not_rebalance() -> None:
    x = h()
    ids, leader, gen = static_group(x)
    follower = ids[1] if ids[0] == leader else ids[0]
    fi = "i1" if follower == ids[1] else "i0"
    before = len(x.transitions)
    t = x.join(instance=fi, session=10_000)  # restarted process: empty member id
    r = x.result(t)
    assert r.error == E.NONE and r.generation_id == gen and r.member_id != follower
    assert r.member_id.startswith(fi + "-")
    assert r.leader == leader and r.members == () and not r.skip_assignment
    assert len(x.transitions) == before  # no rebalance
    record = x.persisted[-1].records[0][1]
    assert r.member_id in {m.member_id for m in record.members} and follower not in {
        m.member_id for m in record.members
    }
    # the new id gets its old assignment back through SyncGroup in Stable
    assert x.result(x.sync("g", r.member_id, gen, instance=fi)).assignment == b"a-" + fi.encode()
    # the old id is fenced
    assert x.heartbeat("g", follower, gen, instance=fi) == E.FENCED_INSTANCE_ID
    assert x.result(x.sync("g", follower, gen, instance=fi)).error == E.FENCED_INSTANCE_ID
    assert x.result(x.join(member_id=follower, instance=fi)).error == E.FENCED_INSTANCE_ID


def test_old_leader_id_before_v9_skip_assignment_from_v9() -> None:
    for version, expect_skip in ((5, False), (9, True)):
        x = h()
        ids, leader, gen = static_group(x, version=version)
        li = "i0" if leader == ids[0] else "i1"
        r = x.result(x.join(instance=li, version=version, session=10_000))
        assert r.error == E.NONE and r.generation_id == gen
        if expect_skip:
            assert r.leader == r.member_id and r.skip_assignment and len(r.members) == 2
        else:
            assert r.leader == leader != r.member_id and not r.skip_assignment and r.members == ()
        assert x.m.groups["g"].leader_id == r.member_id


def test_old_members_parked_join_gets_fenced() -> None:
    x = h()
    ids, leader, _gen = static_group(x)
    t_old = x.join(member_id=leader, instance="i0" if leader == ids[0] else "i1")  # leader rejoin: parked
    assert x.state() == S.PREPARING_REBALANCE and not x.answered(t_old)
    x.join(instance="i0" if leader == ids[0] else "i1")  # the same instance restarted
    r = x.result(t_old)
    assert r.error == E.FENCED_INSTANCE_ID and r.member_id == leader


def test_static_rejoin_in_completing_rebalance_forces_a_rebalance() -> None:
    x = h()
    t0 = x.join(instance="i0")
    t1 = x.join(instance="i1")
    x.advance(0)
    assert x.state() == S.COMPLETING_REBALANCE
    x.join(instance="i1")
    assert x.state() == S.PREPARING_REBALANCE
    del t0, t1


def test_static_rejoin_with_protocol_change_rebalances() -> None:
    x = h()
    ids, leader, _gen = static_group(x)
    follower_inst = "i1" if leader == ids[0] else "i0"
    r = x.result(x.join(instance=follower_inst, protocols=(("roundrobin", META), ("range", META))))
    assert r.error == E.NONE and x.state() == S.STABLE  # only range is common: still selected
    x2 = h()
    static_group(x2, n=1)
    # a protocol the group does not support at all is refused before any replacement
    assert x2.result(x2.join(instance="i0", protocols=(("roundrobin", META),))).error == (E.INCONSISTENT_GROUP_PROTOCOL)
    # the only member now prefers roundrobin: the selected protocol would change -> rebalance
    r2 = x2.result(x2.join(instance="i0", protocols=(("roundrobin", META), ("range", META))))
    # (its own join is the only one awaited, so the new generation completes at once)
    assert x2.transitions_of()[-2:] == [("Stable", "PreparingRebalance"), ("PreparingRebalance", "CompletingRebalance")]
    assert r2.generation_id == 2 and r2.protocol_name == "roundrobin"


def test_static_members_survive_join_completion_without_rejoining() -> None:
    x = h()
    ids, leader, gen = static_group(x, session=60_000)
    follower = ids[1] if ids[0] == leader else ids[0]
    t = x.join(member_id=leader, instance="i0" if leader == ids[0] else "i1", session=60_000)
    x.advance(30_000 - 1)  # rebalance timeout 30 s < session: the follower is not expired
    assert not x.answered(t)
    x.advance(1)
    r = x.result(t)
    assert r.error == E.NONE and r.generation_id == gen + 1
    assert {m.member_id for m in r.members} == {leader, follower}  # static follower kept


def test_static_replacement_persist_failure_reverts() -> None:
    x = h()
    ids, leader, _gen = static_group(x)
    follower = ids[1] if ids[0] == leader else ids[0]
    fi = "i1" if follower == ids[1] else "i0"
    x.fail_persists_with = E.NOT_ENOUGH_REPLICAS
    r = x.result(x.join(instance=fi))
    assert r.error == E.COORDINATOR_NOT_AVAILABLE and r.member_id == ""
    g = x.m.groups["g"]
    assert g.static_members[fi] == follower and follower in g.members


def test_leave_group_v3_removes_a_static_member_by_instance_id() -> None:
    x = h()
    _ids, _leader, _gen = static_group(x)
    res = x.leave("g", ("", "i1"), ("", "nobody"))
    assert [(m.member_id, m.group_instance_id, m.error) for m in res.members] == [
        ("", "i1", E.NONE),
        ("", "nobody", E.UNKNOWN_MEMBER_ID),
    ]
    assert "i1" not in x.m.groups["g"].static_members
    assert x.state() == S.PREPARING_REBALANCE


def test_static_member_rejoining_with_known_id_and_wrong_instance() -> None:
    x = h()
    ids, _leader, _gen = static_group(x)
    assert x.result(x.join(member_id=ids[0], instance="unknown")).error == E.UNKNOWN_MEMBER_ID
    assert x.result(x.join(member_id="someone-else", instance="i0")).error == E.FENCED_INSTANCE_ID


# --------------------------------------------------------------------------- LeaveGroup


def test_leave_group_errors_and_rebalance() -> None:
    x = h()
    res = x.leave("nope", ("m", None))
    assert res.error == E.NONE and res.members[0].error == E.UNKNOWN_MEMBER_ID
    ids, _leader, _gen = x.stable_group(3)
    res = x.leave("g", (ids[2], None), ("stranger", None))
    assert [m.error for m in res.members] == [E.NONE, E.UNKNOWN_MEMBER_ID]
    assert x.state() == S.PREPARING_REBALANCE
    assert x.transitions_of()[-1] == ("Stable", "PreparingRebalance")


def test_leave_of_the_last_missing_member_completes_the_join() -> None:
    x = h()
    ids, leader, gen = x.stable_group(2)
    t = x.join(member_id=leader)
    assert not x.answered(t)
    x.leave("g", (ids[1], None))
    assert x.result(t).generation_id == gen + 1 and x.state() == S.COMPLETING_REBALANCE


def test_leave_while_completing_rebalance_rebalances() -> None:
    x = h()
    _t1, _m1 = x.join_dynamic()
    _t2, m2 = x.join_dynamic()
    x.advance(0)
    x.leave("g", (m2, None))
    assert x.transitions_of()[-1] == ("CompletingRebalance", "PreparingRebalance")


def test_leave_of_a_pending_member() -> None:
    x = h()
    pending = x.result(x.join()).member_id
    res = x.leave("g", (pending, None))
    assert res.members[0].error == E.NONE
    assert pending not in x.m.groups["g"].pending_members


def test_leader_leaves_and_a_remaining_member_leads() -> None:
    x = h()
    ids, leader, gen = x.stable_group(3)
    x.leave("g", (leader, None))
    others = [i for i in ids if i != leader]
    ts = [x.join(member_id=o) for o in others]
    r = x.result(ts[0])
    assert r.leader in others and r.generation_id == gen + 1


# ------------------------------------------------------------ leader election at join end


def test_a_static_leader_that_did_not_rejoin_stays_but_a_joined_member_leads() -> None:
    x = h()
    ids, leader, gen = static_group(x, session=120_000)
    follower = ids[1] if ids[0] == leader else ids[0]
    fi = "i1" if follower == ids[1] else "i0"
    # the follower changes its subscription: rebalance; the static leader does not rejoin
    t = x.join(member_id=follower, instance=fi, session=120_000, protocols=(("range", meta_for("b")),))
    x.advance(30_000)  # rebalance timeout
    r = x.result(t)
    assert r.error == E.NONE and r.generation_id == gen + 1
    assert r.leader == follower and {m.member_id for m in r.members} == {leader, follower}


def test_rebalance_timeout_removes_dynamic_members_that_did_not_rejoin() -> None:
    x = h()
    ids, _leader, _gen = x.stable_group(3, rebalance=20_000, session=60_000)
    # a follower changes its subscription (-> rebalance) and is the only one to rejoin
    t = x.join(member_id=ids[1], rebalance=20_000, session=60_000, protocols=(("range", meta_for("b")),))
    x.advance(20_000)
    r = x.result(t)
    assert r.error == E.NONE and r.leader == ids[1] and [m.member_id for m in r.members] == [ids[1]]
    assert set(x.m.groups["g"].members) == {ids[1]}


# ----------------------------------------------------------- group.max.size ("JoinGroup")


def test_group_max_size() -> None:
    x = h(max_size=2)
    ids, leader, _gen = x.stable_group(2)
    pending = x.result(x.join()).member_id  # MEMBER_ID_REQUIRED is still handed out
    r = x.result(x.join(member_id=pending))
    assert r.error == E.GROUP_MAX_SIZE_REACHED and r.member_id == ""
    assert x.state() == S.STABLE
    # in PreparingRebalance, known members that are already awaiting are accepted
    x.join(member_id=leader)
    t = x.join(member_id=ids[1])
    assert x.result(t).error == E.NONE


def test_join_validation_errors() -> None:
    x = h()
    assert x.result(x.join("")).error == E.INVALID_GROUP_ID
    assert x.result(x.join(session=5999)).error == E.INVALID_SESSION_TIMEOUT
    assert x.result(x.join(session=1_800_001)).error == E.INVALID_SESSION_TIMEOUT
    r = x.result(x.join("new-group", "some-member"))
    assert r.error == E.UNKNOWN_MEMBER_ID and "new-group" not in x.m.groups


def test_member_of_an_old_generation_rejoining_an_empty_group_is_unknown() -> None:
    x = h()
    _ids, leader, _gen = x.stable_group(1)
    x.leave("g", (leader, None))
    x.advance(0)
    assert x.state() == S.EMPTY
    assert x.result(x.join(member_id=leader)).error == E.UNKNOWN_MEMBER_ID


# ------------------------------------------------------------------------ describe / list


def test_describe_unknown_group_is_dead_v5_and_not_found_v6() -> None:
    x = h()
    (d,) = x.describe("nope").groups
    assert (d.error, d.state, d.protocol_type, d.members) == (E.NONE, "Dead", "", ())
    (d6,) = x.describe("nope", version=6).groups
    assert d6.error == E.GROUP_ID_NOT_FOUND and d6.error_message == "Group nope not found."


def test_describe_fills_metadata_and_assignments_only_in_stable() -> None:
    x = h()
    _t1, m1 = x.join_dynamic(protocols=(("range", meta_for("a")),))
    x.advance(0)
    (d,) = x.describe("g").groups
    assert d.state == "CompletingRebalance" and d.protocol_data == ""
    assert d.members[0].member_id == m1 and d.members[0].metadata == b"" and d.members[0].assignment == b""
    assert d.members[0].client_host == "/127.0.0.1" and d.members[0].client_id == "client"
    x.sync("g", m1, 1, {m1: b"ASSIGN"})
    (d,) = x.describe("g").groups
    assert (d.state, d.protocol_type, d.protocol_data) == ("Stable", "consumer", "range")
    assert d.members[0].metadata == meta_for("a") and d.members[0].assignment == b"ASSIGN"


def test_list_groups_filters() -> None:
    x = h()
    x.stable_group(1, group="stable-one")
    x.commit("simple", {("t", 0): 5})
    res = x.list_groups()
    assert {(g.group_id, g.protocol_type, g.state, g.group_type) for g in res.groups} == {
        ("stable-one", "consumer", "Stable", "classic"),
        ("simple", "", "Empty", "classic"),
    }
    assert [g.group_id for g in x.list_groups(states=["stable"]).groups] == ["stable-one"]
    assert [g.group_id for g in x.list_groups(states=[" EMPTY "]).groups] == ["simple"]
    assert len(x.list_groups(types=["Classic"]).groups) == 2
    assert x.list_groups(types=["consumer"]).groups == ()


# ---------------------------------------------------------------------- DeleteGroups


def test_delete_groups() -> None:
    x = h()
    x.stable_group(1, group="busy")
    x.commit("idle", {("t", 0): 1, ("t", 1): 2})
    t = x.delete_groups("idle", "busy", "nope", "idle")
    assert x.result(t).results == (("idle", E.NONE), ("busy", E.NON_EMPTY_GROUP), ("nope", E.GROUP_ID_NOT_FOUND))
    assert "idle" not in x.m.groups
    records = x.persisted[-1].records
    assert all(v is None for _, v in records)
    assert {k for k, _ in records} >= {GroupMetadataKey("idle")}
    assert len(records) == 3
    assert x.transitions_of("idle") == [("Empty", "Dead")]
    (d,) = x.describe("idle").groups
    assert d.state == "Dead"


def test_delete_groups_answers_after_the_tombstones_are_written() -> None:
    x = h()
    x.commit("idle", {("t", 0): 1})
    x.hold_persists = True
    t = x.delete_groups("idle")
    assert not x.answered(t)
    x.complete_persists()
    assert x.result(t).results == (("idle", E.NONE),)


# ------------------------------------------------------ shutdown ("Loading and unloading")


def test_shutdown_answers_parked_requests_not_coordinator() -> None:
    x = h()
    _ids, leader, gen = x.stable_group(2, group="a")
    tj = x.join("a", leader)  # parked in PreparingRebalance
    t1, _ = x.join_dynamic("b")
    t2, _ = x.join_dynamic("b")
    x.advance(0)
    b_leader = x.result(t1).leader
    follower = x.result(t2).member_id if x.result(t2).member_id != b_leader else x.result(t1).member_id
    ts = x.sync("b", follower, 1)  # parked in CompletingRebalance
    x.apply(x.m.shutdown(x.now))
    assert x.result(tj).error == E.NOT_COORDINATOR and x.result(ts).error == E.NOT_COORDINATOR
    assert x.m.groups == {}
    assert ("PreparingRebalance", "Dead") in x.transitions_of("a")
    assert dict(x.m.deadlines) == {}
    assert x.result(x.join("a")).error == E.COORDINATOR_NOT_AVAILABLE
    assert x.heartbeat("a", leader, gen) == E.COORDINATOR_NOT_AVAILABLE
    assert DEAD == S.DEAD


# ------------------------------------------------------- following Kafka's Java coordinator


def test_describe_outside_stable_keeps_each_members_last_assignment() -> None:
    """GroupMetadataManager.describeGroups: outside Stable, members are described without
    metadata (describeNoMetadata) but with the assignment they last received."""
    x = h()
    ids, leader, _gen = x.stable_group(2)
    x.join(member_id=leader)  # -> PreparingRebalance; assignments are kept (Stable -> Preparing)
    (d,) = x.describe("g").groups
    assert (d.state, d.protocol_type, d.protocol_data) == ("PreparingRebalance", "consumer", "")
    assert {m.member_id: (m.metadata, m.assignment) for m in d.members} == {
        i: (b"", f"assign-{i}".encode()) for i in ids
    }


def test_protocol_vote_ties_are_broken_as_javas_hash_map_iterates() -> None:
    """ClassicGroup.selectProtocol counts votes in a java.util.HashMap and keeps the first
    protocol with the most votes in its iteration order: range (bucket 9 of 16) beats
    roundrobin (10) and cooperative-sticky (15), whoever voted first."""
    for other in ("roundrobin", "cooperative-sticky"):
        x = h()
        t1, _ = x.join_dynamic(protocols=((other, META), ("range", META)))  # first vote: other
        t2, _ = x.join_dynamic(protocols=(("range", META), (other, META)))
        x.advance(0)
        assert x.result(t1).protocol_name == x.result(t2).protocol_name == "range", other
    # a majority still wins over the tie-break
    x = h()
    tokens = [x.join_dynamic(protocols=p)[0] for p in [(("roundrobin", META), ("range", META))] * 2]
    tokens.append(x.join_dynamic(protocols=(("range", META), ("roundrobin", META)))[0])
    x.advance(0)
    assert {x.result(t).protocol_name for t in tokens} == {"roundrobin"}


def test_java_hash_map_order_matches_java() -> None:
    from rallypoint.groups.model import java_hash_map_order, java_string_hash

    assert java_string_hash("hello") == 99162322  # "hello".hashCode()
    assert java_string_hash("polygenelubricants") == 2**31  # Integer.MIN_VALUE, unsigned
    assert java_hash_map_order(["cooperative-sticky", "roundrobin", "range", "sticky"]) == [
        "sticky",
        "range",
        "roundrobin",
        "cooperative-sticky",
    ]


def test_pending_member_rejoining_with_an_instance_id_gets_unknown_server_error() -> None:
    """classicGroupJoinExistingMember throws IllegalStateException for a pending member with a
    group.instance.id; GroupCoordinatorService answers it UNKNOWN_SERVER_ERROR, group untouched."""
    x = h()
    pending = x.result(x.join()).member_id
    before = (len(x.transitions), dict(x.m.deadlines))
    r = x.result(x.join(member_id=pending, instance="i1"))
    assert (r.error, r.member_id, r.generation_id, r.leader) == (E.UNKNOWN_SERVER_ERROR, "", -1, "")
    g = x.m.groups["g"]
    assert pending in g.pending_members and not g.members and not g.static_members
    assert (len(x.transitions), dict(x.m.deadlines)) == before
    t = x.join(member_id=pending)  # the same member without the instance id is accepted
    x.advance(0)
    assert x.result(t).error == E.NONE


def test_join_group_naming_a_protocol_twice_is_refused_and_the_group_keeps_working() -> None:
    """Issue 14, defect 8: a protocol listed twice counted twice, so no protocol was supported
    by every member, the vote raised inside the join timer and the group stayed
    PreparingRebalance.  The request is refused INCONSISTENT_GROUP_PROTOCOL instead."""
    x = h()
    twice = (("range", META), ("range", META))
    r = x.result(x.join(protocols=twice))
    assert (r.error, r.member_id) == (E.INCONSISTENT_GROUP_PROTOCOL, "")
    r = x.result(x.join(protocols=twice, version=3))
    assert r.error == E.INCONSISTENT_GROUP_PROTOCOL
    ids, leader, gen = x.stable_group(2)
    r = x.result(x.join(member_id=ids[1], protocols=(("range", META), ("roundrobin", META), ("range", META))))
    assert (r.error, r.member_id) == (E.INCONSISTENT_GROUP_PROTOCOL, ids[1])
    assert x.state() == S.STABLE and x.heartbeat("g", leader, gen) == E.NONE
