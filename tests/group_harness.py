"""A driver for the sans-IO group coordinator: a FakeClock, instant timers, inspectable
effects.  No sockets, no asyncio, no sleeping.

Writes succeed at once unless ``hold_persists`` (then ``complete_persists``/``fail_persist``
answer them) or ``fail_persists_with``.  An ``InternalError`` effect fails the test unless
``expect_internal_errors`` is set (they are then collected in ``internal_errors``)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rallypoint.clock import FakeClock
from rallypoint.groups.coordinator import GroupCoordinator
from rallypoint.groups.events import (
    CommitPartition,
    CommitRequest,
    CommitTopic,
    Effect,
    HeartbeatRequest,
    InternalError,
    JoinRequest,
    JoinResult,
    LeaveMember,
    LeaveRequest,
    Note,
    OffsetFetchGroupRequest,
    OffsetFetchRequest,
    Persist,
    Protocol,
    Respond,
    SyncRequest,
    SyncResult,
    Transition,
)
from rallypoint.groups.model import GroupConfig, GroupState, assert_transition
from rallypoint.protocol.consumer_protocol import Subscription, encode_subscription
from rallypoint.protocol.errors import ErrorCode
from rallypoint.protocol.offsets_schema import GroupMetadataKey, GroupMetadataValue, OffsetCommitKey, OffsetCommitValue

E = ErrorCode
META = encode_subscription(Subscription(1, ("topic",)))  # ConsumerProtocolSubscription v1: ["topic"]


def meta_for(*topics: str) -> bytes:
    """A v0 subscription to ``topics``."""
    return encode_subscription(Subscription(0, topics))


@dataclass
class Harness:
    config: GroupConfig = field(default_factory=GroupConfig)
    clock: FakeClock = field(default_factory=FakeClock)
    hold_persists: bool = False
    fail_persists_with: ErrorCode | None = None
    expect_internal_errors: bool = False

    def __post_init__(self) -> None:
        ids = itertools.count(1)
        self.m = GroupCoordinator(self.config, new_uuid=lambda: f"uuid{next(ids)}")
        self.internal_errors: list[InternalError] = []
        self.written: list[Persist] = []  # writes the log acknowledged, in order
        self.responses: dict[int, Any] = {}
        self.transitions: list[Transition] = []
        self.persisted: list[Persist] = []
        self.pending: list[Persist] = []
        self.notes: list[Note] = []
        self._tokens = itertools.count(1)
        self.apply(self.m.start(self.now))

    @property
    def now(self) -> int:
        return self.clock.now_ms()

    # ------------------------------------------------------------------ effects

    def apply(self, effects: Sequence[Effect]) -> None:
        for e in effects:
            if isinstance(e, Respond):
                assert e.token not in self.responses, f"token {e.token} answered twice"
                self.responses[e.token] = e.result
            elif isinstance(e, Persist):
                self.persisted.append(e)
                if self.hold_persists:
                    self.pending.append(e)
                else:
                    self._answer(e, self.fail_persists_with)
            elif isinstance(e, Transition):
                assert_transition(e.group_id, GroupState(e.from_state), GroupState(e.to_state))
                self.transitions.append(e)
            elif isinstance(e, Note):
                self.notes.append(e)
            elif isinstance(e, InternalError):
                if not self.expect_internal_errors:
                    raise AssertionError(f"internal error in {e.event}") from e.error
                self.internal_errors.append(e)

    def _answer(self, p: Persist, error: ErrorCode | None) -> None:
        if error is None:
            self.written.append(p)
        self.apply(self.m.persist_done(p.persist_id, error, self.now))

    def complete_persists(self, error: ErrorCode | None = None) -> None:
        pending, self.pending = self.pending, []
        for p in pending:
            self._answer(p, error)

    def answer_persist(self, index: int, error: ErrorCode | None = None) -> Persist:
        """Answer one held write (by its index among the held ones), the others stay held."""
        p = self.pending.pop(index)
        self._answer(p, error)
        return p

    # ------------------------------------------------------------ memory and "disk"

    def offsets(self, group: str) -> dict[tuple[str, int], OffsetCommitValue]:
        """The group's offsets as later writes see them (appended writes included)."""
        return self.m.ctx.timeline.current_offsets(group)

    def committed(self, group: str) -> dict[tuple[str, int], OffsetCommitValue]:
        """The group's offsets the log acknowledged (what OffsetFetch answers)."""
        return self.m.ctx.timeline.committed_offsets(group)

    def disk(self) -> tuple[dict[str, GroupMetadataValue], dict[OffsetCommitKey, OffsetCommitValue]]:
        """What a restart would load: the acknowledged writes replayed in order."""
        groups: dict[str, GroupMetadataValue] = {}
        offsets: dict[OffsetCommitKey, OffsetCommitValue] = {}
        for p in self.written:
            for key, value in p.records:
                if isinstance(key, GroupMetadataKey):
                    if value is None:
                        groups.pop(key.group, None)
                    else:
                        assert isinstance(value, GroupMetadataValue)
                        groups[key.group] = value
                elif value is None:
                    offsets.pop(key, None)
                else:
                    assert isinstance(value, OffsetCommitValue)
                    offsets[key] = value
        return groups, offsets

    def disk_offsets(self, group: str) -> dict[tuple[str, int], int]:
        return {(k.topic, k.partition): v.offset for k, v in self.disk()[1].items() if k.group == group}

    def advance(self, ms: int) -> None:
        self.clock.advance(ms)
        self.apply(self.m.advance(self.now))

    def token(self) -> int:
        return next(self._tokens)

    def result(self, token: int) -> Any:
        return self.responses.get(token)

    def answered(self, token: int) -> bool:
        return token in self.responses

    # ------------------------------------------------------------------ requests

    def join(
        self,
        group: str = "g",
        member_id: str = "",
        *,
        instance: str | None = None,
        session: int = 10_000,
        rebalance: int = 30_000,
        protocols: Sequence[tuple[str, bytes]] = (("range", META),),
        version: int = 5,
        client_id: str = "client",
        protocol_type: str = "consumer",
    ) -> int:
        t = self.token()
        req = JoinRequest(
            group,
            member_id,
            instance,
            session,
            rebalance,
            protocol_type,
            tuple(Protocol(n, m) for n, m in protocols),
            client_id,
            "/127.0.0.1",
            version,
        )
        self.apply(self.m.join(t, req, self.now))
        return t

    def sync(
        self,
        group: str,
        member_id: str,
        generation: int,
        assignments: dict[str, bytes] | None = None,
        *,
        instance: str | None = None,
        version: int = 3,
        protocol_type: str | None = None,
        protocol_name: str | None = None,
    ) -> int:
        t = self.token()
        req = SyncRequest(
            group,
            generation,
            member_id,
            instance,
            protocol_type,
            protocol_name,
            tuple((assignments or {}).items()),
            version,
        )
        self.apply(self.m.sync(t, req, self.now))
        return t

    def heartbeat(self, group: str, member_id: str, generation: int, instance: str | None = None) -> ErrorCode:
        t = self.token()
        self.apply(self.m.heartbeat(t, HeartbeatRequest(group, generation, member_id, instance), self.now))
        return ErrorCode(self.responses[t].error)

    def leave(self, group: str, *members: tuple[str, str | None]) -> Any:
        t = self.token()
        req = LeaveRequest(group, tuple(LeaveMember(m, i) for m, i in members))
        self.apply(self.m.leave(t, req, self.now))
        return self.responses[t]

    def commit(
        self,
        group: str,
        offsets: dict[tuple[str, int], int],
        *,
        generation: int = -1,
        member_id: str = "",
        instance: str | None = None,
        metadata: str | None = "",
        version: int = 8,
        retention: int = -1,
    ) -> int:
        t = self.token()
        topics: dict[str, list[CommitPartition]] = {}
        for (topic, p), off in offsets.items():
            topics.setdefault(topic, []).append(CommitPartition(p, off, -1, metadata))
        req = CommitRequest(
            group,
            generation,
            member_id,
            instance,
            retention,
            tuple(CommitTopic(n, tuple(ps)) for n, ps in topics.items()),
            version,
        )
        self.apply(self.m.commit_offsets(t, req, self.now))
        return t

    def commit_errors(self, token: int) -> dict[tuple[str, int], ErrorCode]:
        res = self.responses[token]
        return {(t.name, p): ErrorCode(e) for t in res.topics for p, e in t.partitions}

    def fetch(self, group: str, topics: dict[str, list[int]] | None = None, *, require_stable: bool = False) -> int:
        t = self.token()
        tps = None if topics is None else tuple((n, tuple(ps)) for n, ps in topics.items())
        req = OffsetFetchRequest((OffsetFetchGroupRequest(group, tps),), require_stable)
        self.apply(self.m.fetch_offsets(t, req, self.now))
        return t

    def fetched(self, token: int) -> dict[tuple[str, int], tuple[int, str, ErrorCode]]:
        (g,) = self.responses[token].groups
        return {
            (t.name, p.partition): (p.offset, p.metadata, ErrorCode(p.error)) for t in g.topics for p in t.partitions
        }

    def describe(self, *groups: str, version: int = 5) -> Any:
        t = self.token()
        self.apply(self.m.describe(t, groups, version, self.now))
        return self.responses[t]

    def list_groups(self, states: Sequence[str] = (), types: Sequence[str] = ()) -> Any:
        t = self.token()
        self.apply(self.m.list_groups(t, states, types, self.now))
        return self.responses[t]

    def delete_groups(self, *groups: str) -> int:
        t = self.token()
        self.apply(self.m.delete_groups(t, groups, self.now))
        return t

    # ------------------------------------------------------------------ scenarios

    def join_dynamic(self, group: str = "g", version: int = 5, **kw: Any) -> tuple[int, str]:
        """A v4+ dynamic join: MEMBER_ID_REQUIRED, then the real (parked) join."""
        first = self.join(group, version=version, **kw)
        r = self.result(first)
        if version < 4:
            return first, ""
        assert r.error == E.MEMBER_ID_REQUIRED, r
        return self.join(group, r.member_id, version=version, **kw), r.member_id

    def stable_group(self, n: int, group: str = "g", *, assign: bool = True, **kw: Any) -> tuple[list[str], str, int]:
        """n dynamic members in one Stable generation: (member ids, leader id, generation)."""
        tokens = []
        for _ in range(n):
            tokens.append(self.join_dynamic(group, **kw)[0])
        self.advance(self.config.initial_rebalance_delay_ms)
        results: list[JoinResult] = [self.result(t) for t in tokens]
        assert all(r is not None and r.error == E.NONE for r in results), results
        gen = results[0].generation_id
        leader = results[0].leader
        ids = [r.member_id for r in results]
        syncs = []
        for r in results:
            a = {mid: f"assign-{mid}".encode() for mid in ids} if (r.member_id == leader and assign) else None
            syncs.append(self.sync(group, r.member_id, gen, a))
        for s in syncs:
            res: SyncResult = self.result(s)
            assert res is not None and res.error == E.NONE, res
        assert self.state(group) == GroupState.STABLE
        return ids, leader, gen

    def state(self, group: str = "g") -> GroupState | None:
        g = self.m.groups.get(group)
        return None if g is None else g.state

    def transitions_of(self, group: str = "g") -> list[tuple[str, str]]:
        return [(t.from_state, t.to_state) for t in self.transitions if t.group_id == group]


def fail_once(obj: Any, name: str) -> Any:
    """A replacement for method ``name`` of class ``obj`` that raises RuntimeError("boom") on
    its first call and behaves normally after (for monkeypatch.setattr)."""
    real = getattr(obj, name)
    calls = [0]

    def flaky(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError("boom")
        return real(self, *args, **kwargs)

    return flaky
