"""RSS per member: 10,000 groups × 10 members held Stable in one rallypoint process.

Members join through the real protocol (JoinGroup v3, so dynamic members need no
MEMBER_ID_REQUIRED round trip; SyncGroup v3 with the leader's assignment).  RSS is read from
/proc before the first join and after the last sync; the difference divided by the number of
members is the cost of one member (its group share included).

    python -m bench.memory [--groups 10000] [--members 10]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from bench.common import rallypoint, rss_bytes, summarize
from bench.loadgen import Conn
from bench.rebalance import converge

JOIN_V3 = 3
SESSION_MS = 600_000
META = b"\x00\x01\x00\x00\x00\x01\x00\x05topic\x00\x00\x00\x00"  # ConsumerProtocolSubscription v1
ASSIGNMENT = b"\x00\x01\x00\x00\x00\x01\x00\x05topic\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00"


async def _fill_group(conns: list[Conn], group: str) -> None:
    # Members behave like consumers (rejoin when told to): with a 0 ms initial delay the first
    # join phase closes after one timer tick, as in Kafka, so a burst of JoinGroups can take
    # more than one generation to settle.
    await converge(conns, group, join_version=JOIN_V3, subscription=META)


async def _fill(host: str, port: int, groups: int, members: int, lanes: int) -> None:
    lane_conns = [[await Conn.open(host, port) for _ in range(members)] for _ in range(lanes)]
    try:

        async def lane(i: int) -> None:
            for g in range(i, groups, lanes):
                await _fill_group(lane_conns[i], f"mem-{g}")

        await asyncio.gather(*(lane(i) for i in range(lanes)))
    finally:
        for cs in lane_conns:
            for c in cs:
                c.close()


def measure(groups: int, members: int, lanes: int = 8) -> dict[str, float]:
    with rallypoint({"group.max.session.timeout.ms": str(SESSION_MS)}) as ep:
        assert ep.pid is not None
        time.sleep(0.5)
        before = rss_bytes(ep.pid)
        start = time.perf_counter()
        asyncio.run(_fill(ep.host, ep.port, groups, members, lanes))
        elapsed = time.perf_counter() - start
        time.sleep(0.5)
        after = rss_bytes(ep.pid)
    n = groups * members
    return {
        "bytes_per_member": (after - before) / n,
        "rss_before": before,
        "rss_after": after,
        "seconds": elapsed,
        "members": n,
    }


def run(quick: bool = False) -> list[dict[str, Any]]:
    groups = 1000 if quick else 10_000
    m = measure(groups, 10)
    print(
        f"{groups} groups x 10 members: RSS {m['rss_before'] / 2**20:.1f} → {m['rss_after'] / 2**20:.1f} MiB, "
        f"{m['bytes_per_member']:.0f} bytes/member, filled in {m['seconds']:.1f} s",
        flush=True,
    )
    return [
        {
            "name": f"RSS per member ({groups:,} groups × 10 members)",
            "unit": "bytes",
            "stats": summarize([m["bytes_per_member"]]),
            "note": f"broker RSS {m['rss_before'] / 2**20:.1f} MiB idle → {m['rss_after'] / 2**20:.1f} MiB with "
            f"{m['members']:,} Stable members; all joined and synced in {m['seconds']:.1f} s "
            f"({m['members'] * 2 / m['seconds']:,.0f} join+sync requests/s)",
        }
    ]


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--groups", type=int, default=10_000)
    p.add_argument("--members", type=int, default=10)
    a = p.parse_args()
    print(measure(a.groups, a.members))
