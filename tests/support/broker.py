"""The broker launcher: a real rallypoint process per :class:`BrokerProcess`.

Every broker started here runs as its own process (``python -m rallypoint``, the installed
package) on 127.0.0.1 with a port the OS picks (``--port 0``; the port is read from its JSON
``listening`` log line).  Tests get them from the ``broker`` / ``broker_factory`` fixtures
(tests/conftest.py), which kill them at the end of the test; benchmarks use them as context
managers.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .paths import ROOT

START_TIMEOUT_S = 20.0


@dataclass
class BrokerProcess:
    data_dir: Path
    config: dict[str, str]
    env: dict[str, str] = field(default_factory=dict)
    extra_args: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    host: str = "127.0.0.1"
    port: int = 0
    requested_port: int = 0
    start_timeout_s: float = START_TIMEOUT_S
    log_lines: list[str] = field(default_factory=list)
    _reader: threading.Thread | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def listener_port(self, name: str) -> int:
        """The bound port of listener ``name`` (from the ``listening`` line's ``listeners``)."""
        for ev in self.events("listening"):
            for url in ev.get("listeners", []):
                lname, _, rest = url.partition("://")
                if lname == name:
                    return int(rest.rpartition(":")[2])
        raise KeyError(f"no listener {name} in the listening line")

    def node_ports(self) -> dict[int, int]:
        """Each node's port, several brokers in one process (docs/cluster.md): the ``listening``
        line lists every node's listeners in node order; a node's first listener's port."""
        ev = self.events("listening")[-1]
        nodes = [int(n) for n in ev.get("nodes", [1])]
        urls = ev["listeners"]
        per_node = len(urls) // len(nodes)
        return {n: int(urls[i * per_node].rpartition(":")[2]) for i, n in enumerate(nodes)}

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "rallypoint", "--host", self.host, "--port", str(self.requested_port)]
        cmd += ["--data-dir", str(self.data_dir), "--log-format", "json"]
        for k, v in self.config.items():
            cmd += ["--config", f"{k}={v}"]
        return cmd + self.extra_args

    def start(self) -> BrokerProcess:
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        self._begin_log()
        self.proc = subprocess.Popen(
            self.command(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
            preexec_fn=self._in_child(),
        )
        ready = threading.Event()
        proc = self.proc

        def pump() -> None:
            assert proc.stdout is not None
            for raw in proc.stdout:
                line = raw.decode(errors="replace").rstrip("\n")
                self._feed(line)
                if not ready.is_set():
                    try:
                        ev = json.loads(line)
                    except ValueError:
                        continue
                    if ev.get("event") == "listening":
                        self.port = int(ev["port"])
                        ready.set()
            self._log_ended()

        self._reader = threading.Thread(target=pump, name="broker-log", daemon=True)
        self._reader.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not ready.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self._tail()
                self.kill()
                raise RuntimeError("broker did not start:\n" + tail)
        self.requested_port = self.port  # a restart comes back on the same port
        return self

    # How the log is kept (a subclass may classify it instead, e.g. the fuzz suite's broker).
    def _begin_log(self) -> None:
        self.log_lines = []

    def _feed(self, line: str) -> None:
        self.log_lines.append(line)

    def _log_ended(self) -> None:
        pass

    def _tail(self) -> str:
        return "\n".join(self.log_lines[-50:])

    def _in_child(self) -> Callable[[], None] | None:
        """What the child runs before exec (None: nothing)."""
        return None

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self._reader is not None:
            self._reader.join(5)
        rc = self.proc.returncode
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self.proc = None
        return rc

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def restart(self) -> BrokerProcess:
        self.stop()
        return self.start()

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def __enter__(self) -> BrokerProcess:
        return self if self.proc is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        out = []
        for line in list(self.log_lines):
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if name is None or ev.get("event") == name:
                out.append(ev)
        return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
