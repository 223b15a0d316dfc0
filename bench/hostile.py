"""Hostile crowds against one broker: RSS stays bounded, healthy clients keep their latency.

The issue's last two probes at full size (tests/test_limits_connections.py runs them at a
quarter of it):

* 200 connections announce 100 MB request frames, send a few bytes and stall;
* 200 connections pipeline 500 Metadata requests each and never read an answer.

Meanwhile a keeper process pings ApiVersions on its own connection (latency p50/p99/max) and a
confluent-kafka producer sends small messages (throughput); both are also measured before the
crowd arrives, and after ``connections.max.idle.ms`` has dropped it.  The broker's peak RSS is
``VmHWM`` from /proc.

    python -m bench.hostile [--crowd 200] [--seconds 5] [--idle-ms 3000]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import rallypoint

KEEPER = r"""
import socket, struct, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
frame = bytes.fromhex(sys.argv[3])
def recv(n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise SystemExit(0)
        buf += chunk
    return buf
while True:
    t0 = time.monotonic()
    s.sendall(frame)
    recv(struct.unpack(">i", recv(4))[0])
    print(f"{t0:.6f} {time.monotonic() - t0:.6f}", flush=True)
    time.sleep(0.01)
"""


def _status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(key)


def _request(api_key: int, version: int, body: dict[str, Any]) -> bytes:
    from rallypoint.protocol import codec

    return codec.encode_request(api_key, version, 1, body, "hostile")


class Producer:
    """A confluent-kafka producer sending 100-byte messages as fast as acks=1 allows."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        from confluent_kafka import Producer as CKProducer

        self.topic = topic
        self.producer = CKProducer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 5})
        self.acked: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        def delivered(err: Any, _msg: Any) -> None:
            if err is None:
                self.acked.append(time.monotonic())

        while not self._stop.is_set():
            try:
                self.producer.produce(self.topic, b"x" * 100, callback=delivered)
            except BufferError:
                pass
            self.producer.poll(0.001)
        self.producer.flush(10)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def rate(self, start: float, end: float) -> float:
        return sum(1 for t in self.acked if start <= t < end) / (end - start)


def _latencies(pings: list[tuple[float, float]], start: float, end: float) -> dict[str, float]:
    lat = sorted(latency for t0, latency in pings if start <= t0 < end)
    if not lat:
        return {"n": 0}
    return {
        "n": len(lat),
        "p50_ms": statistics.median(lat) * 1000,
        "p99_ms": lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1000,
        "max_ms": lat[-1] * 1000,
    }


def measure(crowd: int, seconds: float, idle_ms: int) -> dict[str, Any]:
    cfg = {"connections.max.idle.ms": str(idle_ms)}
    with rallypoint(cfg) as ep:
        assert ep.pid is not None
        admin = socket.create_connection((ep.host, ep.port))
        create = _request(
            19,
            7,
            {
                "topics": [
                    {"name": n, "num_partitions": p, "replication_factor": 1, "assignments": [], "configs": []}
                    for n, p in (("healthy", 1), ("ten", 10))
                ],
                "timeout": 5000,
            },
        )
        admin.sendall(create)
        admin.recv(1 << 16)
        admin.close()
        keeper = subprocess.Popen(
            [sys.executable, "-c", KEEPER, ep.host, str(ep.port), _request(18, 0, {}).hex()],
            stdout=subprocess.PIPE,
            text=True,
        )
        pings: list[tuple[float, float]] = []

        def pump() -> None:
            assert keeper.stdout is not None
            for line in keeper.stdout:
                t0, lat = line.split()
                pings.append((float(t0), float(lat)))

        threading.Thread(target=pump, daemon=True).start()
        producer = Producer(ep.bootstrap, "healthy")
        producer.start()
        try:
            time.sleep(1.0)  # warm up
            base_start = time.monotonic()
            time.sleep(seconds)
            base_end = time.monotonic()
            rss_before = _status_kb(ep.pid, "VmRSS")

            crowd_start = time.monotonic()
            stalled = []
            for _ in range(crowd):
                s = socket.create_connection((ep.host, ep.port))
                s.sendall(struct.pack(">i", 100 * 2**20) + b"\x00\x03\x00\x0c")
                stalled.append(s)
            metadata = _request(3, 12, {"topics": [{"name": "ten"}], "allow_auto_topic_creation": False})
            pipeliners = []
            for _ in range(crowd):
                s = socket.create_connection((ep.host, ep.port))
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                s.setblocking(False)
                try:
                    s.send(metadata * 500)
                except BlockingIOError:
                    pass
                pipeliners.append(s)
            opened = time.monotonic()
            time.sleep(seconds)
            crowd_end = time.monotonic()
            rss_during = _status_kb(ep.pid, "VmRSS")

            time.sleep(idle_ms / 1000 + 1.0)  # connections.max.idle.ms drops the crowd
            after_start = time.monotonic()
            time.sleep(seconds)
            after_end = time.monotonic()
            for s in stalled + pipeliners:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.close()
            return {
                "crowd": {"stalled_100mb_frames": crowd, "pipeliners_not_reading": crowd},
                "open_crowd_s": round(opened - crowd_start, 3),
                "rss_mb": {
                    "before": round(rss_before / 1024, 1),
                    "during": round(rss_during / 1024, 1),
                    "peak": round(_status_kb(ep.pid, "VmHWM") / 1024, 1),
                    "after_idle_drop": round(_status_kb(ep.pid, "VmRSS") / 1024, 1),
                },
                "keeper_latency": {
                    "before": _latencies(pings, base_start, base_end),
                    "during": _latencies(pings, crowd_start, crowd_end),
                    "after": _latencies(pings, after_start, after_end),
                },
                "producer_msgs_per_s": {
                    "before": round(producer.rate(base_start, base_end)),
                    "during": round(producer.rate(crowd_start, crowd_end)),
                    "after": round(producer.rate(after_start, after_end)),
                },
            }
        finally:
            producer.stop()
            keeper.kill()
            keeper.wait(5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--crowd", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--idle-ms", type=int, default=3000)
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.crowd, args.seconds, args.idle_ms), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
