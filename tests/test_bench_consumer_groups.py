"""bench/consumer_groups.py keeps running (smallest workload: 10 members, one run)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.support import ROOT

pytestmark = [pytest.mark.wire, pytest.mark.slow]


def test_consumer_groups_bench_runs() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.consumer_groups", "--sizes", "10", "--runs", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = re.search(r"10 consumer-protocol members: Stable after\s+([\d.]+) ms", proc.stdout)
    assert m, proc.stdout
    assert 0 < float(m.group(1)) < 30_000
    assert re.search(r"uniform assignor, 1000 members x 1000 partitions:\s+[\d.]+ ms", proc.stdout)
