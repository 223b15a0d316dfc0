"""Start-up time: process start → first ApiVersions answer, over N fresh broker processes.

    python -m bench.startup [--runs 15] [--json]

The broker's modules are byte-compiled first, as an install leaves them (:func:`compile_package`).
Each run starts ``python -m rallypoint --port 0`` on a fresh data directory (the test support's
BrokerProcess), reads the port from its JSON ``listening`` log line, then connects and sends
ApiVersions until one is answered.  It also times SIGTERM → exit.  Prints median, min, p90 and
max in milliseconds.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tests.support import ROOT, BrokerProcess, WireClient, wait_until

DEADLINE_S = 30.0


def _api_versions_answered(port: int) -> bool:
    try:
        with WireClient("127.0.0.1", port, timeout=1.0, client_id=None) as c:
            resp = c.call(18, 3, {"client_software_name": "bench", "client_software_version": "1"})
        return int(resp.error_code) == 0
    except (OSError, ValueError):
        return False


def one_run(data_dir: str) -> dict[str, float]:
    broker = BrokerProcess(data_dir=Path(data_dir), config={}, start_timeout_s=DEADLINE_S)
    t0 = time.perf_counter()
    try:
        broker.start()  # returns when the broker's `listening` line is read
        t_listening = time.perf_counter()
        wait_until(lambda: _api_versions_answered(broker.port), DEADLINE_S, "an ApiVersions answer", step=0.001)
        t_answer = time.perf_counter()
        rc = broker.stop(signal.SIGTERM, timeout=DEADLINE_S)
        t_exit = time.perf_counter()
    finally:
        broker.kill()
    if rc != 0:
        raise RuntimeError(f"exit code {rc} after SIGTERM")
    return {
        "first_answer_ms": (t_answer - t0) * 1000,
        "listening_line_ms": (t_listening - t0) * 1000,
        "sigterm_to_exit_ms": (t_exit - t_answer) * 1000,
    }


def summarise(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, max(0, round(0.9 * len(ordered) + 0.5) - 1))]
    return {
        "median": statistics.median(ordered),
        "min": ordered[0],
        "p90": p90,
        "max": ordered[-1],
        "stdev": statistics.stdev(ordered) if len(ordered) > 1 else 0.0,
    }


def compile_package() -> None:
    """Byte-compile the broker's code first, as an install does (pip writes ``.pyc`` files for
    the packages it installs, the image's wheels included).  Without this a checkout run with
    ``PYTHONDONTWRITEBYTECODE=1`` (as CI machines often are) compiles every module at every
    start, which is not what a user's start-up costs."""
    for folder in ("coordinator", "protocol"):
        compileall.compile_dir(str(ROOT / folder), quiet=1)


def measure(runs: int) -> dict[str, dict[str, float]]:
    """Figures (ms) over ``runs`` fresh broker processes (the code byte-compiled first)."""
    compile_package()
    samples = []
    with tempfile.TemporaryDirectory(prefix="rallypoint-bench-") as tmp:
        for i in range(runs):
            samples.append(one_run(str(Path(tmp) / f"run{i}")))
    return {name: summarise([r[name] for r in samples]) for name in samples[0]}


_LABELS = {
    "first_answer_ms": "process start → first ApiVersions answer",
    "listening_line_ms": "process start → `listening` log line",
    "sigterm_to_exit_ms": "SIGTERM → process exit",
}


def run(quick: bool = False) -> list[dict[str, object]]:
    """Rows for ``python -m bench`` (docs/BENCHMARKS.md)."""
    runs = 5 if quick else 15
    figures = measure(runs)
    rows: list[dict[str, object]] = []
    for name, f in figures.items():
        print(f"{_LABELS[name]}: median {f['median']:.1f} ms (p90 {f['p90']:.1f})", flush=True)
        stats = {**f, "n": runs}
        note = f"{_LABELS[name]}: p90 {f['p90']:.1f} ms"
        rows.append({"name": _LABELS[name], "unit": "ms", "stats": stats, "note": note})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", "-n", type=int, default=15, help="broker processes to start (default 15)")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be at least 1")
    figures = measure(args.runs)
    if args.json:
        print(json.dumps({"runs": args.runs, **figures}))
        return 0
    print(f"rallypoint start-up, {args.runs} runs, Python {sys.version.split()[0]} ({os.cpu_count()} CPUs)")
    print(f"{'ms':24s} {'median':>8s} {'min':>8s} {'p90':>8s} {'max':>8s}")
    for name, f in figures.items():
        print(f"{name:24s} {f['median']:8.1f} {f['min']:8.1f} {f['p90']:8.1f} {f['max']:8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
