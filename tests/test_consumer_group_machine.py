"""The consumer-group (KIP-848) machine with a fake clock (docs/consumer-groups.md)."""

from __future__ import annotations

import uuid

import pytest
from rallypoint.groups.consumer import ConsumerGroupConfig, ConsumerGroupMachine
from rallypoint.groups.consumer_events import ClassicGroupSnapshot
from rallypoint.groups.events import ConsumerMemberKey
from rallypoint.groups.reconciliation import MemberState
from rallypoint.protocol.consumer_group_records import (
    CurrentMemberAssignmentKey,
    GroupMetadataKey,
    MemberMetadataKey,
    RegularExpressionKey,
    TargetAssignmentMemberKey,
    TargetAssignmentMetadataKey,
    decode_record,
    encode_record,
)
from rallypoint.protocol.errors import ErrorCode

from .consumer_harness import Client, Harness

pytestmark = pytest.mark.unit

E = ErrorCode


def settle(clients: list[Client], rounds: int = 10) -> None:
    for _ in range(rounds):
        for c in clients:
            c.beat()


@pytest.fixture
def h() -> Harness:
    h = Harness()
    h.topics.create("t", 6)
    return h


# ------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("kw", "code", "message"),
    [
        ({"member_id": "", "epoch": 0}, E.INVALID_REQUEST, "MemberId can't be empty."),
        ({"member_id": "  ", "epoch": 5, "version": 0}, E.INVALID_REQUEST, "MemberId can't be empty."),
        ({"member_id": "m", "epoch": -3}, E.INVALID_REQUEST, "MemberEpoch is invalid: -3."),
        ({"member_id": "m", "epoch": 0, "rebalance_timeout_ms": -1}, E.INVALID_REQUEST, None),
        ({"member_id": "m", "epoch": 0, "owned": {uuid.uuid4(): [1]}}, E.INVALID_REQUEST, None),
        ({"member_id": "m", "epoch": -2}, E.INVALID_REQUEST, "InstanceId can't be null."),
        ({"member_id": "m", "epoch": 0, "instance_id": " "}, E.INVALID_REQUEST, "InstanceId can't be empty."),
        ({"member_id": "m", "epoch": 0, "assignor": "sticky"}, E.UNSUPPORTED_ASSIGNOR, None),
        ({"member_id": "m", "epoch": 3}, E.GROUP_ID_NOT_FOUND, None),
    ],
)
def test_validation(h: Harness, kw: dict, code: ErrorCode, message: str | None) -> None:
    r = h.hb(**kw)
    assert r.error == code
    if message is not None:
        assert r.error_message == message
    assert "g" not in h.machine.groups


def test_join_needs_names_or_regex(h: Harness) -> None:
    r = h.hb("m", 0, topics=None, regex=None, rebalance_timeout_ms=1000, owned={})
    # the harness turns "neither" into names=() for convenience: send a raw one instead
    assert r.error == E.NONE
    from rallypoint.groups.consumer import validate_heartbeat
    from rallypoint.groups.consumer_events import ConsumerHeartbeat

    bad = ConsumerHeartbeat("g", "m2", 0, rebalance_timeout_ms=1000, topic_partitions={})
    assert validate_heartbeat(bad, h.config) is not None
    empty = ConsumerHeartbeat("g", "m2", 0, rebalance_timeout_ms=1000, topic_partitions={}, subscribed_topic_names=())
    assert validate_heartbeat(empty, h.config) is None


def test_v0_empty_member_id_gets_a_uuid(h: Harness) -> None:
    r = h.hb("", 0, topics=["t"], version=0)
    assert r.error == E.NONE and r.member_id and uuid.UUID(r.member_id)


# ------------------------------------------------------------------ epochs and assignment


def test_first_member_gets_epoch_2_and_everything(h: Harness) -> None:
    a = Client(h, "a", ["t"])
    r = a.join()
    assert r.error == E.NONE and r.member_epoch == 2 and r.heartbeat_interval_ms == 5000
    assert a.count() == 6
    g = h.group()
    assert (g.epoch, g.assignment_epoch, g.state()) == (2, 2, "Stable")
    # one atomic batch in Kafka's order: member metadata, group epoch, target, current assignment
    kinds = [type(k).__name__ for k, _ in h.log]
    assert kinds == [
        "MemberMetadataKey",
        "GroupMetadataKey",
        "TargetAssignmentMemberKey",
        "TargetAssignmentMetadataKey",
        "CurrentMemberAssignmentKey",
    ]


def test_three_members_uniform_two_each_and_revoke_before_assign(h: Harness) -> None:
    a, b, c = (Client(h, m, ["t"]) for m in "abc")
    a.join()
    b.join()
    # b is at the new epoch but gets nothing a still owns
    assert b.epoch == 3 and b.count() == 0
    assert h.group().members["b"].assignment.state == MemberState.UNRELEASED_PARTITIONS
    h.check_single_owner()
    r = a.beat()  # a is told to revoke: same epoch, fewer partitions
    assert r.member_epoch == 2 and a.count() == 3
    assert h.group().members["a"].assignment.state == MemberState.UNREVOKED_PARTITIONS
    assert h.group().state() == "Reconciling"
    a.beat()  # a acks (owned no longer lists them) -> epoch 3
    assert a.epoch == 3
    b.beat()
    assert b.count() == 3
    c.join()
    settle([a, b, c])
    assert [x.count() for x in (a, b, c)] == [2, 2, 2]
    assert h.group().state() == "Stable"
    h.check_single_owner()
    # every partition once
    allp = [(t, p) for x in (a, b, c) for t, ps in x.owned.items() for p in ps]
    assert len(allp) == len(set(allp)) == 6


