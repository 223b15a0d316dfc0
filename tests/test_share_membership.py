"""Share-group membership, the simple assignor and share sessions (docs/share-groups.md,
"Membership", "Assignment", "Share sessions"): sans-IO, explicit clocks."""

from __future__ import annotations

import uuid
from collections.abc import Iterable

import pytest
from rallypoint.groups.consumer_model import TopicInfo
from rallypoint.protocol.errors import ErrorCode
from rallypoint.share import assignor
from rallypoint.share.membership import ShareGroupMachine, ShareHeartbeat
from rallypoint.share.runtime import parse_duration_ms
from rallypoint.share.sessions import SessionError, ShareSessions

pytestmark = pytest.mark.unit

T1 = uuid.UUID(int=1)
T2 = uuid.UUID(int=2)
NOW = 1_000_000
SETTINGS = {"share.heartbeat.interval.ms": "5000", "share.session.timeout.ms": "45000"}


class Topics:
    def __init__(self, **counts: int) -> None:
        self.counts = dict(counts)

    def get(self, name: str) -> TopicInfo | None:
        n = self.counts.get(name)
        return None if n is None else TopicInfo(T1 if name == "t1" else T2, name, n)

    def by_id(self, topic_id: uuid.UUID) -> TopicInfo | None:
        return None

    def names(self) -> Iterable[str]:
        return list(self.counts)


def machine(topics: Topics | None = None, **kw: object) -> ShareGroupMachine:
    return ShareGroupMachine(topics or Topics(t1=2), setting=lambda g, n: SETTINGS[n], **kw)  # type: ignore[arg-type]


def hb(m: ShareGroupMachine, member: str, epoch: int, names: tuple[str, ...] | None = ("t1",), now: int = NOW):
    return m.heartbeat(ShareHeartbeat("g", member, epoch, subscribed_topic_names=names), now)


def test_join_gets_an_assignment_epoch_and_session_timer() -> None:
    m = machine()
    r, timers = hb(m, "a", 0)
    assert r.error == ErrorCode.NONE
    assert r.member_epoch == 1 and r.heartbeat_interval_ms == 5000
    assert r.assignment == {T1: frozenset({0, 1})}
    assert timers.arm == ((("g", "a"), NOW + 45000),)
    r, _ = hb(m, "a", 1, None)
    assert r.member_epoch == 1 and r.assignment is None  # unchanged: not repeated


def test_three_members_two_partitions_everyone_gets_work_and_partitions_are_shared() -> None:
    m = machine()
    for mid in ("a", "b", "c"):
        hb(m, mid, 0)
    epochs = {}
    for mid in ("a", "b", "c"):
        r, _ = hb(m, mid, m.groups["g"].members[mid].epoch, None)
        epochs[mid] = r.member_epoch
    g = m.groups["g"]
    assert set(epochs.values()) == {g.epoch} == {3}
    for mem in g.members.values():
        assert mem.assignment.get(T1), mem.member_id
    covered = set().union(*(mem.assignment[T1] for mem in g.members.values()))
    assert covered == {0, 1}


def test_epoch_rules() -> None:
    m = machine()
    hb(m, "a", 0)
    hb(m, "b", 0)  # group epoch 2; a is still at 1
    r, _ = hb(m, "a", 1, None)
    assert r.member_epoch == 2
    assert hb(m, "a", 1, None)[0].member_epoch == 2  # the previous epoch: its answer may have been lost
    assert hb(m, "a", 3, None)[0].error == ErrorCode.FENCED_MEMBER_EPOCH
    hb(m, "c", 0)
    hb(m, "a", 2, None)  # now at 3, previous 2
    assert hb(m, "a", 1, None)[0].error == ErrorCode.FENCED_MEMBER_EPOCH
    assert hb(m, "zz", 5, None)[0].error == ErrorCode.UNKNOWN_MEMBER_ID


@pytest.mark.parametrize(
    ("member", "epoch", "names", "message"),
    [
        ("", 0, ("t1",), "MemberId can't be empty."),
        ("a", 0, None, "SubscribedTopicNames must be set in first request."),
        ("a", 0, (), "SubscribedTopicNames must be set in first request."),
        ("a", -2, None, "MemberEpoch is invalid."),
    ],
)
def test_invalid_requests(member: str, epoch: int, names: tuple[str, ...] | None, message: str) -> None:
    r, _ = hb(machine(), member, epoch, names)
    assert (r.error, r.error_message) == (ErrorCode.INVALID_REQUEST, message)


