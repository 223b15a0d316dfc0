"""Graceful shutdown of coordinator.server.Server, in-process with real sockets on 127.0.0.1.

Handlers are swapped for controllable ones so a request can be held in flight while
``stop()`` runs.  (The SIGTERM path of the real process is in tests/test_bad_input.py.)
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from rallypoint import config as config_mod
from rallypoint.assemble import build_broker
from rallypoint.broker import RequestContext
from rallypoint.protocol import codec
from rallypoint.protocol.errors import ErrorCode
from rallypoint.server import Server

pytestmark = pytest.mark.unit

WAIT = 5.0  # bound on every wait in this file


class Recorder:
    """A component that records its life cycle and can hold requests parked."""

    def __init__(self, events: list[str]) -> None:
        self.events = events
        self.parked: list[asyncio.Future[int]] = []

    async def start(self) -> None:
        self.events.append("start")

    async def begin_shutdown(self) -> None:
        self.events.append("begin_shutdown")
        for f in self.parked:
            if not f.done():
                f.set_result(int(ErrorCode.NOT_COORDINATOR))

    async def stop(self) -> None:
        self.events.append("stop")

    def park(self) -> asyncio.Future[int]:
        f: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.parked.append(f)
        return f


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[tuple[Server, Recorder, list[str]]]:
    cfg = config_mod.load({"port": "0", "data.dir": str(tmp_path)}, env={})
    broker = build_broker(cfg)
    events: list[str] = []
    recorder = Recorder(events)
    broker.add_component(recorder)
    server = Server(broker, "127.0.0.1", 0)
    await server.start()
    yield server, recorder, events
    await asyncio.wait_for(server.stop(), WAIT + server.shutdown_grace_s)


async def _connect(server: Server) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.wait_for(asyncio.open_connection("127.0.0.1", server.port), WAIT)


async def _send_api_versions(writer: asyncio.StreamWriter, corr: int) -> None:
    writer.write(codec.encode_request(18, 3, corr, {"client_software_name": "t", "client_software_version": "1"}))
    await writer.drain()


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, Any]:
    (size,) = struct.unpack(">i", await asyncio.wait_for(reader.readexactly(4), WAIT))
    body = await asyncio.wait_for(reader.readexactly(size), WAIT)
    return codec.decode_response_frame(18, 3, body)


async def _assert_closed(reader: asyncio.StreamReader) -> None:
    assert await asyncio.wait_for(reader.read(1), WAIT) == b""


async def test_in_flight_request_is_answered_then_connection_closed_then_components_stop(
    rig: tuple[Server, Recorder, list[str]],
) -> None:
    server, _recorder, events = rig
    entered = asyncio.Event()

    async def slow(ctx: RequestContext, request: Any) -> dict[str, Any]:
        entered.set()
        await asyncio.sleep(0.3)
        events.append("answered")
        return {"error_code": 0, "api_keys": [{"api_key": 18, "min_version": 0, "max_version": 4}]}

    server.handlers[18] = slow
    reader, writer = await _connect(server)
    await _send_api_versions(writer, 5)
    await asyncio.wait_for(entered.wait(), WAIT)
    stopping = asyncio.create_task(server.stop())
    await asyncio.sleep(0.05)
    with pytest.raises(OSError):  # no longer accepting
        await asyncio.wait_for(asyncio.open_connection("127.0.0.1", server.port), WAIT)
    corr, resp = await _read_response(reader)
    assert corr == 5 and int(resp.error_code) == 0
    await _assert_closed(reader)
    await asyncio.wait_for(stopping, WAIT)
    assert events == ["start", "begin_shutdown", "answered", "stop"]
    writer.close()


async def test_parked_request_is_released_by_begin_shutdown(rig: tuple[Server, Recorder, list[str]]) -> None:
    server, recorder, events = rig
    entered = asyncio.Event()

    async def parked(ctx: RequestContext, request: Any) -> dict[str, Any]:
        future = recorder.park()
        entered.set()
        return {"error_code": await future}

    server.handlers[18] = parked
    reader, writer = await _connect(server)
    await _send_api_versions(writer, 9)
    await asyncio.wait_for(entered.wait(), WAIT)
    started = time.monotonic()
    await asyncio.wait_for(server.stop(), WAIT)
    assert time.monotonic() - started < 1.0, "shutdown waited for the grace period instead of releasing"
    corr, resp = await _read_response(reader)
    assert corr == 9 and int(resp.error_code) == ErrorCode.NOT_COORDINATOR
    await _assert_closed(reader)
    assert events == ["start", "begin_shutdown", "stop"]
    writer.close()


async def test_stuck_request_is_cancelled_after_the_grace_period(rig: tuple[Server, Recorder, list[str]]) -> None:
    server, _recorder, events = rig
    server.shutdown_grace_s = 0.3
    entered = asyncio.Event()

    async def stuck(ctx: RequestContext, request: Any) -> dict[str, Any]:
        entered.set()
        await asyncio.sleep(3600)
        raise AssertionError("unreachable")

    server.handlers[18] = stuck
    reader, writer = await _connect(server)
    await _send_api_versions(writer, 1)
    await asyncio.wait_for(entered.wait(), WAIT)
    started = time.monotonic()
    await asyncio.wait_for(server.stop(), WAIT)
    elapsed = time.monotonic() - started
    assert 0.25 <= elapsed < 2.0
    await _assert_closed(reader)  # no answer: closed
    assert events[-1] == "stop"
    writer.close()


async def test_idle_connections_are_closed_at_once(rig: tuple[Server, Recorder, list[str]]) -> None:
    server, _recorder, _events = rig
    idle = [await _connect(server) for _ in range(5)]
    # one connection mid-frame: a size and half a header
    partial_reader, partial_writer = await _connect(server)
    partial_writer.write(struct.pack(">i", 100) + b"\x00\x12")
    await partial_writer.drain()
    reader, writer = await _connect(server)
    await _send_api_versions(writer, 3)
    assert (await _read_response(reader))[0] == 3
    started = time.monotonic()
    await asyncio.wait_for(server.stop(), WAIT)
    assert time.monotonic() - started < 1.0
    for r, _w in [*idle, (partial_reader, partial_writer), (reader, writer)]:
        await _assert_closed(r)
    for _r, w in [*idle, (partial_reader, partial_writer), (reader, writer)]:
        w.close()
