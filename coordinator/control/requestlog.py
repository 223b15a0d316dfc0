"""The request log: a bounded ring of what clients sent and what they got (``GET /v1/requests``).

Recording is on the path of every request, so an entry is a plain tuple of values already at hand
(a NamedTuple costs ~0.7 µs more to build); the wall-clock time is derived from the monotonic
start time only when someone reads the log, and the JSON shape is built then too
(docs/control.md, "Request log").
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from rallypoint.protocol.errors import ErrorCode

from .faults import api_name

# (seq, start perf_counter_ns, clock skew ms, connection, client_id, client_host, api_key, version,
#  correlation_id, errors, latency ns, fault id or None, answered, node)
Entry = tuple[int, int, int, int, "str | None", str, int, int, int, tuple[int, ...], int, "int | None", bool, int]


def _error_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)


class RequestLog:
    def __init__(self, size: int, node_id: int) -> None:
        self.size = size
        self.node_id = node_id
        self.ring: deque[Entry] = deque(maxlen=max(size, 1))
        self.last_seq = 0  # the hot path appends to `ring` and bumps this itself
        self._cleared = 0
        self._wall0_ns = time.time_ns()
        self._perf0_ns = time.perf_counter_ns()

    @property
    def enabled(self) -> bool:
        return self.size > 0

    @property
    def dropped(self) -> int:
        """Entries pushed out of the full ring (not those cleared)."""
        return self.last_seq - self._cleared - len(self.ring)

    def add(
        self,
        start_ns: int,
        skew_ms: int,
        connection: int,
        client_id: str | None,
        client_host: str,
        api_key: int,
        version: int,
        correlation_id: int,
        errors: tuple[int, ...],
        latency_ns: int,
        fault: int | None = None,
        answered: bool = True,
        node: int | None = None,
    ) -> None:
        seq = self.last_seq = self.last_seq + 1
        self.ring.append(
            (
                seq,
                start_ns,
                skew_ms,
                connection,
                client_id,
                client_host,
                api_key,
                version,
                correlation_id,
                errors,
                latency_ns,
                fault,
                answered,
                self.node_id if node is None else node,
            )
        )

    def clear(self) -> int:
        n = len(self.ring)
        self._cleared += n
        self.ring.clear()
        return n

    def query(
        self, since: int = 0, api_key: int | None = None, client_id: str | None = None, node: int | None = None
    ) -> list[dict[str, Any]]:
        out = []
        for e in self.ring:
            if e[0] <= since:
                continue
            if node is not None and e[13] != node:
                continue
            if api_key is not None and e[6] != api_key:
                continue
            if client_id is not None and e[4] != client_id:
                continue
            out.append(self.to_json(e))
        return out

    def to_json(self, e: Entry) -> dict[str, Any]:
        (
            seq,
            start_ns,
            skew,
            connection,
            client_id,
            host,
            api_key,
            version,
            corr,
            errors,
            latency,
            fault,
            answered,
            node,
        ) = e
        return {
            "seq": seq,
            "time_ms": (self._wall0_ns + start_ns - self._perf0_ns) // 1_000_000 + skew,
            "node": node,
            "connection": connection,
            "client_id": client_id,
            "client_host": host,
            "api": api_name(api_key),
            "api_key": api_key,
            "version": version,
            "correlation_id": corr,
            "errors": list(dict.fromkeys(_error_name(c) for c in errors)),
            "latency_ms": round(latency / 1e6, 3),
            "fault": fault,
            "answered": answered,
        }
