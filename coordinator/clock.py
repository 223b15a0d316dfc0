"""Time as an injected dependency: the group state machine never reads the system clock."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int: ...


class SystemClock:
    """Wall-clock milliseconds (commit timestamps, group state timestamps), plus a skew that only
    moves forward: the control plane's ``POST /v1/clock/advance`` (docs/control.md, "Clock")."""

    def __init__(self) -> None:
        self.skew_ms = 0

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000 + self.skew_ms

    def advance(self, ms: int) -> int:
        if ms < 0:
            raise ValueError("time does not go backwards")
        self.skew_ms += ms
        return self.now_ms()


class FakeClock:
    """A clock that moves only when told: unit tests advance time instantly."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now = start_ms

    def now_ms(self) -> int:
        return self._now

    def advance(self, ms: int) -> int:
        if ms < 0:
            raise ValueError("time does not go backwards")
        self._now += ms
        return self._now