def test_leave_rebalances_to_three_each(h: Harness) -> None:
    cs = [Client(h, m, ["t"]) for m in "abc"]
    for c in cs:
        c.join()
    settle(cs)
    epoch = h.group().epoch
    r = cs[2].leave()
    assert (r.error, r.member_epoch, r.member_id) == (E.NONE, -1, "c")
    assert "c" not in h.group().members and h.group().epoch == epoch + 1
    settle(cs[:2])
    assert sorted(x.count() for x in cs[:2]) == [3, 3]
    h.check_single_owner()


def test_fenced_member_epoch_and_lost_response(h: Harness) -> None:
    a, b = Client(h, "a", ["t"]), Client(h, "b", ["t"])
    a.join()
    assert h.hb("a", 7, owned=a.owned).error == E.FENCED_MEMBER_EPOCH  # newer than the server's
    b.join()
    settle([a, b])
    assert a.epoch == 3 and h.group().members["a"].assignment.previous_epoch == 2
    # the response carrying epoch 3 was lost: epoch 2 with owned ⊆ assigned is accepted
    r = h.hb("a", 2, owned=a.owned)
    assert r.error == E.NONE and r.member_epoch == 3
    # ... but not without an owned list
    assert h.hb("a", 2).error == E.FENCED_MEMBER_EPOCH
    # nor with a partition it does not own
    other = {t: set(range(6)) for t in a.owned}
    assert h.hb("a", 2, owned=other).error == E.FENCED_MEMBER_EPOCH
    # epoch 0 with a known id is a rejoin, not fenced
    r = h.hb("a", 0, topics=["t"])
    assert r.error == E.NONE and r.member_epoch == 3


def test_unknown_member(h: Harness) -> None:
    Client(h, "a", ["t"]).join()
    assert h.hb("zz", 2).error == E.UNKNOWN_MEMBER_ID
    assert h.hb("zz", -1).error == E.UNKNOWN_MEMBER_ID
    assert h.hb("zz", -1, group="nope").error == E.GROUP_ID_NOT_FOUND


def test_assignment_sent_only_on_join_full_or_change(h: Harness) -> None:
    a = Client(h, "a", ["t"])
    a.join()
    r = a.beat()
    assert r.assignment is None
    full = h.hb("a", 2, topics=["t"], owned=a.owned, rebalance_timeout_ms=1000)
    assert full.assignment is not None


def test_subscription_change_bumps_epoch_rack_does_not(h: Harness) -> None:
    h.topics.create("u", 2)
    a = Client(h, "a", ["t"])
    a.join()
    assert h.hb("a", 2, rack="r1").member_epoch == 2 and h.group().epoch == 2
    assert h.group().members["a"].meta.rack_id == "r1"
    r = h.hb("a", 2, topics=["t", "u"], owned=a.owned)
    assert h.group().epoch == 3 and r.member_epoch == 3 and sum(map(len, r.assignment.values())) == 8


def test_assignment_interval_defers_the_assignor() -> None:
    h = Harness(config=ConsumerGroupConfig(assignment_interval_ms=1000))
    h.topics.create("t", 4)
    a, b = Client(h, "a", ["t"]), Client(h, "b", ["t"])
    a.join()
    h.advance(100)
    b.join()
    g = h.group()
    assert g.epoch == 3 and g.assignment_epoch == 2 and g.state() == "Assigning"
    assert b.count() == 0
    a.beat()
    assert g.assignment_epoch == 2  # still within the interval: nothing computed, no timer either
    h.advance(1000)
    a.beat()
    assert g.assignment_epoch == 3
    settle([a, b])
    assert sorted((a.count(), b.count())) == [2, 2]


def test_session_timeout_fences(h: Harness) -> None:
    a, b = Client(h, "a", ["t"]), Client(h, "b", ["t"])
    a.join()
    b.join()
    settle([a, b])
    h.advance(40000)
    a.beat()
    h.advance(10000)  # b's 45 s are up, a's are not
    assert set(h.group().members) == {"a"}
    assert b.beat().error == E.UNKNOWN_MEMBER_ID
    settle([a])
    assert a.count() == 6


