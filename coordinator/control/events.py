"""Events for ``GET /v1/events`` (server-sent events): a bounded ring and its live subscribers.

Kinds (docs/control.md, "Events"): ``group`` (a state transition), ``member`` (joined, left,
expired, fenced) and ``fault`` (a rule hit).  Ids grow by one per event; a subscriber that says
``Last-Event-ID: n`` first gets what the ring still holds after n.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from typing import Any, Final

from msgspec import Struct

KINDS: Final = ("group", "member", "fault")
RING_SIZE: Final = 1000
SUBSCRIBER_QUEUE: Final = 10000  # a subscriber further behind than this is cut off


class Event(Struct, frozen=True):
    """One event of the ring: its id, kind and JSON data; :meth:`sse` frames it for the stream."""

    id: int
    kind: str
    data: dict[str, Any]

    def sse(self) -> bytes:
        return f"id: {self.id}\nevent: {self.kind}\ndata: {json.dumps(self.data, separators=(',', ':'))}\n\n".encode()


class Subscriber:
    def __init__(self, kinds: frozenset[str]) -> None:
        self.kinds = kinds
        self.queue: asyncio.Queue[Event | None] = asyncio.Queue(SUBSCRIBER_QUEUE)
        self.overflowed = False


class EventHub:
    def __init__(self, ring_size: int = RING_SIZE) -> None:
        self._ring: deque[Event] = deque(maxlen=ring_size)
        self._next_id = 1
        self._subscribers: set[Subscriber] = set()
        self.closed = False

    @property
    def last_id(self) -> int:
        return self._next_id - 1

    def publish(self, kind: str, data: dict[str, Any]) -> Event:
        ev = Event(self._next_id, kind, data)
        self._next_id += 1
        self._ring.append(ev)
        for sub in list(self._subscribers):
            if kind not in sub.kinds:
                continue
            try:
                sub.queue.put_nowait(ev)
            except asyncio.QueueFull:
                sub.overflowed = True
                self._subscribers.discard(sub)
                _end(sub)
        return ev

    def subscribe(self, after: int | None, kinds: frozenset[str]) -> tuple[list[Event], Subscriber]:
        """Events still held with id > ``after`` (none when ``after`` is None), and a live feed."""
        backlog = [] if after is None else [e for e in self._ring if e.id > after and e.kind in kinds]
        sub = Subscriber(kinds)
        if self.closed:
            sub.queue.put_nowait(None)
        else:
            self._subscribers.add(sub)
        return backlog, sub

    def unsubscribe(self, sub: Subscriber) -> None:
        self._subscribers.discard(sub)

    def recent(self, kinds: frozenset[str] = frozenset(KINDS)) -> list[Event]:
        return [e for e in self._ring if e.kind in kinds]

    def close(self) -> None:
        """Shutdown: every live feed ends."""
        self.closed = True
        for sub in self._subscribers:
            _end(sub)
        self._subscribers.clear()


def _end(sub: Subscriber) -> None:
    """Queue the end of ``sub``'s feed (dropping its oldest event if the queue is full)."""
    if sub.queue.full():
        sub.queue.get_nowait()
    sub.queue.put_nowait(None)
