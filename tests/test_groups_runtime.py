"""The asyncio runtime around the state machine: acknowledge-after-write through the
``offsets_log`` hook, append order, error mapping, timers, transition logs, loading."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import structlog
from rallypoint import config
from rallypoint.assemble import build_broker
from rallypoint.clock import SystemClock
from rallypoint.groups.events import (
    CommitPartition,
    CommitRequest,
    CommitTopic,
    HeartbeatRequest,
    JoinRequest,
    OffsetFetchGroupRequest,
    OffsetFetchRequest,
    Protocol,
    SessionsKey,
    SyncRequest,
)
from rallypoint.groups.model import ClassicGroup
from rallypoint.groups.persist import Record
from rallypoint.groups.runtime import GroupsRuntime
from rallypoint.protocol.consumer_protocol import Subscription, encode_subscription
from rallypoint.protocol.errors import ErrorCode
from rallypoint.protocol.offsets_schema import (
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadata,
    OffsetCommitKey,
    OffsetCommitValue,
    partition_for,
)
from rallypoint.storage.errors import PersistError

from tests.group_harness import fail_once

pytestmark = pytest.mark.unit

E = ErrorCode
META = encode_subscription(Subscription(0, ("t",)))


class FakeLog:
    """An offsets log whose appends block until released (or fail)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, tuple[Record, ...]]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail: PersistError | None = None
        self.active = 0
        self.max_active = 0
        self.now_ok = False  # append_now takes batches (a log with no fsync to wait for)
        self.now_calls: list[tuple[int, tuple[Record, ...]]] = []
        self.txn_calls: list[tuple[int, tuple[int, int] | None, bool | None]] = []

    def append_now(self, partition: int, records: Sequence[Record]) -> bool:
        if not self.now_ok:
            return False  # every append waits at the gate (or fails)
        self.now_calls.append((partition, tuple(records)))
        if self.fail is not None:
            raise self.fail
        return True

    async def append(
        self,
        partition: int,
        records: Sequence[Record],
        *,
        producer: tuple[int, int] | None = None,
        marker: bool | None = None,
    ) -> None:
        self.calls.append((partition, tuple(records)))
        self.txn_calls.append((partition, producer, marker))
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            await self.gate.wait()
            if self.fail is not None:
                raise self.fail
        finally:
            self.active -= 1


async def started(tmp_path: Path, log: FakeLog | None = None, **cfg: str) -> GroupsRuntime:
    """A started groups runtime writing to the fake log (if any)."""
    overrides = {"data.dir": str(tmp_path), "group.min.session.timeout.ms": "100", **cfg}
    rt = GroupsRuntime.from_config(config.load(overrides, env={}), SystemClock())
    rt.offsets_log = log
    await rt.start()
    return rt


def test_the_broker_registers_the_groups_runtime(tmp_path: Path) -> None:
    broker = build_broker(config.load({"data.dir": str(tmp_path)}, env={}))
    assert isinstance(broker.groups, GroupsRuntime) and broker.groups.offsets_log is broker.offsets_log


def commit_req(group: str, offset: int, generation: int = -1, member: str = "") -> CommitRequest:
    return CommitRequest(group, generation, member, None, -1, (CommitTopic("t", (CommitPartition(0, offset),)),), 8)


def join_req(group: str, member: str = "", session: int = 10_000) -> JoinRequest:
    return JoinRequest(group, member, None, session, session, "consumer", (Protocol("range", META),), "c", "/h", 3)


async def test_commit_is_answered_only_after_the_append(tmp_path: Path) -> None:
    log = FakeLog()
    rt = await started(tmp_path, log)
    log.gate.clear()
    task = asyncio.create_task(rt.commit_offsets(commit_req("g", 5)))
    await asyncio.sleep(0.05)
    assert not task.done()
    ((partition, records),) = log.calls
    assert partition == partition_for("g", 50)
    (key, value) = records[0]
    assert key == OffsetCommitKey("g", "t", 0) and isinstance(value, OffsetCommitValue) and value.offset == 5
    fetched = await rt.fetch_offsets(OffsetFetchRequest((OffsetFetchGroupRequest("g", (("t", (0,)),)),)))
    assert fetched.groups[0].topics[0].partitions[0].offset == -1  # not visible before the write
    log.gate.set()
    result = await asyncio.wait_for(task, 5)
    assert result.topics[0].partitions == ((0, E.NONE),)
    fetched = await rt.fetch_offsets(OffsetFetchRequest((OffsetFetchGroupRequest("g", (("t", (0,)),)),)))
    assert fetched.groups[0].topics[0].partitions[0].offset == 5
    await rt.stop()