def test_group_configs_override_session_timeout_and_heartbeat_interval(h: Harness) -> None:
    """consumer.session.timeout.ms / consumer.heartbeat.interval.ms set on one group (resource
    type GROUP) apply to that group only; the others keep the broker's settings."""
    overrides = {("fast", "consumer.session.timeout.ms"): "8000", ("fast", "consumer.heartbeat.interval.ms"): "700"}
    defaults = {"consumer.session.timeout.ms": "45000", "consumer.heartbeat.interval.ms": "5000"}
    h.machine.group_setting = lambda gid, name: overrides.get((gid, name), defaults[name])
    fast, slow = Client(h, "a", ["t"], group="fast"), Client(h, "b", ["t"], group="g")
    assert fast.join().heartbeat_interval_ms == 700
    assert slow.join().heartbeat_interval_ms == 5000
    assert h.timers[ConsumerMemberKey("session", "fast", "a")] == h.now + 8000
    h.advance(8001)
    assert "a" not in h.group("fast").members  # fenced after the group's own 8 s
    assert set(h.group("g").members) == {"b"}


def test_rebalance_timeout_fences_a_member_that_does_not_revoke(h: Harness) -> None:
    a = Client(h, "a", ["t"], rebalance_timeout_ms=10000)
    b = Client(h, "b", ["t"])
    a.join()
    b.join()
    h.hb("a", a.epoch)  # told to revoke; keeps heartbeating without acknowledging (owned = null)
    assert h.group().members["a"].assignment.state == MemberState.UNREVOKED_PARTITIONS
    h.advance(5000)
    h.hb("a", a.epoch)
    h.advance(5001)
    assert "a" not in h.group().members
    settle([b])
    assert b.count() == 6


def test_group_max_size() -> None:
    h = Harness(config=ConsumerGroupConfig(max_size=1, assignment_interval_ms=0))
    h.topics.create("t", 1)
    Client(h, "a", ["t"]).join()
    assert h.hb("b", 0, topics=["t"]).error == E.GROUP_MAX_SIZE_REACHED


# ------------------------------------------------------------------------- static members


def test_static_member_leaves_and_returns_with_its_partitions(h: Harness) -> None:
    a = Client(h, "a1", ["t"], instance_id="ia")
    b = Client(h, "b", ["t"])
    a.join()
    b.join()
    settle([a, b])
    before_a, before_b, epoch = dict(a.owned), dict(b.owned), h.group().epoch
    r = a.leave(-2)
    assert (r.error, r.member_epoch) == (E.NONE, -2)
    m = h.group().members["a1"]
    assert m.epoch == -2 and all(e == 0 for ps in m.assignment.assigned.values() for e in ps.values())
    # a duplicate of a live instance is refused
    assert h.hb("x", 0, topics=["t"], instance_id=b.member_id + "-no").error == E.NONE  # other instance: fine
    h.hb("x", -1)
    epoch = h.group().epoch
    a2 = Client(h, "a2", ["t"], instance_id="ia")
    r = a2.join()
    assert r.error == E.NONE and {t: set(p) for t, p in r.assignment.items()} == {
        t: set(p) for t, p in before_a.items()
    }
    assert h.group().epoch == epoch  # no bump
    assert "a1" not in h.group().members
    settle([a2, b])
    assert b.owned == before_b
    # the old id is fenced by instance
    assert h.hb("a1", 3, instance_id="ia").error == E.FENCED_INSTANCE_ID


def test_unreleased_instance_id(h: Harness) -> None:
    Client(h, "a1", ["t"], instance_id="ia").join()
    r = h.hb("a2", 0, topics=["t"], instance_id="ia")
    assert r.error == E.UNRELEASED_INSTANCE_ID


def test_static_member_that_does_not_return_is_fenced_at_session_timeout(h: Harness) -> None:
    a = Client(h, "a1", ["t"], instance_id="ia")
    a.join()
    a.leave(-2)
    h.advance(45001)
    assert "g" in h.machine.groups and not h.group().members


# ------------------------------------------------------------------------- topics / regex


def test_topic_growth_and_deletion_change_the_assignment(h: Harness) -> None:
    a = Client(h, "a", ["t", "u"])
    a.join()
    assert a.count() == 6
    h.topics.create("u", 2)
    a.beat()
    assert a.count() == 8 and h.group().epoch == 3
    h.topics.delete("u")
    a.beat()
    a.beat()
    assert a.count() == 6


def test_regex_subscription_picks_up_new_topics(h: Harness) -> None:
    a = Client(h, "a", None, regex="(^rp-.*)")
    h.topics.create("rp-1", 2)
    a.join()
    assert a.count() == 2
    assert any(isinstance(k, RegularExpressionKey) for k, _ in h.log)
    h.topics.create("rp-2", 3)
    h.topics.create("xrp-3", 3)
    a.beat()
    assert a.count() == 5
    g = h.group()
    assert g.regexes["(^rp-.*)"].topics == ("rp-1", "rp-2")


def test_invalid_regex(h: Harness) -> None:
    r = h.hb("a", 0, regex="(unclosed")
    assert r.error == E.INVALID_REGULAR_EXPRESSION
    assert "g" not in h.machine.groups


def test_regex_is_a_full_match(h: Harness) -> None:
    h.topics.create("topic", 1)
    a = Client(h, "a", None, regex="^top")
    a.join()
    assert a.count() == 0


def test_regex_tombstoned_when_last_subscriber_leaves(h: Harness) -> None:
    h.topics.create("rp-1", 1)
    a = Client(h, "a", None, regex="rp-.*")
    a.join()
    a.leave()
    assert not h.group().regexes
    assert (RegularExpressionKey("g", "rp-.*"), None) in h.log


