"""bench/load.py keeps running: a small load (60 connections, a 20-member group, 3 s)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.load import healthy, rows
from tests.support import ROOT

pytestmark = [pytest.mark.wire, pytest.mark.slow]


def test_load_bench_runs(tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    cmd = [sys.executable, "-m", "bench.load", "--seconds", "3", "--connections", "60", "--members", "20"]
    cmd += ["--heartbeat-s", "0.5", "--idle-s", "0.5", "--json", str(out), "--no-results"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    m = json.loads(out.read_text())
    assert healthy(m), m
    assert (m["connections"], m["members"], m["generation"]) == (60, 20, m["generation"])
    assert m["heartbeats"] >= 20 and m["idle_requests"] >= 40  # 40 idle connections, each at least once
    assert m["probe"]["requests"] > 10
    assert 0 < m["probe"]["p50_ms"] <= m["probe"]["p99_ms"] <= m["probe"]["max_ms"]
    assert m["rss_mib"]["peak"] > 0
    assert [r["unit"] for r in rows(m)] == ["ms", "ms", "ms", "MiB", "s"]
