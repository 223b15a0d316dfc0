"""Rebalance time in the coordinator alone: the two figures of ``bench.rebalance`` (first
generation, rebalance of a Stable group) for 10, 100 and 1,000 members, on the sans-IO classic
group coordinator driven directly -- no sockets, no codec, no event loop; writes acknowledged at
once; the initial rebalance delay is a step of a fake clock.  What is left of ``bench.rebalance``'s
wall time is the request path (decoding, encoding, the server, the request log) for every
JoinGroup, Heartbeat and SyncGroup, and the 1,000 clients themselves on the same two cores.

    python -m bench.coordinator_time
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from bench.common import summarize
from bench.rebalance import JOIN_V, REBALANCE_MS, SESSION_MS, SUBSCRIPTION, SYNC_V, _assignment


class _Machine:
    """The sans-IO classic group coordinator driven directly: no sockets, no codec, no event
    loop; writes acknowledged at once, timers fired when the (fake) clock reaches them."""

    def __init__(self, initial_delay_ms: int) -> None:
        from rallypoint.groups.coordinator import GroupCoordinator
        from rallypoint.groups.model import GroupConfig

        cfg = GroupConfig(initial_rebalance_delay_ms=initial_delay_ms, max_session_timeout_ms=SESSION_MS)
        self.m = GroupCoordinator(cfg)
        self.now = 1_000_000
        self.answers: dict[int, Any] = {}
        self.timers: dict[Any, int] = {}
        self.tokens = iter(range(1, 1 << 62))
        self.apply(self.m.start(self.now))

    def apply(self, effects: list[Any]) -> None:
        from rallypoint.groups.events import ArmTimer, CancelTimer, Persist, Respond

        queue = list(effects)
        while queue:
            e = queue.pop(0)
            if isinstance(e, Respond):
                self.answers[e.token] = e.result
            elif isinstance(e, ArmTimer):
                self.timers[e.key] = e.deadline_ms
            elif isinstance(e, CancelTimer):
                self.timers.pop(e.key, None)
            elif isinstance(e, Persist):
                queue.extend(self.m.persist_done(e.persist_id, None, self.now))

    def advance(self, ms: int) -> None:
        self.now += ms
        for key, deadline in sorted(self.timers.items(), key=lambda kv: kv[1]):
            if deadline <= self.now and self.timers.get(key) == deadline:
                del self.timers[key]
                self.apply(self.m.timer_fired(key, self.now))

    def join(self, group: str, member_id: str) -> int:
        from rallypoint.groups.events import JoinRequest, Protocol

        t = next(self.tokens)
        req = JoinRequest(
            group, member_id, None, SESSION_MS, REBALANCE_MS, "consumer",
            (Protocol("range", SUBSCRIPTION),), "bench", "/127.0.0.1", JOIN_V,
        )  # fmt: skip
        self.apply(self.m.join(t, req, self.now))
        return t

    def sync(self, group: str, member_id: str, gen: int, assignments: tuple[tuple[str, bytes], ...]) -> int:
        from rallypoint.groups.events import SyncRequest

        t = next(self.tokens)
        req = SyncRequest(group, gen, member_id, None, "consumer", "range", assignments, SYNC_V)
        self.apply(self.m.sync(t, req, self.now))
        return t

    def heartbeat(self, group: str, member_id: str, gen: int) -> Any:
        from rallypoint.groups.events import HeartbeatRequest

        t = next(self.tokens)
        self.apply(self.m.heartbeat(t, HeartbeatRequest(group, gen, member_id), self.now))
        return self.answers.pop(t)


def coordinator_time(members: int) -> tuple[float, float]:
    """Milliseconds of the coordinator's own work for the two figures of ``bench.rebalance``:
    (first generation, rebalance of the Stable group).  The initial delay
    is a fake-clock step, so both count CPU only: joins, the join phase's completion, the
    leader's member list, the assignment record and every answer."""
    d = _Machine(initial_delay_ms=3000)
    group = f"g-{uuid.uuid4().hex[:6]}"
    first = [d.join(group, "") for _ in range(members)]
    ids = [d.answers.pop(t).member_id for t in first]  # MEMBER_ID_REQUIRED: not timed
    t0 = time.perf_counter()
    tokens = [d.join(group, mid) for mid in ids]
    for _ in range(REBALANCE_MS // 3000):  # the initial delay (extended while members arrive) ends
        if all(t in d.answers for t in tokens):
            break
        d.advance(3000)
    results = [d.answers.pop(t) for t in tokens]
    gen, leader = results[0].generation_id, results[0].leader
    assignments = tuple((mid, _assignment(i)) for i, mid in enumerate(ids))
    syncs = [d.sync(group, mid, gen, assignments if mid == leader else ()) for mid in ids]
    if any(int(d.answers.pop(s).error) != 0 for s in syncs):
        raise RuntimeError("a sync failed")
    first_ms = (time.perf_counter() - t0) * 1000
    t0 = time.perf_counter()
    rejoin = [d.join(group, leader)]
    for mid in ids:
        if mid != leader:
            if int(d.heartbeat(group, mid, gen).error) != 27:  # REBALANCE_IN_PROGRESS
                raise RuntimeError("a follower did not learn of the rebalance")
            rejoin.append(d.join(group, mid))
    results = [d.answers.pop(t) for t in rejoin]
    gen, leader = results[0].generation_id, results[0].leader
    syncs = [d.sync(group, mid, gen, assignments if mid == leader else ()) for mid in ids]
    if any(int(d.answers.pop(s).error) != 0 for s in syncs):
        raise RuntimeError("a sync failed")
    return first_ms, (time.perf_counter() - t0) * 1000


def run(quick: bool = False) -> list[dict[str, Any]]:
    runs = 3 if quick else 7
    rows: list[dict[str, Any]] = []
    for n in (10, 100, 1000):
        samples = [coordinator_time(n) for _ in range(runs)]
        rows.append(
            {"name": f"coordinator time, first generation, {n:,} members", "unit": "ms",
             "stats": summarize([s[0] for s in samples])}
        )  # fmt: skip
        rows.append(
            {"name": f"coordinator time, rebalance of a Stable group, {n:,} members", "unit": "ms",
             "stats": summarize([s[1] for s in samples])}
        )  # fmt: skip
        print(f"{n} members: first generation {rows[-2]['stats']['median']:.1f} ms, "
              f"rebalance {rows[-1]['stats']['median']:.1f} ms", flush=True)  # fmt: skip
    rows[-1]["note"] = (
        "the sans-IO classic group coordinator alone (GroupCoordinator with its effects applied at once): "
        "JoinGroup v5 with known member ids, SyncGroup v3 with the leader's assignment of every member, "
        "the followers learning of the rebalance from a Heartbeat; the rest of bench.rebalance's wall "
        "time is the request path and the clients"
    )
    return rows


if __name__ == "__main__":
    run()
