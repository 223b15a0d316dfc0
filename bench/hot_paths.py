"""Hot paths side by side: requests/s of single requests at three concurrency levels,
rallypoint vs librdkafka's mock cluster, the same raw-frame load generator, one run.

    python -m bench.hot_paths [--quick] [--seconds S]

Rows: ApiVersions v2 (the mock answers v3 with UNSUPPORTED_VERSION), Metadata v4 (one known
topic), Heartbeat v3 in a Stable one-member group and from an unknown member, OffsetCommit
v7 (one partition; rallypoint with ``rallypoint.offsets.flush=never``, like the mock: no
fsync) and OffsetFetch v5 (one partition).  Levels: connections × requests in flight per connection — 1×1, 4×8, 16×16.

The generator (:class:`_Hammer`) is an asyncio ``Protocol``: requests are encoded once; every
answer that arrives is counted by its size prefix alone (no decoding) and replaced at once by
the next request, so each connection keeps exactly ``depth`` requests in flight.  A sample
answer per cell is decoded before the load and its error code checked, so a broker that
answers an error (other than the one a row expects) fails the row instead of looking fast.
The generator runs in this process on one core; the broker under test in its own process.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from rallypoint.protocol import codec

from bench.common import Endpoint, describe, mock_peer, rallypoint, summarize
from bench.loadgen import COMMIT_V, HB_V, MD_V, Conn, join_single_member_group

LEVELS: tuple[tuple[int, int], ...] = ((1, 1), (4, 8), (16, 16))
APIV_V, FETCH_OFFSETS_V = 2, 5
TOPIC = "bench-hot"
# An unknown member's heartbeat: Kafka answers UNKNOWN_MEMBER_ID for a group it does not know;
# the mock answers GROUP_ID_NOT_FOUND (69).  Either counts as the error this row expects.
UNKNOWN_MEMBER = (25, 69)


@dataclass(frozen=True)
class Row:
    """One kind of request: how to make a connection's frame, and the error code it expects."""

    name: str
    api_key: int
    version: int
    expect: tuple[int, ...]  # error codes a sample answer may carry
    needs_member: bool


ROWS: tuple[Row, ...] = (
    Row("ApiVersions", 18, APIV_V, (0,), False),
    Row("Metadata", 3, MD_V, (0,), False),
    Row("Heartbeat (Stable group)", 12, HB_V, (0,), True),
    Row("Heartbeat (unknown member)", 12, HB_V, UNKNOWN_MEMBER, False),
    Row("OffsetCommit", 8, COMMIT_V, (0,), True),
    Row("OffsetFetch", 9, FETCH_OFFSETS_V, (0,), False),
)


def _body(row: Row, group: str, gen: int, member: str) -> dict[str, Any]:
    if row.api_key == 18:
        return {"client_software_name": "bench", "client_software_version": "1"}
    if row.api_key == 3:
        return {"topics": [{"name": TOPIC}], "allow_auto_topic_creation": False}
    if row.api_key == 12:
        return {"group_id": group, "generation_id": gen, "member_id": member}
    if row.api_key == 8:
        partition = {"partition_index": 0, "committed_offset": 42, "committed_metadata": ""}
        return {
            "group_id": group,
            "generation_id_or_member_epoch": gen,
            "member_id": member,
            "topics": [{"name": TOPIC, "partitions": [partition]}],
        }
    if row.api_key == 9:
        return {"group_id": group, "topics": [{"name": TOPIC, "partition_indexes": [0]}]}
    raise ValueError(row)


def _error_code(row: Row, resp: Any) -> int:
    if row.api_key == 3:
        return max((int(t.error_code) for t in resp.topics), default=0)
    if row.api_key in (8, 9):
        codes = [int(p.error_code) for t in resp.topics for p in t.partitions]
        return max([*codes, int(getattr(resp, "error_code", 0))])
    return int(resp.error_code)


class _Hammer(asyncio.Protocol):
    """Keeps ``depth`` copies of ``frame`` in flight on one connection and counts answers."""

    def __init__(self, frame: bytes, depth: int) -> None:
        self.frame = frame
        self.depth = depth
        self.buf = bytearray()
        self.count = 0
        self.counting = False
        self.running = True
        self.transport: asyncio.Transport | None = None
        self.lost = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(self.frame * self.depth)

    def answers_in(self, data: bytes) -> int:
        """How many whole answers ``data`` completes (by their size prefixes alone)."""
        buf = self.buf
        buf += data
        pos, n, end = 0, 0, len(buf)
        while end - pos >= 4:
            size = int.from_bytes(buf[pos : pos + 4], "big")
            if end - pos - 4 < size:
                break
            pos += 4 + size
            n += 1
        if pos:
            del buf[:pos]
        return n

    def data_received(self, data: bytes) -> None:
        n = self.answers_in(data)
        if n:
            if self.counting:
                self.count += n
            if self.running and self.transport is not None:
                self.transport.write(self.frame * n)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(exc)