async def test_appends_reach_the_log_in_order_without_waiting_for_each_other(tmp_path: Path) -> None:
    """The runtime hands every batch to the log at once, in the machine's order: the log
    keeps call order per partition, and concurrent appends can then share one fsync."""
    log = FakeLog()
    rt = await started(tmp_path, log)
    log.gate.clear()
    tasks = [asyncio.create_task(rt.commit_offsets(commit_req("g", i))) for i in range(5)]
    await asyncio.sleep(0.05)
    assert [c[1][0][1].offset for c in log.calls] == [0, 1, 2, 3, 4]  # type: ignore[union-attr]
    assert not any(t.done() for t in tasks)  # none answered before its write
    log.gate.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert log.max_active == 5
    await rt.stop()


async def test_a_write_the_log_takes_at_once_answers_within_the_request(tmp_path: Path) -> None:
    """With no fsync to wait for, the log writes the batch during the event (``append_now``):
    the commit is answered without an append task; a failure there is mapped as ever."""
    log = FakeLog()
    log.now_ok = True
    rt = await started(tmp_path, log)
    result = await rt.commit_offsets(commit_req("g", 5))
    assert result.topics[0].partitions == ((0, E.NONE),)
    assert [r[0][0] for _p, r in log.now_calls] == [OffsetCommitKey("g", "t", 0)] and not log.calls
    fetched = await rt.fetch_offsets(OffsetFetchRequest((OffsetFetchGroupRequest("g", (("t", (0,)),)),)))
    assert fetched.groups[0].topics[0].partitions[0].offset == 5
    log.fail = PersistError("disk on fire", E.KAFKA_STORAGE_ERROR)
    result = await rt.commit_offsets(commit_req("g", 6))
    assert result.topics[0].partitions == ((0, E.NOT_COORDINATOR),)
    fetched = await rt.fetch_offsets(OffsetFetchRequest((OffsetFetchGroupRequest("g", (("t", (0,)),)),)))
    assert fetched.groups[0].topics[0].partitions[0].offset == 5  # the failed write was undone
    await rt.stop()


async def test_no_write_at_once_passes_an_append_still_in_flight_on_its_partition(tmp_path: Path) -> None:
    """Order per partition: while an append task of the runtime is in flight on a partition,
    later batches for it go the same way, even when the log could take them at once."""
    log = FakeLog()
    rt = await started(tmp_path, log)
    log.gate.clear()
    first = asyncio.create_task(rt.commit_offsets(commit_req("g", 1)))  # append_now declines: a task
    await asyncio.sleep(0.01)
    log.now_ok = True
    second = asyncio.create_task(rt.commit_offsets(commit_req("g", 2)))
    other = await asyncio.wait_for(rt.commit_offsets(commit_req("x", 3)), 5)  # another partition
    await asyncio.sleep(0.01)
    assert partition_for("x", 50) != partition_for("g", 50)
    assert other.topics[0].partitions == ((0, E.NONE),)
    assert [(p, r[0][1].offset) for p, r in log.now_calls] == [(partition_for("x", 50), 3)]  # type: ignore[union-attr]
    assert [r[0][1].offset for _p, r in log.calls] == [1, 2]  # type: ignore[union-attr]
    log.gate.set()
    await asyncio.wait_for(asyncio.gather(first, second), 5)
    third = await rt.commit_offsets(commit_req("g", 4))  # nothing in flight any more: at once
    assert third.topics[0].partitions == ((0, E.NONE),) and log.now_calls[-1][1][0][1].offset == 4  # type: ignore[union-attr]
    await rt.stop()


@pytest.mark.parametrize(
    ("storage_error", "client_error"),
    [
        (E.KAFKA_STORAGE_ERROR, E.NOT_COORDINATOR),
        (E.NOT_ENOUGH_REPLICAS, E.COORDINATOR_NOT_AVAILABLE),
        (E.RECORD_LIST_TOO_LARGE, E.UNKNOWN_SERVER_ERROR),
    ],
)
async def test_append_failures_are_mapped(tmp_path: Path, storage_error: ErrorCode, client_error: ErrorCode) -> None:
    log = FakeLog()
    log.fail = PersistError("disk on fire", storage_error)
    rt = await started(tmp_path, log)
    result = await asyncio.wait_for(rt.commit_offsets(commit_req("g", 1)), 5)
    assert result.topics[0].partitions == ((0, client_error),)
    await rt.stop()


