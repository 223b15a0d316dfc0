"""A broker process for the fuzzing suite, with its log read as it is written.

Unlike ``tests.support.BrokerProcess`` (which keeps every log line), a fuzz run writes a warning
line per malformed request for hours, so the log is classified on the fly and only bounded
summaries are kept:

* ``problems``: tracebacks and error-level lines (what a fuzz run must never cause), each with a
  one-line ``signature`` (innermost ``File ..., in func`` + the exception line) for grouping
  (the first 200, then the first of each new signature; ``problem_count`` counts them all);
* ``warnings``: a count per event name (a malformed request closing its connection is one
  warning line, which is fine);
* ``transitions``: group state transitions of the groups named in ``watch_groups``;
* ``tail``: the last lines, for diagnostics.

Memory: ``rss_kb()`` reads ``VmRSS`` from ``/proc/<pid>/status``.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.broker import BrokerProcess

START_TIMEOUT_S = 30.0
MAX_PROBLEMS = 200


@dataclass
class Problem:
    """A traceback or error-level line of the broker log."""

    at: float  # time.monotonic() when read
    signature: str
    text: str  # the event and traceback (bounded)
    fields: dict[str, Any] = field(default_factory=dict)  # the JSON event's fields (api, api_version, ...)


def _signature(text: str) -> str:
    """``<innermost File line> | <exception line>`` of a traceback text, or its first line."""
    lines = [ln.rstrip() for ln in text.splitlines() if ln.strip()]
    files = [ln.strip() for ln in lines if ln.strip().startswith("File ")]
    last = lines[-1].strip() if lines else ""
    where = files[-1] if files else ""
    if where:
        # File "/abs/path/coordinator/handlers/x.py", line 12, in handle -> handlers/x.py:12 in handle
        try:
            path = where.split('"')[1]
            rest = where.split('"')[2]
            lineno = rest.split("line ")[1].split(",")[0]
            func = rest.split(" in ")[-1]
            short = "/".join(Path(path).parts[-2:])
            where = f"{short}:{lineno} in {func}"
        except IndexError:
            pass
    return f"{where} | {last}"[:300] if where else last[:300]


@dataclass
class LogWatch:
    watch_groups: set[str] = field(default_factory=set)
    problems: list[Problem] = field(default_factory=list)
    problem_count: int = 0
    signatures: Counter[str] = field(default_factory=Counter)
    warnings: Counter[str] = field(default_factory=Counter)
    levels: Counter[str] = field(default_factory=Counter)
    transitions: list[dict[str, Any]] = field(default_factory=list)
    tail: deque[str] = field(default_factory=lambda: deque(maxlen=200))
    lines: int = 0
    _raw: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _problem(self, text: str, fields: dict[str, Any] | None = None) -> None:
        sig = _signature(text)
        with self._lock:
            self.problem_count += 1
            self.signatures[sig] += 1
            if len(self.problems) < MAX_PROBLEMS or self.signatures[sig] == 1:  # every new kind is kept
                small = {k: v for k, v in (fields or {}).items() if k != "exception"}
                self.problems.append(Problem(time.monotonic(), sig, text[:6000], small))

    def _flush_raw(self) -> None:
        if self._raw:
            text = "\n".join(self._raw)
            self._raw = []
            # Anything the process writes outside structlog is an unhandled error report
            # (asyncio's "Exception in callback", a Python traceback, a Rust panic, ...).
            self._problem(text)

    def feed(self, line: str) -> dict[str, Any] | None:
        self.lines += 1
        self.tail.append(line[:2000])
        try:
            ev = json.loads(line)
        except ValueError:
            ev = None
        if not isinstance(ev, dict):
            self._raw.append(line[:2000])
            if len(self._raw) > 400:
                self._flush_raw()
            return None
        self._flush_raw()
        level = str(ev.get("level", ""))
        self.levels[level] += 1
        if "exception" in ev or level in ("error", "critical", "exception"):
            self._problem(f"{ev.get('event')}\n{ev.get('exception', '')}", ev)
        elif level == "warning":
            self.warnings[str(ev.get("event"))] += 1
        if ev.get("event") == "group state transition" and ev.get("group") in self.watch_groups:
            self.transitions.append({**ev, "at": time.monotonic()})
        return ev

    def close(self) -> None:
        self._flush_raw()

    def problems_since(self, t: float) -> list[Problem]:
        with self._lock:
            return [p for p in self.problems if p.at >= t]


def _die_with_parent() -> None:
    """Linux: SIGKILL this (child) process when its parent dies, so that a fuzz run killed in
    the middle (a memory-guard broker may be at 250 MB) leaves no broker behind.  "Parent" is
    the *thread* that started it: start brokers from a thread that outlives them (the main one)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class FuzzBroker(BrokerProcess):
    """``python -m rallypoint`` on 127.0.0.1 (``tests.support.BrokerProcess``) with its JSON log
    read by a :class:`LogWatch` instead of kept whole."""

    def __init__(
        self,
        data_dir: Path,
        config: dict[str, str] | None = None,
        *,
        port: int = 0,
        advertised_port: int | None = None,
        watch_groups: set[str] | None = None,
        nice: int = 0,
    ) -> None:
        extra = [] if advertised_port is None else ["--advertised-port", str(advertised_port)]
        super().__init__(
            data_dir,
            {"group.initial.rebalance.delay.ms": "0", **(config or {})},
            extra_args=extra,
            requested_port=port,
            start_timeout_s=START_TIMEOUT_S,
        )
        self.watch_groups = set(watch_groups or ())
        self.nice = nice
        self.log = LogWatch(self.watch_groups)
        self.starts = 0

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> FuzzBroker:
        super().start()
        self.starts += 1
        return self

    def _begin_log(self) -> None:
        self.log = LogWatch(self.watch_groups)

    def _feed(self, line: str) -> None:
        self.log.feed(line)

    def _log_ended(self) -> None:
        self.log.close()

    def _tail(self) -> str:
        return "\n".join(self.log.tail)

    def _in_child(self) -> Callable[[], None]:
        nice = self.nice

        def in_child() -> None:
            _die_with_parent()
            if nice:
                os.nice(nice)

        return in_child

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def rss_kb(self) -> int:
        """Resident set size now (0 when the process is gone)."""
        if self.proc is None:
            return 0
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError, ValueError):
            pass
        return 0

    def restart(self) -> FuzzBroker:
        self.kill()
        return self.start()

    def __enter__(self) -> FuzzBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
