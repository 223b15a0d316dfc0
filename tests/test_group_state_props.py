"""Property tests: random join/sync/heartbeat/leave/commit/restart/time sequences from several
well-behaved and badly-behaved clients never break the group invariants.

* only legal transitions (the harness checks every Transition effect against the table of
  docs/groups.md, "States and transitions");
* a group's generation never goes down;
* a Stable group's members and assignments are exactly those of the last GroupMetadata
  record written for it (the leader's SyncGroup, or a static replacement that kept them);
* the bookkeeping agrees with itself (awaiting-join count, protocol counts, static map, leader);
* no request stays parked forever: once clients go quiet, every JoinGroup and SyncGroup is
  answered within the timeouts.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from rallypoint.groups.events import JoinResult
from rallypoint.groups.model import GroupConfig, GroupState
from rallypoint.protocol.errors import ErrorCode
from rallypoint.protocol.offsets_schema import GroupMetadataKey, GroupMetadataValue

from tests.group_harness import Harness, meta_for

pytestmark = pytest.mark.unit

E = ErrorCode
S = GroupState
CLIENTS = 4
PROTOCOL_SETS = (
    (("range", meta_for("a")),),
    (("range", meta_for("a", "b")),),
    (("roundrobin", meta_for("a")), ("range", meta_for("a"))),
)


@dataclass
class Client:
    index: int
    static: bool
    version: int
    member_id: str = ""
    generation: int = -1
    last_join: JoinResult | None = None
    synced: bool = False
    protocols: int = 0

    @property
    def instance(self) -> str | None:
        return f"inst{self.index}" if self.static else None


OPS = st.lists(
    st.tuples(
        st.sampled_from(
            ["step"] * 8 + ["join", "sync", "heartbeat", "leave", "commit", "restart", "advance", "advance", "proto"]
        ),
        st.integers(0, CLIENTS - 1),
        st.sampled_from([0, 1, 500, 500, 1_000, 3_000, 6_000, 11_000, 31_000]),
    ),
    min_size=10,
    max_size=120,
)


def check_invariants(x: Harness, generations: dict[int, int]) -> None:
    for g in x.m.groups.values():
        prev = generations.get(id(g))
        assert prev is None or g.generation >= prev, (g.group_id, prev, g.generation)
        generations[id(g)] = g.generation
        assert g.num_awaiting_join == sum(1 for m in g.members.values() if m.join_token is not None)
        counts: dict[str, int] = {}
        for m in g.members.values():
            for p in m.protocols:
                counts[p.name] = counts.get(p.name, 0) + 1
        assert {k: v for k, v in g.supported_protocols.items() if v} == counts
        assert g.static_members == {
            m.group_instance_id: mid for mid, m in g.members.items() if m.group_instance_id is not None
        }
        if g.members:
            assert g.leader_id in g.members
        else:
            assert g.leader_id is None
        assert not (g.pending_members & set(g.members))
        if g.state == S.EMPTY:
            assert not g.members
        if g.state in (S.COMPLETING_REBALANCE, S.STABLE):
            assert g.members and g.protocol_name is not None
            assert all(m.join_token is None for m in g.members.values())
        if g.state == S.STABLE:
            records = [
                r[1]
                for p in x.persisted
                for r in p.records
                if r[0] == GroupMetadataKey(g.group_id) and isinstance(r[1], GroupMetadataValue)
            ]
            assert records, "a Stable group has a persisted assignment"
            last = records[-1]
            assert last.generation == g.generation
            assert {m.member_id: m.assignment for m in last.members} == {
                mid: m.assignment for mid, m in g.members.items()
            }


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=OPS,
    statics=st.lists(st.booleans(), min_size=CLIENTS, max_size=CLIENTS),
    versions=st.lists(st.sampled_from([3, 5, 7, 9]), min_size=CLIENTS, max_size=CLIENTS),
    delay=st.sampled_from([0, 3000]),
)
@pytest.mark.slow
def test_random_client_behaviour_keeps_the_invariants(
    ops: list[tuple[str, int, int]], statics: list[bool], versions: list[int], delay: int
) -> None:
    x = Harness(GroupConfig(initial_rebalance_delay_ms=delay, max_size=4))
    clients = [Client(i, statics[i], versions[i]) for i in range(CLIENTS)]
    generations: dict[int, int] = {}
    join_tokens: dict[int, int] = {}  # token -> client index
    sync_tokens: list[int] = []

    def absorb() -> None:
        for tok, ci in list(join_tokens.items()):
            r = x.result(tok)
            if r is None:
                continue
            del join_tokens[tok]
            c = clients[ci]
            if r.error == E.NONE:
                c.member_id, c.generation, c.last_join, c.synced = r.member_id, r.generation_id, r, False
            elif r.error == E.MEMBER_ID_REQUIRED:
                c.member_id = r.member_id
            elif r.error in (E.UNKNOWN_MEMBER_ID, E.FENCED_INSTANCE_ID, E.GROUP_MAX_SIZE_REACHED):
                c.member_id, c.generation, c.last_join = "", -1, None

    for op, ci, ms in ops:
        c = clients[ci]
        if op == "step":  # what a well-behaved consumer does next
            parked = ci in join_tokens.values()
            if parked:
                op = "advance"
            elif not c.member_id or c.last_join is None or c.generation == -1:
                op = "join"
            elif not c.synced:
                op = "sync"
                c.synced = True
            else:
                op = "heartbeat"
        if op == "join":
            t = x.join(
                member_id=c.member_id,
                instance=c.instance,
                version=c.version,
                session=10_000,
                rebalance=20_000,
                protocols=PROTOCOL_SETS[c.protocols],
            )
            join_tokens[t] = ci
        elif op == "sync" and c.last_join is not None:
            lj = c.last_join
            assignments = None
            if lj.leader == c.member_id and lj.members:
                # a leader that may leave some members out
                chosen = [m.member_id for m in lj.members][: 1 + ms % len(lj.members)]
                assignments = {mid: f"{mid}@{lj.generation_id}".encode() for mid in chosen}
            sync_tokens.append(x.sync("g", c.member_id, lj.generation_id, assignments, instance=c.instance))
        elif op == "heartbeat" and c.member_id:
            err = x.heartbeat("g", c.member_id, c.generation, instance=c.instance)
            if err in (E.UNKNOWN_MEMBER_ID, E.FENCED_INSTANCE_ID):
                c.member_id, c.generation, c.last_join = "", -1, None
            elif err in (E.REBALANCE_IN_PROGRESS, E.ILLEGAL_GENERATION):
                c.generation, c.last_join = -1, None  # rejoin with the same member id
        elif op == "leave" and c.member_id:
            x.leave("g", (c.member_id, c.instance))
            c.member_id, c.generation, c.last_join = "", -1, None
        elif op == "commit":
            x.commit("g", {("a", ci): ms}, generation=c.generation, member_id=c.member_id, instance=c.instance)
        elif op == "restart":
            c.member_id, c.generation, c.last_join = "", -1, None
        elif op == "proto":
            c.protocols = (c.protocols + 1) % len(PROTOCOL_SETS)
        elif op == "advance":
            x.advance(ms)
        absorb()
        check_invariants(x, generations)

    reached = {t.to_state for t in x.transitions}
    event(f"reached Stable: {'Stable' in reached}")
    event(f"static replacement: {any(n.event == 'static member replaced' for n in x.notes)}")
    # Clients go quiet: within the longest timeouts every parked request is answered.
    for _ in range(12):
        x.advance(60_000)
        check_invariants(x, generations)
    x.advance(300_000)
    absorb()
    assert not join_tokens, "JoinGroup parked forever"
    assert all(x.answered(t) for t in sync_tokens), "SyncGroup parked forever"
    g = x.m.groups.get("g")
    assert g is None or g.state == S.EMPTY  # nobody heartbeats any more
