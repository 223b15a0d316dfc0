"""rallypoint from a test: start a broker, hand the test its address, steer it.

    from rallypoint.testing import Rallypoint

    with Rallypoint(config={"num.partitions": "3"}) as rp:
        consumer = Consumer({"bootstrap.servers": rp.bootstrap, "group.id": "g"})
        ...
        rp.wait_group("g", state="Stable", members=1)
        fault = rp.inject("OffsetCommit", "NOT_COORDINATOR", group="g")
        fault.wait(1)

A :class:`Rallypoint` runs one broker on free ports with a temporary data directory, either
in this process (its own event loop on a thread: starts in a few milliseconds) or as a child
process (``python -m rallypoint``: nothing shared with the test), and has one method per
control-plane endpoint (docs/control.md).  The pytest plugin (``rallypoint.pytest_plugin``,
docs/control.md, "pytest plugin") builds its fixtures on it.

Only the standard library is used on the test's side (``urllib`` for the control plane).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

__all__ = ["ControlError", "Fault", "Mode", "Rallypoint", "RallypointError"]

Mode = Literal["inprocess", "subprocess"]
MODES: tuple[Mode, ...] = ("inprocess", "subprocess")

START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0


class RallypointError(RuntimeError):
    """The broker could not be started or stopped."""


class ControlError(RuntimeError):
    """The control plane answered an error (``status``; ``body`` is its JSON answer)."""

    def __init__(self, status: int, body: Any, what: str) -> None:
        message = body.get("error") if isinstance(body, dict) and "error" in body else body
        super().__init__(f"{what}: HTTP {status}: {message}")
        self.status = status
        self.body = body


class Fault:
    """A fault rule on the broker (``POST /v1/faults``)."""

    def __init__(self, owner: Rallypoint, rule: dict[str, Any]) -> None:
        self._owner = owner
        self.id: int = int(rule["id"])
        self.rule = rule

    def refresh(self) -> dict[str, Any]:
        """The rule as the broker has it now."""
        self.rule = self._owner._call("GET", f"/v1/faults/{self.id}")
        return self.rule

    @property
    def hits(self) -> int:
        """Requests the rule has acted on so far."""
        return int(self.refresh()["hits"])

    def wait(self, hits: int = 1, timeout: float = 10.0) -> dict[str, Any]:
        """Wait until the rule has acted on ``hits`` requests; TimeoutError otherwise."""
        status, body = self._owner._request(
            "POST", f"/v1/faults/{self.id}/wait", {"hits": hits, "timeout_ms": _ms(timeout)}, timeout
        )
        if status == 408:
            self.rule = body
            raise TimeoutError(f"fault {self.id} had {body.get('hits')} hits, not {hits}, after {timeout} s")
        self.rule = _ok(status, body, f"wait for fault {self.id}")
        return self.rule

    def release(self) -> int:
        """Let the requests the rule holds go on; returns how many were released."""
        body = self._owner._call("POST", f"/v1/faults/{self.id}/release")
        self.rule = body["fault"]
        return int(body["released"])

    def delete(self) -> None:
        """Remove the rule (what it holds is released)."""
        self._owner._call("DELETE", f"/v1/faults/{self.id}")

    def __repr__(self) -> str:
        return f"Fault({self.rule!r})"


def _consecutive_free_ports(host: str, n: int) -> int:
    """A port p with p .. p+n-1 free to bind on ``host`` now."""
    for _ in range(100):
        with socket.socket() as probe:
            probe.bind((host, 0))
            base = int(probe.getsockname()[1])
        if base + n > 65535:
            continue
        socks: list[socket.socket] = []
        try:
            for i in range(n):
                s = socket.socket()
                socks.append(s)
                s.bind((host, base + i))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RallypointError(f"found no {n} consecutive free ports")


class Rallypoint:
    """One rallypoint broker for a test: ``bootstrap`` for clients, ``control_url`` and the
    methods below for steering it.  Use it as a context manager (or call start/stop)."""

    def __init__(
        self,
        config: Mapping[str, str | int | bool] | None = None,
        *,
        mode: Mode = "inprocess",
        brokers: int = 1,
        data_dir: str | os.PathLike[str] | None = None,
        host: str = "127.0.0.1",
        log_level: str = "info",
        start_timeout: float = START_TIMEOUT_S,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, not {mode!r}")
        if not 1 <= brokers <= 64:
            raise ValueError(f"brokers must be in [1, 64], not {brokers}")
        self.brokers = brokers  # nodes in the process (docs/cluster.md); node 1 is ``bootstrap``
        self.config = {str(k): _config_value(v) for k, v in (config or {}).items()}
        for key in ("port", "host", "data.dir", "rallypoint.control.port", "rallypoint.brokers"):
            if key in self.config:
                raise ValueError(f"{key!r} is chosen by Rallypoint (free ports, a temporary data dir)")
        self.mode: Mode = mode
        self.host = host
        self.log_level = log_level
        self.start_timeout = start_timeout
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir is not None else Path(tempfile.mkdtemp(prefix="rallypoint-"))
        self.port = 0
        self.control_url = ""
        self.token: str | None = self.config.get("rallypoint.control.token") or None
        self._runner: _InProcess | _Subprocess | None = None

    # ------------------------------------------------------------------ lifecycle

    @property
    def bootstrap(self) -> str:
        """``host:port`` for ``bootstrap.servers``."""
        if not self.port:
            raise RallypointError("the broker is not running")
        return f"{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._runner is not None

    def start(self) -> Rallypoint:
        if self._runner is not None:
            return self
        # The first start takes free ports; a restart asks for the same ones (clients keep
        # their bootstrap address), falling back to new ones if they were taken meanwhile.
        try:
            self._runner = self._start(self._settings())
        except RallypointError:
            if not self.port:
                raise
            self.port, self.control_url = 0, ""  # the old ports were taken meanwhile
            self._runner = self._start(self._settings())
        return self

    def _start(self, settings: dict[str, str]) -> _InProcess | _Subprocess:
        runner: _InProcess | _Subprocess
        runner = _InProcess(settings) if self.mode == "inprocess" else _Subprocess(settings, self.log_level)
        self.port, self.control_url = runner.start(self.start_timeout)
        return runner

    def stop(self) -> None:
        """Stop the broker (cleanly: offsets flushed); the data directory is kept for
        :meth:`restart` until :meth:`close`."""
        runner, self._runner = self._runner, None
        if runner is not None:
            runner.stop(STOP_TIMEOUT_S)

    def restart(self) -> Rallypoint:
        """Stop and start again on the same data directory (persistence tests)."""
        self.stop()
        return self.start()

    def close(self) -> None:
        """Stop and remove the temporary data directory (one given by the caller is kept)."""
        try:
            self.stop()
        finally:
            if self._own_dir:
                shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> Rallypoint:
        try:
            return self.start()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _settings(self) -> dict[str, str]:
        port = self.port
        if not port and self.brokers > 1:
            # node i listens on port + i: take a run of free ports, so a restart gets them back
            port = _consecutive_free_ports(self.host, self.brokers)
        return {
            **self.config,
            "rallypoint.brokers": str(self.brokers),
            "host": self.host,
            "port": str(port),  # 0 the first time: any free port
            "data.dir": str(self.data_dir),
            "rallypoint.control.port": self.control_url.rsplit(":", 1)[-1] if self.control_url else "0",
        }

    # ------------------------------------------------------------------ control plane

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/v1/health")  # type: ignore[no-any-return]

    def inject(
        self,
        api: str | int,
        error: str | int | None = None,
        *,
        count: int | None = 1,
        action: str | None = None,
        **match: Any,
    ) -> Fault:
        """A fault rule: ``api`` (name or key) answered with ``error`` (or another ``action``:
        ``delay``, ``disconnect``, ``no-response``, ``hold``) ``count`` times (None: until
        deleted).  ``match`` takes the rule's other fields: ``group``, ``topic``,
        ``client_id``, ``versions``, ``after``, ``probability``, ``seed``, ``delay_ms``."""
        body: dict[str, Any] = {"api": api, "count": count, **match}
        if error is not None:
            body["error"] = error
        if action is not None:
            body["action"] = action
        answer = self._call("POST", "/v1/faults", body)
        return Fault(self, answer["fault"])

    def faults(self) -> list[Fault]:
        return [Fault(self, rule) for rule in self._call("GET", "/v1/faults")]

    def clear_faults(self) -> int:
        """Delete every rule; returns how many there were."""
        return int(self._call("DELETE", "/v1/faults")["deleted"])

    def group(self, group: str) -> dict[str, Any] | None:
        """The group as the coordinator has it (docs/control.md, "The group shape"), or None."""
        status, body = self._request("GET", f"/v1/groups/{_segment(group)}")
        if status == 404:
            return None
        return _ok(status, body, f"group {group!r}")  # type: ignore[no-any-return]

    def groups(self) -> list[dict[str, Any]]:
        return self._call("GET", "/v1/groups")  # type: ignore[no-any-return]

    def wait_group(
        self,
        group: str,
        *,
        state: str | None = None,
        members: int | None = None,
        min_generation: int | None = None,
        timeout: float = 10.0,
    ) -> dict[str, Any]:
        """Wait until the group is in ``state`` with exactly ``members`` members at
        ``min_generation`` or later (any subset); returns the group, or raises TimeoutError
        saying how the group was at the end."""
        body: dict[str, Any] = {"timeout_ms": _ms(timeout)}
        for name, value in (("state", state), ("members", members), ("min_generation", min_generation)):
            if value is not None:
                body[name] = value
        status, answer = self._request("POST", f"/v1/groups/{_segment(group)}/wait", body, timeout)
        if status == 408:
            raise TimeoutError(f"group {group!r} did not reach {body} within {timeout} s; it is {answer}")
        return _ok(status, answer, f"wait for group {group!r}")  # type: ignore[no-any-return]

    def expire_member(self, group: str, member_id: str) -> dict[str, Any]:
        """Expire one member's session now (as if it stopped heartbeating)."""
        path = f"/v1/groups/{_segment(group)}/members/{_segment(member_id)}/expire"
        return self._call("POST", path, {})  # type: ignore[no-any-return]

    def advance_clock(self, ms: int) -> dict[str, Any]:
        """Move the coordinator's clock forward by ``ms``: deadlines inside the jump fire."""
        return self._call("POST", "/v1/clock/advance", {"ms": ms})  # type: ignore[no-any-return]

    def requests(
        self,
        *,
        api: str | int | None = None,
        since: int | None = None,
        client_id: str | None = None,
        node: int | None = None,
    ) -> list[dict[str, Any]]:
        """What clients sent, oldest first (the request log), optionally filtered."""
        pairs = (("api", api), ("since", since), ("client_id", client_id), ("node", node))
        query = {k: str(v) for k, v in pairs if v is not None}
        path = "/v1/requests" + ("?" + urllib.parse.urlencode(query) if query else "")
        return self._call("GET", path)["requests"]  # type: ignore[no-any-return]

    def clear_requests(self) -> int:
        return int(self._call("DELETE", "/v1/requests")["cleared"])

    # several brokers (docs/cluster.md, "Moving things")

    def cluster(self) -> dict[str, Any]:
        """Every node with its state and endpoints, and the controller."""
        return self._call("GET", "/v1/brokers")  # type: ignore[no-any-return]

    def stop_broker(self, node: int, *, offline: bool = False) -> dict[str, Any]:
        """Stop one node: its partitions move to running nodes (``offline``: stay leaderless)."""
        return self._call("POST", f"/v1/brokers/{node}/stop", {"offline": offline})  # type: ignore[no-any-return]

    def start_broker(self, node: int) -> dict[str, Any]:
        return self._call("POST", f"/v1/brokers/{node}/start", {})  # type: ignore[no-any-return]

    def move_leader(self, topic: str, partition: int, node: int) -> dict[str, Any]:
        """Make ``node`` the leader of a partition (of ``__consumer_offsets`` too)."""
        path = f"/v1/partitions/{_segment(topic)}/{partition}/leader"
        return self._call("POST", path, {"node": node})  # type: ignore[no-any-return]

    def move_coordinator(self, group: str, node: int) -> dict[str, Any]:
        """Move the group's ``__consumer_offsets`` partition — and every group on it — to ``node``."""
        return self._call("POST", f"/v1/groups/{_segment(group)}/coordinator", {"node": node})  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ HTTP

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        status, answer = self._request(method, path, body)
        return _ok(status, answer, f"{method} {path}")

    def _request(self, method: str, path: str, body: Any = None, wait: float = 0.0) -> tuple[int, Any]:
        if not self.control_url:
            raise RallypointError("the broker is not running")
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.control_url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=wait + 30.0) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                return e.code, json.loads(raw) if raw else None
            except ValueError:
                return e.code, raw.decode(errors="replace")

    def __repr__(self) -> str:
        state = f"on {self.bootstrap}" if self.running else "stopped"
        return f"Rallypoint({self.mode}, {state}, data_dir={str(self.data_dir)!r})"


