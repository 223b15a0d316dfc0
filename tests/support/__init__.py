"""Test support: start real broker processes, and a raw Kafka wire client.

Every broker started here runs as its own process on 127.0.0.1 with a port the OS picks
(``--port 0``; the port is read from its ``listening`` log line), and is killed at the end
of the test that started it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rallypoint.protocol import codec

ROOT = Path(__file__).resolve().parents[2]
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
    log_lines: list[str] = field(default_factory=list)
    _reader: threading.Thread | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "rallypoint", "--host", self.host, "--port", str(self.requested_port)]
        cmd += ["--data-dir", str(self.data_dir), "--log-format", "json"]
        for k, v in self.config.items():
            cmd += ["--config", f"{k}={v}"]
        return cmd + self.extra_args

    def start(self) -> BrokerProcess:
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        self.log_lines = []
        self.proc = subprocess.Popen(
            self.command(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=ROOT
        )
        ready = threading.Event()

        def pump() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            for raw in self.proc.stdout:
                line = raw.decode(errors="replace").rstrip("\n")
                self.log_lines.append(line)
                if not ready.is_set():
                    try:
                        ev = json.loads(line)
                    except ValueError:
                        continue
                    if ev.get("event") == "listening":
                        self.port = int(ev["port"])
                        ready.set()

        self._reader = threading.Thread(target=pump, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                raise RuntimeError("broker did not start:\n" + "\n".join(self.log_lines[-50:]))
        self.requested_port = self.port  # a restart comes back on the same port
        return self

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
            self._reader.join(2)
        rc = self.proc.returncode
        self.proc = None
        return rc

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def restart(self) -> BrokerProcess:
        self.stop()
        return self.start()

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


class WireClient:
    """A blocking raw-protocol client: send any request at any version, read the answer."""

    def __init__(self, host: str, port: int, timeout: float = 10.0, client_id: str | None = "wire-test") -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.settimeout(timeout)
        self.client_id = client_id
        self._corr = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> WireClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_frame(self) -> bytes:
        (size,) = struct.unpack(">i", self._recv(4))
        return self._recv(size)

    def _recv(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("connection closed by broker")
            buf += chunk
        return bytes(buf)

    def send(self, api_key: int, version: int, body: Mapping[str, Any]) -> int:
        self._corr += 1
        self.sock.sendall(codec.encode_request(api_key, version, self._corr, body, self.client_id))
        return self._corr

    def receive(self, api_key: int, version: int, corr: int | None = None) -> Any:
        got, msg = codec.decode_response_frame(api_key, version, self.recv_frame())
        if corr is not None:
            assert got == corr, f"correlation id {got} != {corr}"
        return msg

    def call(self, api_key: int, version: int, body: Mapping[str, Any]) -> Any:
        corr = self.send(api_key, version, body)
        return self.receive(api_key, version, corr)

    def is_closed_by_peer(self, timeout: float = 5.0) -> bool:
        """True when the broker closes this connection within ``timeout``."""
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False


class FrameProxy:
    """A TCP proxy in front of a broker that sees (and may rewrite) each client request frame.

    ``rewrite(n, frame)`` gets the n-th request frame (0-based, per connection, bytes after the
    size) and returns the frame to forward.  ``seen`` lists (api_key, api_version) as the client
    sent them.  Responses pass through untouched.
    """

    def __init__(self, upstream: tuple[str, int], rewrite: Callable[[int, bytes], bytes] | None = None) -> None:
        self.upstream = upstream
        self.rewrite = rewrite
        self.seen: list[tuple[int, int]] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._sockets: list[socket.socket] = [self._listener]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream, timeout=10)
            server.settimeout(None)
            self._sockets += [client, server]
            threading.Thread(target=self._requests, args=(client, server), daemon=True).start()
            threading.Thread(target=self._responses, args=(server, client), daemon=True).start()

    def _requests(self, client: socket.socket, server: socket.socket) -> None:
        n = 0
        try:
            while True:
                head = _recv_all(client, 4)
                (size,) = struct.unpack(">i", head)
                frame = _recv_all(client, size)
                self.seen.append(struct.unpack_from(">hh", frame))
                if self.rewrite is not None:
                    frame = self.rewrite(n, frame)
                n += 1
                server.sendall(struct.pack(">i", len(frame)) + frame)
        except (OSError, ConnectionError):
            pass
        finally:
            _shut(server)

    def _responses(self, server: socket.socket, client: socket.socket) -> None:
        try:
            while data := server.recv(65536):
                client.sendall(data)
        except OSError:
            pass
        finally:
            _shut(client)

    def close(self) -> None:
        self._closed = True
        for s in self._sockets:
            _shut(s)
            s.close()


def _recv_all(s: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return bytes(buf)


def _shut(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