# ---------------------------------------------------------------------------- assignors


def test_range_assignor_orders_static_members_by_instance_id() -> None:
    h = Harness()
    t1, t2 = h.topics.create("t1", 3), h.topics.create("t2", 3)
    # join order differs from instance-id order
    cs = [
        Client(h, "m-z", ["t1", "t2"], instance_id="i-2", assignor="range"),
        Client(h, "m-a", ["t1", "t2"], instance_id="i-1", assignor="range"),
    ]
    for c in cs:
        c.join()
    settle(cs)
    first = {t1.topic_id: {0, 1}, t2.topic_id: {0, 1}}
    second = {t1.topic_id: {2}, t2.topic_id: {2}}
    assert cs[1].owned == first and cs[0].owned == second


def test_range_heterogeneous() -> None:
    h = Harness()
    t1, t2 = h.topics.create("t1", 3), h.topics.create("t2", 3)
    a = Client(h, "a", ["t1", "t2"], instance_id="i-1", assignor="range")
    b = Client(h, "b", ["t1"], instance_id="i-2", assignor="range")
    a.join()
    b.join()
    settle([a, b])
    assert a.owned == {t1.topic_id: {0, 1}, t2.topic_id: {0, 1, 2}}
    assert b.owned == {t1.topic_id: {2}}
    assert h.machine.describe(["g"])[0].assignor_name == "range"


# ---------------------------------------------------------------------- offsets, admin


def test_offset_commit_validation(h: Harness) -> None:
    a, b = Client(h, "a", ["t"]), Client(h, "b", ["t"])
    a.join()
    tid = h.topics.get("t").topic_id
    v = h.machine.validate_offset_commit
    assert v("other", "a", 2, 9) is None  # not a consumer group: classic rules
    assert v("g", "a", 2, 9, [(tid, 0)]) == E.NONE
    assert v("g", "a", 3, 9, [(tid, 0)]) == E.STALE_MEMBER_EPOCH
    assert v("g", "zz", 2, 9) == E.UNKNOWN_MEMBER_ID
    assert v("g", "a", 2, 8, [(tid, 0)]) == E.UNSUPPORTED_VERSION
    assert v("g", "", -1, 9) == E.UNKNOWN_MEMBER_ID  # epoch -1 on a non-empty group
    assert v("g", "", -1, 3, transactional=True) == E.NONE
    b.join()
    settle([a, b])
    assert a.epoch == 3
    # older epoch: accepted for partitions assigned at or before it (KIP-1251), else stale
    kept = [(t, p) for t, ps in h.group().members["a"].assignment.assigned.items() for p, e in ps.items() if e <= 2]
    assert kept and v("g", "a", 2, 9, kept) == E.NONE
    new_b = [(t, p) for t, ps in h.group().members["b"].assignment.assigned.items() for p in ps]
    assert v("g", "b", 2, 9, new_b) == E.STALE_MEMBER_EPOCH
    assert v("g", "a", 2, 9, new_b) == E.STALE_MEMBER_EPOCH  # not its partition
    a.leave()
    b.leave()
    assert v("g", "", -1, 9) == E.NONE  # empty group: admin commits


def test_offset_fetch_validation(h: Harness) -> None:
    Client(h, "a", ["t"]).join()
    v = h.machine.validate_offset_fetch
    assert v("g", None, -1) == E.NONE
    assert v("g", "a", 2) == E.NONE
    assert v("g", "a", 1) == E.STALE_MEMBER_EPOCH
    assert v("g", "zz", 2) == E.UNKNOWN_MEMBER_ID
    assert v("x", "a", 2) is None


def test_describe_and_list(h: Harness) -> None:
    a = Client(h, "a", ["t"])
    a.join()
    d = h.machine.describe(["g", "nope"])
    assert d[1].error == E.GROUP_ID_NOT_FOUND
    g = d[0]
    assert (g.state, g.group_epoch, g.assignment_epoch, g.assignor_name) == ("Stable", 2, 2, "uniform")
    m = g.members[0]
    assert m.member_id == "a" and m.subscribed_topic_names == ("t",) and m.member_type == 1
    assert m.assignment[0].topic_name == "t" and m.assignment[0].partitions == tuple(range(6))
    assert m.target_assignment == m.assignment
    ls = h.machine.list_groups([], [])
    assert [(x.group_id, x.protocol_type, x.state, x.group_type) for x in ls] == [
        ("g", "consumer", "Stable", "consumer")
    ]
    assert h.machine.list_groups([], ["classic"]) == []
    assert h.machine.list_groups(["empty"], []) == []
    assert h.machine.list_groups([" STABLE "], ["Consumer"]) == ls


def test_delete_group(h: Harness) -> None:
    a = Client(h, "a", ["t"])
    a.join()
    h.apply(h.machine.delete_group(99, "g", h.now))
    assert h.responses.pop(99) == E.NON_EMPTY_GROUP
    a.leave()
    h.apply(h.machine.delete_group(99, "g", h.now))
    assert h.responses.pop(99) == E.NONE
    assert "g" not in h.machine.groups
    assert h.log[-1] == (GroupMetadataKey("g"), None)


