"""Cooperative slicing: long loops on the event loop yield to other connections every few ms.

A handler whose work grows with what a request asks for (topics to answer, partitions to
build) calls :meth:`Slicer.tick` once per unit of work; every ``SLICE_S`` of work it yields,
so other connections are served in between (docs/reliability.md, "Limits").
"""

from __future__ import annotations

import asyncio
import time

# Longest stretch of work between two yields.
SLICE_S = 0.005


class Slicer:
    __slots__ = ("_since", "slice_s")

    def __init__(self, slice_s: float = SLICE_S) -> None:
        self.slice_s = slice_s
        self._since = time.perf_counter()

    async def tick(self) -> None:
        if time.perf_counter() - self._since >= self.slice_s:
            await asyncio.sleep(0)
            self._since = time.perf_counter()