def test_leave_and_expiry_bump_the_epoch_and_reassign() -> None:
    m = machine()
    hb(m, "a", 0)
    hb(m, "b", 0)
    r, timers = hb(m, "a", -1, None)
    assert (r.error, r.member_epoch) == (ErrorCode.NONE, -1)
    assert timers.cancel == (("g", "a"),)
    assert hb(m, "a", -1, None)[0].error == ErrorCode.UNKNOWN_MEMBER_ID
    g = m.groups["g"]
    assert g.epoch == 3 and g.target["b"] == {T1: frozenset({0, 1})}
    assert m.session_expired(("g", "b"), NOW + 45000)
    assert g.state == "Empty" and g.epoch == 4
    assert not m.session_expired(("g", "b"), NOW + 45000)


def test_a_group_id_held_by_another_kind_of_group_and_max_size() -> None:
    m = machine(other_group=lambda g: g == "g")
    r, _ = hb(m, "a", 0)
    assert r.error == ErrorCode.GROUP_ID_NOT_FOUND
    assert "not a share group" in (r.error_message or "")
    m = machine(max_size=1)
    hb(m, "a", 0)
    assert hb(m, "b", 0)[0].error == ErrorCode.GROUP_MAX_SIZE_REACHED
    assert hb(m, "a", 1, None)[0].error == ErrorCode.NONE


def test_topic_growth_is_noticed_at_the_next_heartbeat() -> None:
    topics = Topics(t1=1)
    m = machine(topics)
    assert hb(m, "a", 0)[0].assignment == {T1: frozenset({0})}
    topics.counts["t1"] = 3
    r, _ = hb(m, "a", 1, None)
    assert r.member_epoch == 2 and r.assignment == {T1: frozenset({0, 1, 2})}


def test_assignor_hashes_members_and_keeps_what_they_held() -> None:
    # java "a".hashCode() = 97; 97 % 4 = 1
    out = assignor.assign({"a": [T1]}, {T1: 4}, {})
    assert out == {"a": {T1: frozenset({0, 1, 2, 3})}}
    out2 = assignor.assign({"a": [T1], "b": [T1]}, {T1: 4}, out)
    # "b".hashCode() = 98 -> partition 2; a keeps everything it held
    assert out2["a"] == {T1: frozenset({0, 1, 2, 3})}
    assert out2["b"] == {T1: frozenset({2})}
    # unsubscribed topics are dropped; unknown topics give nothing
    out3 = assignor.assign({"a": [T2]}, {T1: 4}, out2)
    assert out3 == {"a": {}}


def test_sessions_epoch_rules() -> None:
    s = ShareSessions(max_sessions=1)
    tp = (T1, 0)
    s1 = s.open(("g", "a"), 7, [tp], NOW)
    assert s1.epoch == 1
    with pytest.raises(SessionError) as e:
        s.use(("g", "a"), 2, 7, NOW)
    assert e.value.code == ErrorCode.INVALID_SHARE_SESSION_EPOCH
    assert s.use(("g", "a"), 1, 8, NOW, forget=[tp]).epoch == 2
    assert s1.partitions == {} and s1.connection_id == 8
    with pytest.raises(SessionError) as e:
        s.use(("g", "b"), 1, 7, NOW)
    assert e.value.code == ErrorCode.SHARE_SESSION_NOT_FOUND
    with pytest.raises(SessionError) as e:
        s.open(("g", "b"), 7, [], NOW)
    assert e.value.code == ErrorCode.SHARE_SESSION_LIMIT_REACHED
    assert s.open(("g", "a"), 9, [], NOW).epoch == 1  # reopening replaces
    assert [x.key for x in s.of_connection(9)] == [("g", "a")]
    with pytest.raises(SessionError) as e:
        s.close(("g", "a"))
    assert e.value.code == ErrorCode.SHARE_SESSION_NOT_FOUND


@pytest.mark.parametrize(
    ("text", "ms"),
    [("PT1H", 3_600_000), ("P1D", 86_400_000), ("PT0.5S", 500), ("P1DT2H3M4S", 93_784_000), ("pt10m", 600_000)],
)
def test_by_duration_parses_iso_8601(text: str, ms: int) -> None:
    assert parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["", "P", "PT", "1H", "P1H"])