def test_classic_group_of_the_same_id_is_not_taken_over() -> None:
    h = Harness()
    h.machine.classic_members = lambda gid: 2 if gid == "g" else None
    assert h.hb("a", 0, topics=[]).error == E.GROUP_ID_NOT_FOUND


# ---------------------------------------------------------------------- persistence


def test_replay_restores_the_group_exactly(h: Harness) -> None:
    h.topics.create("rp-x", 2)
    cs = [Client(h, "a", ["t"]), Client(h, "b", ["t"], instance_id="ib"), Client(h, "c", None, regex="rp-.*")]
    for c in cs:
        c.join()
    cs[0].beat()  # mid-reconciliation
    # through the byte codec, like the log
    records = [decode_record(*encode_record(k, v)) for k, v in h.log]
    other = ConsumerGroupMachine(h.config, h.topics)
    effects = other.load(h.group().partition, records, h.now)
    g1, g2 = h.group(), other.groups["g"]
    assert (g1.epoch, g1.assignment_epoch, g1.metadata_hash, g1.target, g1.owners, g1.static, g1.regexes) == (
        g2.epoch,
        g2.assignment_epoch,
        g2.metadata_hash,
        g2.target,
        g2.owners,
        g2.static,
        g2.regexes,
    )
    assert {k: (m.meta, m.assignment) for k, m in g1.members.items()} == {
        k: (m.meta, m.assignment) for k, m in g2.members.items()
    }
    armed = {e.key for e in effects if type(e).__name__ == "ArmTimer"}
    assert {ConsumerMemberKey("session", "g", m) for m in "abc"} <= armed


def test_failed_write_is_undone(h: Harness) -> None:
    a = Client(h, "a", ["t"])
    a.join()
    h.fail_writes = E.KAFKA_STORAGE_ERROR
    r = h.hb("b", 0, topics=["t"])
    assert r.error == E.NOT_COORDINATOR
    assert set(h.group().members) == {"a"} and h.group().epoch == 2
    h.fail_writes = None
    r = h.hb("b", 0, topics=["t"])
    assert r.error == E.NONE and r.member_epoch == 3


def test_failed_write_undoes_later_writes_too(h: Harness) -> None:
    a = Client(h, "a", ["t"])
    a.join()
    h.hold_writes = True
    h.hb("b", 0, topics=["t"])
    h.hb("c", 0, topics=["t"])
    assert set(h.group().members) == {"a", "b", "c"}
    h.hold_writes = False
    h.release(E.KAFKA_STORAGE_ERROR)
    assert set(h.group().members) == {"a"} and h.group().epoch == 2
    h.check_single_owner()


def test_failed_first_join_removes_the_group() -> None:
    h = Harness()
    h.fail_writes = E.KAFKA_STORAGE_ERROR
    assert h.hb("a", 0, topics=[]).error == E.NOT_COORDINATOR
    assert "g" not in h.machine.groups


def test_fencing_writes_tombstones_in_order(h: Harness) -> None:
    a = Client(h, "a", ["t"])
    a.join()
    n = len(h.log)
    a.leave()
    assert [k for k, _ in h.log[n:]] == [
        CurrentMemberAssignmentKey("g", "a"),
        TargetAssignmentMemberKey("g", "a"),
        MemberMetadataKey("g", "a"),
        GroupMetadataKey("g"),
        TargetAssignmentMetadataKey("g"),
    ]
    assert h.group().state() == "Empty"


def test_preferred_assignor_change_bumps_the_epoch(h: Harness) -> None:
    a = Client(h, "a", ["t"])
    a.join()
    assert h.machine.describe(["g"])[0].assignor_name == "uniform"
    r = h.hb("a", 2, assignor="range", owned=a.owned)
    assert h.group().epoch == 3 and r.member_epoch == 3
    assert h.machine.describe(["g"])[0].assignor_name == "range"


def test_target_records_only_for_members_whose_target_changed(h: Harness) -> None:
    h.topics.create("u", 2)
    a, b = Client(h, "a", ["t"]), Client(h, "b", ["u"])
    a.join()
    b.join()
    settle([a, b])
    n = len(h.log)
    h.topics.create("t2", 1)
    h.hb("b", b.epoch, topics=["u", "t2"], owned=b.owned)  # b's subscription changes, a's target does not
    written = [k for k, _ in h.log[n:] if isinstance(k, TargetAssignmentMemberKey)]
    assert written == [TargetAssignmentMemberKey("g", "b")]
    assert [k for k, _ in h.log[n:]].count(TargetAssignmentMetadataKey("g")) == 1


def test_leave_does_not_validate_the_epoch(h: Harness) -> None:
    a = Client(h, "a", ["t"])
    a.join()
    r = h.hb("a", -1)
    assert (r.error, r.member_epoch) == (E.NONE, -1)


def test_static_leave_releases_pending_revocations(h: Harness) -> None:
    a = Client(h, "a", ["t"], instance_id="ia")
    b = Client(h, "b", ["t"])
    a.join()
    b.join()
    h.hb("a", a.epoch)  # told to revoke 3 partitions, does not acknowledge
    assert h.group().members["a"].assignment.pending_revocation
    a.leave(-2)
    assert not h.group().members["a"].assignment.pending_revocation
    settle([b])
    assert b.count() == 3  # the released ones
    h.check_single_owner()


