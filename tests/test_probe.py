"""``rallypoint probe``, the image's HEALTHCHECK: exit 0 for a broker that answers ApiVersions,
1 for anything else, and fast -- a health check must not hang on a stuck port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from tests.support import ROOT, BrokerProcess, free_port

pytestmark = pytest.mark.wire

# Interpreter start and imports included; the probe's own budget is --timeout.
FAST_S = 3.0


def run_probe(port: int, timeout: float = 1.0) -> tuple[int, str, float]:
    env = dict(os.environ)
    t0 = time.monotonic()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "rallypoint",
            "probe",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--timeout",
            str(timeout),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
        cwd=ROOT,
    )
    return r.returncode, r.stdout + r.stderr, time.monotonic() - t0


def test_healthy_broker_exits_0_fast(broker: BrokerProcess) -> None:
    rc, out, took = run_probe(broker.port)
    assert rc == 0, out
    assert out.startswith("healthy:"), out
    assert took < FAST_S, took


def test_nothing_listening_exits_1_fast() -> None:
    rc, out, took = run_probe(free_port())
    assert rc == 1, out
    assert out.startswith("unhealthy:"), out
    assert took < FAST_S, took


StartServer = Callable[[Callable[[socket.socket], None]], int]


@pytest.fixture
def fake_server() -> Iterator[StartServer]:
    """A TCP server on 127.0.0.1 whose connections get ``behave(conn)``; returns its port."""
    servers: list[socket.socket] = []
    stop = threading.Event()

    def start(behave: Callable[[socket.socket], None]) -> int:
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        srv.settimeout(0.2)
        servers.append(srv)

        def loop() -> None:
            while not stop.is_set():
                try:
                    conn, _ = srv.accept()
                except TimeoutError:
                    continue
                except OSError:
                    return
                with conn:
                    behave(conn)

        threading.Thread(target=loop, daemon=True).start()
        return int(srv.getsockname()[1])

    yield start
    stop.set()
    for s in servers:
        s.close()


def test_port_that_accepts_but_never_answers_exits_1_within_timeout(fake_server: StartServer) -> None:
    port = fake_server(lambda conn: stop_wait(conn, 5.0))
    rc, out, took = run_probe(port, timeout=1.0)
    assert rc == 1, out
    assert "timed out" in out, out
    assert took < FAST_S, took


def test_port_that_closes_at_once_exits_1(fake_server: StartServer) -> None:
    port = fake_server(lambda conn: None)
    rc, out, took = run_probe(port)
    assert rc == 1, out
    assert took < FAST_S, took


def test_port_that_answers_garbage_exits_1(fake_server: StartServer) -> None:
    def garbage(conn: socket.socket) -> None:
        conn.recv(4096)
        conn.sendall(b"\x00\x00\x00\x08HTTP/1.1")

    port = fake_server(garbage)
    rc, out, took = run_probe(port)
    assert rc == 1, out
    assert took < FAST_S, took


def stop_wait(conn: socket.socket, seconds: float) -> None:
    """Read what comes, answer nothing, for ``seconds``."""
    conn.settimeout(seconds)
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline and conn.recv(4096):
            pass
    except OSError:
        pass