def _ok(status: int, body: Any, what: str) -> Any:
    if status >= 300:
        raise ControlError(status, body, what)
    return body


def _ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))


def _segment(value: str) -> str:
    return urllib.parse.quote(value, safe="")


def _config_value(v: str | int | bool) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


# ---------------------------------------------------------------------------- runners


class _InProcess:
    """The broker on its own event loop in a daemon thread of this process."""

    def __init__(self, settings: dict[str, str]) -> None:
        self.settings = settings
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        self.stopped: asyncio.Event | None = None

    def start(self, timeout: float) -> tuple[int, str]:
        from . import config as config_mod

        # ConfigError for a bad key or value.  Logging is left as the host process has it
        # configured (structlog's defaults when it has not).
        cfg = config_mod.load(self.settings, env={})
        ready: list[tuple[int, str] | BaseException] = []
        started = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self.loop = loop
            try:
                loop.run_until_complete(self._serve(cfg, ready, started))
            except BaseException as e:  # a start-up failure is reported to start()
                if not ready:
                    ready.append(e)
                    started.set()
            finally:
                with contextlib.suppress(Exception):
                    loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

        self.thread = threading.Thread(target=run, name="rallypoint-broker", daemon=True)
        self.thread.start()
        if not started.wait(timeout):
            raise RallypointError(f"the in-process broker did not start within {timeout} s")
        outcome = ready[0]
        if isinstance(outcome, BaseException):
            self.thread.join(STOP_TIMEOUT_S)
            raise RallypointError(f"the in-process broker did not start: {outcome}") from outcome
        return outcome

    async def _serve(self, cfg: Any, ready: list[Any], started: threading.Event) -> None:
        from .assemble import build_broker
        from .server import Server

        server = Server(build_broker(cfg), cfg["host"], cfg["port"])
        server.owns_process = False
        await server.start()
        self.stopped = asyncio.Event()
        ready.append((server.port, getattr(server.hook, "address", None) or ""))
        started.set()
        try:
            await self.stopped.wait()
        finally:
            await server.stop()

    def stop(self, timeout: float) -> None:
        loop, stopped, thread = self.loop, self.stopped, self.thread
        if loop is not None and stopped is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # the loop ended already
                loop.call_soon_threadsafe(stopped.set)
        if thread is not None:
            thread.join(timeout)
            if thread.is_alive():
                raise RallypointError(f"the in-process broker did not stop within {timeout} s")


