"""bench/cluster.py keeps running (smallest workload: 10 groups, two moves)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.wire


def test_cluster_bench_runs() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.cluster", "--groups", "10", "--moves", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    [row] = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert row["groups"] == 10 and row["load_ms"]["n"] == 2
    assert 0 < row["load_ms"]["median"] <= row["answered_ms"]["max"] < 60_000
