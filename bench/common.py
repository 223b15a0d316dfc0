"""Shared benchmark plumbing: start brokers (rallypoint or the librdkafka mock peer),
repeat measurements, summarise them.

Benchmarks import the repository's test support (``tests.support``: broker launcher, wire
client, topic helpers, bounded waits) and nothing else from tests/.  Run them from the
repository root (``python -m bench``, ``make bench``), where ``tests`` and ``bench`` import.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support import ROOT, BrokerProcess


@dataclass
class Endpoint:
    name: str
    host: str
    port: int
    pid: int | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"


@contextmanager
def rallypoint(config: dict[str, str] | None = None, data_dir: str | None = None) -> Iterator[Endpoint]:
    """A rallypoint broker process on 127.0.0.1 and a free port (tests.support.BrokerProcess),
    stopped on exit; its data directory is a fresh temporary one unless ``data_dir`` is given."""
    with tempfile.TemporaryDirectory(prefix="rp-bench-") as tmp:
        cfg = {"group.initial.rebalance.delay.ms": "0", **(config or {})}
        with BrokerProcess(data_dir=Path(data_dir or tmp), config=cfg).start() as broker:
            yield Endpoint("rallypoint", broker.host, broker.port, broker.pid)


@contextmanager
def mock_peer() -> Iterator[Endpoint]:
    """librdkafka's mock cluster (one broker) in its own process."""
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "peer.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if not line.startswith("BOOTSTRAP "):
            raise RuntimeError(f"mock peer did not start: {line!r}")
        host, port = line.split()[1].rsplit(":", 1)
        yield Endpoint("librdkafka-mock", host, int(port), proc.pid)
    finally:
        if proc.stdin:
            proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def summarize(samples: list[float]) -> dict[str, float]:
    s = sorted(samples)
    return {
        "median": statistics.median(s),
        "min": s[0],
        "max": s[-1],
        "n": len(s),
        "stdev": statistics.stdev(s) if len(s) > 1 else 0.0,
    }


def repeat(fn: Callable[[], float], runs: int) -> dict[str, float]:
    return summarize([fn() for _ in range(runs)])


def fmt(x: float, unit: str = "") -> str:
    if abs(x) >= 100:
        v = f"{x:,.0f}"
    elif abs(x) >= 10:
        v = f"{x:.1f}"
    else:
        v = f"{x:.3g}"
    return f"{v} {unit}".strip()


def now() -> float:
    return time.perf_counter()


def describe(stats: dict[str, Any], unit: str) -> str:
    return f"{fmt(stats['median'], unit)} (min {fmt(stats['min'])}, max {fmt(stats['max'])}, n={int(stats['n'])})"


MOCK = "librdkafka-mock"


def side_by_side(
    name: str,
    unit: str,
    measure: Callable[[Endpoint], float],
    runs: int,
    *,
    rallypoint_config: dict[str, str] | None = None,
    higher_is_better: bool = True,
    warmup: int = 0,
) -> dict[str, Any]:
    """One side-by-side row: ``measure`` ``runs`` times against a fresh rallypoint (with
    ``rallypoint_config``) and a fresh librdkafka mock, after ``warmup`` runs whose figures are
    discarded (each broker alike); the ratio is how many times better rallypoint did (nan, and
    the failures in ``note``, when either broker failed)."""
    per_broker: dict[str, dict[str, float]] = {}
    failures: list[str] = []
    for starter in (lambda: rallypoint(rallypoint_config), mock_peer):
        try:
            with starter() as ep:
                for _ in range(warmup):
                    measure(ep)
                per_broker[ep.name] = repeat(lambda: measure(ep), runs)
        except Exception as e:  # one broker failing a measurement must not hide the other
            failures.append(f"{name}: {type(e).__name__}: {e}")
            print(f"{name}: FAILED: {e}", flush=True)
    row: dict[str, Any] = {"name": name, "unit": unit, "brokers": per_broker, "higher_is_better": higher_is_better}
    if "rallypoint" not in per_broker or MOCK not in per_broker:
        return {**row, "ratio": float("nan"), "note": "; ".join(failures)}
    rp, peer = per_broker["rallypoint"]["median"], per_broker[MOCK]["median"]
    row["ratio"] = (rp / peer) if higher_is_better else (peer / rp)
    print(
        f"{name}: rallypoint {describe(per_broker['rallypoint'], unit)} | "
        f"{MOCK} {describe(per_broker[MOCK], unit)} | "
        f"rallypoint is {row['ratio']:.2f}x {'as fast' if higher_is_better else 'as quick'}",
        flush=True,
    )
    return row


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")
