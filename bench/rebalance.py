"""Rebalance time of one group of 10, 100 and 1,000 members (group.initial.rebalance.delay.ms=0).

A lightweight protocol-level driver: one raw asyncio connection per member, requests encoded
with protocol.codec.  Each member first gets its id (JoinGroup v5 with an empty member id →
MEMBER_ID_REQUIRED), then two figures are measured:

* first generation: every member sends JoinGroup v5 with its id at once and behaves like a
  consumer (SyncGroup v3, the leader with every member's assignment; heartbeats every 100 ms;
  rejoin on REBALANCE_IN_PROGRESS).  With a 0 ms initial delay the first join phase closes
  after one event-loop turn, so members that arrive later cause more generations; the clock
  runs until every member holds its assignment of one common generation.
* rebalance of a Stable group: the leader sends JoinGroup (which always rebalances), the
  followers learn it from a heartbeat (REBALANCE_IN_PROGRESS) and all rejoin at once, then sync
  again, generation N → N+1: the coordinator's join phase, vote, leader election, the leader's
  member list, the assignment record and every answer.

    python -m bench.rebalance [--sizes 10 100 1000] [--runs 5]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import time
import uuid
from typing import Any

from bench.common import rallypoint, summarize
from bench.loadgen import Conn

JOIN_V, SYNC_V = 5, 3
SESSION_MS = 60_000
REBALANCE_MS = 60_000
SUBSCRIPTION = b"\x00\x00\x00\x00\x00\x01\x00\x05topic\xff\xff\xff\xff"  # ConsumerProtocolSubscription v0


def _assignment(i: int) -> bytes:
    # ConsumerProtocolAssignment v0: topic "topic", partition i, no user data
    return b"\x00\x00\x00\x00\x00\x01\x00\x05topic\x00\x00\x00\x01" + i.to_bytes(4, "big") + b"\xff\xff\xff\xff"


def _join_body(group: str, member_id: str, subscription: bytes = SUBSCRIPTION) -> dict[str, Any]:
    return {
        "group_id": group,
        "session_timeout": SESSION_MS,
        "rebalance_timeout": REBALANCE_MS,
        "member_id": member_id,
        "group_instance_id": None,
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": subscription}],
    }


async def _member_ids(conns: list[Conn], group: str) -> list[str]:
    async def one(c: Conn) -> str:
        r = await c.call(11, JOIN_V, _join_body(group, ""))
        if int(r.error_code) != 79:  # MEMBER_ID_REQUIRED
            raise RuntimeError(f"expected MEMBER_ID_REQUIRED, got {int(r.error_code)}")
        return str(r.member_id)

    return list(await asyncio.gather(*(one(c) for c in conns)))


async def converge(
    conns: list[Conn],
    group: str,
    ids: list[str] | None = None,
    heartbeat_s: float = 0.1,
    join_version: int = JOIN_V,
    subscription: bytes = SUBSCRIPTION,
) -> tuple[float, int, str]:
    """Members behave like consumers: join, sync (the leader with everybody's assignment),
    heartbeat, and rejoin when told to.  Seconds from the first JoinGroup sent to the moment
    every member holds its assignment of one common generation; that generation; its leader.
    ``ids``: known member ids (else each member learns its id from the coordinator)."""
    n = len(conns)
    ids = ids if ids is not None else [""] * n  # updated in place
    done: dict[int, int] = {}  # member index -> generation it is synced in
    leaders: dict[int, str] = {}
    finished = asyncio.Event()
    start = time.perf_counter()
    end = [0.0]

    async def member(i: int) -> None:
        c, mid = conns[i], ids[i]
        while not finished.is_set():
            r = await c.call(11, join_version, _join_body(group, mid, subscription))
            if int(r.error_code) == 79:  # MEMBER_ID_REQUIRED
                mid = ids[i] = str(r.member_id)
                continue
            if int(r.error_code) != 0:
                if int(r.error_code) in (25, 82):  # UNKNOWN_MEMBER_ID / FENCED: start over
                    mid = ids[i] = ""
                continue
            mid = ids[i] = str(r.member_id)
            gen = int(r.generation_id)
            assignments = [{"member_id": m.member_id, "assignment": _assignment(k)} for k, m in enumerate(r.members)]
            s = await c.call(
                14,
                SYNC_V,
                {
                    "group_id": group,
                    "generation_id": gen,
                    "member_id": mid,
                    "group_instance_id": None,
                    "assignments": assignments,
                },
            )
            if int(s.error_code) != 0:
                continue
            done[i] = gen
            leaders[gen] = str(r.leader)
            if len(done) == n and len(set(done.values())) == 1:
                end[0] = time.perf_counter()
                finished.set()
            while not finished.is_set():
                try:  # sleep until the next heartbeat, or until everybody is done
                    await asyncio.wait_for(finished.wait(), heartbeat_s)
                    break
                except TimeoutError:
                    pass
                hb = await c.call(12, 3, {"group_id": group, "generation_id": gen, "member_id": mid})
                if int(hb.error_code) != 0:
                    done.pop(i, None)
                    break

    tasks = [asyncio.create_task(member(i)) for i in range(n)]
    await asyncio.wait_for(finished.wait(), 120)
    # let in-flight heartbeats be answered (a cancelled call would leave its answer unread)
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
    gen = next(iter(done.values()))
    return end[0] - start, gen, leaders[gen]


async def _rejoin_all(conns: list[Conn], group: str, ids: list[str], leader: str, gen: int) -> tuple[float, int]:
    """A Stable group whose leader sends JoinGroup (which always rebalances); the followers see
    REBALANCE_IN_PROGRESS on a heartbeat and rejoin at once.  Seconds from the leader's
    JoinGroup to the last SyncGroup answer; the new generation."""
    li = ids.index(leader)
    start = time.perf_counter()
    leader_join = asyncio.create_task(conns[li].call(11, JOIN_V, _join_body(group, leader)))
    probe = next(i for i in range(len(ids)) if i != li) if len(ids) > 1 else None
    if probe is not None:
        while True:  # (a follower rejoining before the leader would just get the current generation back)
            hb = await conns[probe].call(12, 3, {"group_id": group, "generation_id": gen, "member_id": ids[probe]})
            if int(hb.error_code) == 27:  # REBALANCE_IN_PROGRESS
                break
    followers = [
        asyncio.create_task(c.call(11, JOIN_V, _join_body(group, m)))
        for i, (c, m) in enumerate(zip(conns, ids, strict=True))
        if i != li
    ]
    joined = await asyncio.gather(leader_join, *followers)
    order = [li] + [i for i in range(len(ids)) if i != li]
    conns = [conns[i] for i in order]
    ids = [ids[i] for i in order]
    for r in joined:
        if int(r.error_code) != 0:
            raise RuntimeError(f"JoinGroup error {int(r.error_code)}")
    generation = int(joined[0].generation_id)
    leader = joined[0].leader
    assignments = [
        {"member_id": m.member_id, "assignment": _assignment(k)}
        for r in joined
        if r.members
        for k, m in enumerate(r.members)
    ]

    async def sync(c: Conn, member_id: str) -> Any:
        return await c.call(
            14,
            SYNC_V,
            {
                "group_id": group,
                "generation_id": generation,
                "member_id": member_id,
                "group_instance_id": None,
                "assignments": assignments if member_id == leader else [],
            },
        )

    synced = await asyncio.gather(*(sync(c, m) for c, m in zip(conns, ids, strict=True)))
    elapsed = time.perf_counter() - start
    for s in synced:
        if int(s.error_code) != 0:
            raise RuntimeError(f"SyncGroup error {int(s.error_code)}")
    if len({bytes(s.assignment) for s in synced}) != len(conns):
        raise RuntimeError("members did not get their own assignments")
    return elapsed, generation


async def _measure(host: str, port: int, members: int) -> tuple[float, int, float]:
    conns = [await Conn.open(host, port) for _ in range(members)]
    try:
        group = f"rebalance-{members}-{uuid.uuid4().hex[:8]}"
        ids = await _member_ids(conns, group)
        first, gen1, leader = await converge(conns, group, ids)
        again, gen2 = await _rejoin_all(conns, group, ids, leader, gen1)
        if gen2 != gen1 + 1:
            raise RuntimeError(f"unexpected generations {gen1}, {gen2}")
        return first, gen1, again
    finally:
        for c in conns:
            c.close()


def _raise_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(needed, hard), hard))


def measure(sizes: list[int], runs: int) -> dict[int, tuple[list[float], list[float]]]:
    _raise_fd_limit(max(sizes) * 2 + 256)  # the broker inherits it
    out: dict[int, tuple[list[float], list[float]]] = {}
    with rallypoint({"group.max.session.timeout.ms": str(SESSION_MS)}) as ep:
        for n in sizes:
            firsts, agains, gens = [], [], []
            for _ in range(runs):
                first, gen, again = asyncio.run(_measure(ep.host, ep.port, n))
                firsts.append(first * 1000)
                agains.append(again * 1000)
                gens.append(gen)
            out[n] = (firsts, agains)
            print(
                f"{n:>5} members: first generation {summarize(firsts)['median']:8.1f} ms "
                f"(generations needed: {min(gens)}-{max(gens)}), "
                f"rebalance of a Stable group {summarize(agains)['median']:8.1f} ms  (median of {runs})",
                flush=True,
            )
    return out


def run(quick: bool = False) -> list[dict[str, Any]]:
    runs = 3 if quick else 7
    results = measure([10, 100, 1000], runs)
    rows: list[dict[str, Any]] = []
    for n, (firsts, agains) in results.items():
        rows.append({"name": f"first generation, {n:,} members", "unit": "ms", "stats": summarize(firsts)})
        rows.append({"name": f"rebalance of a Stable group, {n:,} members", "unit": "ms", "stats": summarize(agains)})
    rows[-1]["note"] = (
        "one raw connection per member; JoinGroup v5 (member id already known) and SyncGroup v3 with the "
        "leader's assignment of every member; group.initial.rebalance.delay.ms=0; timed from the first "
        "JoinGroup sent until every member holds its assignment (first generation: members heartbeat "
        "every 100 ms and rejoin when told to)"
    )
    return rows


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", type=int, nargs="*", default=[10, 100, 1000])
    p.add_argument("--runs", type=int, default=5)
    a = p.parse_args()
    measure(a.sizes, a.runs)
