"""bench/rebalance.py keeps running (smallest workload: one group of 10 members, one run)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.wire


def test_rebalance_bench_runs() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.rebalance", "--sizes", "10", "--runs", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = re.search(r"10 members: first generation\s+([\d.]+) ms .* Stable group\s+([\d.]+) ms", proc.stdout)
    assert m, proc.stdout
    assert 0 < float(m.group(1)) < 10_000 and 0 < float(m.group(2)) < 10_000
