"""Kafka's listener settings: ``listeners``, ``advertised.listeners``,
``listener.security.protocol.map`` (docs/security.md, "Listeners").

A listener is ``NAME://host:port``; its security protocol is the map's entry for ``NAME``
(Kafka's ``SocketServerConfigs`` / ``EndPoint.parseListener``).  Without ``listeners``, the
``host``/``port`` settings are the shorthand for ``PLAINTEXT://host:port``.  Listeners named in
``controller.listener.names`` are a KRaft controller's business and are not served.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, Final

from msgspec import Struct

PROTOCOLS: Final = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")

# The advertised (host, port) of the listener the current connection came in on.  The server
# sets it in each connection's task (a context of its own), so Metadata, FindCoordinator and
# Fetch answer with the endpoint of the listener the client used (docs/security.md, "Listeners").
CURRENT_ENDPOINT: ContextVar[tuple[str, int] | None] = ContextVar("rallypoint_listener_endpoint", default=None)


class ListenerError(ValueError):
    pass


class Listener(Struct):
    """One listener: its name, security protocol, bind address, what it advertises and the port it bound."""

    name: str
    protocol: str  # one of PROTOCOLS
    host: str  # bind address ("" = every interface)
    port: int  # requested port (0 = any free port)
    advertised_host: str | None = None  # None: the broker's default advertised host
    advertised_port: int | None = None  # None: the bound port
    bound_port: int = 0
    node_id: int = -1  # the node it serves (docs/cluster.md); -1: the broker's own node.id

    @property
    def sasl(self) -> bool:
        return self.protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.protocol.endswith("SSL")

    def advertised(self, default_host: str) -> tuple[str, int]:
        """(host, port) clients are told: advertised.listeners' entry, else the bind address
        (``default_host`` for a wildcard one) and the bound port."""
        host = self.advertised_host
        if not host:
            host = self.host if self.host not in ("", "0.0.0.0", "::") else default_host
        return host, self.advertised_port or self.bound_port or self.port

    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.name}://{host}:{self.bound_port or self.port}"


def split_endpoint(value: str) -> tuple[str, str, int]:
    """``NAME://host:port`` → (NAME, host, port); ``[v6]`` hosts allowed, host may be empty."""
    name, sep, rest = value.strip().partition("://")
    if not sep or not name:
        raise ListenerError(f"listener {value!r} is not of the form NAME://host:port")
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        port_s = tail.lstrip(":")
    else:
        host, sep, port_s = rest.rpartition(":")
        if not sep:
            raise ListenerError(f"listener {value!r} has no port")
    try:
        port = int(port_s)
    except ValueError:
        raise ListenerError(f"listener {value!r} has a bad port") from None
    if not 0 <= port <= 65535:
        raise ListenerError(f"listener {value!r}: port out of range")
    return name.upper(), host, port


def parse_protocol_map(value: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in value.split(","):
        if not item.strip():
            continue
        name, sep, proto = item.partition(":")
        name, proto = name.strip().upper(), proto.strip().upper()
        if not sep or not name or proto not in PROTOCOLS:
            raise ListenerError(
                f"listener.security.protocol.map entry {item.strip()!r}: expected NAME:PROTOCOL, "
                f"PROTOCOL one of {', '.join(PROTOCOLS)}"
            )
        if name in out:
            raise ListenerError(f"listener.security.protocol.map names {name} twice")
        out[name] = proto
    return out


def _names(value: str | None) -> list[str]:
    return [v.strip().upper() for v in (value or "").split(",") if v.strip()]


def per_node(listeners: list[Listener], nodes: list[int], advertised: str) -> list[Listener]:
    """Each listener once per node (docs/cluster.md, "Listeners"): node i binds port + i (a free
    port for port 0) and advertises its advertised port + i when one is set;
    ``rallypoint.advertised.listeners`` (``host:port`` per node, in node order) sets each node's
    advertised endpoint of the first listener."""
    overrides: list[tuple[str, int]] = []
    for item in (advertised or "").split(","):
        if item.strip():
            _name, host, port = split_endpoint(f"X://{item.strip()}")
            overrides.append((host, port))
    if overrides and len(overrides) != len(nodes):
        raise ListenerError(
            f"rallypoint.advertised.listeners lists {len(overrides)} endpoints for {len(nodes)} brokers"
        )
    out: list[Listener] = []
    for i, node in enumerate(nodes):
        for k, base in enumerate(listeners):
            ad_host, ad_port = base.advertised_host, base.advertised_port
            if ad_port:
                ad_port += i
            if k == 0 and overrides:
                ad_host, ad_port = overrides[i]
            out.append(
                Listener(
                    base.name,
                    base.protocol,
                    base.host,
                    base.port + i if base.port else 0,
                    ad_host,
                    ad_port,
                    node_id=node,
                )
            )
    return out


def from_config(values: Any) -> list[Listener]:
    """The listeners to serve, in the order given; :class:`ListenerError` if inconsistent."""
    pmap = parse_protocol_map(values["listener.security.protocol.map"])
    controller = set(_names(values["controller.listener.names"]))
    advertised: dict[str, tuple[str, int]] = {}
    # without ``listeners``, config.load has taken advertised.host/port from advertised.listeners
    for item in (values["advertised.listeners"] or "").split(",") if values["listeners"] else []:
        if item.strip():
            name, host, port = split_endpoint(item)
            advertised[name] = (host, port)
    listeners: list[Listener] = []
    if values["listeners"]:
        for item in values["listeners"].split(","):
            if not item.strip():
                continue
            name, host, port = split_endpoint(item)
            if name in controller:
                continue
            if name not in pmap:
                raise ListenerError(
                    f"listener {name} has no security protocol: add {name}:<PROTOCOL> to listener.security.protocol.map"
                )
            if any(listener.name == name for listener in listeners):
                raise ListenerError(f"listeners names {name} twice")
            if port and any(listener.port == port for listener in listeners):
                raise ListenerError(f"listeners use port {port} twice")
            ad = advertised.get(name)
            listeners.append(
                Listener(
                    name,
                    pmap[name],
                    host,
                    port,
                    ((ad[0] if ad else None) or values["advertised.host"]) or None,
                    (ad[1] or None) if ad else None,
                )
            )
        if not listeners:
            raise ListenerError("listeners names no listener this broker serves")
    else:
        # --host/--port: the shorthand for PLAINTEXT://host:port (advertised.host/port apply)
        port = values["advertised.port"]
        host, ad_host = values["host"], values["advertised.host"]
        listeners.append(Listener("PLAINTEXT", "PLAINTEXT", host, values["port"], ad_host, port))
    unknown = set(advertised) - {listener.name for listener in listeners}
    if values["listeners"] and unknown:
        raise ListenerError(f"advertised.listeners names listeners that are not in listeners: {sorted(unknown)}")
    return listeners
