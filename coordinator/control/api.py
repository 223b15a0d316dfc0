"""The control endpoints (docs/control.md has each one with an example and its JSON shape).

Every endpoint checks its input completely before it changes anything: bad JSON, an unknown
field, a wrong type, an unknown API, error or action name → 400 with a message.  Unknown ids →
404.  With ``rallypoint.control.token`` set, every endpoint needs ``Authorization: Bearer T`` or
``?token=T`` (401 otherwise).
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

from .events import KINDS, Event
from .faults import BadRequest, FaultRule, api_key_of
from .groupview import GROUP_STATES, Unavailable
from .http import HttpError, HttpRequest, HttpResponse
from .page import live_page

if TYPE_CHECKING:
    from .plane import ControlPlane

MAX_WAIT_MS: Final = 600_000
DEFAULT_WAIT_MS: Final = 10_000
MAX_ADVANCE_MS: Final = 10 * 365 * 24 * 3600 * 1000
SSE_KEEPALIVE_S: Final = 15.0

Route = Callable[[HttpRequest, list[str]], Awaitable[HttpResponse]]


def _object(body: Any, allowed: frozenset[str], required: frozenset[str] = frozenset()) -> Mapping[str, Any]:
    if body is None:
        body = {}
    if not isinstance(body, Mapping):
        raise BadRequest("the body must be a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise BadRequest(f"unknown field(s): {', '.join(unknown)}")
    missing = sorted(required - set(body))
    if missing:
        raise BadRequest(f"missing field(s): {', '.join(missing)}")
    return body


def _int_field(body: Mapping[str, Any], key: str, lo: int, hi: int, default: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadRequest(f"{key} must be an integer")
    if not lo <= value <= hi:
        raise BadRequest(f"{key} must be in [{lo}, {hi}]")
    return value


def _int_param(value: str, name: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise BadRequest(f"{name} must be an integer") from None


def _params(req: HttpRequest, allowed: frozenset[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in req.query:
        if k == "token":
            continue
        if k not in allowed:
            raise BadRequest(f"unknown query parameter {k!r}")
        out[k] = v
    return out


def _rule_id(segment: str) -> int:
    try:
        return int(segment)
    except ValueError:
        raise HttpError(404, f"no fault {segment!r}") from None


class Api:
    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        # (method, path pattern) -> handler; "*" matches one path segment.
        self.routes: list[tuple[str, tuple[str, ...], Route]] = [
            ("GET", (), self.page),
            ("GET", ("v1", "health"), self.health),
            ("GET", ("v1", "groups"), self.list_groups),
            ("GET", ("v1", "groups", "*"), self.get_group),
            ("POST", ("v1", "groups", "*", "wait"), self.wait_group),
            ("POST", ("v1", "groups", "*", "members", "*", "expire"), self.expire_member),
            ("GET", ("v1", "faults"), self.list_faults),
            ("POST", ("v1", "faults"), self.add_fault),
            ("DELETE", ("v1", "faults"), self.clear_faults),
            ("GET", ("v1", "faults", "*"), self.get_fault),
            ("DELETE", ("v1", "faults", "*"), self.delete_fault),
            ("POST", ("v1", "faults", "*", "release"), self.release_fault),
            ("POST", ("v1", "faults", "*", "wait"), self.wait_fault),
            ("GET", ("v1", "clock"), self.get_clock),
            ("POST", ("v1", "clock", "advance"), self.advance_clock),
            ("GET", ("v1", "requests"), self.get_requests),
            ("DELETE", ("v1", "requests"), self.clear_requests),
            ("GET", ("v1", "events"), self.get_events),
            ("GET", ("v1", "brokers"), self.list_brokers),
            ("POST", ("v1", "brokers", "*", "stop"), self.stop_broker),
            ("POST", ("v1", "brokers", "*", "start"), self.start_broker),
            ("POST", ("v1", "partitions", "*", "*", "leader"), self.set_leader),
            ("POST", ("v1", "groups", "*", "coordinator"), self.move_coordinator),
        ]

    # ------------------------------------------------------------------ dispatch

    async def dispatch(self, req: HttpRequest) -> HttpResponse:
        self._authorize(req)
        allowed: list[str] = []
        for method, pattern, route in self.routes:
            if len(pattern) != len(req.segments):
                continue
            if not all(p == "*" or p == s for p, s in zip(pattern, req.segments, strict=True)):
                continue
            if method != req.method and not (method == "GET" and req.method == "HEAD"):
                allowed.append(method)
                continue
            args = [s for p, s in zip(pattern, req.segments, strict=True) if p == "*"]
            try:
                return await route(req, args)
            except BadRequest as e:
                return HttpResponse.error(400, str(e))
            except Unavailable as e:
                return HttpResponse.error(503, f"the group coordinator cannot answer now: {e}")
        if allowed:
            return HttpResponse.error(405, f"use {', '.join(allowed)}", [(b"allow", ", ".join(allowed).encode())])
        return HttpResponse.error(404, f"no endpoint {req.method} /{'/'.join(req.segments)}")

    def _authorize(self, req: HttpRequest) -> None:
        token = self.plane.token
        if token is None:
            return
        given = None
        auth = req.headers.get("authorization", "")
        if auth[:7].lower() == "bearer ":
            given = auth[7:].strip()
        else:
            for k, v in req.query:
                if k == "token":
                    given = v
        if given is None or not hmac.compare_digest(given.encode(), token.encode()):
            raise HttpError(
                401, "a token is required: Authorization: Bearer T, or ?token=T", [(b"www-authenticate", b"Bearer")]
            )

    # ------------------------------------------------------------------ health, groups

    async def page(self, req: HttpRequest, args: list[str]) -> HttpResponse:
        """The live page (docs/control.md, "The live page"): one self-contained HTML file."""
        _params(req, frozenset({"token"}))
        return HttpResponse(
            200,
            raw=live_page(),
            content_type=b"text/html; charset=utf-8",
            headers=[
                (b"cache-control", b"no-store"),
                # nothing from elsewhere: scripts, styles and connections to this server only
                (
                    b"content-security-policy",
                    b"default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                    b"connect-src 'self'; img-src 'self' data:",
                ),
            ],
        )

    async def health(self, req: HttpRequest, args: list[str]) -> HttpResponse:
        _params(req, frozenset())
        return HttpResponse(200, self.plane.health())

    async def list_groups(self, req: HttpRequest, args: list[str]) -> HttpResponse:
        _params(req, frozenset())
        return HttpResponse(200, await self.plane.groups.views())

    async def get_group(self, req: HttpRequest, args: list[str]) -> HttpResponse:
        _params(req, frozenset())
        view = await self.plane.groups.view(args[0])
        if view is None:
            raise HttpError(404, f"no group {args[0]!r}")
        return HttpResponse(200, view)

    async def wait_group(self, req: HttpRequest, args: list[str]) -> HttpResponse:
        _params(req, frozenset())
        body = _object(req.json(), frozenset({"state", "members", "min_generation", "timeout_ms"}))
        state = body.get("state")
        if state is not None:
            if not isinstance(state, str) or state.lower() not in GROUP_STATES:
                raise BadRequest(f"state must be one of {', '.join(GROUP_STATES.values())}")
            state = GROUP_STATES[state.lower()]
        members = _int_field(body, "members", 0, 2**31 - 1)
        min_generation = _int_field(body, "min_generation", -1, 2**31 - 1)
        timeout_ms = _int_field(body, "timeout_ms", 0, MAX_WAIT_MS, DEFAULT_WAIT_MS)
        assert timeout_ms is not None

        def holds(view: dict[str, Any] | None) -> bool:
            if view is None:
                return False
            if state is not None and view["state"] != state:
                return False
            if members is not None and len(view["members"]) != members:
                return False
            if min_generation is not None:
                gen = view.get("generation", view.get("epoch"))
                if gen is None or gen < min_generation:
                    return False
            return True

        ok, view = await self.plane.groups.wait(args[0], holds, timeout_ms)
        return HttpResponse(200 if ok else 408, view)

    async def expire_member(self, req: HttpRequest, args: list[str]) -> HttpResponse:
        _params(req, frozenset())
        _object(req.json(), frozenset())
        group_id, member_id = args
        if await self.plane.groups.view(group_id) is None:
            raise HttpError(404, f"no group {group_id!r}")
        if not self.plane.expire_member(group_id, member_id):
            raise HttpError(404, f"no member {member_id!r} with a session in group {group_id!r}")
        return HttpResponse(
            200, {"group_id": group_id, "member_id": member_id, "group": await self.plane.groups.view(group_id)}
        )

    # ------------------------------------------------------------------ the cluster

    def _cluster_view(self) -> dict[str, Any]:
        b = self.plane.broker
        c = b.cluster
        return {
            "brokers": [
                {
                    "node": n,
                    "state": "running" if n in c.up else ("offline" if n in c.offline else "stopped"),
                    "endpoints": {name: f"{h}:{p}" for name, (h, p) in c.endpoints.get(n, {}).items()},
                }
                for n in c.nodes
            ],
            "controller": b.controller_id,
        }

    def _node(self, segment: str) -> int:
        node = _int_param(segment, "node")
        c = self.plane.broker.cluster
        if node not in c.nodes:
            raise HttpError(404, f"no broker {node} (brokers: {c.nodes})")
        if c.single:
            raise BadRequest("this rallypoint runs one broker: start it with --brokers N to move things")
        return node

    async def list_brokers(self, req: HttpRequest, args: list[str]) -> HttpResponse:
        _params(req, frozenset())
        return HttpResponse(200, self._cluster_view())

    async def stop_broker(self, req: HttpRequest, args: list[str]) -> HttpResponse:
        _params(req, frozenset())
        body = _object(req.json(), frozenset({"offline"}))
        offline = body.get("offline", False)
        if not isinstance(offline, bool):
            raise BadRequest("offline must be true or false")
        node = self._node(args[0])
        c = self.plane.broker.cluster
        if node not in c.up:
            raise HttpError(409, f"broker {node} is not running")
        if len(c.up) == 1:
            raise HttpError(409, f"broker {node} is the last one running")
        moved = await self.plane.stop_node(node, offline)
        return HttpResponse(200, {**self._cluster_view(), "coordinators_moved": moved})

    async def start_broker(self, req: HttpRequest, args: list[str]) -> HttpResponse:
        _params(req, frozenset())
        _object(req.json(), frozenset())
        node = self._node(args[0])
        if node in self.plane.broker.cluster.up:
            raise HttpError(409, f"broker {node} is running")
        moved = await self.plane.start_node(node)
        return HttpResponse(200, {**self._cluster_view(), "coordinators_moved": moved})

    def _leader_target(self, req: HttpRequest) -> int:
        _params(req, frozenset())
        body = _object(req.json(), frozenset({"node"}), frozenset({"node"}))
        node = _int_field(body, "node", 0, 2**31 - 1)
        assert node is not None
        c = self.plane.broker.cluster
        if c.single:
            raise BadRequest("this rallypoint runs one broker: start it with --brokers N to move things")
        if node not in c.nodes:
            raise BadRequest(f"no broker {node} (brokers: {c.nodes})")
        if node not in c.up:
            raise HttpError(409, f"broker {node} is not running")
        return node

    async def set_leader(self, req: HttpRequest, args: list[str]) -> HttpResponse:
        node = self._leader_target(req)
        topic_name, partition = args[0], _int_param(args[1], "partition")
        topic = self.plane.broker.topics.get(topic_name)
        if topic is None or not 0 <= partition < topic.num_partitions:
            raise HttpError(404, f"no partition {topic_name}-{partition}")
        moved = await self.plane.move_partition(topic_name, partition, node)
        return HttpResponse(
            200, {"topic": topic_name, "partition": partition, "leader": node, "coordinators_moved": moved}
        )

    async def move_coordinator(self, req: HttpRequest, args: list[str]) -> HttpResponse:
        from rallypoint.protocol.offsets_schema import partition_for

        from ..topics.store import OFFSETS_TOPIC

        node = self._leader_target(req)
        group_id = args[0]
        partition = partition_for(group_id, self.plane.broker.groups.config.num_partitions)
        moved = await self.plane.move_partition(OFFSETS_TOPIC, partition, node)
        return HttpResponse(
            200, {"group_id": group_id, "partition": partition, "coordinator": node, "coordinators_moved": moved}
        )

    # ------------------------------------------------------------------ faults

    def _rule(self, segment: str) -> FaultRule:
        rule = self.plane.faults.rules.get(_rule_id(segment))
        if rule is None:
            raise HttpError(404, f"no fault {segment!r}")
        return rule

    async def list_faults(self, req: HttpRequest, args: list[str]) -> HttpResponse:
        _params(req, frozenset())
        return HttpResponse(200, [r.to_json() for r in self.plane.faults.rules.values()])

    async def add_fault(self, req: HttpRequest, args: list[str]) -> HttpResponse:
        _params(req, frozenset())
        rule = self.plane.faults.add(req.json())
        return HttpResponse(
            201, {"id": rule.id, "fault": rule.to_json()}, [(b"location", f"/v1/faults/{rule.id}".encode())]
        )

    async def clear_faults(self, req: HttpRequest, args: list[str]) -> HttpResponse:
        _params(req, frozenset())
        return HttpResponse(200, {"deleted": self.plane.faults.clear()})

    async def get_fault(self, req: HttpRequest, args: list[str]) -> HttpResponse:
        _params(req, frozenset())
        return HttpResponse(200, self._rule(args[0]).to_json())

    async def delete_fault(self, req: HttpRequest, args: list[str]) -> HttpResponse:
        _params(req, frozenset())
        rule = self._rule(args[0])
        self.plane.faults.delete(rule.id)
        return HttpResponse(204)

    async def release_fault(self, req: HttpRequest, args: list[str]) -> HttpResponse:
        _params(req, frozenset())
        _object(req.json(), frozenset())
        rule = self._rule(args[0])
        released = rule.release()
        return HttpResponse(200, {"released": released, "fault": rule.to_json()})

    async def wait_fault(self, req: HttpRequest, args: list[str]) -> HttpResponse:
        _params(req, frozenset())
        body = _object(req.json(), frozenset({"hits", "timeout_ms"}))
        hits = _int_field(body, "hits", 0, 2**62, 1)
        timeout_ms = _int_field(body, "timeout_ms", 0, MAX_WAIT_MS, DEFAULT_WAIT_MS)
        assert hits is not None and timeout_ms is not None
        rule = self._rule(args[0])
        deadline = time.monotonic() + timeout_ms / 1000.0
        while rule.hits < hits:
            left = deadline - time.monotonic()
            if left <= 0:
                return HttpResponse(408, rule.to_json())
            await self.plane.fault_changed(min(left, 1.0))
            if self.plane.faults.rules.get(rule.id) is not rule:
                raise HttpError(404, f"fault {rule.id} was deleted")
        return HttpResponse(200, rule.to_json())

    # ------------------------------------------------------------------ clock

    def _clock(self) -> dict[str, Any]:
        return {"skew_ms": self.plane.skew_ms, "now_ms": self.plane.broker.clock.now_ms()}

    async def get_clock(self, req: HttpRequest, args: list[str]) -> HttpResponse:
        _params(req, frozenset())
        return HttpResponse(200, self._clock())

    async def advance_clock(self, req: HttpRequest, args: list[str]) -> HttpResponse:
        _params(req, frozenset())
        body = _object(req.json(), frozenset({"ms"}), frozenset({"ms"}))
        ms = _int_field(body, "ms", 0, MAX_ADVANCE_MS)
        assert ms is not None
        self.plane.advance_clock(ms)
        return HttpResponse(200, {"advanced_ms": ms, **self._clock()})

    # ------------------------------------------------------------------ request log

    async def get_requests(self, req: HttpRequest, args: list[str]) -> HttpResponse:
        p = _params(req, frozenset({"since", "api", "client_id", "node"}))
        since = _int_param(p["since"], "since") if "since" in p else 0
        api = api_key_of(p["api"]) if "api" in p else None
        node = _int_param(p["node"], "node") if "node" in p else None
        log = self.plane.requests
        return HttpResponse(
            200,
            {
                "requests": log.query(since, api, p.get("client_id"), node),
                "dropped": log.dropped,
                "last_seq": log.last_seq,
                "size": log.size,
            },
        )

    async def clear_requests(self, req: HttpRequest, args: list[str]) -> HttpResponse:
        _params(req, frozenset())
        return HttpResponse(200, {"cleared": self.plane.requests.clear(), "last_seq": self.plane.requests.last_seq})

    # ------------------------------------------------------------------ events

    async def get_events(self, req: HttpRequest, args: list[str]) -> HttpResponse:
        p = _params(req, frozenset({"types", "last_event_id"}))
        kinds = frozenset(KINDS)
        if "types" in p:
            kinds = frozenset(t.strip() for t in p["types"].split(",") if t.strip())
            unknown = sorted(kinds - set(KINDS))
            if unknown or not kinds:
                raise BadRequest(f"types must be among {', '.join(KINDS)}")
        last = req.headers.get("last-event-id", p.get("last_event_id"))
        after = _int_param(last, "Last-Event-ID") if last not in (None, "") else None
        backlog, sub = self.plane.events.subscribe(after, kinds)
        hub = self.plane.events

        async def stream() -> AsyncIterator[bytes]:
            try:
                yield b": rallypoint control events\nretry: 1000\n\n"
                for ev in backlog:
                    yield ev.sse()
                while True:
                    try:
                        nxt: Event | None = await asyncio.wait_for(sub.queue.get(), SSE_KEEPALIVE_S)
                    except TimeoutError:
                        yield b": keep-alive\n\n"
                        continue
                    if nxt is None:
                        return
                    yield nxt.sse()
            finally:
                hub.unsubscribe(sub)

        return HttpResponse(200, stream=stream())
