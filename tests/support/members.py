"""Consumer-group members driven by real client libraries, each in its own process.

A :class:`Member` runs ``tests/support/consumer_member.py`` (kafka-python, aiokafka or
confluent-kafka; see that module for its JSON-lines protocol) and keeps the events it reports.
Stopping closes its stdin (the client closes its consumer cleanly: LeaveGroup unless static);
``kill`` is SIGKILL.  Always register members with a fixture that kills them at the end.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

from .broker import BrokerProcess
from .paths import ROOT

TP = tuple[str, int]

CLIENTS = ("kafka-python", "aiokafka", "confluent")
MEMBER_SCRIPT = ROOT / "tests" / "support" / "consumer_member.py"


class EventProcess:
    """A child process that reports JSON events, one object per line on stdout, read into
    :attr:`events` by a thread; its stderr kept in a temporary file (:meth:`log`).  Base of
    :class:`Member` and of the test-specific member processes (e.g. the pipeline's)."""

    def __init__(self, cmd: Sequence[str]) -> None:
        self.stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            list(cmd), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True, cwd=ROOT
        )
        self.events: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.events.append(json.loads(line))
            except ValueError:
                continue

    @property
    def assignment(self) -> frozenset[TP] | None:
        """The last assignment it reported (None before the first)."""
        for e in reversed(self.events):
            if e["event"] == "assignment":
                return frozenset((t, p) for t, p in e["partitions"])
        return None

    def history(self) -> list[tuple[float, frozenset[TP]]]:
        """Every assignment it reported, with the time it saw it."""
        return [
            (e["t"], frozenset((t, p) for t, p in e["partitions"])) for e in self.events if e["event"] == "assignment"
        ]

    def kill(self) -> None:
        """SIGKILL (also ends a process stopped with SIGSTOP)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def log(self, tail: int = 6000) -> str:
        """The end of its stderr (client logs, thread stacks after :meth:`dump_stacks`)."""
        self.stderr.seek(0)
        return self.stderr.read().decode(errors="replace")[-tail:]

    def dump_stacks(self) -> None:
        """Ask a live member to write its thread stacks to its stderr (faulthandler on SIGUSR1)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGUSR1)


class HasBootstrap(Protocol):
    """A broker to point a member at: BrokerProcess, or rallypoint.testing.Rallypoint."""

    @property
    def bootstrap(self) -> str: ...


class Member(EventProcess):
    """One consumer process of a real client library (``client`` is one of :data:`CLIENTS`).

    ``opts`` become flags of the member process: ``instance``, ``session_ms``, ``heartbeat_ms``,
    ``max_poll_ms``, ``assignor`` (comma-separated names), ``client_id``.
    """

    def __init__(self, client: str, broker: HasBootstrap, group: str, topics: Sequence[str], **opts: Any) -> None:
        self.client = client
        self.name = opts.pop("client_id", None) or client
        cmd = [sys.executable, str(MEMBER_SCRIPT), "--client", client]
        cmd += ["--bootstrap", broker.bootstrap, "--group", group, "--topics", ",".join(topics)]
        cmd += ["--client-id", self.name]
        for k, v in opts.items():
            cmd += [f"--{k.replace('_', '-')}", str(v)]
        super().__init__(cmd)

    def begin_stop(self) -> None:
        """Ask it to close (stdin EOF) without waiting: members stopped together close in parallel."""
        if self.proc.poll() is None and self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except BrokenPipeError:
                pass

    def stop(self, timeout: float = 20.0) -> None:
        """Close cleanly (stdin EOF: the client closes its consumer); SIGKILL after ``timeout``."""
        if self.proc.poll() is None:
            self.begin_stop()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()


def explain_members(members: Sequence[Member], broker: BrokerProcess | None = None, group: str | None = None) -> str:
    """What each member saw last, its log and stacks, and the broker's events (of ``group``):
    the message to attach to a timed-out wait."""
    for m in members:
        m.dump_stacks()
    time.sleep(0.5)  # let the stack dumps reach the stderr files
    out = [f"{m.name}: {sorted(m.assignment or [])}\n{m.events[-5:]}\n{m.log()}" for m in members]
    if broker is not None:
        for e in broker.events():
            if group is None or e.get("group") == group:
                out.append(json.dumps({k: v for k, v in e.items() if k != "level"})[:300])
    return "\n".join(out)
