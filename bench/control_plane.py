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
import statistics
from typing import Any

from bench.common import Endpoint, rallypoint, summarize
from bench.compare import group_round_trips

LIMIT = 0.05  # the control plane may cost at most this share of heartbeat round trips/s


def measure(pairs: int, seconds: float) -> dict[str, Any]:
    off_rates: list[float] = []
    on_rates: list[float] = []
    costs: list[float] = []
    with (
        rallypoint({"rallypoint.control.port": "-1"}) as off,
        rallypoint({"rallypoint.control.port": "0"}) as on,
    ):
        for ep in (off, on):  # warm-up: imports, first joins, the JIT-less interpreter's caches
            group_round_trips(ep, "heartbeat", min(1.0, seconds))
        for i in range(pairs):
            order: tuple[Endpoint, Endpoint] = (off, on) if i % 2 == 0 else (on, off)
            rates = {ep.port: group_round_trips(ep, "heartbeat", seconds) for ep in order}
            off_rates.append(rates[off.port])
            on_rates.append(rates[on.port])
            costs.append(1.0 - rates[on.port] / rates[off.port])
    return {"off": off_rates, "on": on_rates, "costs": costs, "cost_median": statistics.median(costs)}


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Entry point for ``python -m bench``."""
    pairs, seconds = (5, 1.5) if quick else (7, 3.0)
    m = measure(pairs, seconds)
    cost_pct = [c * 100 for c in m["costs"]]
    verdict = "within" if m["cost_median"] < LIMIT else "OVER"
    return [
        {"name": "heartbeat round trips/s, control plane off", "unit": "rt/s", "stats": summarize(m["off"])},
        {
            "name": "heartbeat round trips/s, control plane on (request log on)",
            "unit": "rt/s",
            "stats": summarize(m["on"]),
        },
        {
            "name": "cost of the control plane (1 − on/off, per pair)",
            "unit": "%",
            "stats": summarize(cost_pct),
            "note": (
                f"control plane cost: median {m['cost_median'] * 100:.1f}% of heartbeat round trips/s over "
                f"{pairs} interleaved pairs of {seconds:g} s rounds ({verdict} the {LIMIT * 100:.0f}% budget); "
                f"per pair: {', '.join(f'{c:.1f}%' for c in cost_pct)}"
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
