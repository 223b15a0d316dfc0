"""The control plane: the request hook of the Kafka server plus the state the HTTP API shows.

On every request (docs/control.md, "How it plugs in"):

1. if a fault rule has answers left, the rules are matched (creation order, first applies);
2. the request is answered: by its handler, or as the rule says (error / delay / disconnect /
   no-response / hold);
3. one request-log entry is recorded (API, version, client, errors in the answer, latency).

With no live rule and the request log off, a request costs one method call and a comparison.
"""

from __future__ import annotations

import asyncio
import errno
import time
import uuid
from time import perf_counter_ns
from typing import TYPE_CHECKING, Any, Final, Protocol

from rallypoint.protocol.errors import ErrorCode

from ..broker import CloseConnection
from ..logger import get as get_logger
from . import shapes
from .events import EventHub
from .faults import FaultTable, Hit, api_name
from .groupview import GroupTracker
from .hooks import Handler, Response, ServerInfo
from .http import HttpServer
from .requestlog import RequestLog
from .shapes import FLAT as _FLAT
from .shapes import error_codes

if TYPE_CHECKING:
    from ..broker import Broker, RequestContext

log = get_logger("rallypoint.control")

DEFAULT_PORT: Final = 9644
JOIN_GROUP_KEY: Final = 11
PRODUCE_KEY: Final = 0
_NO_ERRORS: Final[tuple[int, ...]] = ()


class AdvancingClock(Protocol):
    def now_ms(self) -> int: ...

    def advance(self, ms: int) -> int: ...