class _Subprocess:
    """``python -m rallypoint`` as a child process; its JSON ``listening`` line gives the ports."""

    def __init__(self, settings: dict[str, str], log_level: str) -> None:
        self.settings = settings
        self.log_level = log_level
        self.proc: subprocess.Popen[str] | None = None
        self.log: list[str] = []
        self._reader: threading.Thread | None = None

    def start(self, timeout: float) -> tuple[int, str]:
        # --log-level info at least: the "listening" line (info) gives the ports
        level = self.log_level if self.log_level in ("debug", "info") else "info"
        args = [sys.executable, "-m", "rallypoint", "--log-format", "json", "--log-level", level]
        for key, value in self.settings.items():
            args += ["--config", f"{key}={value}"]
        self.proc = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True
        )
        found: list[tuple[int, str]] = []
        listening = threading.Event()
        stderr = self.proc.stderr
        assert stderr is not None

        def read() -> None:
            for line in stderr:
                if len(self.log) < 2000:
                    self.log.append(line.rstrip())
                if not found:
                    try:
                        event = json.loads(line)
                    except ValueError:
                        continue
                    if isinstance(event, dict) and event.get("event") == "listening":
                        found.append((int(event["port"]), str(event.get("control") or "")))
                        listening.set()
            listening.set()  # the process ended

        self._reader = threading.Thread(target=read, name="rallypoint-broker-log", daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout
        while not listening.wait(0.05):
            if time.monotonic() > deadline:
                self.stop(STOP_TIMEOUT_S)
                raise RallypointError(f"the broker process did not start within {timeout} s: {self._tail()}")
        if not found:
            self.stop(STOP_TIMEOUT_S)
            raise RallypointError(f"the broker process exited during start-up: {self._tail()}")
        return found[0]

    def _tail(self) -> str:
        return "\n".join(self.log[-20:])

    def stop(self, timeout: float) -> None:
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()  # SIGTERM: a clean shutdown
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
        if self._reader is not None:
            self._reader.join(timeout)
        if proc.stderr is not None:
            proc.stderr.close()