async def test_leader_sync_waits_for_the_group_record(tmp_path: Path) -> None:
    log = FakeLog()
    rt = await started(tmp_path, log)
    joined = await asyncio.wait_for(rt.join(join_req("g")), 5)  # v3: no MEMBER_ID_REQUIRED
    assert joined.error == E.NONE and joined.generation_id == 1
    log.gate.clear()
    sync = asyncio.create_task(
        rt.sync(SyncRequest("g", 1, joined.member_id, None, None, None, ((joined.member_id, b"A"),), 3))
    )
    await asyncio.sleep(0.05)
    assert not sync.done()
    key, value = log.calls[-1][1][0]
    assert key == GroupMetadataKey("g") and isinstance(value, GroupMetadataValue)
    assert [(m.member_id, m.assignment) for m in value.members] == [(joined.member_id, b"A")]
    log.gate.set()
    assert (await asyncio.wait_for(sync, 5)).assignment == b"A"
    await rt.stop()


async def test_heartbeats_keep_one_timer_handle_and_the_session_expires_on_time(tmp_path: Path) -> None:
    rt = await started(tmp_path)
    joined = await asyncio.wait_for(rt.join(join_req("g", session=300)), 5)
    s = await rt.sync(SyncRequest("g", 1, joined.member_id, None, None, None, ((joined.member_id, b""),), 3))
    assert s.error == E.NONE
    member = rt.machine.groups["g"].members[joined.member_id]
    handles, heap_sizes = [], []
    entries = len(rt._heap)  # the sessions timer's and the join phase's cancelled timers
    deadline = member.session_deadline
    assert rt.machine.deadlines[SessionsKey("g")] <= deadline  # the group's timer: at or before it
    for _ in range(10):
        await asyncio.sleep(0.1)
        hb = await rt.heartbeat(HeartbeatRequest("g", 1, joined.member_id))
        assert hb.error == E.NONE
        assert member.session_deadline > deadline  # the deadline moved ...
        deadline = member.session_deadline
        handles.append(rt._wake)
        heap_sizes.append(len(rt._heap))
    # ... but 1 s of heartbeats every 100 ms made no loop handle and no heap entry per heartbeat:
    # the one entry moves on when it comes due (about every 300 ms)
    assert len({id(h) for h in handles}) <= 5, handles
    assert max(heap_sizes) <= entries, (entries, heap_sizes)
    assert rt.machine.groups["g"].state.value == "Stable"
    await asyncio.sleep(0.5)
    assert rt.machine.groups["g"].state.value == "Empty"  # expired, rebalanced, empty
    await rt.stop()


async def test_many_sessions_share_one_loop_handle_and_expire_in_deadline_order(tmp_path: Path) -> None:
    rt = await started(tmp_path)
    order: list[str] = []
    rt.add_listener(
        lambda e: (
            order.append(e.group_id)
            if getattr(e, "to_state", None) == "PreparingRebalance" and "expired" in getattr(e, "reason", "")
            else None
        )
    )
    members = {}
    for i, session in enumerate((1000, 400, 700, 550)):  # armed out of deadline order
        gid = f"s{i}"
        joined = await asyncio.wait_for(rt.join(join_req(gid, session=session)), 5)
        await rt.sync(SyncRequest(gid, 1, joined.member_id, None, None, None, ((joined.member_id, b""),), 3))
        members[gid] = joined.member_id
    assert rt._wake is not None and len(rt._heap) >= 4
    wake = rt._wake
    await asyncio.sleep(0.2)
    assert rt._wake is wake  # nothing came due: the same handle
    await asyncio.sleep(1.1)
    assert order == ["s1", "s3", "s2", "s0"]
    assert all(rt.machine.groups[g].state.value == "Empty" for g in members)
    await rt.stop()
    assert rt._wake is None and not rt._heap


async def test_state_transitions_are_logged(tmp_path: Path) -> None:
    rt = await started(tmp_path)
    with structlog.testing.capture_logs() as logs:
        joined = await asyncio.wait_for(rt.join(join_req("logged")), 5)
        await rt.sync(SyncRequest("logged", 1, joined.member_id, None, None, None, (), 3))
    events = [e for e in logs if e["event"] == "group state transition"]
    assert [(e["from"], e["to"], e["generation"], e["members"]) for e in events] == [
        ("Empty", "PreparingRebalance", 0, 1),
        ("PreparingRebalance", "CompletingRebalance", 1, 1),
        ("CompletingRebalance", "Stable", 1, 1),
    ]
    assert all(e["group"] == "logged" and e["leader"] == joined.member_id and e["reason"] for e in events)
    await rt.stop()


