"""Benchmarks must keep running: each bench script once, with the smallest workload."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.support import ROOT


def test_startup_bench_runs() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "startup.py"), "--runs", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    figures = json.loads(proc.stdout)
    assert figures["runs"] == 2
    first, listening = figures["first_answer_ms"], figures["listening_line_ms"]
    assert 0 < listening["min"] <= first["min"] <= first["median"] <= first["p90"] <= first["max"]
    assert figures["sigterm_to_exit_ms"]["max"] > 0