def test_transitions_are_reported(h: Harness) -> None:
    a, b = Client(h, "a", ["t"]), Client(h, "b", ["t"])
    a.join()
    b.join()
    settle([a, b])
    a.leave()
    b.leave()
    states = [(t.from_state, t.to_state) for t in h.transitions]
    assert states[0] == ("Dead", "Stable")
    assert ("Stable", "Reconciling") in states and states[-1][1] == "Empty"


# ---------------------------------------------------------------------- classic members


def _subscription(topics: list[str], version: int = 1, owned: tuple = ()) -> bytes:
    from rallypoint.protocol.consumer_protocol import Subscription, encode_subscription

    return encode_subscription(Subscription(version, tuple(topics), None, owned))


def classic_join(
    h: Harness,
    member_id: str,
    topics: list[str],
    *,
    version: int = 5,
    instance: str | None = None,
    session: int = 10000,
):
    from rallypoint.groups.events import JoinRequest, Protocol

    req = JoinRequest(
        "g",
        member_id,
        instance,
        session,
        20000,
        "consumer",
        (Protocol("range", _subscription(topics)),),
        "cid",
        "/h",
        version,
    )
    h._token += 1
    h.apply(h.machine.classic_join(h._token, req, h.now))
    return h.responses.pop(h._token)


def classic_sync(h: Harness, member_id: str, generation: int):
    from rallypoint.groups.events import SyncRequest
    from rallypoint.protocol.consumer_protocol import decode_assignment

    h._token += 1
    h.apply(
        h.machine.classic_sync(
            h._token, SyncRequest("g", generation, member_id, None, "consumer", "range", (), 5), h.now
        )
    )
    r = h.responses.pop(h._token)
    return r, (decode_assignment(r.assignment) if r.error == E.NONE else None)


def classic_heartbeat(h: Harness, member_id: str, generation: int) -> ErrorCode:
    from rallypoint.groups.events import HeartbeatRequest

    h._token += 1
    h.apply(h.machine.classic_heartbeat(h._token, HeartbeatRequest("g", generation, member_id), h.now))
    return h.responses.pop(h._token).error


def test_classic_member_joins_a_consumer_group(h: Harness) -> None:
    a = Client(h, "a", ["t"])
    a.join()
    r = classic_join(h, "", ["t"])
    assert r.error == E.MEMBER_ID_REQUIRED and r.member_id
    cid = r.member_id
    r = classic_join(h, cid, ["t"])
    assert (r.error, r.member_id, r.protocol_type, r.protocol_name, r.leader, r.members) == (
        E.NONE,
        cid,
        "consumer",
        "range",
        "",
        (),
    )
    gen = r.generation_id
    assert gen == 3  # its member epoch
    # a still owns everything: the classic member is told to rejoin until it is released
    s, assignment = classic_sync(h, cid, gen)
    assert s.error == E.NONE and assignment.partitions == ()
    a.beat()
    a.beat()
    assert a.count() == 3
    assert classic_heartbeat(h, cid, gen) == E.REBALANCE_IN_PROGRESS
    r = classic_join(h, cid, ["t"])
    s, assignment = classic_sync(h, cid, r.generation_id)
    assert s.error == E.NONE and sum(len(tp.partitions) for tp in assignment.partitions) == 3
    assert classic_heartbeat(h, cid, r.generation_id) == E.NONE
    assert classic_heartbeat(h, cid, r.generation_id + 1) == E.ILLEGAL_GENERATION
    h.check_single_owner()
    d = h.machine.describe(["g"])[0]
    assert sorted(m.member_type for m in d.members) == [0, 1]
    # classic commits use the generation; a wrong one is ILLEGAL_GENERATION, old versions are fine
    tid = h.topics.get("t").topic_id
    mine = [(tid, p) for p in h.group().members[cid].assignment.assigned[tid]]
    assert h.machine.validate_offset_commit("g", cid, r.generation_id, 2, mine) == E.NONE
    assert h.machine.validate_offset_commit("g", cid, r.generation_id + 1, 2, mine) == E.ILLEGAL_GENERATION


def test_classic_member_session_timeout_is_its_own(h: Harness) -> None:
    Client(h, "a", ["t"]).join()
    r = classic_join(h, "c1", ["t"], version=3, session=6000)
    assert r.error == E.NONE
    h.advance(6001)
    assert "c1" not in h.group().members and "a" in h.group().members  # a's is the group's 45 s


def test_classic_leave_and_unsupported_protocols(h: Harness) -> None:
    from rallypoint.groups.events import JoinRequest, LeaveMember, LeaveRequest, Protocol

    Client(h, "a", ["t"]).join()
    assert classic_join(h, "c1", ["t"]).error == E.NONE
    # a protocol no classic member supports
    req = JoinRequest(
        "g", "c2", None, 10000, 10000, "consumer", (Protocol("roundrobin", _subscription(["t"])),), "c", "/h", 5
    )
    h.apply(h.machine.classic_join(500, req, h.now))
    assert h.responses.pop(500).error == E.INCONSISTENT_GROUP_PROTOCOL
    h.apply(h.machine.classic_leave(501, LeaveRequest("g", (LeaveMember("c1"), LeaveMember("zz"))), h.now))
    res = h.responses.pop(501)
    assert [m.error for m in res.members] == [E.NONE, E.UNKNOWN_MEMBER_ID]
    assert set(h.group().members) == {"a"}


