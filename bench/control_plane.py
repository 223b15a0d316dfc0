"""What the control plane costs: heartbeat round trips/s with it off and on (no fault rules, the
request log recording every request), measured as alternating interleaved rounds in one run.

    python -m bench.control_plane [--quick] [--pairs N] [--seconds S]

Two brokers run side by side, one with ``rallypoint.control.port=-1`` (off), one with the control
plane on.  Each has 32 connections, each a one-member group joined once at the start; a round
sends pipelined Heartbeats (8 in flight per connection) to one broker for S seconds.  Each pair
measures both, the order alternating from pair to pair so that drift on a shared machine hits
both alike; the cost is the median over pairs of ``1 - on / off``.  Beside round trips/s, the
broker's own CPU time per round trip is measured (from /proc): it is less sensitive to other
load on the machine than a rate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

from rallypoint.protocol import codec

from bench.common import Endpoint, rallypoint, summarize
from bench.loadgen import HB_V, Conn, join_single_member_group

LIMIT = 0.05  # the control plane may cost at most this share of heartbeat round trips/s
CONNECTIONS, DEPTH = 32, 8


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class HeartbeatLoad:
    """Connections to one broker, each a one-member group, with its Heartbeat frame ready."""

    def __init__(self, ep: Endpoint) -> None:
        self.ep = ep
        self.conns: list[Conn] = []
        self.frames: list[bytes] = []

    async def open(self) -> None:
        run = uuid.uuid4().hex[:8]
        self.conns = [await Conn.open(self.ep.host, self.ep.port) for _ in range(CONNECTIONS)]
        for i, c in enumerate(self.conns):
            group = f"bench-control-{run}-{i}"
            gen, member = await join_single_member_group(c, group, session_ms=300000)
            body = {"group_id": group, "generation_id": gen, "member_id": member}
            resp = await c.call(12, HB_V, body)
            if int(resp.error_code) != 0:
                raise RuntimeError(f"heartbeat answered error {int(resp.error_code)} before the load started")
            self.frames.append(codec.encode_request(12, HB_V, 1, body, "loadgen") * DEPTH)

    async def round(self, seconds: float) -> tuple[float, float]:
        """(round trips/s, broker CPU µs per round trip) over ``seconds``."""
        assert self.ep.pid is not None
        count = [0]
        deadline = time.perf_counter() + seconds

        async def hammer(c: Conn, burst: bytes) -> None:
            while time.perf_counter() < deadline:
                c.writer.write(burst)
                for _ in range(DEPTH):
                    await c.read_frame()
                count[0] += DEPTH

        cpu0 = cpu_seconds(self.ep.pid)
        start = time.perf_counter()
        await asyncio.gather(*(hammer(c, f) for c, f in zip(self.conns, self.frames, strict=True)))
        elapsed = time.perf_counter() - start
        cpu = cpu_seconds(self.ep.pid) - cpu0
        return count[0] / elapsed, cpu / count[0] * 1e6

    def close(self) -> None:
        for c in self.conns:
            c.close()


async def _measure(off: Endpoint, on: Endpoint, pairs: int, seconds: float) -> dict[str, Any]:
    loads = {"off": HeartbeatLoad(off), "on": HeartbeatLoad(on)}
    rates: dict[str, list[float]] = {"off": [], "on": []}
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    try:
        for load in loads.values():
            await load.open()
            await load.round(min(1.0, seconds))  # warm-up
        for i in range(pairs):
            for name in ("off", "on") if i % 2 == 0 else ("on", "off"):
                rate, per_rt = await loads[name].round(seconds)
                rates[name].append(rate)
                cpu[name].append(per_rt)
    finally:
        for load in loads.values():
            load.close()
    costs = [1.0 - on_r / off_r for off_r, on_r in zip(rates["off"], rates["on"], strict=True)]
    cpu_costs = [on_c / off_c - 1.0 for off_c, on_c in zip(cpu["off"], cpu["on"], strict=True)]
    return {
        "off": rates["off"],
        "on": rates["on"],
        "costs": costs,
        "cost_median": statistics.median(costs),
        "cpu_us_off": cpu["off"],
        "cpu_us_on": cpu["on"],
        "cpu_costs": cpu_costs,
        "cpu_cost_median": statistics.median(cpu_costs),
    }


def measure(pairs: int, seconds: float) -> dict[str, Any]:
    with (
        rallypoint({"rallypoint.control.port": "-1"}) as off,
        rallypoint({"rallypoint.control.port": "0"}) as on,
    ):
        return asyncio.run(_measure(off, on, pairs, seconds))


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Entry point for ``python -m bench``."""
    pairs, seconds = (5, 1.0) if quick else (15, 2.0)
    m = measure(pairs, seconds)
    cost_pct = [c * 100 for c in m["costs"]]
    cpu_pct = [c * 100 for c in m["cpu_costs"]]
    verdict = "within" if m["cost_median"] < LIMIT else "OVER"
    return [
        {"name": "heartbeat round trips/s, control plane off", "unit": "rt/s", "stats": summarize(m["off"])},
        {
            "name": "heartbeat round trips/s, control plane on (no rules, request log on)",
            "unit": "rt/s",
            "stats": summarize(m["on"]),
        },
        {"name": "cost: 1 − on/off round trips/s, per pair", "unit": "%", "stats": summarize(cost_pct)},
        {"name": "broker CPU per heartbeat, control plane off", "unit": "µs", "stats": summarize(m["cpu_us_off"])},
        {"name": "broker CPU per heartbeat, control plane on", "unit": "µs", "stats": summarize(m["cpu_us_on"])},
        {
            "name": "cost: on/off − 1 broker CPU per heartbeat, per pair",
            "unit": "%",
            "stats": summarize(cpu_pct),
            "note": (
                f"control plane cost: median {m['cost_median'] * 100:.1f}% of heartbeat round trips/s over "
                f"{pairs} interleaved pairs of {seconds:g} s rounds ({verdict} the {LIMIT * 100:.0f}% budget); "
                f"broker CPU per heartbeat: median {m['cpu_cost_median'] * 100:+.1f}%"
            ),
        },
    ]


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.control_plane")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--pairs", type=int)
    p.add_argument("--seconds", type=float)
    a = p.parse_args()
    if a.pairs or a.seconds:
        print(json.dumps(measure(a.pairs or 5, a.seconds or 2.0), indent=1))
    else:
        print(json.dumps(run(a.quick), indent=1))


if __name__ == "__main__":
    main()
