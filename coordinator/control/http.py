"""A small HTTP/1.1 server on the broker's event loop, for the control plane's JSON endpoints.

Parsing and framing are h11's (a sans-IO HTTP/1.1 implementation: no threads, no second
process; the socket I/O is ours, on asyncio).  Input is bounded: a request head over
:data:`MAX_HEAD_BYTES` or a body over :data:`MAX_BODY_BYTES` is refused and the connection closed.
Connections are kept alive between requests; a streamed answer (server-sent events) holds its
connection until the stream ends or the client goes away.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final
from urllib.parse import parse_qsl, unquote

import h11
from msgspec import Struct, field

from ..logger import get as get_logger

log = get_logger("rallypoint.control")

MAX_HEAD_BYTES: Final = 64 * 1024
MAX_BODY_BYTES: Final = 1024 * 1024
READ_CHUNK: Final = 64 * 1024
IDLE_TIMEOUT_S: Final = 300.0  # a kept-alive connection with no request for this long is closed
STOP_GRACE_S: Final = 0.2
LINGER_S: Final = 1.0  # after an error answer, input is drained this long (and LINGER_BYTES) before closing
LINGER_BYTES: Final = 4 * 1024 * 1024  # at most this much input is drained after an error answer

REASONS: Final = {
    200: b"OK",
    201: b"Created",
    204: b"No Content",
    400: b"Bad Request",
    401: b"Unauthorized",
    404: b"Not Found",
    405: b"Method Not Allowed",
    408: b"Request Timeout",
    413: b"Content Too Large",
    431: b"Request Header Fields Too Large",
    500: b"Internal Server Error",
    503: b"Service Unavailable",
}


class HttpError(Exception):
    def __init__(self, status: int, message: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or []


class HttpRequest(Struct):
    """One parsed HTTP request: method, target (path segments and query), headers and body."""

    method: str
    target: str
    segments: list[str]  # path segments, percent-decoded one by one (a group id may hold "/")
    query: list[tuple[str, str]]
    headers: dict[str, str]  # lower-case names; a repeated header keeps its last value
    body: bytes

    def json(self) -> Any:
        """The body as JSON (None when empty); :class:`HttpError` 400 when it is not JSON."""
        if not self.body.strip():
            return None
        try:
            return json.loads(self.body, parse_constant=_no_constant)
        except (ValueError, UnicodeDecodeError) as e:
            raise HttpError(400, f"bad JSON: {e}") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


class HttpResponse(Struct):
    """An answer to send: a status with a JSON body, a raw body or a stream (server-sent events)."""

    status: int
    body: Any = None  # JSON-able; not sent for 204
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    stream: AsyncIterator[bytes] | None = None  # a streamed body (text/event-stream)
    raw: bytes | None = None  # a body sent as it is with ``content_type`` (the live page), not JSON
    content_type: bytes = b"application/json"

    @classmethod
    def error(cls, status: int, message: str, headers: list[tuple[bytes, bytes]] | None = None) -> HttpResponse:
        return cls(status, {"error": message, "status": status}, headers or [])


App = Callable[[HttpRequest], Awaitable[HttpResponse]]


def _parse_target(target: str) -> tuple[list[str], list[tuple[str, str]]]:
    path, _, query = target.partition("?")
    segments = [unquote(s) for s in path.split("/") if s != ""]
    try:
        params = parse_qsl(query, keep_blank_values=True, strict_parsing=False)
    except ValueError as e:
        raise HttpError(400, f"bad query string: {e}") from None
    return segments, params


class HttpServer:
    def __init__(self, app: App) -> None:
        self.app = app
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._on_connect, host, port, reuse_address=True)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._tasks:  # ended streams send their last chunk; then whatever still runs is cancelled
            await asyncio.wait(list(self._tasks), timeout=STOP_GRACE_S)
        for t in list(self._tasks):
            t.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        except (asyncio.CancelledError, ConnectionError, TimeoutError):
            pass
        except Exception:
            log.exception("control connection failed")
        finally:
            self._tasks.discard(task)
            with contextlib.suppress(Exception):
                writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        while True:
            try:
                request = await self._read_request(conn, reader)
            except HttpError as e:
                await self._send_error_and_close(conn, reader, writer, e)
                return
            except h11.RemoteProtocolError as e:
                status = e.error_status_hint if e.error_status_hint in REASONS else 400
                await self._send_error_and_close(conn, reader, writer, HttpError(status, f"bad HTTP request: {e}"))
                return
            if request is None:
                return
            try:
                response = await self.app(request)
            except HttpError as e:
                response = HttpResponse.error(e.status, e.message, e.headers)
            except Exception:
                log.exception("control endpoint failed", method=request.method, target=request.target)
                response = HttpResponse.error(500, "internal error (see the broker's log)")
            await self._send(conn, reader, writer, request, response)
            if response.stream is not None:
                return  # a stream ends its connection
            if conn.our_state is h11.MUST_CLOSE or conn.their_state is not h11.DONE:
                return
            try:
                conn.start_next_cycle()
            except h11.LocalProtocolError:
                return

    async def _read_request(self, conn: h11.Connection, reader: asyncio.StreamReader) -> HttpRequest | None:
        head: h11.Request | None = None
        body = bytearray()
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                try:
                    data = await asyncio.wait_for(reader.read(READ_CHUNK), IDLE_TIMEOUT_S if head is None else 30.0)
                except TimeoutError:
                    return None
                conn.receive_data(data)
                if not data and head is None and conn.their_state is h11.IDLE:
                    return None
                continue
            if isinstance(event, h11.Request):
                head = event
            elif isinstance(event, h11.Data):
                body += event.data
                if len(body) > MAX_BODY_BYTES:
                    raise HttpError(413, f"body larger than {MAX_BODY_BYTES} bytes")
            elif isinstance(event, h11.EndOfMessage):
                assert head is not None
                target = head.target.decode("latin-1")
                segments, query = _parse_target(target)
                headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in head.headers}
                return HttpRequest(head.method.decode("ascii"), target, segments, query, headers, bytes(body))
            elif isinstance(event, h11.ConnectionClosed):
                return None
            elif event is h11.PAUSED:
                return None

    async def _send(
        self,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        request: HttpRequest,
        response: HttpResponse,
    ) -> None:
        reason = REASONS.get(response.status, b"")
        if response.stream is not None:
            headers = [
                (b"content-type", b"text/event-stream; charset=utf-8"),
                (b"cache-control", b"no-cache"),
                (b"connection", b"close"),
                *response.headers,
            ]
            writer.write(conn.send(h11.Response(status_code=response.status, headers=headers, reason=reason)))
            await writer.drain()
            await self._stream(conn, reader, writer, response.stream)
            return
        if response.raw is not None:
            payload = response.raw
        else:
            payload = b"" if response.status == 204 else json.dumps(response.body, indent=None).encode() + b"\n"
        headers = [*response.headers]
        if response.status != 204:
            headers += [(b"content-type", response.content_type), (b"content-length", str(len(payload)).encode())]
        writer.write(conn.send(h11.Response(status_code=response.status, headers=headers, reason=reason)))
        if payload and request.method != "HEAD":
            writer.write(conn.send(h11.Data(data=payload)))
        writer.write(conn.send(h11.EndOfMessage()))
        await writer.drain()

    async def _stream(
        self,
        conn: h11.Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        chunks: AsyncIterator[bytes],
    ) -> None:
        """Send ``chunks`` until they end or the client goes away (its side of the socket closes).
        The connection closes afterwards either way (the answer says ``connection: close``)."""
        gone = asyncio.ensure_future(reader.read(1))
        try:
            while True:
                nxt = asyncio.ensure_future(anext(chunks))
                done, _ = await asyncio.wait({nxt, gone}, return_when=asyncio.FIRST_COMPLETED)
                if gone in done:
                    nxt.cancel()
                    with contextlib.suppress(BaseException):
                        await nxt
                    return
                try:
                    chunk = nxt.result()
                except StopAsyncIteration:
                    break
                writer.write(conn.send(h11.Data(data=chunk)))
                await writer.drain()
            writer.write(conn.send(h11.EndOfMessage()))
            await writer.drain()
        finally:
            gone.cancel()
            with contextlib.suppress(BaseException):
                await gone
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(BaseException):
                    await aclose()

    async def _send_error_and_close(
        self, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, e: HttpError
    ) -> None:
        """Answer ``e`` and close gracefully: what the client is still sending is read and dropped
        for a moment (bounded), so that closing with unread input does not reset the connection
        before the client has read the answer."""
        if conn.our_state not in (h11.IDLE, h11.SEND_RESPONSE):
            return
        payload = json.dumps({"error": e.message, "status": e.status}).encode() + b"\n"
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(payload)).encode()),
            (b"connection", b"close"),
        ]
        with contextlib.suppress(h11.LocalProtocolError, ConnectionError):
            writer.write(
                conn.send(h11.Response(status_code=e.status, headers=headers, reason=REASONS.get(e.status, b"")))
            )
            writer.write(conn.send(h11.Data(data=payload)))
            writer.write(conn.send(h11.EndOfMessage()))
            await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()
            deadline = asyncio.get_running_loop().time() + LINGER_S
            dropped = 0
            while dropped < LINGER_BYTES:
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                try:
                    data = await asyncio.wait_for(reader.read(READ_CHUNK), left)
                except TimeoutError:
                    break
                if not data:
                    break
                dropped += len(data)