def test_by_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration_ms(text)


def test_records_replay_to_the_same_groups() -> None:
    m = machine(Topics(t1=2, t2=1))
    hb(m, "a", 0, ("t1", "t2"))
    hb(m, "b", 0)
    hb(m, "a", 1, None)
    hb(m, "c", 0)
    hb(m, "c", -1, None)
    records = [r for _, r in m.pending]
    again = machine(Topics(t1=2, t2=1))
    loaded = again.load(records)
    assert sorted(loaded) == [("g", "a"), ("g", "b")]
    g, h = m.groups["g"], again.groups["g"]
    assert (h.epoch, h.assignment_epoch, h.target) == (g.epoch, g.assignment_epoch, g.target)
    for mid in ("a", "b"):
        x, y = g.members[mid], h.members[mid]
        assert (y.epoch, y.previous_epoch, y.subscribed, y.assignment) == (
            x.epoch,
            x.previous_epoch,
            x.subscribed,
            x.assignment,
        )
    # after the replay a member carries on exactly as it would have without the restart
    r, _ = hb(again, "a", g.members["a"].epoch, None)
    assert r == hb(m, "a", g.members["a"].epoch, None)[0]
    assert r.error == ErrorCode.NONE and r.member_epoch == g.epoch
    # deleting the emptied group leaves tombstones that a replay honours
    hb(again, "a", -1, None)
    hb(again, "b", -1, None)
    assert again.delete("g") == ErrorCode.NONE
    third = machine(Topics(t1=2, t2=1))
    third.load([r for _, r in (*m.pending, *again.pending)])
    assert "g" not in third.groups


def test_share_record_layouts_are_kafkas() -> None:
    from rallypoint.protocol import share_group_records as sgr

    key, value = sgr.encode_record(sgr.ShareKey(sgr.GROUP_METADATA, "g"), sgr.ShareGroupMetadataValue(5, 7))
    assert key == b"\x00\x0b\x00\x01g"
    assert value == b"\x00\x00" + b"\x00\x00\x00\x05" + b"\x00" * 7 + b"\x07" + b"\x00"
    key, value = sgr.encode_record(
        sgr.ShareKey(sgr.CURRENT_MEMBER_ASSIGNMENT, "g", "m"),
        sgr.ShareCurrentMemberAssignmentValue(3, 2, 0, (sgr.ShareTopicPartitions(T1, (0, 1)),)),
    )
    assert key == b"\x00\x0e\x00\x01g\x00\x01m"
    assert value == (
        b"\x00\x00\x00\x00\x00\x03\x00\x00\x00\x02\x00"
        + b"\x02"
        + T1.bytes
        + b"\x03\x00\x00\x00\x00\x00\x00\x00\x01"
        + b"\x00"
        + b"\x00"
    )
    key, value = sgr.encode_record(
        sgr.ShareKey(sgr.MEMBER_METADATA, "g", "m"), sgr.ShareMemberMetadataValue(None, "c", "/h", ("t",))
    )
    assert value == b"\x00\x00" + b"\x00" + b"\x02c" + b"\x03/h" + b"\x02\x02t" + b"\x00"
    for k, v in [
        (sgr.ShareKey(sgr.MEMBER_METADATA, "g", "m"), sgr.ShareMemberMetadataValue("r", "c", "/h", ("t", "u"))),
        (sgr.ShareKey(sgr.TARGET_ASSIGNMENT_METADATA, "g"), sgr.ShareTargetAssignmentMetadataValue(4)),
        (
            sgr.ShareKey(sgr.TARGET_ASSIGNMENT_MEMBER, "g", "m"),
            sgr.ShareTargetAssignmentMemberValue((sgr.ShareTopicPartitions(T2, (3,)),)),
        ),
        (sgr.ShareKey(sgr.TARGET_ASSIGNMENT_MEMBER, "g", "m"), None),
    ]:
        assert sgr.decode_record(*sgr.encode_record(k, v)) == (k, v)
    # Kafka 4.0's group metadata value had no metadata hash: still read
    assert sgr.decode_value(sgr.ShareKey(sgr.GROUP_METADATA, "g"), b"\x00\x00\x00\x00\x00\x09\x00") == (
        sgr.ShareGroupMetadataValue(9, 0)
    )
