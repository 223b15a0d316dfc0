"""Helpers for the control-plane tests: a small HTTP client for the control endpoints."""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from tests.support import BrokerProcess


def control_url(broker: BrokerProcess) -> str:
    ev = broker.events("listening")[-1]
    url = ev.get("control")
    assert url, f"no control address in the listening line: {ev}"
    return str(url)


@dataclass
class Reply:
    status: int
    body: Any
    headers: dict[str, str]


class Control:
    """Blocking JSON calls to a broker's control plane."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 30.0) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.token = token
        self.timeout = timeout

    @classmethod
    def of(cls, broker: BrokerProcess, token: str | None = None) -> Control:
        return cls(control_url(broker), token)

    def raw(self, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None) -> Reply:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        try:
            h = dict(headers or {})
            if self.token is not None and "Authorization" not in h:
                h["Authorization"] = f"Bearer {self.token}"
            conn.request(method, path, body=body, headers=h)
            resp = conn.getresponse()
            data = resp.read()
            parsed = json.loads(data) if data else None
            return Reply(resp.status, parsed, {k.lower(): v for k, v in resp.getheaders()})
        finally:
            conn.close()

    def call(self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None) -> Reply:
        payload = None if body is None else json.dumps(body).encode()
        h = {"Content-Type": "application/json", **(headers or {})}
        return self.raw(method, path, payload, h)

    def get(self, path: str) -> Any:
        r = self.call("GET", path)
        assert r.status == 200, (path, r.status, r.body)
        return r.body

    def post(self, path: str, body: Any = None, expect: int = 200) -> Any:
        r = self.call("POST", path, body)
        assert r.status == expect, (path, r.status, r.body)
        return r.body

    def fault(self, **rule: Any) -> int:
        return int(self.post("/v1/faults", rule, expect=201)["id"])

    def requests(self, **params: str) -> list[dict[str, Any]]:
        q = "&".join(f"{k}={v}" for k, v in params.items())
        return list(self.get("/v1/requests" + (f"?{q}" if q else ""))["requests"])

    def events(self, path: str = "/v1/events", headers: dict[str, str] | None = None) -> SseStream:
        return SseStream(self.host, self.port, path, headers or {}, self.token)


class SseStream:
    """A raw server-sent-events reader (chunked HTTP/1.1), for bounded reads in tests."""

    def __init__(self, host: str, port: int, path: str, headers: dict[str, str], token: str | None) -> None:
        self.sock = socket.create_connection((host, port), timeout=10)
        lines = [f"GET {path} HTTP/1.1", f"Host: {host}:{port}", "Accept: text/event-stream"]
        if token is not None:
            lines.append(f"Authorization: Bearer {token}")
        lines += [f"{k}: {v}" for k, v in headers.items()]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        self.buf = b""
        head = self._until(b"\r\n\r\n")
        self.status = int(head.split(b" ", 2)[1])
        self.text = ""

    def _until(self, marker: bytes) -> bytes:
        while marker not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("stream closed")
            self.buf += chunk
        head, _, self.buf = self.buf.partition(marker)
        return head

    def _chunk(self) -> bytes:
        size = int(self._until(b"\r\n").split(b";")[0], 16)
        while len(self.buf) < size + 2:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("stream closed")
            self.buf += chunk
        data, self.buf = self.buf[:size], self.buf[size + 2 :]
        return data

    def events(self, timeout: float) -> Iterator[dict[str, Any]]:
        """Parsed events ({"id", "event", "data"}) as they arrive, until ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while True:
            while "\n\n" in self.text:
                block, _, self.text = self.text.partition("\n\n")
                ev: dict[str, Any] = {}
                for line in block.split("\n"):
                    if line.startswith(":") or ":" not in line:
                        continue
                    k, _, v = line.partition(":")
                    ev[k] = v.strip()
                if "data" in ev:
                    ev["data"] = json.loads(ev["data"])
                    ev["id"] = int(ev["id"])
                    yield ev
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self.sock.settimeout(left)
            try:
                self.text += self._chunk().decode()
            except (TimeoutError, ConnectionError):
                return

    def close(self) -> None:
        self.sock.close()
