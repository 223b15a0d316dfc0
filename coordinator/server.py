"""The asyncio TCP server: connections, framing, in-order responses, graceful shutdown.

Like Kafka, a connection's next request is read only after the previous one is answered
(Kafka mutes the channel while a request is in flight), so responses go out in request
order even when a JoinGroup waits for seconds.  Bad input affects only its own connection:

* frame size <= 0 or > socket.request.max.bytes → close (the buffer is never allocated);
* unknown API key, or an unsupported version of anything but ApiVersions → close, as Kafka
  does (it cannot parse the request);
* ApiVersions at a version we do not serve → v0-format UNSUPPORTED_VERSION with our ranges;
* undecodable body or truncated frame → close;
* a handler that fails → Kafka's generic error response (UNKNOWN_SERVER_ERROR) where the
  response has a top-level error code, else close.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import struct
from typing import Any

from rallypoint.protocol import codec
from rallypoint.protocol.apis import API_VERSIONS_KEY, served
from rallypoint.protocol.errors import ErrorCode
from rallypoint.protocol.framing import FrameError, parse_request_header, peek_api_key_version

from .broker import Broker, CloseConnection, RequestContext
from .control import control_plane_for
from .handlers import load_handlers
from .handlers.api_versions import unsupported_version_body
from .logger import get as get_logger

log = get_logger("rallypoint.server")

_SIZE = struct.Struct(">i")

# Most bytes of answers held back while more pipelined requests are already buffered.
_COALESCE_MAX = 256 * 1024


def _frame_buffered(reader: asyncio.StreamReader) -> bool:
    """Is a whole request frame already in the reader's buffer (so answering it needs no wait)?"""
    buf = getattr(reader, "_buffer", None)  # asyncio's StreamReader buffer (uvloop uses the same class)
    if buf is None or len(buf) < 4:
        return False
    size = int.from_bytes(buf[:4], "big", signed=True)
    return 0 < size <= len(buf) - 4


# How long in-flight requests may take to finish once shutdown starts.
SHUTDOWN_GRACE_S = 5.0