class ControlPlane:
    def __init__(self, broker: Broker) -> None:
        cfg = broker.config
        self.broker = broker
        self.requested_port: int | None = cfg["rallypoint.control.port"]
        self.token: str | None = cfg["rallypoint.control.token"] or None
        self.events = EventHub()
        self.requests = RequestLog(cfg["rallypoint.control.request.log.size"], broker.node_id)
        self.faults = FaultTable(broker.node_id, self.topic_name)
        self.faults.on_change = self._faults_changed
        self.groups = GroupTracker(broker, self.events)
        runtime = getattr(broker, "groups", None)  # a bare Broker (some unit tests) has none
        if runtime is not None:
            runtime.add_listener(self.groups.on_group_event)
        consumer = getattr(broker, "consumer_groups", None)  # KIP-848 groups: their epochs and members
        if consumer is not None:
            consumer.add_listener(self.groups.on_group_event)
        share = getattr(broker, "share_groups", None)  # KIP-932 groups: their membership changes
        if share is not None:
            share.add_listener(self.groups.on_share_change)
        self.skew_ms = 0
        self.started = time.monotonic()
        self.server: ServerInfo | None = None
        self.address: str | None = None
        self._http: HttpServer | None = None
        self._fault_waiters: set[asyncio.Future[None]] = set()
        self._log_on = self.requests.enabled

    # ------------------------------------------------------------------ life cycle

    async def start(self, server: ServerInfo) -> str | None:
        from .api import Api

        self.server = server
        http = HttpServer(Api(self).dispatch)
        host = server.host
        port = DEFAULT_PORT if self.requested_port is None else self.requested_port
        try:
            bound = await http.start(host, port)
        except OSError as e:
            if self.requested_port is not None or e.errno != errno.EADDRINUSE:
                raise OSError(
                    e.errno,
                    f"control port {port} on {host} is not available ({e.strerror or e}); set "
                    "rallypoint.control.port (--control-port) to a free port, 0 for any, or -1 to turn "
                    "the control plane off",
                ) from e
            bound = await http.start(host, 0)
            log.warning("control port taken, using a free port", wanted=port, port=bound)
        self._http = http
        shown = f"[{host}]" if ":" in host else host
        self.address = f"http://{shown}:{bound}"
        return self.address

    async def stop(self) -> None:
        self.faults.release_all()  # held requests go on (kfake wakes its sleepers on Close too)
        self.events.close()
        for fut in self._fault_waiters:
            if not fut.done():
                fut.set_result(None)
        if self._http is not None:
            await self._http.stop()

    # ------------------------------------------------------------------ the request hook

    def handle(self, ctx: RequestContext, request: Any, handler: Handler) -> Any:
        if self.faults.live:
            hit = self.faults.match(ctx.api_key, ctx.api_version, ctx.client_id, request, ctx.node_id)
            if hit is not None:
                return self._faulted(ctx, request, handler, hit)
        if self._log_on or ctx.api_key == JOIN_GROUP_KEY:
            return self._observed(ctx, request, handler)
        return handler(ctx, request)

    async def _observed(self, ctx: RequestContext, request: Any, handler: Handler) -> Response:
        # The path of every request while the control plane is on: kept lean (bench/control_plane.py
        # holds it to a few per cent of a heartbeat round trip), hence the inlined request-log entry.
        t0 = perf_counter_ns()
        try:
            response = await handler(ctx, request)
        except CloseConnection:
            self._record(ctx, _NO_ERRORS, t0, None, False)
            raise
        except Exception:
            self._record(ctx, (int(ErrorCode.UNKNOWN_SERVER_ERROR),), t0, None, True)
            raise
        key = ctx.api_key
        if response is None:
            errors = _NO_ERRORS
        elif type(response) is dict and _FLAT.get(key << 16 | ctx.api_version):
            # the error code is only at the top level (Heartbeat, JoinGroup, SyncGroup ...)
            code = response.get("error_code")
            errors = (int(code),) if code is not None and code != 0 else _NO_ERRORS
            if key == JOIN_GROUP_KEY:
                self.groups.on_join_answer(request, response)
        else:
            errors = error_codes(key, ctx.api_version, response)
            if key == JOIN_GROUP_KEY:
                self.groups.on_join_answer(request, response)
        if self._log_on:
            log = self.requests
            seq = log.last_seq = log.last_seq + 1
            log.ring.append(
                (
                    seq,
                    t0,
                    self.skew_ms,
                    ctx.connection_id,
                    ctx.client_id,
                    ctx.client_host,
                    ctx.api_key,
                    ctx.api_version,
                    ctx.correlation_id,
                    errors,
                    perf_counter_ns() - t0,
                    None,
                    True,
                    ctx.node_id,
                )
            )
        return response

    def _record(self, ctx: RequestContext, errors: tuple[int, ...], t0: int, fault: int | None, answered: bool) -> None:
        if self._log_on:
            self.requests.add(
                t0,
                self.skew_ms,
                ctx.connection_id,
                ctx.client_id,
                ctx.client_host,
                ctx.api_key,
                ctx.api_version,
                ctx.correlation_id,
                errors,
                perf_counter_ns() - t0,
                fault,
                answered,
                ctx.node_id,
            )

    async def _faulted(self, ctx: RequestContext, request: Any, handler: Handler, hit: Hit) -> Response:
        rule = hit.rule
        t0 = perf_counter_ns()
        self.events.publish(
            "fault",
            {
                "fault_id": rule.id,
                "time_ms": self.broker.clock.now_ms(),
                "api": api_name(ctx.api_key),
                "version": ctx.api_version,
                "action": rule.action,
                "error": rule.error.name if rule.error is not None else None,
                "client_id": ctx.client_id,
                "connection": ctx.connection_id,
                "correlation_id": ctx.correlation_id,
                "hits": rule.hits,
                "remaining": rule.remaining,
            },
        )
        log.info(
            "fault applied",
            fault=rule.id,
            action=rule.action,
            api=api_name(ctx.api_key),
            error=rule.error.name if rule.error is not None else None,
            connection=ctx.connection_id,
        )
        response: Response = None
        try:
            if rule.delay_ms:
                await asyncio.sleep(rule.delay_ms / 1000.0)
            if rule.action == "hold":
                await rule.park()
            if rule.action == "disconnect":
                raise CloseConnection(f"fault {rule.id}: disconnect")
            if rule.action == "error":
                assert rule.error is not None
                response = await self._error_answer(ctx, request, handler, hit, int(rule.error))
            else:
                response = await handler(ctx, request)
        except CloseConnection:
            self._record(ctx, _NO_ERRORS, t0, rule.id, False)
            raise
        except Exception:
            self._record(ctx, (int(ErrorCode.UNKNOWN_SERVER_ERROR),), t0, rule.id, True)
            raise
        if response is not None and ctx.api_key == JOIN_GROUP_KEY:
            self.groups.on_join_answer(request, response)
        errors = error_codes(ctx.api_key, ctx.api_version, response) if response is not None else _NO_ERRORS
        if rule.action == "no-response":
            self._record(ctx, errors, t0, rule.id, False)
            return None
        self._record(ctx, errors, t0, rule.id, response is not None)
        return response

    async def _error_answer(self, ctx: RequestContext, request: Any, handler: Handler, hit: Hit, code: int) -> Response:
        key, version = ctx.api_key, ctx.api_version
        if key == PRODUCE_KEY and int(getattr(request, "acks", -1)) == 0:
            # acks=0 gets no answer; Kafka closes the connection when such a Produce fails.
            raise CloseConnection("fault: acks=0 Produce failed")
        if hit.target is None:
            return shapes.error_body(key, version, request, code, None, self.topic_name)
        pruned, kept = shapes.prune(request, hit.target, self.topic_name)
        errors = shapes.error_body(key, version, request, code, hit.target, self.topic_name)
        if kept == 0:
            return errors
        real = await handler(ctx, pruned)
        if real is None:
            return None
        return shapes.merge(shapes.as_message(key, version, real), shapes.as_message(key, version, errors))

    # ------------------------------------------------------------------ helpers for the API

    def topic_name(self, topic_id: uuid.UUID) -> str | None:
        t = self.broker.topics.by_id(topic_id)
        return t.name if t is not None else None

    def _faults_changed(self) -> None:
        waiters, self._fault_waiters = self._fault_waiters, set()
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    async def fault_changed(self, timeout_s: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._fault_waiters.add(fut)
        try:
            await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            pass
        finally:
            self._fault_waiters.discard(fut)

    def advance_clock(self, ms: int) -> int:
        clock: Any = self.broker.clock
        if not callable(getattr(clock, "advance", None)):
            raise RuntimeError("this broker's clock cannot be advanced")
        adv: AdvancingClock = clock
        adv.advance(ms)
        self.skew_ms += ms
        runtime = getattr(self.broker, "groups", None)
        if runtime is not None:
            runtime.fire_timers()
        consumer = getattr(self.broker, "consumer_groups", None)
        if consumer is not None:
            consumer.fire_timers()  # KIP-848 sessions and revocation deadlines now due fire at once
        share = getattr(self.broker, "share_groups", None)
        if share is not None:
            share.poke()  # share-member sessions and acquisition locks now due fire at once
        return adv.now_ms()

    # ------------------------------------------------------------------ the cluster (docs/cluster.md)

    def _server_nodes(self) -> Any:
        server = self.server
        if server is None or not hasattr(server, "stop_node"):
            raise RuntimeError("no Kafka server to stop or start nodes of")
        return server

    async def move_partition(self, topic: str, partition: int, node: int) -> list[dict[str, object]]:
        return await self.broker.moves.move_partition(topic, partition, node)

    async def stop_node(self, node: int, offline: bool) -> list[dict[str, object]]:
        server = self._server_nodes()
        before = self.broker.moves.coordinators()
        self.broker.cluster.stop(node, offline)
        await server.stop_node(node)
        return await self.broker.moves.settle(before)

    async def start_node(self, node: int) -> list[dict[str, object]]:
        server = self._server_nodes()
        before = self.broker.moves.coordinators()
        await server.start_node(node)
        self.broker.cluster.start(node)
        return await self.broker.moves.settle(before)

    def expire_member(self, group_id: str, member_id: str) -> bool:
        share = getattr(self.broker, "share_groups", None)
        if share is not None and share.machine.is_share_group(group_id):
            return bool(share.expire_member(group_id, member_id))
        consumer = getattr(self.broker, "consumer_groups", None)
        if consumer is not None and consumer.is_consumer_group(group_id):
            return bool(consumer.fire_timers((group_id, member_id)))
        runtime = getattr(self.broker, "groups", None)
        return bool(runtime is not None and runtime.fire_timers((group_id, member_id)))

    def health(self) -> dict[str, Any]:
        server = self.server
        broker = self.broker
        listeners: list[str] = []
        advertised = [f"PLAINTEXT://{_host_port(broker.advertised_host, broker.advertised_port)}"]
        if server is not None:  # every listener (docs/security.md, "Listeners")
            default_host = broker.config.advertised_host
            listeners = [f"{lst.name}://{_host_port(lst.host, lst.bound_port or lst.port)}" for lst in server.listeners]
            advertised = [f"{lst.name}://{_host_port(*lst.advertised(default_host))}" for lst in server.listeners]
        return {
            "node_id": broker.node_id,
            "listeners": listeners,
            "advertised_listeners": advertised,
            "control": self.address,
            "uptime_ms": int((time.monotonic() - self.started) * 1000),
            "cluster_id": broker.cluster_id,
        }


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
