"""Shared benchmark plumbing: start brokers (rallypoint or the librdkafka mock peer),
repeat measurements, summarise them."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Endpoint:
    name: str
    host: str
    port: int
    pid: int | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


@contextmanager
def rallypoint(config: dict[str, str] | None = None, data_dir: str | None = None) -> Iterator[Endpoint]:
    """A rallypoint broker process on 127.0.0.1 and a free port (killed on exit)."""
    tmp = tempfile.TemporaryDirectory(prefix="rp-bench-") if data_dir is None else None
    ddir = data_dir or (tmp.name if tmp else "")
    cfg = {"group.initial.rebalance.delay.ms": "0", **(config or {})}
    cmd = [sys.executable, "-m", "rallypoint", "--port", "0", "--data-dir", ddir, "--log-format", "json"]
    for k, v in cfg.items():
        cmd += ["--config", f"{k}={v}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=_env(), cwd=ROOT)
    port: list[int] = []
    ready = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            if not ready.is_set():
                try:
                    ev = json.loads(raw)
                except ValueError:
                    continue
                if ev.get("event") == "listening":
                    port.append(int(ev["port"]))
                    ready.set()

    threading.Thread(target=pump, daemon=True).start()
    try:
        if not ready.wait(30):
            raise RuntimeError("rallypoint did not start")
        yield Endpoint("rallypoint", "127.0.0.1", port[0], proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if tmp is not None:
            tmp.cleanup()


@contextmanager
def mock_peer() -> Iterator[Endpoint]:
    """librdkafka's mock cluster (one broker) in its own process."""
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "peer.py")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env=_env(),
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


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")
