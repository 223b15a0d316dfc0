"""The asyncio TCP server: connections, framing, in-order responses, limits, graceful shutdown.

Why one module of about 880 lines: everything a connection goes through, from accept to close
(limits, authentication, framing, the in-order answer queue, idle and shutdown rules), is one
per-connection loop; splitting it would spread that loop's rules over several files.

Like Kafka, a connection's next request is read only after the previous one is answered
(Kafka mutes the channel while a request is in flight), so responses go out in request
order even when a JoinGroup waits for seconds.  Bad input affects only its own connection:

* frame size <= 0 or > socket.request.max.bytes → close (the buffer is never allocated);
* unknown API key, or an unsupported version of anything but ApiVersions → close, as Kafka
  does (it cannot parse the request);
* ApiVersions at a version we do not serve → v0-format UNSUPPORTED_VERSION with our ranges;
* undecodable body or truncated frame → close (a null non-nullable array and more than
  ``rallypoint.request.max.elements`` elements are undecodable: :mod:`protocol.tagged`);
* a handler that fails → Kafka's generic error response (UNKNOWN_SERVER_ERROR) where the
  response has a top-level error code, else close.

Every closing is one warning line.  Resource limits (docs/reliability.md, "Limits"):

* ``max.connections`` / ``max.connections.per.ip``: a connection beyond them is closed at once;
* ``connections.max.idle.ms``: a connection that sends nothing, or does not read what it is
  sent, for that long is closed;
* ``queued.max.requests``: requests read and not yet handed to their handler (being decoded),
  all connections together; at the limit, connections wait before decoding the next one;
* ``queued.max.request.bytes`` (off by default, as in Kafka): the announced sizes of the
  requests being read or served, all connections together; while that budget is spent, no
  connection starts reading another request body (:class:`_BytePool`);
* ``rallypoint.connection.max.queued.response.bytes``: answers waiting for a peer that does not
  read; above it the connection's next request waits until the peer reads (then the idle
  timeout drops it); ``socket.send.buffer.bytes`` / ``socket.receive.buffer.bytes`` size the
  kernel's buffers as Kafka does, so they do not grow to megabytes for such a peer either;
* fairness: a connection whose next request is already buffered yields to the others before
  serving it, so a pipeline of thousands of requests is served interleaved with everyone else;
  a connection the peer reset is noticed at that point and served no further;
* large bodies are decoded, and large answers built and encoded, in a worker thread, so the
  event loop keeps serving other connections meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import itertools
import socket
import struct
from collections import Counter, deque
from typing import Any

from msgspec import Struct
from rallypoint.protocol import codec
from rallypoint.protocol.apis import API_VERSIONS_KEY, served
from rallypoint.protocol.errors import ErrorCode
from rallypoint.protocol.framing import FrameError, client_id_and_size, peek_api_key_version

from . import routing
from .broker import Broker, CloseConnection, RequestContext
from .cluster import CURRENT_LISTENER, CURRENT_NODE
from .control import control_plane_for
from .handlers import load_handlers
from .handlers.api_versions import unsupported_version_body
from .logger import get as get_logger
from .security import listeners as listeners_mod
from .security.listeners import CURRENT_ENDPOINT, Listener
from .security.sasl import SASL_HANDSHAKE, SaslAuthenticator, parse_mechanisms
from .security.tls import server_context

log = get_logger("rallypoint.server")

_SIZE = struct.Struct(">i")

# Bytes a connection's StreamReader buffers ahead of what is being served (asyncio pauses
# reading from the socket at twice this).  A frame larger than this is read as it arrives.
_READ_AHEAD = 64 * 1024
# Bodies at least this large are decoded in a worker thread (their element count, bounded by
# rallypoint.request.max.elements, may take milliseconds to walk).
_DECODE_OFF_LOOP_BYTES = 16 * 1024
# Requests a connection is served in a row from what it already sent before it takes a turn
# (Kafka clients keep up to 5 in flight by default, so they rarely need one); see
# Server._serve_connection.  16 rather than 8: with 16 connections of 16 in flight each, 20 %
# more requests/s (a turn flushes and yields; docs/BENCHMARKS.md, item 33), and a turn is still
# well under a millisecond of work.
_TURN = 16
# Answers with at least this many array elements are built and encoded in a worker thread.
_ENCODE_OFF_LOOP_ELEMENTS = 2000
# APIs whose answer holds at most one struct per struct of the request (Produce, OffsetCommit,
# Heartbeat, SyncGroup, LeaveGroup, ApiVersions' fixed list, FindCoordinator, InitProducerId,
# AddPartitionsToTxn, AddOffsetsToTxn, EndTxn, TxnOffsetCommit): for a request small enough to
# be decoded on the loop the answer is small too, and is not counted first.
_ANSWER_BOUNDED_BY_REQUEST = frozenset({0, 8, 10, 12, 13, 14, 18, 22, 24, 25, 26, 28})
OFFSET_FETCH = 9


def _answer_bounded(api_key: int, request: Any) -> bool:
    """Whether the answer holds at most one struct per struct of the request: the APIs above,
    and an OffsetFetch that names its partitions (not "every committed offset of the group",
    a null topic list)."""
    if api_key in _ANSWER_BOUNDED_BY_REQUEST:
        return True
    if api_key == OFFSET_FETCH:
        groups = getattr(request, "groups", None)  # v8+: one entry per group
        if groups is not None:
            return all(g.topics is not None for g in groups)
        return getattr(request, "topics", None) is not None
    return False


def _frame_buffered(reader: asyncio.StreamReader) -> int:
    """The size of the next request frame if all of it is already in the reader's buffer (so
    answering it needs no wait), else 0."""
    buf = getattr(reader, "_buffer", None)  # asyncio's StreamReader buffer (uvloop uses the same class)
    if buf is None or len(buf) < 4:
        return 0
    size = int.from_bytes(buf[:4], "big", signed=True)
    return size if 0 < size <= len(buf) - 4 else 0


def _take_frame(reader: asyncio.StreamReader, size: int) -> bytes:
    """The body of a frame of ``size`` that :func:`_frame_buffered` found whole in the buffer,
    taken out of it as ``readexactly`` would (without its two coroutines per request)."""
    buf: bytearray = getattr(reader, "_buffer")  # noqa: B009  (private: typeshed does not declare it)
    end = 4 + size
    body = bytes(buf[4:end])
    del buf[:end]
    getattr(reader, "_maybe_resume_transport")()  # noqa: B009  (flow control, as readexactly does)
    return body


class _BytePool:
    """Kafka's ``SimpleMemoryPool`` as ``SocketServer`` uses it (non-strict): a request may take
    its bytes while any are left (so the pool can dip below zero by up to one request), else it
    waits, first come first served, until answered requests give theirs back."""

    __slots__ = ("_waiters", "available")

    def __init__(self, capacity: int) -> None:
        self.available = capacity
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def acquire(self, n: int) -> None:
        if self.available <= 0 or self._waiters:
            turn = asyncio.get_running_loop().create_future()
            self._waiters.append(turn)
            try:
                await turn
            except asyncio.CancelledError:
                if turn in self._waiters:
                    self._waiters.remove(turn)
                else:
                    self._wake()  # its turn came with the cancellation: pass it on
                raise
        self.available -= n
        self._wake()

    def release(self, n: int) -> None:
        self.available += n
        self._wake()

    def _wake(self) -> None:
        while self.available > 0 and self._waiters:
            turn = self._waiters.popleft()
            if not turn.done():
                turn.set_result(None)
                return


class _Answers:
    """A connection's answers not yet handed to its socket.

    Answers made while the connection's task runs without pausing (requests the client
    pipelined) are coalesced into one socket write; whenever the task pauses -- it waits for
    input, it takes its turn, a handler waits -- they go out, so an answer never waits for the
    requests after it.  Order and content are exactly those of one write per answer; it saves
    a syscall per answer under load.  The connection's loop flushes before it waits for input
    and after its turn; before each request that might wait (the handler's, the request
    memory's) it calls :meth:`guard`, which has a callback flush at the next event-loop
    iteration if answers are waiting -- so the last answer of a batch, the usual case, costs
    no callback.
    """

    __slots__ = ("_buf", "_timer", "_writer")

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._writer = writer
        self._buf = bytearray()
        self._timer: asyncio.Handle | None = None

    def __len__(self) -> int:
        return len(self._buf)

    def add(self, data: bytes) -> None:
        self._buf += data

    def guard(self) -> None:
        """Answers waiting now go out at the next event-loop iteration unless flushed before:
        the task is about to do something that may pause."""
        if self._buf and self._timer is None:
            self._timer = asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self.cancel()
        if self._buf:
            data = bytes(self._buf)
            self._buf.clear()
            if not self._writer.transport.is_closing():
                self._writer.write(data)

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class _Idle(Exception):
    """No progress on a connection for connections.max.idle.ms."""

    @classmethod
    def after(cls, timeout_s: float, doing: str) -> _Idle:
        return cls(f"no progress for {timeout_s * 1000:.0f} ms while {doing}")


class _IdleWatch:
    """connections.max.idle.ms while a connection waits for its next request, without a timer
    per wait (``asyncio.timeout`` made and cancelled one per request: several per cent of a
    small request's cost).  One handle per connection fires at the earliest moment the wait
    could have lasted the whole timeout; a wait that began later moves it on, so a busy
    connection re-arms it about once per timeout, not once per request."""

    __slots__ = ("expired", "handle", "loop", "since", "task", "timeout", "waiting")

    def __init__(self, timeout: float, task: asyncio.Task[Any]) -> None:
        self.timeout = timeout
        self.task = task
        self.loop = asyncio.get_running_loop()
        self.handle: asyncio.TimerHandle | None = None
        self.since = 0.0
        self.waiting = False
        self.expired = False

    def begin(self) -> None:
        self.since = self.loop.time()
        self.waiting = True
        if self.handle is None:
            self.handle = self.loop.call_at(self.since + self.timeout, self._check)

    def _check(self) -> None:
        self.handle = None
        if not self.waiting:
            return  # the next wait arms it again
        if self.loop.time() - self.since >= self.timeout:
            self.expired = True
            self.task.cancel()
        else:
            self.handle = self.loop.call_at(self.since + self.timeout, self._check)

    def close(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None


# (api_key << 16 | version) -> (API name, request header version), for the versions served,
# filled as requests arrive (_check_served).
_SERVED: dict[int, tuple[str, int]] = {}


class _Decoded(Struct):
    """A decoded request frame: its header's fields, the API's name and the request body."""

    api_key: int
    version: int
    corr: int
    api_name: str
    client_id: str | None
    request: Any


# How long in-flight requests may take to finish once shutdown starts.
SHUTDOWN_GRACE_S = 5.0


# A TLS handshake that takes longer than this closes the connection (a plaintext client on a
# TLS listener fails at once; one that sends nothing does not hold a connection forever).
TLS_HANDSHAKE_TIMEOUT_S = 10.0


class Server:
    def __init__(self, broker: Broker, host: str, port: int, listeners: list[Listener] | None = None) -> None:
        """``listeners`` default: the config's ``listeners``, else ``PLAINTEXT://host:port``."""
        self.broker = broker
        cfg = broker.config
        if listeners is None:
            if cfg["listeners"]:
                listeners = listeners_mod.from_config(cfg.values)
            else:
                ad_host, ad_port = cfg["advertised.host"], cfg["advertised.port"]
                listeners = [Listener("PLAINTEXT", "PLAINTEXT", host, port, ad_host, ad_port)]
        cluster = broker.cluster
        if not cluster.single or cfg["rallypoint.advertised.listeners"]:
            listeners = listeners_mod.per_node(listeners, cluster.nodes, cfg["rallypoint.advertised.listeners"])
        for listener in listeners:
            if listener.node_id < 0:
                listener.node_id = broker.node_id
        self.listeners = listeners
        self.host = listeners[0].host
        self.port = listeners[0].port
        self.sasl_mechanisms = parse_mechanisms(cfg["sasl.enabled.mechanisms"])
        self.reauth_ms: int = cfg["connections.max.reauth.ms"]
        self.sasl_max_receive: int = cfg["sasl.server.max.receive.size"]
        self.failed_auth_delay_s: float = cfg["connection.failed.authentication.delay.ms"] / 1000
        self.max_request_bytes: int = cfg["socket.request.max.bytes"]
        self.max_elements: int = cfg["rallypoint.request.max.elements"]
        self.max_connections: int = cfg["max.connections"]
        self.max_connections_per_ip: int = cfg["max.connections.per.ip"]
        idle_ms: int = cfg["connections.max.idle.ms"]
        self.idle_timeout_s: float | None = None if idle_ms < 0 else idle_ms / 1000
        self.max_queued_response_bytes: int = cfg["rallypoint.connection.max.queued.response.bytes"]
        self.send_buffer_bytes: int = cfg["socket.send.buffer.bytes"]
        self.receive_buffer_bytes: int = cfg["socket.receive.buffer.bytes"]
        self._request_slots = asyncio.Semaphore(cfg["queued.max.requests"])
        self._slots_free: int = cfg["queued.max.requests"]  # what _request_slots has left (its locked() is slow)
        pool: int = cfg["queued.max.request.bytes"]
        self._memory = _BytePool(pool) if pool > 0 else None
        self._pipeline_turn = asyncio.Lock()
        self.handlers = routing.guarded(load_handlers(), broker)  # NOT_COORDINATOR on the wrong node
        self.hook = control_plane_for(broker)  # docs/control.md; a no-op when the control plane is off
        self._server: asyncio.base_events.Server | None = None
        self._servers: list[asyncio.base_events.Server] = []
        self._conn_ids = itertools.count(1)
        self._connections: dict[int, tuple[asyncio.Task[None], asyncio.StreamWriter]] = {}
        self._conn_node: dict[int, int] = {}  # connection -> the node whose listener took it
        self._per_ip: Counter[str] = Counter()
        self._busy: set[int] = set()
        self._closing = False
        self.shutdown_grace_s = SHUTDOWN_GRACE_S
        self.owns_process = True  # False when embedded in another program (rallypoint.testing)

    async def start(self) -> None:
        await self.broker.start()
        # What start-up built (schema classes, handlers, loaded state) lives as long as the
        # process: keep it out of the garbage collector's full passes, whose pauses grow with
        # every object they walk and would stall all connections at once.  (Not when embedded:
        # the host program's objects would be frozen too.)
        if self.owns_process:
            gc.freeze()
        try:
            for listener in self.listeners:
                server = await self._listen(listener, listener.port)
                self._servers.append(server)
                listener.bound_port = server.sockets[0].getsockname()[1]
            self._server = self._servers[0]
            self.port = self.listeners[0].bound_port
            for listener in self.listeners:
                eps = self.broker.cluster.endpoints.setdefault(listener.node_id, {})
                eps[listener.name] = self._advertised(listener)
            self.broker.bound_port = self.port
            control = await self.hook.start(self)
        except BaseException:
            for server in self._servers:
                server.close()
            await self.broker.stop()  # components started above (files open) are closed again
            raise
        default_host = self.broker.config.advertised_host
        advertised = [self._advertised(listener) for listener in self.listeners]
        log.info(
            "listening",
            host=self.host,
            port=self.port,
            advertised=f"{advertised[0][0]}:{advertised[0][1]}",
            listeners=[listener.url() for listener in self.listeners],
            advertised_listeners=[
                f"{listener.name}://{listener.advertised(default_host)[0]}:{listener.advertised(default_host)[1]}"
                for listener in self.listeners
            ],
            security_protocols={listener.name: listener.protocol for listener in self.listeners},
            node_id=self.broker.node_id,
            nodes=self.broker.cluster.nodes,
            cluster_id=self.broker.cluster_id,
            control=control,
        )

    async def _listen(self, listener: Listener, port: int) -> asyncio.base_events.Server:
        ssl_ctx = server_context(self.broker.config) if listener.tls else None
        return await asyncio.start_server(
            functools.partial(self._on_connect, listener),
            listener.host or None,
            port,
            reuse_address=True,
            limit=_READ_AHEAD,
            ssl=ssl_ctx,
            ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S if ssl_ctx is not None else None,
        )

    async def stop_node(self, node: int) -> None:
        """One node of several stops (docs/cluster.md, "Moving things"): its listeners close
        (connecting is refused) and its connections are closed."""
        for i, listener in enumerate(self.listeners):
            if listener.node_id == node:
                self._servers[i].close()
        for cid, (task, _writer) in list(self._connections.items()):
            if self._conn_node.get(cid) == node:
                task.cancel()
        log.info("node stopped", node=node)

    async def start_node(self, node: int) -> None:
        """A stopped node listens again, on the ports it had."""
        for i, listener in enumerate(self.listeners):
            if listener.node_id == node and not self._servers[i].is_serving():
                self._servers[i] = await self._listen(listener, listener.bound_port)
        log.info("node started", node=node)

    def _advertised(self, listener: Listener) -> tuple[str, int]:
        return listener.advertised(self.broker.config.advertised_host)

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
        for server in self._servers:
            server.close()
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
        for server in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)
        log.info("stopped")

    # ------------------------------------------------------------------ connections

    async def _on_connect(self, listener: Listener, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._closing:
            writer.close()
            return
        peer = writer.get_extra_info("peername")
        client_host = peer[0] if isinstance(peer, tuple) else str(peer)
        if len(self._connections) >= self.max_connections or self._per_ip[client_host] >= self.max_connections_per_ip:
            # Kafka: ConnectionQuotas refuses it (per ip: closed at once; broker-wide: the
            # acceptor waits -- here it is closed too, and the client reconnects with backoff).
            log.warning(
                "closing connection: too many connections",
                client=client_host,
                connections=len(self._connections),
                from_client=self._per_ip[client_host],
                max_connections=self.max_connections,
                max_connections_per_ip=self.max_connections_per_ip,
            )
            writer.close()
            return
        cid = next(self._conn_ids)
        task = asyncio.current_task()
        assert task is not None
        self._connections[cid] = (task, writer)
        self._conn_node[cid] = listener.node_id
        self._per_ip[client_host] += 1
        # drain() waits while more than this many answer bytes wait for the peer.
        writer.transport.set_write_buffer_limits(high=self.max_queued_response_bytes)
        self._size_socket_buffers(writer)
        # This task's context: Metadata and FindCoordinator answer with this listener's endpoint,
        # and the node it belongs to answers (docs/cluster.md).
        CURRENT_ENDPOINT.set(self._advertised(listener))
        CURRENT_NODE.set(listener.node_id)
        CURRENT_LISTENER.set(listener.name)
        session: SaslAuthenticator | None = None
        try:
            if listener.sasl:
                session = SaslAuthenticator(
                    self.sasl_mechanisms, self.broker.credentials, self.reauth_ms, self.max_elements
                )
                if not await self._authenticate(cid, client_host, reader, writer, session, None):
                    return
            await self._serve_connection(cid, client_host, reader, writer, session)
        except asyncio.CancelledError:
            pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except _Idle as e:
            log.info("closing connection: idle", connection=cid, client=client_host, reason=str(e))
        except Exception:
            log.exception("connection failed", connection=cid)
        finally:
            self._connections.pop(cid, None)
            self._conn_node.pop(cid, None)
            self._per_ip[client_host] -= 1
            if self._per_ip[client_host] <= 0:
                del self._per_ip[client_host]
            self._busy.discard(cid)
            with contextlib.suppress(Exception):
                writer.close()
            try:
                self.broker.connection_closed(cid)
            except Exception:
                log.exception("connection close hook failed", connection=cid)

    def _size_socket_buffers(self, writer: asyncio.StreamWriter) -> None:
        """Kafka's socket.send/receive.buffer.bytes: a fixed kernel buffer (no autotuning to
        megabytes), so a peer that does not read is paused after about this much."""
        sock = writer.get_extra_info("socket")
        if sock is None:
            return
        with contextlib.suppress(OSError):
            if self.send_buffer_bytes >= 0:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.send_buffer_bytes)
            if self.receive_buffer_bytes >= 0:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.receive_buffer_bytes)

    async def _idle_bound(self, aw: Any, doing: str) -> Any:
        """``aw`` within connections.max.idle.ms, else :class:`_Idle`."""
        if self.idle_timeout_s is None:
            return await aw
        try:
            async with asyncio.timeout(self.idle_timeout_s):
                return await aw
        except TimeoutError:
            raise _Idle.after(self.idle_timeout_s, doing) from None

    async def _drain(self, writer: asyncio.StreamWriter) -> None:
        """Wait (within connections.max.idle.ms) while the peer's unread answers keep the
        transport above its high-water mark; below it there is nothing to wait for (no timer)."""
        transport = writer.transport
        if transport.get_write_buffer_size() <= transport.get_write_buffer_limits()[1]:
            return
        await self._idle_bound(writer.drain(), "the peer does not read its answers")

    async def _read_body(self, reader: asyncio.StreamReader, size: int) -> bytes | memoryview:
        if len(getattr(reader, "_buffer", b"")) >= size:
            return await reader.readexactly(size)  # already here: no wait
        # Read as it arrives; any progress restarts the idle clock.
        body = bytearray()
        while len(body) < size:
            chunk = await self._idle_bound(reader.read(size - len(body)), "reading a request")
            if not chunk:
                raise asyncio.IncompleteReadError(bytes(body), size)
            body += chunk
        return memoryview(body).toreadonly()  # kio reads only read-only buffers

    async def _authenticate(
        self,
        cid: int,
        client_host: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        session: SaslAuthenticator,
        first: bytes | memoryview | None,
    ) -> bool:
        """Run the SASL exchange (``first``: a SaslHandshake already read, re-authentication).

        True once authenticated; False when the connection is to be closed (answers sent)."""
        reauth = first is not None
        if reauth:
            session.begin_reauthentication()
        body = first
        while True:
            if body is None:
                size_bytes = await self._idle_bound(reader.readexactly(4), "authenticating")
                (size,) = _SIZE.unpack(size_bytes)
                if size <= 0 or size > self.sasl_max_receive:
                    # SaslServerAuthenticator: "invalid receive size" (sasl.server.max.receive.size);
                    # a TLS ClientHello on a SASL_PLAINTEXT listener ends here too.
                    log.warning(
                        "closing connection: bad frame size during SASL authentication",
                        connection=cid,
                        client=client_host,
                        size=size,
                        max=self.sasl_max_receive,
                    )
                    return False
                body = await self._read_body(reader, size)
            step = session.on_frame(body, self.broker.clock.now_ms())
            if step.delegate:  # ApiVersions before the handshake: the usual answer
                answer = await self._process(cid, client_host, body)
                if answer is None:
                    return False
                writer.write(answer)
                await self._drain(writer)
                body = None
                continue
            body = None
            if step.answer:
                writer.write(step.answer)
                await self._drain(writer)
            if step.close:
                log.info(
                    "closing connection: SASL authentication failed",
                    connection=cid,
                    client=client_host,
                    mechanism=session.mechanism,
                    reauthentication=reauth,
                    reason=step.reason,
                )
                # Kafka's connection.failed.authentication.delay.ms: the answer is read by the
                # client before the connection closes, and nothing else is read meanwhile.
                if self.failed_auth_delay_s > 0:
                    await asyncio.sleep(self.failed_auth_delay_s)
                return False
            if step.complete:
                log.info(
                    "sasl reauthenticated" if reauth else "sasl authenticated",
                    connection=cid,
                    client=client_host,
                    principal=f"User:{session.principal}",
                    mechanism=session.mechanism,
                    session_lifetime_ms=self.reauth_ms,
                )
                return True

    async def _serve_connection(
        self,
        cid: int,
        client_host: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        session: SaslAuthenticator | None = None,
    ) -> None:
        out = _Answers(writer)
        transport = writer.transport
        streak = 0  # requests served in a row from what was already buffered
        task = asyncio.current_task()
        assert task is not None
        idle = _IdleWatch(self.idle_timeout_s, task) if self.idle_timeout_s is not None else None
        try:
            while not self._closing:
                buffered = _frame_buffered(reader)
                if buffered:
                    # The next request is already here (the client pipelines).  Every _TURN of
                    # them, let the others run (answers made so far go out meanwhile) and notice
                    # a reset (the transport closes once the loop sees it).  Deep pipelines take
                    # these turns at a gate that lets one of them through per event-loop
                    # iteration, so requests that just arrived elsewhere are served in between,
                    # however many connections pipeline.
                    streak += 1
                    if streak % _TURN == 0:
                        async with self._pipeline_turn:
                            await asyncio.sleep(0)
                        out.flush()
                        await self._drain(writer)
                else:
                    streak = 0
                    out.flush()
                    await self._drain(writer)
                    if not out:
                        self._busy.discard(cid)
                if transport.is_closing() or reader.exception() is not None:
                    return  # the peer is gone: serve nothing more
                body: bytes | memoryview | None = None
                if buffered and buffered <= self.max_request_bytes and self._memory is None:
                    size = buffered
                    body = _take_frame(reader, size)  # all here: taken without waiting
                else:
                    try:
                        if len(getattr(reader, "_buffer", b"")) >= 4 or idle is None:
                            size_bytes = await reader.readexactly(4)  # already here: no wait
                        else:
                            idle.begin()
                            try:
                                size_bytes = await reader.readexactly(4)
                            finally:
                                idle.waiting = False
                    except (asyncio.IncompleteReadError, ConnectionError):
                        return
                    except asyncio.CancelledError:
                        if idle is None or not idle.expired:
                            raise
                        task.uncancel()
                        raise _Idle.after(idle.timeout, "waiting for a request") from None
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
                if self._memory is not None:
                    out.guard()
                    await self._memory.acquire(size)
                try:
                    if body is None:
                        try:
                            body = await self._read_body(reader, size)
                        except asyncio.IncompleteReadError:
                            log.warning(
                                "closing connection: truncated frame", connection=cid, client=client_host, size=size
                            )
                            return
                    if session is not None:
                        # KIP-368: a SaslHandshake re-authenticates; after expiry nothing else is served
                        is_handshake = len(body) >= 2 and int.from_bytes(body[:2], "big") == SASL_HANDSHAKE
                        if is_handshake:
                            out.flush()
                            if not await self._authenticate(cid, client_host, reader, writer, session, body):
                                return
                            continue
                        if session.expired(self.broker.clock.now_ms()):
                            log.info(
                                "closing connection: SASL session expired",
                                connection=cid,
                                client=client_host,
                                principal=f"User:{session.principal}",
                            )
                            return
                    # Busy until the answer is handed to the socket: shutdown waits for it.
                    self._busy.add(cid)
                    out.guard()  # the answers before this request go out if it waits
                    answer = await self._process(cid, client_host, body)
                    del body
                finally:
                    if self._memory is not None:
                        self._memory.release(size)
                if answer is None:
                    return  # close the connection (answers already made go out first, below)
                out.add(answer)
                if len(out) >= self.max_queued_response_bytes:
                    out.flush()
                    await self._drain(writer)
        finally:
            if idle is not None:
                idle.close()
            if not transport.is_closing():
                with contextlib.suppress(Exception):
                    out.flush()
            out.cancel()

    async def _process(self, cid: int, client_host: str, body: bytes | memoryview) -> bytes | None:
        """The response frame, b"" for no response, or None to close the connection."""
        # queued.max.requests: a request holds a slot from the time it is read until its
        # handler takes it (Kafka's request queue between network and handler threads).  A
        # small frame is decoded without yielding, so it would hold its slot for no time at
        # all: it only waits for one while every slot is held (by frames decoded off the loop).
        small = len(body) < _DECODE_OFF_LOOP_BYTES
        if small and self._slots_free > 0:
            decoded = self._decode(cid, client_host, body)
        else:
            async with self._request_slots:
                self._slots_free -= 1
                try:
                    if small:
                        decoded = self._decode(cid, client_host, body)
                    else:
                        decoded = await asyncio.to_thread(self._decode, cid, client_host, body)
                finally:
                    self._slots_free += 1
        if not isinstance(decoded, _Decoded):
            return decoded
        api_key, version, corr = decoded.api_key, decoded.version, decoded.corr
        node = CURRENT_NODE.get()
        ctx = RequestContext(
            self.broker,
            api_key,
            version,
            corr,
            decoded.client_id,
            client_host,
            cid,
            self.broker.node_id if node is None else node,
        )
        store = self.broker.topics
        mutations = store.mutations
        try:
            response = await self.hook.handle(ctx, decoded.request, self.handlers[api_key])
        except asyncio.CancelledError:
            raise
        except CloseConnection as e:
            log.info("closing connection", connection=cid, api=decoded.api_name, reason=str(e))
            return None
        except Exception:
            log.exception("handler failed", connection=cid, api=decoded.api_name, api_version=version)
            return self._error_response(api_key, version, corr)
        if store.mutations != mutations:
            # Topic metadata changed: on disk before the answer says so (group commit).
            try:
                await store.persist()
            except OSError as e:  # a full or failed disk: not acknowledged, retried by the next write
                log.warning("could not save topic metadata", connection=cid, api=decoded.api_name, error=str(e))
                return self._error_response(api_key, version, corr)
            except Exception:
                log.exception("could not save topic metadata", connection=cid, api=decoded.api_name)
                return self._error_response(api_key, version, corr)
        if response is None:
            return b""
        try:
            small = len(body) < _DECODE_OFF_LOOP_BYTES and _answer_bounded(api_key, decoded.request)
            if not small and codec.count_elements(response, _ENCODE_OFF_LOOP_ELEMENTS) >= _ENCODE_OFF_LOOP_ELEMENTS:
                return await asyncio.to_thread(codec.encode_response, api_key, version, corr, response)
            return codec.encode_response(api_key, version, corr, response)
        except Exception:
            log.exception("could not encode response", api=decoded.api_name, api_version=version)
            return self._error_response(api_key, version, corr)

    def _decode(self, cid: int, client_host: str, body: bytes | memoryview) -> _Decoded | bytes | None:
        """The decoded request, or the answer to send instead (bytes), or None to close.

        Large bodies are decoded in a worker thread (:meth:`_process`): nothing here touches
        the event loop."""
        try:
            api_key, version, corr = peek_api_key_version(body)
        except FrameError:
            log.warning("closing connection: frame shorter than a request header", connection=cid)
            return None
        served_as = _SERVED.get(api_key << 16 | version)
        if served_as is not None:
            name, header_version = served_as
        else:
            checked = self._check_served(cid, api_key, version, corr)
            if not isinstance(checked, tuple):
                return checked
            name, header_version = checked
        try:
            client_id, header_size = client_id_and_size(body, header_version)
            request = codec.decode_request(api_key, version, body, header_size, self.max_elements)
        except (FrameError, codec.DecodeError) as e:
            log.warning(
                "closing connection: undecodable request",
                connection=cid,
                client=client_host,
                api=name,
                api_version=version,
                error=str(e),
            )
            return None
        return _Decoded(api_key, version, corr, name, client_id, request)

    def _check_served(self, cid: int, api_key: int, version: int, corr: int) -> tuple[str, int] | bytes | None:
        """(API name, request header version) of a request served (remembered in _SERVED), the
        answer to an ApiVersions at a version not served, or None to close the connection."""
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
        plan = _SERVED[api_key << 16 | version] = (api.name, codec.request_header_version(api_key, version))
        return plan

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