class Server:
    def __init__(self, broker: Broker, host: str, port: int) -> None:
        self.broker = broker
        self.host = host
        self.port = port
        self.max_request_bytes: int = broker.config["socket.request.max.bytes"]
        self.handlers = load_handlers()
        self.hook = control_plane_for(broker)  # docs/control.md; a no-op when the control plane is off
        self._server: asyncio.base_events.Server | None = None
        self._conn_ids = itertools.count(1)
        self._connections: dict[int, tuple[asyncio.Task[None], asyncio.StreamWriter]] = {}
        self._busy: set[int] = set()
        self._closing = False
        self.shutdown_grace_s = SHUTDOWN_GRACE_S

    async def start(self) -> None:
        await self.broker.start()
        try:
            self._server = await asyncio.start_server(
                self._on_connect, self.host, self.port, reuse_address=True, limit=2**20
            )
            self.port = self._server.sockets[0].getsockname()[1]
            control = await self.hook.start(self)
        except BaseException:
            if self._server is not None:
                self._server.close()
            await self.broker.stop()  # components started above (files open) are closed again
            raise
        sock = self._server.sockets[0]
        self.port = sock.getsockname()[1]
        self.broker.bound_port = self.port
        log.info(
            "listening",
            host=self.host,
            port=self.port,
            advertised=f"{self.broker.advertised_host}:{self.broker.advertised_port}",
            node_id=self.broker.node_id,
            cluster_id=self.broker.cluster_id,
            control=control,
        )

    async def stop(self) -> None:
        """Stop accepting, answer in-flight requests (bounded), close connections, flush components.

        1. the listening socket closes, so no new connection is accepted;
        2. idle connections (waiting for a request) are closed at once;
        3. components are told to stop waiting (``begin_shutdown``): a component holding a
           request parked (a JoinGroup waiting for a rebalance) answers it now, as Kafka's
           coordinator answers NOT_COORDINATOR when it unloads a group;
        4. busy connections get ``shutdown_grace_s`` to send their answer, then are cancelled;
        5. components stop in reverse order (offsets flushed, files closed).
        """
        if self._closing:
            return
        self._closing = True
        log.info("shutting down", connections=len(self._connections), busy=len(self._busy))
        await self.hook.stop()  # held requests are released, the control listener closes
        if self._server is not None:
            self._server.close()
        for cid, (task, _writer) in list(self._connections.items()):
            if cid not in self._busy:
                task.cancel()
        await self.broker.begin_shutdown()
        busy = [t for cid, (t, _w) in self._connections.items() if cid in self._busy]
        if busy:
            _done, pending = await asyncio.wait(busy, timeout=self.shutdown_grace_s)
            for t in pending:
                t.cancel()
            if pending:
                log.warning("in-flight requests cancelled at shutdown", count=len(pending))
        remaining = [t for t, _w in self._connections.values()]
        if remaining:
            await asyncio.gather(*remaining, return_exceptions=True)
        await self.broker.stop()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 1.0)
        log.info("stopped")

    # ------------------------------------------------------------------ connections

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._closing:
            writer.close()
            return
        cid = next(self._conn_ids)
        task = asyncio.current_task()
        assert task is not None
        self._connections[cid] = (task, writer)
        peer = writer.get_extra_info("peername")
        client_host = peer[0] if isinstance(peer, tuple) else str(peer)
        try:
            await self._serve_connection(cid, client_host, reader, writer)
        except asyncio.CancelledError:
            pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception:
            log.exception("connection failed", connection=cid)
        finally:
            self._connections.pop(cid, None)
            self._busy.discard(cid)
            with contextlib.suppress(Exception):
                writer.close()

    async def _serve_connection(
        self, cid: int, client_host: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        # Answers to requests the client pipelined are coalesced into one socket write: while
        # the next request is already buffered, its answer joins the pending bytes; they go out
        # before we wait for more input.  Order and content are exactly as one write per answer
        # (Kafka answers a connection's requests one at a time, in order); it saves a syscall
        # per answer under load.
        pending = bytearray()
        try:
            while not self._closing:
                try:
                    size_bytes = await reader.readexactly(4)
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                (size,) = _SIZE.unpack(size_bytes)
                if size <= 0 or size > self.max_request_bytes:
                    log.warning(
                        "closing connection: bad frame size",
                        connection=cid,
                        client=client_host,
                        size=size,
                        max=self.max_request_bytes,
                    )
                    return
                try:
                    body = await reader.readexactly(size)
                except asyncio.IncompleteReadError:
                    log.warning("closing connection: truncated frame", connection=cid, client=client_host, size=size)
                    return
                # Busy until the answer is handed to the socket: shutdown waits for it.
                self._busy.add(cid)
                out = await self._process(cid, client_host, body)
                if out is None:
                    return  # close the connection (answers already made go out first, below)
                pending += out
                if pending and (len(pending) >= _COALESCE_MAX or not _frame_buffered(reader)):
                    writer.write(bytes(pending))
                    pending.clear()
                    await writer.drain()
                if not pending:
                    self._busy.discard(cid)
        finally:
            if pending:
                with contextlib.suppress(Exception):
                    writer.write(bytes(pending))

    async def _process(self, cid: int, client_host: str, body: bytes) -> bytes | None:
        """The response frame, b"" for no response, or None to close the connection."""
        try:
            api_key, version, corr = peek_api_key_version(body)
        except FrameError:
            log.warning("closing connection: frame shorter than a request header", connection=cid)
            return None
        api = served(api_key)
        if api is None:
            log.warning("closing connection: unknown api key", connection=cid, api_key=api_key, api_version=version)
            return None
        if not api.supports(version):
            if api_key == API_VERSIONS_KEY:
                log.info("ApiVersions at unsupported version: answering v0", connection=cid, api_version=version)
                return codec.encode_response(API_VERSIONS_KEY, 0, corr, unsupported_version_body())
            log.warning(
                "closing connection: unsupported version",
                connection=cid,
                api=api.name,
                api_version=version,
                supported=f"{api.min_version}-{api.max_version}",
            )
            return None
        try:
            header = parse_request_header(body, codec.request_header_version(api_key, version))
            request = codec.decode_request(api_key, version, body, header.size)
        except (FrameError, codec.DecodeError) as e:
            log.warning(
                "closing connection: undecodable request",
                connection=cid,
                api=api.name,
                api_version=version,
                error=str(e),
            )
            return None
        ctx = RequestContext(self.broker, api_key, version, corr, header.client_id, client_host, cid)
        try:
            response = await self.hook.handle(ctx, request, self.handlers[api_key])
        except asyncio.CancelledError:
            raise
        except CloseConnection as e:
            log.info("closing connection", connection=cid, api=api.name, reason=str(e))
            return None
        except Exception:
            log.exception("handler failed", connection=cid, api=api.name, api_version=version)
            return self._error_response(api_key, version, corr)
        if response is None:
            return b""
        try:
            return codec.encode_response(api_key, version, corr, response)
        except Exception:
            log.exception("could not encode response", api=api.name, api_version=version)
            return self._error_response(api_key, version, corr)

    def _error_response(self, api_key: int, version: int, corr: int) -> bytes | None:
        """Kafka's ``getErrorResponse``: UNKNOWN_SERVER_ERROR where a top-level code exists."""
        try:
            cls = codec.response_class(api_key, version)
            if "error_code" not in getattr(cls, "__dataclass_fields__", {}):
                return None
            body: dict[str, Any] = {"error_code": ErrorCode.UNKNOWN_SERVER_ERROR}
            return codec.encode_response(api_key, version, corr, body)
        except Exception:
            return None