async def test_load_installs_groups_and_arms_their_sessions(tmp_path: Path) -> None:
    rt = await started(tmp_path)
    member = MemberMetadata("m1", None, "c", "/h", 1000, 300, META, b"A")
    value = GroupMetadataValue("consumer", 4, "range", "m1", 1, (member,))
    offsets: dict[Any, Any] = {OffsetCommitKey("loaded", "t", 0): OffsetCommitValue(9, "", 1)}
    rt.load(partition_for("loaded", 50), {"loaded": value}, offsets)
    assert rt.machine.groups["loaded"].state.value == "Stable"
    sync = await rt.sync(SyncRequest("loaded", 4, "m1", None, None, None, (), 3))
    assert sync.assignment == b"A"
    await asyncio.sleep(0.5)  # nobody heartbeats: the loaded member expires after its session
    assert "m1" not in rt.machine.groups["loaded"].members
    await rt.stop()


async def test_deleted_topics_lose_their_offsets(tmp_path: Path) -> None:
    log = FakeLog()
    rt = await started(tmp_path, log)
    await rt.commit_offsets(commit_req("g", 3))
    rt.on_topics_deleted(["t"])
    await asyncio.sleep(0.05)
    assert log.calls[-1][1] == ((OffsetCommitKey("g", "t", 0), None),)
    fetched = await rt.fetch_offsets(OffsetFetchRequest((OffsetFetchGroupRequest("g", None),)))
    assert fetched.groups[0].topics == ()
    await rt.stop()


async def test_parked_join_is_answered_on_shutdown(tmp_path: Path) -> None:
    rt = await started(tmp_path, **{"group.initial.rebalance.delay.ms": "60000"})
    task = asyncio.create_task(rt.join(join_req("g")))
    await asyncio.sleep(0.05)
    assert not task.done()
    await rt.begin_shutdown()
    assert (await asyncio.wait_for(task, 1)).error == E.NOT_COORDINATOR
    await rt.stop()


async def test_an_exception_in_a_timer_is_logged_once_and_the_group_keeps_working(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = await started(tmp_path)
    monkeypatch.setattr(ClassicGroup, "select_protocol", fail_once(ClassicGroup, "select_protocol"))
    with structlog.testing.capture_logs() as logs:
        first = await asyncio.wait_for(rt.join(join_req("g")), 5)  # parked until the join timer
    assert first.error == E.NOT_COORDINATOR
    errors = [e for e in logs if e["log_level"] == "error"]
    assert len(errors) == 1, errors
    assert errors[0]["event"] == "group coordinator event failed" and errors[0]["groups"] == ["g"]
    assert errors[0]["event_name"] == "timer join" and "boom" in errors[0]["error"]
    joined = await asyncio.wait_for(rt.join(join_req("g")), 5)
    assert joined.error == E.NONE and joined.generation_id == 1
    await rt.stop()


async def test_the_runtime_survives_an_exception_escaping_the_coordinator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = await started(tmp_path)
    real = rt.machine.timer_fired

    def broken(*_args: object) -> list[Any]:
        raise RuntimeError("bug in the recovery")

    monkeypatch.setattr(rt.machine, "timer_fired", broken)
    with structlog.testing.capture_logs() as logs:
        parked = asyncio.create_task(rt.join(join_req("g")))
        await asyncio.sleep(0.1)  # the join timer fires into the broken coordinator
    assert [e["event"] for e in logs if e["log_level"] == "error"] == ["group coordinator failed"]
    monkeypatch.setattr(rt.machine, "timer_fired", real)
    committed = await asyncio.wait_for(rt.commit_offsets(commit_req("other", 1)), 5)
    assert committed.topics[0].partitions == ((0, E.NONE),)  # the loop carries on
    await rt.stop()  # and the join left parked is answered when the groups unload
    assert (await asyncio.wait_for(parked, 1)).error == E.NOT_COORDINATOR


async def test_a_join_naming_a_protocol_twice_is_refused_without_disturbing_the_group(tmp_path: Path) -> None:
    """Issue 14, defect 8, through the runtime: refused at once, nothing raises in a timer."""
    rt = await started(tmp_path)
    twice = JoinRequest(
        "g", "", None, 10_000, 10_000, "consumer", (Protocol("range", META), Protocol("range", META)), "c", "/h", 3
    )
    with structlog.testing.capture_logs() as logs:
        refused = await asyncio.wait_for(rt.join(twice), 5)
        assert refused.error == E.INCONSISTENT_GROUP_PROTOCOL
        joined = await asyncio.wait_for(rt.join(join_req("g")), 5)
    assert joined.error == E.NONE and joined.generation_id == 1 and joined.protocol_name == "range"
    assert not [e for e in logs if e["log_level"] == "error"]
    await rt.stop()
