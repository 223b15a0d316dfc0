"""The one hook the Kafka server calls around each request (docs/control.md, "How it plugs in").

``coordinator/server.py`` holds a :class:`RequestHook` and

* awaits ``hook.start(server)`` once its listener is bound (the answer, the control address or
  None, goes into the ``listening`` log line) and ``hook.stop()`` when shutdown starts;
* answers every decoded request with ``await hook.handle(ctx, request, handler)`` instead of
  ``await handler(ctx, request)``.

What ``handle`` returns is what a handler returns (a response body, or None for "no answer");
it may raise :class:`rallypoint.broker.CloseConnection` to close the connection, as a handler
may.  The server answers a connection's requests one at a time, so whatever the hook does
(delay, hold) answers still leave in request order.

:data:`NO_HOOK` does nothing: ``handle`` returns the handler's own awaitable, so a broker
without a control plane pays one method call per request.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..broker import Broker, RequestContext
    from ..security.listeners import Listener

Response = Mapping[str, Any] | Any | None  # a handler's answer: a dict, a codec message, or None
Handler = Callable[["RequestContext", Any], Awaitable[Response]]


class ServerInfo(Protocol):
    """What the hook may read of the Kafka server it is attached to."""

    broker: Broker
    host: str
    port: int
    listeners: list[Listener]  # every listener (docs/security.md, "Listeners")


class RequestHook(Protocol):
    async def start(self, server: ServerInfo) -> str | None:
        """Start (listen); return the control address for the ``listening`` line, or None."""
        ...

    async def stop(self) -> None:
        """Shutdown started: release what is parked, stop listening."""
        ...

    def handle(self, ctx: RequestContext, request: Any, handler: Handler) -> Awaitable[Response]:
        """Answer ``request``: usually ``handler(ctx, request)``."""
        ...


class NoHook:
    """The default: every request goes straight to its handler."""

    async def start(self, server: ServerInfo) -> str | None:
        return None

    async def stop(self) -> None:
        return None

    def handle(self, ctx: RequestContext, request: Any, handler: Handler) -> Awaitable[Response]:
        return handler(ctx, request)


NO_HOOK: RequestHook = NoHook()
