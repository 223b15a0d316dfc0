"""What the control plane costs: heartbeat round trips/s with it off and on (no fault rules, the
request log recording every request), measured as alternating interleaved rounds in one run.

    python -m bench.control_plane [--quick] [--pairs N] [--seconds S]

Two brokers run side by side, one with ``rallypoint.control.port=-1`` (off), one with the control
plane on.  Each pair measures both with the same heartbeat load (32 pipelined connections), the
order alternating from pair to pair so that drift on a shared machine hits both alike; the cost
is the median over pairs of ``1 - on / off``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path
from typing import Any

from bench.common import Endpoint, rallypoint, summarize
from bench.compare import group_round_trips

LIMIT = 0.05  # the control plane may cost at most this share of heartbeat round trips/s


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(pairs: int, seconds: float) -> dict[str, Any]:
    """Interleaved rounds: round trips/s of each broker, and its CPU time per round trip."""
    off_rates: list[float] = []
    on_rates: list[float] = []
    costs: list[float] = []
    cpu_costs: list[float] = []
    cpu_us: dict[str, list[float]] = {"off": [], "on": []}
    with (
        rallypoint({"rallypoint.control.port": "-1"}) as off,
        rallypoint({"rallypoint.control.port": "0"}) as on,
    ):
        for ep in (off, on):  # warm-up: imports, first joins, the interpreter's caches
            group_round_trips(ep, "heartbeat", min(1.0, seconds))
        for i in range(pairs):
            order: tuple[Endpoint, Endpoint] = (off, on) if i % 2 == 0 else (on, off)
            rates: dict[int, float] = {}
            per_rt: dict[int, float] = {}
            for ep in order:
                assert ep.pid is not None
                cpu0 = cpu_seconds(ep.pid)
                rate = group_round_trips(ep, "heartbeat", seconds)
                rates[ep.port] = rate
                per_rt[ep.port] = (cpu_seconds(ep.pid) - cpu0) / (rate * seconds) * 1e6
            off_rates.append(rates[off.port])
            on_rates.append(rates[on.port])
            costs.append(1.0 - rates[on.port] / rates[off.port])
            cpu_us["off"].append(per_rt[off.port])
            cpu_us["on"].append(per_rt[on.port])
            cpu_costs.append(per_rt[on.port] / per_rt[off.port] - 1.0)
    return {
        "off": off_rates,
        "on": on_rates,
        "costs": costs,
        "cost_median": statistics.median(costs),
        "cpu_us_off": cpu_us["off"],
        "cpu_us_on": cpu_us["on"],
        "cpu_costs": cpu_costs,
        "cpu_cost_median": statistics.median(cpu_costs),
    }


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Entry point for ``python -m bench``."""
    pairs, seconds = (5, 1.5) if quick else (9, 3.0)
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
                f"per pair: {', '.join(f'{c:.1f}%' for c in cost_pct)}. Broker CPU per round trip (less "
                f"sensitive to other load on the machine): median {m['cpu_cost_median'] * 100:.1f}% more"
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
        m = measure(a.pairs or 5, a.seconds or 3.0)
        print(json.dumps({k: v for k, v in m.items()}, indent=1))
    else:
        print(json.dumps(run(a.quick), indent=1))


if __name__ == "__main__":
    main()