def test_classic_join_to_an_empty_consumer_group_hands_it_to_the_classic_coordinator(h: Harness) -> None:
    a = Client(h, "a", ["t"])
    a.join()
    a.leave()
    from rallypoint.groups.events import JoinRequest, Protocol

    req = JoinRequest("g", "", None, 10000, 10000, "consumer", (Protocol("range", _subscription(["t"])),), "c", "/h", 5)
    h.apply(h.machine.classic_join(600, req, h.now))
    assert h.responses.pop(600) is None
    assert "g" not in h.machine.groups
    assert h.log[-1] == (GroupMetadataKey("g"), None)


def test_migration_policy_disabled_refuses_classic_members() -> None:
    h = Harness(config=ConsumerGroupConfig(migration_policy="disabled", assignment_interval_ms=0))
    h.topics.create("t", 2)
    Client(h, "a", ["t"]).join()
    assert classic_join(h, "c1", ["t"]).error == E.INCONSISTENT_GROUP_PROTOCOL


def test_upgrade_records_from_a_classic_group(h: Harness) -> None:
    """The conversion of a live classic group (online upgrade), then a consumer-protocol member
    joining it and the classic members following the server's assignment."""
    from rallypoint.groups.consumer_events import ClassicGroupSnapshot, ClassicMemberSnapshot
    from rallypoint.protocol.consumer_protocol import Assignment, TopicPartitions, encode_assignment

    def member(mid: str, parts: tuple[int, ...]) -> ClassicMemberSnapshot:
        return ClassicMemberSnapshot(
            mid,
            None,
            "cid",
            "/h",
            10000,
            20000,
            (("range", _subscription(["t"])),),
            encode_assignment(Assignment(0, (TopicPartitions("t", parts),))),
        )

    snap = ClassicGroupSnapshot("g", 7, "consumer", "range", (member("c1", (0, 1, 2)), member("c2", (3, 4, 5))))
    records = h.machine.upgrade_records(snap)
    assert isinstance(records, list)
    for k, v in records:
        h.machine.replay(k, v)
    g = h.group()
    assert (g.epoch, g.assignment_epoch, g.state()) == (7, 7, "Stable")
    tid = h.topics.get("t").topic_id
    assert g.members["c1"].assignment.assigned == {tid: {0: 7, 1: 7, 2: 7}}
    assert all(not m.uses_consumer_protocol for m in g.members.values())
    # the consumer-protocol member that triggered the upgrade joins: epoch 8, partitions move
    n = Client(h, "n", ["t"])
    n.join()
    assert h.group().epoch == 8 and n.count() == 0
    for _ in range(3):
        for cid in ("c1", "c2"):
            m = h.group().members[cid]
            if classic_heartbeat(h, cid, m.epoch) == E.REBALANCE_IN_PROGRESS:
                r = classic_join(h, cid, ["t"])
                assert r.error == E.NONE
                s, _assignment = classic_sync(h, cid, r.generation_id)
                assert s.error == E.NONE
        n.beat()
        h.check_single_owner()
    assert n.count() == 2 and h.group().state() == "Stable"
    # refusals
    assert (
        h.machine.upgrade_records(ClassicGroupSnapshot("x", 1, "connect", "range", (member("a", (0,)),)))
        == E.GROUP_ID_NOT_FOUND
    )
    with_user_data = ClassicMemberSnapshot(
        "a", None, "c", "/h", 1, 1, (("sticky", _subscription(["t"])),), encode_assignment(Assignment(0, (), b"x"))
    )
    assert (
        h.machine.upgrade_records(ClassicGroupSnapshot("x", 1, "consumer", "sticky", (with_user_data,)))
        == E.GROUP_ID_NOT_FOUND
    )
    down = Harness(config=ConsumerGroupConfig(migration_policy="downgrade"))
    assert down.machine.upgrade_records(snap) == E.GROUP_ID_NOT_FOUND


def _live_classic_group(members: dict[str, tuple[int, ...]]) -> ClassicGroupSnapshot:
    """A Stable classic group "g" at generation 4 as the classic coordinator describes it for an
    upgrade: each member subscribed to "t" (range), owning the given partitions, session 7 s."""
    from rallypoint.groups.consumer_events import ClassicGroupSnapshot, ClassicMemberSnapshot
    from rallypoint.protocol.consumer_protocol import Assignment, TopicPartitions, encode_assignment

    return ClassicGroupSnapshot(
        "g",
        4,
        "consumer",
        "range",
        tuple(
            ClassicMemberSnapshot(
                mid,
                None,
                "cid",
                "/h",
                7000,
                20000,
                (("range", _subscription(["t"])),),
                encode_assignment(Assignment(0, (TopicPartitions("t", parts),))),
            )
            for mid, parts in members.items()
        ),
    )


