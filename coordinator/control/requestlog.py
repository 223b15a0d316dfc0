"""The request log: a bounded ring of what clients sent and what they got (``GET /v1/requests``).

Recording is on the hot path of every request, so an entry is a tuple made of values already at
hand; the JSON shape is built only when someone reads the log (docs/control.md, "Request log").
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import Any, NamedTuple

from rallypoint.protocol.errors import ErrorCode

from .faults import api_name


class Entry(NamedTuple):
    seq: int
    time_ms: int
    connection: int
    client_id: str | None
    client_host: str
    api_key: int
    version: int
    correlation_id: int
    errors: tuple[int, ...]
    latency_us: int
    fault: int | None  # the rule that applied, if one did
    answered: bool


def _error_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return str(code)


class RequestLog:
    def __init__(self, size: int, node_id: int) -> None:
        self.size = size
        self.node_id = node_id
        self._ring: deque[Entry] = deque(maxlen=max(size, 1))
        self._seq = itertools.count(1)
        self.last_seq = 0
        self.dropped = 0  # entries pushed out of the full ring (not those cleared)

    @property
    def enabled(self) -> bool:
        return self.size > 0

    def add(
        self,
        time_ms: int,
        connection: int,
        client_id: str | None,
        client_host: str,
        api_key: int,
        version: int,
        correlation_id: int,
        errors: tuple[int, ...],
        latency_us: int,
        fault: int | None = None,
        answered: bool = True,
    ) -> None:
        ring = self._ring
        if len(ring) == ring.maxlen:
            self.dropped += 1
        seq = self.last_seq = next(self._seq)
        ring.append(
            Entry(
                seq,
                time_ms,
                connection,
                client_id,
                client_host,
                api_key,
                version,
                correlation_id,
                errors,
                latency_us,
                fault,
                answered,
            )
        )

    def clear(self) -> int:
        n = len(self._ring)
        self._ring.clear()
        return n

    def query(
        self, since: int = 0, api_key: int | None = None, client_id: str | None = None, node: int | None = None
    ) -> list[dict[str, Any]]:
        if node is not None and node != self.node_id:
            return []
        out = []
        for e in self._ring:
            if e.seq <= since:
                continue
            if api_key is not None and e.api_key != api_key:
                continue
            if client_id is not None and e.client_id != client_id:
                continue
            out.append(self.to_json(e))
        return out

    def to_json(self, e: Entry) -> dict[str, Any]:
        return {
            "seq": e.seq,
            "time_ms": e.time_ms,
            "node": self.node_id,
            "connection": e.connection,
            "client_id": e.client_id,
            "client_host": e.client_host,
            "api": api_name(e.api_key),
            "api_key": e.api_key,
            "version": e.version,
            "correlation_id": e.correlation_id,
            "errors": list(dict.fromkeys(_error_name(c) for c in e.errors)),
            "latency_ms": e.latency_us / 1000.0,
            "fault": e.fault,
            "answered": e.answered,
        }
