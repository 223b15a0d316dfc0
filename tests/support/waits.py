"""Bounded waits: the one way tests (and benchmarks) wait for something to become true."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    pred: Callable[[], T],
    timeout: float,
    what: str,
    *,
    step: float = 0.05,
    explain: Callable[[], str] | None = None,
) -> T:
    """Call ``pred`` every ``step`` seconds until it returns something truthy, and return that.

    After ``timeout`` seconds raise AssertionError("timed out after ... waiting for <what>"),
    followed by ``explain()`` when given (member logs, broker events ...).  ``pred`` is always
    called at least once, and once more at the deadline.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() >= deadline:
            message = f"timed out after {timeout} s waiting for {what}"
            if explain is not None:
                message += "\n" + explain()
            raise AssertionError(message)
        time.sleep(min(step, max(0.0, deadline - time.monotonic())))


async def async_wait_until(
    pred: Callable[[], T],
    timeout: float,
    what: str,
    *,
    step: float = 0.01,
    explain: Callable[[], str] | None = None,
) -> T:
    """:func:`wait_until` for code running on an event loop (in-process asyncio tests): the
    same contract, sleeping with ``asyncio.sleep`` so the loop keeps running."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() >= deadline:
            message = f"timed out after {timeout} s waiting for {what}"
            if explain is not None:
                message += "\n" + explain()
            raise AssertionError(message)
        await asyncio.sleep(min(step, max(0.0, deadline - time.monotonic())))