def test_a_consumer_join_upgrades_a_live_classic_group(h: Harness) -> None:
    """The wired upgrade: a consumer-protocol join for a group id a live classic group holds
    asks the classic side to hand it over (ConvertClassic, before any record is persisted),
    writes the upgrade records, arms each classic member's session timer with its classic
    session timeout, then joins; a failed write undoes the consumer group."""
    snap = _live_classic_group({"c1": (0, 1, 2, 3, 4, 5)})
    h.machine.classic_members = lambda gid: 1 if gid == "g" else None
    h.machine.classic_snapshot = lambda gid: snap if gid == "g" else None
    n = Client(h, "n", ["t"])
    r = n.join()
    assert r.error == E.NONE and r.member_epoch == 5
    assert h.converted == [("g", 0)]  # handed over before the first record reached the log
    assert h.timers[ConsumerMemberKey("session", "g", "c1")] == h.now + 7000
    assert any(note.event == "consumer_group.upgraded" for note in h.notes)
    assert set(h.group().members) == {"c1", "n"}
    # no snapshot (the classic side cannot hand it over): GROUP_ID_NOT_FOUND, nothing written
    other = Harness()
    other.machine.classic_members = lambda gid: 2
    before = len(other.log)
    assert Client(other, "x", ["t"]).join().error == E.GROUP_ID_NOT_FOUND
    assert len(other.log) == before and not other.converted
    # a failed write: the consumer group is gone again
    failing = Harness(fail_writes=E.NOT_COORDINATOR)
    failing.machine.classic_members = lambda gid: 1
    failing.machine.classic_snapshot = lambda gid: snap
    assert Client(failing, "n", ["t"]).join().error == E.NOT_COORDINATOR
    assert "g" not in failing.machine.groups


def test_the_last_consumer_protocol_member_leaving_downgrades_the_group(h: Harness) -> None:
    """Kafka's online downgrade: after an upgrade, the consumer-protocol member leaves; the
    remaining members are classic, so the consumer group's tombstones are written and the
    classic coordinator gets the group (DowngradeToClassic after them) at the group epoch,
    each member with its protocols, classic session timeout and target assignment.  With the
    policy ``upgrade`` the member is only removed and the group stays a consumer group."""
    from rallypoint.protocol.consumer_group_records import GroupMetadataKey
    from rallypoint.protocol.consumer_protocol import decode_assignment

    def snapshot() -> ClassicGroupSnapshot:
        return _live_classic_group({"c1": (0, 1, 2), "c2": (3, 4, 5)})

    def upgraded(harness: Harness) -> Client:
        harness.machine.classic_members = lambda gid: 2
        harness.machine.classic_snapshot = lambda gid: snapshot()
        n = Client(harness, "n", ["t"])
        assert n.join().error == E.NONE
        return n

    n = upgraded(h)
    epoch = h.group().epoch
    tid = h.topics.get("t").topic_id
    targets = {mid: sorted(h.group().target.get(mid, {}).get(tid, ())) for mid in ("c1", "c2")}
    persisted = len(h.log)
    assert n.leave().error == E.NONE
    [(snap, before)] = h.downgraded
    assert before > persisted and h.log[-1] == (GroupMetadataKey("g"), None)  # tombstones first
    assert "g" not in h.machine.groups
    assert (snap.group_id, snap.generation, snap.protocol_type) == ("g", epoch, "consumer")
    by_id = {m.member_id: m for m in snap.members}
    assert set(by_id) == {"c1", "c2"}
    assert by_id["c1"].session_timeout_ms == 7000 and by_id["c1"].protocols[0][0] == "range"
    # each member's target assignment (n's partitions are nobody's until the classic rebalance)
    assert {
        m.member_id: [p for tp in decode_assignment(m.assignment).partitions for p in tp.partitions]
        for m in snap.members
    } == targets
    assert sum(len(v) for v in targets.values()) == 4
    assert not any(k.group_id == "g" for k in h.timers if isinstance(k, ConsumerMemberKey))
    # the policy forbids it: n is removed, the group stays a consumer group of classic members
    up_only = Harness(config=ConsumerGroupConfig(migration_policy="upgrade", assignment_interval_ms=0))
    n2 = upgraded(up_only)
    assert n2.leave().error == E.NONE
    assert not up_only.downgraded and set(up_only.group().members) == {"c1", "c2"}


def test_load_refuses_a_record_giving_a_partition_two_owners(h: Harness) -> None:
    from rallypoint.protocol.consumer_group_records import CurrentMemberAssignmentValue, EpochTopicPartitions

    tid = h.topics.get("t").topic_id
    both = CurrentMemberAssignmentValue(2, 1, 0, (EpochTopicPartitions(tid, (0,), (2,)),), ())
    records = [(CurrentMemberAssignmentKey("g", "a"), both), (CurrentMemberAssignmentKey("g", "b"), both)]
    effects = h.machine.load(h.machine.partition_for("g"), records, h.now)
    assert any(getattr(e, "event", "") == "consumer_group.record_refused" for e in effects)
    assert h.group().owners[(tid, 0)][0] == "a"
    h.check_single_owner()
