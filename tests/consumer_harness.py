"""A driver for the sans-IO consumer-group machine: fake clock, instant (or failing) writes,
armed timers kept in a dict and fired on demand."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rallypoint.groups.consumer import ConsumerGroup, ConsumerGroupConfig, ConsumerGroupMachine, StaticTopics
from rallypoint.groups.consumer_events import (
    ConsumerHeartbeat,
    ConsumerHeartbeatResult,
    ConvertClassic,
    DowngradeToClassic,
    PersistConsumer,
)
from rallypoint.groups.events import ArmTimer, CancelTimer, Note, Respond, TimerKey, Transition
from rallypoint.protocol.consumer_group_records import ConsumerRecord
from rallypoint.protocol.errors import ErrorCode

Owned = Mapping[uuid.UUID, Iterable[int]]


@dataclass
class Harness:
    config: ConsumerGroupConfig = field(
        default_factory=lambda: ConsumerGroupConfig(
            session_timeout_ms=45000, heartbeat_interval_ms=5000, assignment_interval_ms=0
        )
    )
    now: int = 1_000_000
    topics: StaticTopics = field(default_factory=StaticTopics)
    machine: ConsumerGroupMachine = field(init=False)
    timers: dict[TimerKey, int] = field(default_factory=dict)
    log: list[ConsumerRecord] = field(default_factory=list)  # every persisted record, in order
    transitions: list[Transition] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)
    fail_writes: ErrorCode | None = None
    hold_writes: bool = False
    held: list[PersistConsumer] = field(default_factory=list)
    responses: dict[int, Any] = field(default_factory=dict)
    # ConvertClassic effects: (group id, records persisted before it)
    converted: list[tuple[str, int]] = field(default_factory=list)
    # DowngradeToClassic effects: (snapshot, records persisted before it)
    downgraded: list[tuple[Any, int]] = field(default_factory=list)
    _token: int = 0

    def __post_init__(self) -> None:
        self.machine = ConsumerGroupMachine(self.config, self.topics)

    # ------------------------------------------------------------------ plumbing
    def apply(self, effects: list[Any]) -> None:
        queue = list(effects)
        while queue:
            e = queue.pop(0)
            if isinstance(e, Respond):
                self.responses[e.token] = e.result
            elif isinstance(e, ArmTimer):
                self.timers[e.key] = e.deadline_ms
            elif isinstance(e, CancelTimer):
                self.timers.pop(e.key, None)
            elif isinstance(e, PersistConsumer):
                if self.hold_writes:
                    self.held.append(e)
                    continue
                if self.fail_writes is None:
                    self.log.extend(e.records)
                queue.extend(self.machine.persist_done(e.persist_id, self.fail_writes, self.now))
            elif isinstance(e, ConvertClassic):
                self.converted.append((e.group_id, len(self.log)))
            elif isinstance(e, DowngradeToClassic):
                self.downgraded.append((e.snapshot, len(self.log)))
            elif isinstance(e, Transition):
                self.transitions.append(e)
            elif isinstance(e, Note):
                self.notes.append(e)

    def release(self, error: ErrorCode | None = None) -> None:
        held, self.held = self.held, []
        for e in held:
            if error is None:
                self.log.extend(e.records)
            self.apply(self.machine.persist_done(e.persist_id, error, self.now))

    def advance(self, ms: int) -> None:
        """Move the clock, firing due timers in deadline order."""
        target = self.now + ms
        while True:
            due = sorted(((d, k) for k, d in self.timers.items() if d <= target), key=lambda x: (x[0], x[1].sort_key()))
            if not due:
                break
            d, k = due[0]
            self.now = max(self.now, d)
            del self.timers[k]
            self.apply(self.machine.timer_fired(k, self.now))
        self.now = target

    def hb(
        self,
        member_id: str,
        epoch: int,
        *,
        group: str = "g",
        topics: Iterable[str] | None = None,
        regex: str | None = None,
        owned: Owned | None = None,
        instance_id: str | None = None,
        assignor: str | None = None,
        rebalance_timeout_ms: int | None = None,
        rack: str | None = None,
        version: int = 1,
    ) -> ConsumerHeartbeatResult:
        if epoch == 0:
            rebalance_timeout_ms = 300000 if rebalance_timeout_ms is None else rebalance_timeout_ms
            owned = {} if owned is None else owned
            if topics is None and regex is None:
                topics = ()
        req = ConsumerHeartbeat(
            group_id=group,
            member_id=member_id,
            member_epoch=epoch,
            instance_id=instance_id,
            rack_id=rack,
            rebalance_timeout_ms=-1 if rebalance_timeout_ms is None else rebalance_timeout_ms,
            subscribed_topic_names=tuple(topics) if topics is not None else None,
            subscribed_topic_regex=regex,
            server_assignor=assignor,
            topic_partitions=None if owned is None else {t: frozenset(ps) for t, ps in owned.items()},
            client_id="client",
            client_host="/127.0.0.1",
            api_version=version,
        )
        self._token += 1
        tok = self._token
        self.apply(self.machine.heartbeat(tok, req, self.now))
        if tok not in self.responses:
            return ConsumerHeartbeatResult(ErrorCode.REQUEST_TIMED_OUT)  # parked behind a held write
        r = self.responses.pop(tok)
        assert isinstance(r, ConsumerHeartbeatResult)
        return r

    def group(self, gid: str = "g") -> ConsumerGroup:
        return self.machine.groups[gid]

    def check_single_owner(self, gid: str = "g") -> None:
        """No partition is assigned to, or being revoked by, two members."""
        seen: dict[tuple[uuid.UUID, int], str] = {}
        g = self.machine.groups.get(gid)
        if g is None:
            return
        for m in g.members.values():
            for part in (m.assignment.assigned, m.assignment.pending_revocation):
                for t, ps in part.items():
                    for p in ps:
                        assert (t, p) not in seen, f"{t}-{p} owned by {seen[(t, p)]} and {m.member_id}"
                        seen[(t, p)] = m.member_id
        # the group's member indexes agree with its members
        fresh = ConsumerGroup(g.group_id, g.partition)
        for m in g.members.values():
            fresh.add(m)
        assert (g.names, g.regex_users, g.assignors, g.stable_at) == (
            fresh.names,
            fresh.regex_users,
            fresh.assignors,
            fresh.stable_at,
        )
        # and the owners index agrees with the members' partitions
        assert {tp: o[0] for tp, o in g.owners.items()} == seen


class Client:
    """A well-behaved consumer: heartbeats with what it owns, adopts assignments."""

    def __init__(self, h: Harness, member_id: str, topics: Iterable[str] | None = None, **kw: Any) -> None:
        self.h = h
        self.member_id = member_id
        self.topics = tuple(topics) if topics is not None else None
        self.kw = kw
        self.epoch = 0
        self.owned: dict[uuid.UUID, set[int]] = {}
        self.last: ConsumerHeartbeatResult | None = None

    def join(self) -> ConsumerHeartbeatResult:
        self.epoch = 0
        self.owned = {}
        return self._send(self.h.hb(self.member_id, 0, topics=self.topics, **self.kw))

    def beat(self, full: bool = False) -> ConsumerHeartbeatResult:
        """A heartbeat with what the client owns; ``full`` also resends every field, as clients
        do after a heartbeat failed or timed out (its response may have been lost)."""
        if full:
            kw = {k: v for k, v in self.kw.items() if k not in ("regex",)}
            return self._send(
                self.h.hb(
                    self.member_id,
                    self.epoch,
                    owned=self.owned,
                    topics=self.topics if self.topics is not None else (),
                    regex=self.kw.get("regex"),
                    rebalance_timeout_ms=self.kw.get("rebalance_timeout_ms", 300000),
                    **{k: v for k, v in kw.items() if k != "rebalance_timeout_ms"},
                )
            )
        kw = {k: v for k, v in self.kw.items() if k in ("group",)}
        return self._send(self.h.hb(self.member_id, self.epoch, owned=self.owned, **kw))

    def leave(self, epoch: int = -1) -> ConsumerHeartbeatResult:
        kw = {k: v for k, v in self.kw.items() if k in ("group", "instance_id")}
        return self.h.hb(self.member_id, epoch, **kw)

    def _send(self, r: ConsumerHeartbeatResult) -> ConsumerHeartbeatResult:
        self.last = r
        if r.error == ErrorCode.NONE:
            self.epoch = r.member_epoch
            if r.assignment is not None:
                self.owned = {t: set(ps) for t, ps in r.assignment.items()}
        elif r.error in (ErrorCode.FENCED_MEMBER_EPOCH, ErrorCode.UNKNOWN_MEMBER_ID):
            self.owned = {}
            self.epoch = 0
        return r

    def count(self) -> int:
        return sum(len(ps) for ps in self.owned.values())


class ClassicClient:
    """An eager classic consumer (JoinGroup/SyncGroup/Heartbeat) inside a consumer group."""

    def __init__(self, h: Harness, topics: Iterable[str], session_ms: int = 10000) -> None:
        self.h = h
        self.topics = tuple(topics)
        self.session_ms = session_ms
        self.member_id = ""
        self.generation = -1
        self.owned: dict[str, set[int]] = {}

    def _call(self, effects_of: Any) -> Any:
        self.h._token += 1
        tok = self.h._token
        self.h.apply(effects_of(tok))
        return self.h.responses.pop(tok, None)

    def join(self) -> ErrorCode:
        from rallypoint.groups.events import JoinRequest, Protocol
        from rallypoint.protocol.consumer_protocol import Subscription, encode_subscription

        self.owned = {}  # eager: everything is revoked before rejoining
        meta = encode_subscription(Subscription(1, self.topics, None, ()))
        for _ in range(2):
            req = JoinRequest(
                "g", self.member_id, None, self.session_ms, 20000, "consumer", (Protocol("range", meta),), "c", "/h", 5
            )
            r = self._call(lambda t, req=req: self.h.machine.classic_join(t, req, self.h.now))
            if r is None:
                return ErrorCode.GROUP_ID_NOT_FOUND  # not a consumer group (any more)
            if r.error == ErrorCode.MEMBER_ID_REQUIRED:
                self.member_id = r.member_id
                continue
            if r.error != ErrorCode.NONE:
                self.member_id = ""
                return ErrorCode(r.error)
            self.generation = r.generation_id
            return self.sync()
        return ErrorCode.MEMBER_ID_REQUIRED

    def sync(self) -> ErrorCode:
        from rallypoint.groups.events import SyncRequest
        from rallypoint.protocol.consumer_protocol import decode_assignment

        req = SyncRequest("g", self.generation, self.member_id, None, "consumer", "range", (), 5)
        r = self._call(lambda t: self.h.machine.classic_sync(t, req, self.h.now))
        if r.error == ErrorCode.NONE:
            self.owned = {tp.topic: set(tp.partitions) for tp in decode_assignment(r.assignment).partitions}
        return ErrorCode(r.error)

    def beat(self) -> ErrorCode:
        from rallypoint.groups.events import HeartbeatRequest

        if not self.member_id or self.generation < 0:
            return self.join()
        req = HeartbeatRequest("g", self.generation, self.member_id)
        r = self._call(lambda t: self.h.machine.classic_heartbeat(t, req, self.h.now))
        if r.error == ErrorCode.NONE:
            return ErrorCode.NONE
        if r.error != ErrorCode.REBALANCE_IN_PROGRESS:
            self.member_id = ""
        return self.join()
