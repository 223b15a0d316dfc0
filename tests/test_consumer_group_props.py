"""Property test of the consumer-group machine: random joins, leaves, heartbeats (acknowledging,
not acknowledging, with a lost response), static leaves and returns, topic changes and clock
jumps never give a partition two owners, and once the members heartbeat normally the group
always converges to its target assignment (docs/consumer-groups.md, "Reconciliation")."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from rallypoint.groups.consumer import ConsumerGroupConfig
from rallypoint.groups.reconciliation import MemberState
from rallypoint.protocol.errors import ErrorCode

from .consumer_harness import ClassicClient, Client, Harness

pytestmark = [pytest.mark.unit, pytest.mark.slow]

MEMBERS = [f"m{i}" for i in range(5)]
SUBSCRIPTIONS = [("t",), ("t", "u"), ("u",)]


class ConsumerGroupMachineTest(RuleBasedStateMachine):
    @initialize(
        assignor=st.sampled_from(["uniform", "range"]),
        interval=st.sampled_from([0, 1000]),
    )
    def setup(self, assignor: str, interval: int) -> None:
        self.h = Harness(
            config=ConsumerGroupConfig(
                session_timeout_ms=10000,
                heartbeat_interval_ms=1000,
                assignment_interval_ms=interval,
                assignors=(assignor, "uniform" if assignor == "range" else "range"),
            )
        )
        self.h.topics.create("t", 4)
        self.h.topics.create("u", 3)
        self.clients: dict[str, Client] = {}
        self.static = {"m3": "i3", "m4": "i4"}
        self.incarnation = 0
        self.classic: ClassicClient | None = None

    def _client(self, mid: str, subs: tuple[str, ...]) -> Client:
        kw = {}
        if mid in self.static:
            kw["instance_id"] = self.static[mid]
        self.incarnation += 1
        # a static member that comes back does so with a new member id, as a new process would
        member_id = f"{mid}-{self.incarnation}" if mid in self.static else mid
        return Client(self.h, member_id, subs, **kw)

    @rule(mid=st.sampled_from(MEMBERS), subs=st.sampled_from(SUBSCRIPTIONS))
    def join(self, mid: str, subs: tuple[str, ...]) -> None:
        c = self.clients.get(mid)
        if c is None or c.epoch in (0, -1):
            c = self._client(mid, subs) if c is None or mid in self.static else c
            self.clients[mid] = c
            r = c.join()
            assert r.error in (ErrorCode.NONE, ErrorCode.UNRELEASED_INSTANCE_ID), r

    @rule(mid=st.sampled_from(MEMBERS))
    def heartbeat(self, mid: str) -> None:
        c = self.clients.get(mid)
        if c is not None and c.epoch > 0:
            c.beat()

    @rule(mid=st.sampled_from(MEMBERS))
    def heartbeat_without_owned(self, mid: str) -> None:
        c = self.clients.get(mid)
        if c is not None and c.epoch > 0:
            c._send(self.h.hb(c.member_id, c.epoch))

    @rule(mid=st.sampled_from(MEMBERS))
    def lost_response(self, mid: str) -> None:
        c = self.clients.get(mid)
        if c is not None and c.epoch > 0:
            self.h.hb(c.member_id, c.epoch, owned=c.owned)  # the client never sees the answer ...
            c.beat(full=True)  # ... and retries with a full request, as clients do

    @rule(mid=st.sampled_from(MEMBERS))
    def leave(self, mid: str) -> None:
        c = self.clients.get(mid)
        if c is not None and c.epoch > 0:
            c.leave(-2 if mid in self.static else -1)
            c.epoch, c.owned = -1, {}

    @rule(mid=st.sampled_from(MEMBERS), subs=st.sampled_from(SUBSCRIPTIONS))
    def resubscribe(self, mid: str, subs: tuple[str, ...]) -> None:
        c = self.clients.get(mid)
        if c is not None and c.epoch > 0:
            c.topics = subs
            c._send(self.h.hb(c.member_id, c.epoch, topics=subs, owned=c.owned))

    @rule(subs=st.sampled_from(SUBSCRIPTIONS))
    def classic_member(self, subs: tuple[str, ...]) -> None:
        """A classic (eager) consumer joins, heartbeats (rejoining when told), or leaves."""
        if self.classic is None:
            if self.h.machine.groups.get("g") is not None and self.h.group().members:
                self.classic = ClassicClient(self.h, subs)
                self.classic.join()
            return
        if self.classic.beat() == ErrorCode.GROUP_ID_NOT_FOUND:
            self.classic = None

    @rule()
    def classic_leaves(self) -> None:
        from rallypoint.groups.events import LeaveMember, LeaveRequest

        if self.classic is not None and self.classic.member_id:
            self.h.apply(
                self.h.machine.classic_leave(
                    999_999, LeaveRequest("g", (LeaveMember(self.classic.member_id),)), self.h.now
                )
            )
            self.h.responses.pop(999_999, None)
        self.classic = None

    @rule(ms=st.sampled_from([100, 1500, 6000, 11000]))
    def advance(self, ms: int) -> None:
        self.h.advance(ms)

    @rule(topic=st.sampled_from(["u", "v"]), partitions=st.integers(1, 5))
    def change_topic(self, topic: str, partitions: int) -> None:
        cur = self.h.topics.get(topic)
        if cur is None:
            self.h.topics.create(topic, partitions)
        elif partitions > cur.partitions:
            from rallypoint.groups.consumer import TopicInfo

            self.h.topics.put(TopicInfo(cur.topic_id, topic, partitions))
        elif topic == "v":
            self.h.topics.delete(topic)

    @invariant()
    def single_owner(self) -> None:
        if hasattr(self, "h"):
            self.h.check_single_owner()

    def teardown(self) -> None:
        if not hasattr(self, "h"):
            return
        # from here on every live client heartbeats normally, with time standing nearly still
        h = self.h
        live = [c for c in self.clients.values() if c.epoch > 0]
        # members that left for good or temporarily (static) expire after the session timeout
        classic = self.classic
        for _ in range(11):
            h.advance(1000)
            for c in live:
                if c.beat().error != ErrorCode.NONE:
                    c.join()
            if classic is not None:
                classic.beat()
        for _ in range(12):
            for c in live:
                r = c.beat()
                if r.error != ErrorCode.NONE:
                    c.join()
            if classic is not None:
                classic.beat()
            h.check_single_owner()
        g = h.machine.groups.get("g")
        if g is None or not g.members:
            return
        live_ids = {c.member_id for c in live}
        if classic is not None and classic.member_id in g.members:
            live_ids.add(classic.member_id)
            server = {
                h.topics.by_id(t).name: set(ps)
                for t, ps in g.members[classic.member_id].assignment.assigned.items()
                if ps and h.topics.by_id(t) is not None
            }
            assert {t: ps for t, ps in classic.owned.items() if ps} == server
        for mid, m in g.members.items():
            if mid not in live_ids:
                continue
            assert m.assignment.state == MemberState.STABLE, (mid, m.assignment)
            assert m.epoch == g.assignment_epoch
            target = {t: set(ps) for t, ps in g.target.get(mid, {}).items()}
            assert {t: set(ps) for t, ps in m.assignment.assigned.items() if ps} == target
        for c in live:
            if c.member_id in g.members:
                assert {t: ps for t, ps in c.owned.items() if ps} == {
                    t: set(ps) for t, ps in g.members[c.member_id].assignment.assigned.items() if ps
                }
        if all(m.epoch > 0 for m in g.members.values()) and g.epoch == g.assignment_epoch:
            # the target covers every subscribed partition exactly once
            subscribed = set()
            for m in g.members.values():
                for n in m.meta.subscribed_topic_names:
                    t = h.topics.get(n)
                    if t is not None:
                        subscribed |= {(t.topic_id, p) for p in range(t.partitions)}
            targeted = [(t, p) for tgt in g.target.values() for t, ps in tgt.items() for p in ps]
            assert len(targeted) == len(set(targeted))
            assert set(targeted) == subscribed


ConsumerGroupMachineTest.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestConsumerGroupMachine = ConsumerGroupMachineTest.TestCase
