"""Time travel and member expiry in the group runtime (GroupsRuntime.fire_timers, add_listener)
and in the share-group runtime (ShareGroupsRuntime.poke, expire_member, add_listener).

The runtimes' timers are ``loop.call_later`` handles; after the clock jumps they must fire at
once (those now due, in deadline order) and the rest must be re-scheduled against the moved
clock, not wait out their old real-time delay.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from rallypoint import config
from rallypoint.clock import SystemClock
from rallypoint.groups.events import JoinRequest, Note, Protocol, SyncRequest, Transition
from rallypoint.groups.runtime import GroupsRuntime
from rallypoint.protocol.errors import ErrorCode
from rallypoint.protocol.records import build_batch
from rallypoint.share.membership import Change, ShareHeartbeat
from rallypoint.share.runtime import ShareGroupsRuntime, ShareSettings
from rallypoint.topics import TopicStore
from rallypoint.topics.log_validator import validate_client_batch, validate_client_records, validate_produce_records

pytestmark = pytest.mark.unit

META = b"\x00\x00\x00\x00\x00\x01\x00\x01t\xff\xff\xff\xff"


async def runtime(tmp_path: Path) -> tuple[GroupsRuntime, SystemClock, list[Transition | Note]]:
    cfg = config.load({"data.dir": str(tmp_path), "group.min.session.timeout.ms": "100"}, env={})
    clock = SystemClock()
    rt = GroupsRuntime.from_config(cfg, clock)
    seen: list[Transition | Note] = []
    rt.add_listener(seen.append)
    await rt.start()
    return rt, clock, seen


async def stable_member(rt: GroupsRuntime, group: str, session_ms: int) -> str:
    join = await rt.join(
        JoinRequest(group, "", None, session_ms, 60000, "consumer", (Protocol("range", META),), "c", "h", 3)
    )
    assert join.error == ErrorCode.NONE, join
    sync = await rt.sync(SyncRequest(group, join.generation_id, join.member_id, None, None, None, (), 3))
    assert sync.error == ErrorCode.NONE, sync
    return join.member_id


def removed(seen: list[Transition | Note]) -> list[tuple[str, object]]:
    return [
        (str(e.fields["group"]), e.fields["reason"])
        for e in seen
        if isinstance(e, Note) and e.event == "member removed"
    ]


async def test_advancing_past_sessions_expires_them_at_once_in_deadline_order(tmp_path: Path) -> None:
    rt, clock, seen = await runtime(tmp_path)
    try:
        await stable_member(rt, "late", 20000)
        await stable_member(rt, "early", 10000)
        await stable_member(rt, "kept", 60000)
        clock.advance(25000)
        started = time.monotonic()
        assert rt.fire_timers()
        assert time.monotonic() - started < 1.0
        assert removed(seen) == [("early", "session timeout expired"), ("late", "session timeout expired")]
        states = {(e.group_id, e.to_state) for e in seen if isinstance(e, Transition)}
        assert ("early", "Empty") in states and ("late", "Empty") in states
        assert not any(g == "kept" and s == "Empty" for g, s in states)
    finally:
        await rt.stop()


async def test_timers_not_yet_due_are_rescheduled_against_the_moved_clock(tmp_path: Path) -> None:
    rt, clock, seen = await runtime(tmp_path)
    try:
        await stable_member(rt, "g", 3000)
        clock.advance(2700)  # 300 ms of the session left on the coordinator's clock
        rt.fire_timers()
        assert removed(seen) == []
        started = time.monotonic()
        while not removed(seen):
            await asyncio.sleep(0.02)
            assert time.monotonic() - started < 2.0, "the session timer waited out its old delay (3 s)"
    finally:
        await rt.stop()


async def test_a_clock_jump_without_fire_timers_leaves_timers_late(tmp_path: Path) -> None:
    """The reason fire_timers exists: call_later handles do not see the clock move."""
    rt, clock, seen = await runtime(tmp_path)
    try:
        await stable_member(rt, "g", 1500)
        clock.advance(10000)
        await asyncio.sleep(0.5)
        assert removed(seen) == []
        rt.fire_timers()
        assert removed(seen) == [("g", "session timeout expired")]
    finally:
        await rt.stop()


async def test_expire_one_member_keeps_the_others(tmp_path: Path) -> None:
    rt, _clock, seen = await runtime(tmp_path)
    try:
        a = await stable_member(rt, "g", 30000)
        # a second member joins (parked: the group rebalances), then the first rejoins
        protocols = (Protocol("range", META),)
        join_b = asyncio.create_task(
            rt.join(JoinRequest("g", "", None, 30000, 60000, "consumer", protocols, "c", "h", 3))
        )
        await asyncio.sleep(0.01)
        join_a = await asyncio.wait_for(
            rt.join(JoinRequest("g", a, None, 30000, 60000, "consumer", protocols, "c", "h", 3)), 5
        )
        b = (await asyncio.wait_for(join_b, 5)).member_id
        gen = join_a.generation_id
        await asyncio.wait_for(
            asyncio.gather(
                rt.sync(SyncRequest("g", gen, a, None, None, None, (), 3)),
                rt.sync(SyncRequest("g", gen, b, None, None, None, (), 3)),
            ),
            5,
        )
        assert not rt.fire_timers(("g", "nobody"))
        assert not rt.fire_timers(("other", a))
        assert rt.fire_timers(("g", b))
        assert removed(seen) == [("g", "session timeout expired")]
        described = (await rt.describe(["g"], 5)).groups[0]
        assert described.state == "PreparingRebalance"
        assert [m.member_id for m in described.members] == [a]
    finally:
        await rt.stop()


async def test_listener_sees_transitions_and_notes_and_a_failing_listener_is_contained(tmp_path: Path) -> None:
    rt, _clock, seen = await runtime(tmp_path)

    def broken(_e: Transition | Note) -> None:
        raise RuntimeError("boom")

    rt.add_listener(broken)
    try:
        await stable_member(rt, "g", 30000)
        kinds = [(type(e).__name__, getattr(e, "event", getattr(e, "to_state", ""))) for e in seen]
        assert ("Note", "member added") in kinds
        assert ("Transition", "PreparingRebalance") in kinds and ("Transition", "Stable") in kinds
    finally:
        await rt.stop()


# ------------------------------------------------------------------ share groups

SHARE_SETTINGS = {
    "share.session.timeout.ms": "45000",
    "share.heartbeat.interval.ms": "5000",
    "share.record.lock.duration.ms": "30000",
    "share.auto.offset.reset": "earliest",
    "share.isolation.level": "read_uncommitted",
}


async def share_runtime(tmp_path: Path) -> tuple[ShareGroupsRuntime, SystemClock, TopicStore, list[Change]]:
    clock = SystemClock()
    store = TopicStore()

    def setting(group: str, name: str) -> str:
        if group == "early" and name == "share.session.timeout.ms":
            return "20000"
        return SHARE_SETTINGS[name]

    rt = ShareGroupsRuntime(ShareSettings(), clock, store, setting, data_dir=tmp_path)
    seen: list[Change] = []
    rt.add_listener(seen.append)
    await rt.start()
    return rt, clock, store, seen


async def share_join(rt: ShareGroupsRuntime, group: str, member: str) -> None:
    r = await rt.heartbeat(ShareHeartbeat(group, member, 0, subscribed_topic_names=("t",)))
    assert r.error == ErrorCode.NONE, r


async def test_a_share_clock_jump_expires_sessions_inside_poke_in_deadline_order(tmp_path: Path) -> None:
    rt, clock, store, seen = await share_runtime(tmp_path)
    try:
        store.create("t", 1)
        await share_join(rt, "late", "m1")  # 45 s session
        await share_join(rt, "early", "m2")  # 20 s session
        await share_join(rt, "kept", "m3")
        await share_join(rt, "kept", "m4")
        assert rt.expire_member("kept", "m4") and not rt.expire_member("kept", "nobody")
        seen.clear()
        clock.advance(44_000)
        rt.poke()  # no loop turn in between: what is due has fired when poke returns
        assert [(c.event, c.group_id) for c in seen] == [("share_group.member_expired", "early")]
        await share_join(rt, "kept", "m5")  # joins after the jump: a full session from now
        seen.clear()
        clock.advance(1_500)
        rt.poke()
        assert [(c.event, c.group_id) for c in seen] == [
            ("share_group.member_expired", "late"),
            ("share_group.member_expired", "kept"),
        ]
        assert list(rt.machine.groups["kept"].members) == ["m5"]
    finally:
        await rt.stop()


async def test_a_share_session_not_yet_due_is_rescheduled_against_the_moved_clock(tmp_path: Path) -> None:
    rt, clock, store, seen = await share_runtime(tmp_path)
    try:
        store.create("t", 1)
        await share_join(rt, "g", "m")
        clock.advance(44_700)  # 300 ms of the session left
        rt.poke()
        assert seen[1:] == []
        started = time.monotonic()
        while len(seen) < 2:
            await asyncio.sleep(0.02)
            assert time.monotonic() - started < 2.0, "the session timer waited out its old delay (45 s)"
        assert seen[1].event == "share_group.member_expired"
    finally:
        await rt.stop()


async def test_a_share_clock_jump_past_the_lock_makes_records_available_inside_poke(tmp_path: Path) -> None:
    rt, clock, store, _seen = await share_runtime(tmp_path)
    try:
        topic = store.create("t", 1)
        plog = topic.partition(0)
        assert plog is not None
        data = build_batch(0, [(None, b"v%d" % i) for i in range(3)], clock.now_ms())
        pos, size = validate_produce_records(9, data)
        h = validate_client_batch(data, pos, size, 1 << 20)
        plog.append_client_batch(data, pos, size, h, validate_client_records(data, h, 1 << 24))
        tp = (topic.topic_id, 0)
        answer = await rt.fetch(
            "g",
            "m",
            0,
            1,
            partitions=[tp],
            forgotten=[],
            acks={},
            max_wait_ms=0,
            min_bytes=1,
            max_bytes=1 << 20,
            max_records=500,
        )
        assert [(a.first_offset, a.last_offset) for a in answer.partitions[tp].acquired] == [(0, 2)]
        [(_, sp)] = rt.describe_partitions("g")
        clock.advance(29_000)
        rt.poke()
        assert sp.counts()["acquired"] == 3
        clock.advance(1_000)
        rt.poke()
        assert (sp.counts()["available"], sp.counts()["acquired"]) == (3, 0)
    finally:
        await rt.stop()
