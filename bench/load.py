"""Load: 2,000 concurrent connections and a 1,000-member classic group held for minutes, with
the latency a healthy connection sees meanwhile.  See docs/reliability.md, "Load".

One broker process on 127.0.0.1.  A raw-protocol driver (asyncio, bench.loadgen.Conn) opens
``connections`` connections; ``members`` of them join one classic group through the real
protocol (JoinGroup v5, SyncGroup v3; bench.rebalance.converge) and then heartbeat every
``heartbeat_s``; the others stay open and send ApiVersions every ``idle_s``.  Meanwhile a
separate probe process (so its timings do not include this driver's event loop) sends a
Metadata request every ``probe_interval_s`` on its own connection and records each round trip.
The broker's RSS is sampled every second.

    python -m bench.load [--seconds 180] [--connections 2000] [--members 1000]

Every figure is also written to bench/results/bench.load.json (as ``python -m bench`` does for
every section).  ``python -m bench --only load`` runs it short (RALLYPOINT_LOAD_SECONDS to
change).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import resource
import socket
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rallypoint.probe import recv_exactly
from rallypoint.protocol import codec

from bench.common import ROOT, rallypoint, rss_bytes, summarize
from bench.loadgen import Conn
from bench.rebalance import SESSION_MS, converge

GROUP = "load-group"
TOPIC = "load-topic"
HEARTBEAT_V = 3
API_VERSIONS_V = 3
METADATA_V = 9
OPEN_BATCH = 100  # connections opened at once (the listen backlog is 100)
DEFAULT_SECONDS = 30.0
QUICK_SECONDS = 15.0


def _raise_fd_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            raise RuntimeError(f"need {needed} file descriptors, the hard limit is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))  # the broker inherits it


def _percentile(sorted_ms: list[float], q: float) -> float:
    if not sorted_ms:
        return float("nan")
    i = min(len(sorted_ms) - 1, max(0, round(q * (len(sorted_ms) - 1))))
    return sorted_ms[i]


# ---------------------------------------------------------------------- probe process


def probe(host: str, port: int, seconds: float, interval_s: float) -> dict[str, Any]:
    """Metadata round trips on one blocking connection for ``seconds``: latencies in ms."""
    sock = socket.create_connection((host, port), timeout=10)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    body = {"topics": [{"name": TOPIC}], "allow_auto_topic_creation": False,
            "include_cluster_authorized_operations": False, "include_topic_authorized_operations": False}  # fmt: skip
    lat: list[float] = []
    slow: list[tuple[float, float]] = []  # (seconds since the probe started, ms) of the slowest
    timeouts = 0
    corr = 0
    start = time.monotonic()
    deadline = start + seconds
    while time.monotonic() < deadline:
        corr += 1
        frame = codec.encode_request(3, METADATA_V, corr, body, "load-probe")
        t0 = time.perf_counter()
        try:
            sock.sendall(frame)
            (size,) = struct.unpack(">i", recv_exactly(sock, 4))
            got, msg = codec.decode_response_frame(3, METADATA_V, recv_exactly(sock, size))
            lat.append((time.perf_counter() - t0) * 1000)
            slow = sorted([*slow, (round(time.monotonic() - start, 2), round(lat[-1], 1))], key=lambda x: -x[1])[:10]
            if got != corr or int(msg.topics[0].error_code) != 0:
                raise RuntimeError(f"bad Metadata answer: {msg}")
        except TimeoutError:
            timeouts += 1
            sock.close()
            sock = socket.create_connection((host, port), timeout=10)
        time.sleep(interval_s)
    sock.close()
    return {"latencies_ms": lat, "timeouts": timeouts, "slowest": slow}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _run_probe(host: str, port: int, seconds: float, interval_s: float) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.load", "--probe", host, str(port), str(seconds), str(interval_s)],
        stdout=subprocess.PIPE,
        cwd=ROOT,  # `-m bench.load` finds bench/ from the working directory
    )


# ---------------------------------------------------------------------- driver


class _Counts:
    def __init__(self) -> None:
        self.heartbeats = 0
        self.heartbeat_errors: dict[int, int] = {}
        self.idle_requests = 0
        self.idle_failures = 0
        self.rss: list[int] = []


async def _open(host: str, port: int, n: int) -> list[Conn]:
    conns: list[Conn] = []
    while len(conns) < n:
        k = min(OPEN_BATCH, n - len(conns))
        conns += await asyncio.gather(*(Conn.open(host, port) for _ in range(k)))
    return conns


async def _member(c: Conn, gen: int, member_id: str, until: float, period: float, counts: _Counts) -> None:
    await asyncio.sleep(random.uniform(0, period))
    body = {"group_id": GROUP, "generation_id": gen, "member_id": member_id, "group_instance_id": None}
    while time.monotonic() < until:
        r = await asyncio.wait_for(c.call(12, HEARTBEAT_V, body), 30)
        counts.heartbeats += 1
        code = int(r.error_code)
        if code:
            counts.heartbeat_errors[code] = counts.heartbeat_errors.get(code, 0) + 1
        await asyncio.sleep(period)


async def _idle(c: Conn, until: float, period: float, counts: _Counts) -> None:
    await asyncio.sleep(random.uniform(0, period))
    body = {"client_software_name": "load", "client_software_version": "1"}
    while time.monotonic() < until:
        try:
            r = await asyncio.wait_for(c.call(18, API_VERSIONS_V, body), 30)
            counts.idle_requests += 1
            if int(r.error_code):
                counts.idle_failures += 1
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError):
            counts.idle_failures += 1
            return
        await asyncio.sleep(period)


async def _sample_rss(pid: int, until: float, counts: _Counts) -> None:
    while time.monotonic() < until:
        counts.rss.append(rss_bytes(pid))
        await asyncio.sleep(1.0)


async def _drive(
    host: str,
    port: int,
    pid: int,
    connections: int,
    members: int,
    seconds: float,
    heartbeat_s: float,
    idle_s: float,
    probe_interval_s: float,
) -> dict[str, Any]:
    counts = _Counts()
    rss_idle = rss_bytes(pid)
    admin = await Conn.open(host, port)
    topic = {"name": TOPIC, "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []}
    await admin.call(19, 7, {"topics": [topic], "timeout": 5000, "validate_only": False})
    admin.close()
    # the same probe against the idle broker first: what this machine gives without the load
    base_s = min(5.0, seconds / 4)
    baseline = json.loads((await asyncio.to_thread(_run_probe(host, port, base_s, probe_interval_s).communicate))[0])

    t0 = time.perf_counter()
    conns = await _open(host, port, connections)
    connect_s = time.perf_counter() - t0
    group = conns[:members]
    ids = [""] * members
    converge_s, gen, _leader = await converge(group, GROUP, ids, heartbeat_s=1.0)
    rss_group = rss_bytes(pid)

    # the probe runs in its own process, for the whole hold
    probe_proc = _run_probe(host, port, seconds, probe_interval_s)
    cpu0, driver0, wall0 = cpu_seconds(pid), time.process_time(), time.monotonic()
    until = time.monotonic() + seconds
    tasks = [_member(c, gen, ids[i], until, heartbeat_s, counts) for i, c in enumerate(group)]
    tasks += [_idle(c, until, idle_s, counts) for c in conns[members:]]
    tasks.append(_sample_rss(pid, until, counts))
    results = await asyncio.gather(*tasks, return_exceptions=True)
    failures = [r for r in results if isinstance(r, BaseException)]
    cpu = {
        "broker": round((cpu_seconds(pid) - cpu0) / (time.monotonic() - wall0), 3),
        "driver": round((time.process_time() - driver0) / (time.monotonic() - wall0), 3),
    }
    out, _ = await asyncio.get_running_loop().run_in_executor(None, probe_proc.communicate)
    probed = json.loads(out)
    # every connection still open and answering?
    alive = await asyncio.gather(
        *(asyncio.wait_for(c.call(18, API_VERSIONS_V, {"client_software_name": "load",
                                                        "client_software_version": "1"}), 30) for c in conns),
        return_exceptions=True,
    )  # fmt: skip
    dead = sum(1 for a in alive if isinstance(a, BaseException))
    for c in conns:
        c.close()

    lat = sorted(probed["latencies_ms"])
    base = sorted(baseline["latencies_ms"])
    return {
        "connections": connections,
        "members": members,
        "seconds": seconds,
        "connect_s": round(connect_s, 3),
        "group_first_generation_s": round(converge_s, 3),
        "generation": gen,
        "probe": {
            "requests": len(lat),
            "timeouts": probed["timeouts"],
            "p50_ms": round(_percentile(lat, 0.50), 3),
            "p99_ms": round(_percentile(lat, 0.99), 3),
            "max_ms": round(lat[-1], 3) if lat else None,
            "mean_ms": round(statistics.fmean(lat), 3) if lat else None,
            "slowest": probed["slowest"],
        },
        "probe_idle_broker": {
            "seconds": base_s,
            "p50_ms": round(_percentile(base, 0.50), 3),
            "p99_ms": round(_percentile(base, 0.99), 3),
            "max_ms": round(base[-1], 3) if base else None,
        },
        "cpu_cores_used": cpu,  # during the hold: CPU seconds per second
        "heartbeats": counts.heartbeats,
        "heartbeat_errors": counts.heartbeat_errors,
        "idle_requests": counts.idle_requests,
        "idle_failures": counts.idle_failures,
        "driver_failures": [repr(f) for f in failures[:5]],
        "connections_lost": dead,
        "rss_mib": {
            "idle": round(rss_idle / 2**20, 1),
            "group_formed": round(rss_group / 2**20, 1),
            "peak": round(max(counts.rss, default=rss_group) / 2**20, 1),
            "end": round((counts.rss[-1] if counts.rss else rss_group) / 2**20, 1),
        },
    }


def measure(
    seconds: float,
    connections: int = 2000,
    members: int = 1000,
    heartbeat_s: float = 3.0,
    idle_s: float = 10.0,
    probe_interval_s: float = 0.02,
) -> dict[str, Any]:
    if members > connections:
        raise ValueError("members are some of the connections")
    _raise_fd_limit(connections + 512)
    config = {"group.max.session.timeout.ms": str(SESSION_MS), "group.initial.rebalance.delay.ms": "0"}
    with rallypoint(config) as ep:
        assert ep.pid is not None
        time.sleep(0.5)
        return asyncio.run(
            _drive(ep.host, ep.port, ep.pid, connections, members, seconds, heartbeat_s, idle_s, probe_interval_s)
        )


def rows(m: dict[str, Any]) -> list[dict[str, Any]]:
    setup = f"{m['connections']:,} connections, {m['members']:,}-member group, {m['seconds']:.0f} s"
    p = m["probe"]
    errors = sum(m["heartbeat_errors"].values())
    return [
        {"name": f"healthy connection, Metadata p50 ({setup})", "unit": "ms", "stats": summarize([p["p50_ms"]])},
        {"name": f"healthy connection, Metadata p99 ({setup})", "unit": "ms", "stats": summarize([p["p99_ms"]])},
        {"name": f"healthy connection, Metadata max ({setup})", "unit": "ms", "stats": summarize([p["max_ms"]])},
        {"name": f"broker RSS, peak ({setup})", "unit": "MiB", "stats": summarize([m["rss_mib"]["peak"]])},
        {
            "name": f"{m['members']:,}-member group, first generation",
            "unit": "s",
            "stats": summarize([m["group_first_generation_s"]]),
            "note": f"{setup}: {p['requests']:,} probe round trips ({p['timeouts']} timed out), "
            f"{m['heartbeats']:,} heartbeats ({errors} errors), {m['idle_requests']:,} requests on idle "
            f"connections ({m['idle_failures']} failed), {m['connections_lost']} connections lost; "
            f"RSS {m['rss_mib']['idle']} MiB idle → {m['rss_mib']['group_formed']} MiB with the group → "
            f"{m['rss_mib']['end']} MiB at the end; the same probe against the idle broker just before: "
            f"p50 {m['probe_idle_broker']['p50_ms']} ms, p99 {m['probe_idle_broker']['p99_ms']} ms",
        },
    ]


def run(quick: bool = False) -> list[dict[str, Any]]:
    default = QUICK_SECONDS if quick else DEFAULT_SECONDS
    seconds = float(os.environ.get("RALLYPOINT_LOAD_SECONDS", default))
    m = measure(seconds)
    print(json.dumps(m, indent=1), flush=True)
    return rows(m)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--probe":
        host, port, seconds, interval = sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
        print(json.dumps(probe(host, port, seconds, interval)))
        return 0
    ap = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=float(os.environ.get("RALLYPOINT_LOAD_SECONDS", DEFAULT_SECONDS)))
    ap.add_argument("--connections", type=int, default=2000)
    ap.add_argument("--members", type=int, default=1000)
    ap.add_argument("--heartbeat-s", type=float, default=3.0)
    ap.add_argument("--idle-s", type=float, default=10.0, help="each idle connection sends ApiVersions this often")
    ap.add_argument("--json", help="also write the measurement here")
    ap.add_argument("--no-results", action="store_true", help="do not write bench/results/bench.load.json")
    a = ap.parse_args()
    m = measure(a.seconds, a.connections, a.members, a.heartbeat_s, a.idle_s)
    print(json.dumps(m, indent=1))
    if not a.no_results:
        results = ROOT / "bench" / "results"
        results.mkdir(parents=True, exist_ok=True)
        (results / "bench.load.json").write_text(json.dumps(rows(m), indent=1, default=str))
    if a.json:
        Path(a.json).write_text(json.dumps(m, indent=1) + "\n")
    return 0 if healthy(m) else 1


def healthy(m: dict[str, Any]) -> bool:
    """Nothing disturbed: no heartbeat error, no lost connection, every request answered."""
    return (
        not (m["heartbeat_errors"] or m["connections_lost"] or m["idle_failures"] or m["probe"]["timeouts"])
        and not m["driver_failures"]
    )


if __name__ == "__main__":
    raise SystemExit(main())