async def _frames(ep: Endpoint, row: Row, connections: int) -> list[bytes]:
    """One request frame per connection, each checked once with a decoded answer."""
    run = uuid.uuid4().hex[:8]
    setup = await Conn.open(ep.host, ep.port)
    try:
        frames = []
        for i in range(connections):
            group = f"bench-hot-{run}-{i}"
            gen, member = -1, "unknown-member"
            if row.needs_member:
                gen, member = await join_single_member_group(setup, group)
            elif row.api_key == 12:
                gen = 1
            body = _body(row, group, gen, member)
            resp = await setup.call(row.api_key, row.version, body)
            code = _error_code(row, resp)
            if code not in row.expect:
                raise RuntimeError(f"{row.name} on {ep.name} answered error {code}, expected {row.expect}")
            frames.append(codec.encode_request(row.api_key, row.version, 1, body, "bench"))
        return frames
    finally:
        setup.close()


async def _ensure_topic(ep: Endpoint) -> None:
    conn = await Conn.open(ep.host, ep.port)
    try:
        deadline = time.perf_counter() + 20
        while time.perf_counter() < deadline:
            resp = await conn.call(3, MD_V, {"topics": [{"name": TOPIC}], "allow_auto_topic_creation": True})
            if all(int(t.error_code) == 0 and t.partitions for t in resp.topics):
                return
            await asyncio.sleep(0.1)
        raise RuntimeError(f"{ep.name} did not create {TOPIC}")
    finally:
        conn.close()


async def measure(ep: Endpoint, row: Row, connections: int, depth: int, seconds: float) -> float:
    """Answers/s of ``row`` over ``connections`` × ``depth`` for ``seconds`` (after a short warm-up)."""
    await _ensure_topic(ep)
    frames = await _frames(ep, row, connections)
    loop = asyncio.get_running_loop()
    hammers: list[_Hammer] = []
    for frame in frames:
        _t, h = await loop.create_connection(lambda f=frame: _Hammer(f, depth), ep.host, ep.port)  # type: ignore[misc]
        hammers.append(h)
    try:
        await asyncio.sleep(min(0.3, seconds / 4))  # warm-up: connections up, caches filled
        for h in hammers:
            h.counting = True
        start = time.perf_counter()
        await asyncio.sleep(seconds)
        for h in hammers:
            h.counting = False
        elapsed = time.perf_counter() - start
        if any(h.lost.done() for h in hammers):
            raise RuntimeError(f"{ep.name} closed a connection during {row.name}")
        return sum(h.count for h in hammers) / elapsed
    finally:
        for h in hammers:
            h.running = False
            if h.transport is not None:
                h.transport.close()


def run(quick: bool = False, seconds: float | None = None) -> list[dict[str, Any]]:
    secs = seconds if seconds is not None else (1.0 if quick else 2.5)
    runs = 1 if quick else 3
    starters: list[Callable[[], AbstractContextManager[Endpoint]]] = [
        lambda: rallypoint({"rallypoint.offsets.flush": "never"}),
        mock_peer,
    ]
    samples: dict[tuple[str, int, int], dict[str, list[float]]] = {}
    failures: dict[tuple[str, int, int], list[str]] = {}
    for starter in starters:
        with starter() as ep:
            for row in ROWS:
                for conns, depth in LEVELS:
                    key = (row.name, conns, depth)
                    for _ in range(runs):
                        try:
                            value = asyncio.run(measure(ep, row, conns, depth, secs))
                        except Exception as e:  # one failing cell must not hide the others
                            failures.setdefault(key, []).append(f"{ep.name}: {type(e).__name__}: {e}")
                            print(f"{row.name} {conns}x{depth} on {ep.name}: FAILED: {e}", flush=True)
                            break
                        samples.setdefault(key, {}).setdefault(ep.name, []).append(value)
    rows: list[dict[str, Any]] = []
    for row in ROWS:
        for conns, depth in LEVELS:
            key = (row.name, conns, depth)
            per = {name: summarize(vals) for name, vals in samples.get(key, {}).items()}
            name = f"{row.name} {conns}×{depth}"
            entry: dict[str, Any] = {"name": name, "unit": "req/s", "brokers": per, "higher_is_better": True}
            if "rallypoint" in per and "librdkafka-mock" in per:
                entry["ratio"] = per["rallypoint"]["median"] / per["librdkafka-mock"]["median"]
                print(
                    f"{name}: rallypoint {describe(per['rallypoint'], 'req/s')} | "
                    f"librdkafka-mock {describe(per['librdkafka-mock'], 'req/s')} | {entry['ratio']:.2f}x",
                    flush=True,
                )
            else:
                entry["ratio"] = float("nan")
            if key in failures:
                entry["note"] = "; ".join(failures[key])
            rows.append(entry)
    return rows


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--seconds", type=float)
    a = p.parse_args()
    run(a.quick, a.seconds)
