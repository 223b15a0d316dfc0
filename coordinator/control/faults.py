"""Fault rules: what ``POST /v1/faults`` creates, and which request a rule applies to.

docs/control.md, "Faults": for each request the first rule, in creation order, that matches it
and has answers left applies.  A rule matches on its API, and optionally the version range,
client id, node, group and topic.  ``after: n`` lets its first n matches pass untouched (they are
not hits); ``probability`` (with ``seed``, reproducibly) lets a match pass untouched at random.
A rule that lets a request pass leaves it to the next rules.  Each applied answer is a hit and
uses up one of ``count`` (None: until deleted).

Everything here is plain data and synchronous except the parking of ``hold`` rules.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from msgspec import Struct
from rallypoint.protocol.apis import SERVED_APIS
from rallypoint.protocol.errors import ErrorCode

from .shapes import Target, TopicNamer, groups_named, topics_named

ACTIONS: Final = ("error", "delay", "disconnect", "no-response", "hold")
FIELDS: Final = frozenset(
    {
        "api",
        "error",
        "count",
        "group",
        "topic",
        "client_id",
        "node",
        "versions",
        "delay_ms",
        "after",
        "probability",
        "seed",
        "action",
    }
)
_API_BY_NAME: Final = {a.name.lower(): a.key for a in SERVED_APIS.values()}
MAX_DELAY_MS: Final = 3_600_000


class BadRequest(ValueError):
    """Input the control plane refuses with 400 and this message."""


def api_key_of(value: object, what: str = "api") -> int:
    """A served API given by name (case-insensitive) or key."""
    if isinstance(value, str):
        key = _API_BY_NAME.get(value.strip().lower())
        if key is None and value.strip().lstrip("-").isdigit():
            key = int(value.strip())
            if key not in SERVED_APIS:
                key = None
        if key is None:
            raise BadRequest(f"{what}: unknown or unserved API {value!r} (see the README's API table)")
        return key
    if isinstance(value, int) and not isinstance(value, bool):
        if value not in SERVED_APIS:
            raise BadRequest(f"{what}: API key {value} is not served")
        return value
    raise BadRequest(f"{what} must be an API name or key")


def api_name(key: int) -> str:
    api = SERVED_APIS.get(key)
    return api.name if api is not None else str(key)


def error_code_of(value: object) -> ErrorCode:
    if isinstance(value, str):
        try:
            code = ErrorCode[value.strip().upper()]
        except KeyError:
            raise BadRequest(f"error: unknown error name {value!r}") from None
    elif isinstance(value, int) and not isinstance(value, bool):
        try:
            code = ErrorCode(value)
        except ValueError:
            raise BadRequest(f"error: unknown error code {value}") from None
    else:
        raise BadRequest("error must be an error name or code")
    if code == ErrorCode.NONE:
        raise BadRequest("error: NONE is not an error")
    return code


def _int(body: Mapping[str, Any], key: str, lo: int, hi: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise BadRequest(f"{key} must be an integer")
    if not lo <= value <= hi:
        raise BadRequest(f"{key} must be in [{lo}, {hi}]")
    return value


def _str(body: Mapping[str, Any], key: str) -> str | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadRequest(f"{key} must be a string")
    return value


@dataclass(eq=False)
class FaultRule:
    """One rule of ``POST /v1/faults``: what it matches, what it answers, and its hits so far."""

    id: int
    api_key: int
    action: str
    error: ErrorCode | None = None
    count: int | None = 1
    group: str | None = None
    topic: str | None = None
    client_id: str | None = None
    node: int | None = None
    versions: tuple[int, int] | None = None
    delay_ms: int = 0
    after: int = 0
    probability: float = 1.0
    seed: int | None = None
    hits: int = 0
    passed: int = 0  # matches let through by `after`
    _rng: random.Random = field(default_factory=random.Random, repr=False)
    _parked: list[asyncio.Future[None]] = field(default_factory=list, repr=False)

    @classmethod
    def parse(cls, rule_id: int, body: object) -> FaultRule:
        """A rule from the JSON body of ``POST /v1/faults``; :class:`BadRequest` if it is wrong."""
        if not isinstance(body, Mapping):
            raise BadRequest("the body must be a JSON object")
        unknown = sorted(set(body) - FIELDS)
        if unknown:
            raise BadRequest(f"unknown field(s): {', '.join(unknown)}")
        if "api" not in body:
            raise BadRequest("api is required")
        api_key = api_key_of(body["api"])
        error = error_code_of(body["error"]) if body.get("error") is not None else None
        delay_ms = _int(body, "delay_ms", 0, MAX_DELAY_MS) or 0
        action = body.get("action")
        if action is None:
            if error is not None:
                action = "error"
            elif "delay_ms" in body and body["delay_ms"] is not None:
                action = "delay"
            else:
                raise BadRequest("give error, delay_ms or action")
        if not isinstance(action, str) or action not in ACTIONS:
            raise BadRequest(f"action must be one of {', '.join(ACTIONS)}")
        if action == "error" and error is None:
            raise BadRequest("action error needs an error")
        if action != "error" and error is not None:
            raise BadRequest(f"error is only for action error, not {action}")
        if "count" in body and body["count"] is None:
            count: int | None = None
        else:
            count = _int(body, "count", 1, 2**62)
            count = 1 if count is None else count
        versions = body.get("versions")
        if versions is not None:
            if (
                not isinstance(versions, list)
                or len(versions) != 2
                or not all(isinstance(v, int) and not isinstance(v, bool) for v in versions)
            ):
                raise BadRequest("versions must be [min, max]")
            if not 0 <= versions[0] <= versions[1] <= 32767:
                raise BadRequest("versions must be [min, max] with 0 <= min <= max")
        probability = body.get("probability", 1.0)
        if probability is None:
            probability = 1.0
        if not isinstance(probability, int | float) or isinstance(probability, bool):
            raise BadRequest("probability must be a number")
        if not (math.isfinite(probability) and 0.0 <= probability <= 1.0):
            raise BadRequest("probability must be in [0, 1]")
        seed = _int(body, "seed", -(2**63), 2**63 - 1)
        rule = cls(
            id=rule_id,
            api_key=api_key,
            action=action,
            error=error,
            count=count,
            group=_str(body, "group"),
            topic=_str(body, "topic"),
            client_id=_str(body, "client_id"),
            node=_int(body, "node", -1, 2**31 - 1),
            versions=(versions[0], versions[1]) if versions is not None else None,
            delay_ms=delay_ms,
            after=_int(body, "after", 0, 2**62) or 0,
            probability=float(probability),
            seed=seed,
        )
        rule._rng = random.Random(seed)
        return rule

    @property
    def remaining(self) -> int | None:
        return None if self.count is None else max(0, self.count - self.hits)

    @property
    def live(self) -> bool:
        return self.count is None or self.hits < self.count

    @property
    def parked(self) -> int:
        return sum(1 for f in self._parked if not f.done())

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "api": api_name(self.api_key),
            "api_key": self.api_key,
            "action": self.action,
            "error": self.error.name if self.error is not None else None,
            "count": self.count,
            "group": self.group,
            "topic": self.topic,
            "client_id": self.client_id,
            "node": self.node,
            "versions": list(self.versions) if self.versions is not None else None,
            "delay_ms": self.delay_ms,
            "after": self.after,
            "probability": self.probability,
            "seed": self.seed,
            "hits": self.hits,
            "remaining": self.remaining,
            "held": self.parked,
        }

    # ------------------------------------------------------------------ hold / release

    async def park(self) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._parked.append(fut)
        try:
            await fut
        finally:
            if fut in self._parked:
                self._parked.remove(fut)

    def release(self) -> int:
        """Let every request this rule parked go on; how many there were."""
        released = 0
        for f in self._parked:
            if not f.done():
                f.set_result(None)
                released += 1
        self._parked.clear()
        return released


class _NoMatch:
    pass


NO_MATCH: Final = _NoMatch()


class Hit(Struct, frozen=True):
    """A rule that applies to a request, and the part of the request it applies to."""

    rule: FaultRule
    target: Target | None  # None: the whole request; else only these entries get the error


class FaultTable:
    """The rules, in creation order."""

    def __init__(self, node_id: int, namer: TopicNamer) -> None:
        self.node_id = node_id
        self._namer = namer
        self.rules: dict[int, FaultRule] = {}
        self._next_id = 1
        self.live = 0  # rules with answers left: the server's fast path checks only this
        self.on_change: Callable[[], None] = lambda: None

    def add(self, body: object) -> FaultRule:
        rule = FaultRule.parse(self._next_id, body)
        self._next_id += 1
        self.rules[rule.id] = rule
        self._recount()
        return rule

    def delete(self, rule_id: int) -> FaultRule | None:
        rule = self.rules.pop(rule_id, None)
        if rule is not None:
            rule.release()
            self._recount()
        return rule

    def clear(self) -> int:
        n = len(self.rules)
        for rule in self.rules.values():
            rule.release()
        self.rules.clear()
        self._recount()
        return n

    def release_all(self) -> None:
        for rule in self.rules.values():
            rule.release()

    def _recount(self) -> None:
        self.live = sum(1 for r in self.rules.values() if r.live)

    def match(
        self, api_key: int, version: int, client_id: str | None, request: Any, node: int | None = None
    ) -> Hit | None:
        """The rule that applies to this request, if any (its hit is counted here); ``node``:
        the node whose listener took it (docs/cluster.md), default this broker's."""
        node_id = self.node_id if node is None or node < 0 else node
        for rule in self.rules.values():
            if rule.api_key != api_key or not rule.live:
                continue
            if rule.versions is not None and not rule.versions[0] <= version <= rule.versions[1]:
                continue
            if rule.client_id is not None and rule.client_id != client_id:
                continue
            if rule.node is not None and rule.node != node_id:
                continue
            target = self._target(rule, api_key, request)
            if isinstance(target, _NoMatch):
                continue
            if rule.passed < rule.after:
                rule.passed += 1
                continue
            if rule.probability < 1.0 and rule._rng.random() >= rule.probability:
                continue
            rule.hits += 1
            if not rule.live:
                self._recount()
            self.on_change()
            return Hit(rule, target)
        return None

    def _target(self, rule: FaultRule, api_key: int, request: Any) -> Target | _NoMatch | None:
        """NO_MATCH: the rule does not match; None: it applies to the whole request; a Target:
        only to those entries."""
        groups: frozenset[str] | None = None
        if rule.group is not None:
            top, listed = groups_named(api_key, request)
            if top == rule.group:
                groups = None  # the whole request is about the group
            elif rule.group in listed:
                groups = frozenset((rule.group,))
            else:
                return NO_MATCH
        if rule.topic is not None:
            if rule.topic not in topics_named(request, self._namer):
                return NO_MATCH
            return Target(groups, frozenset((rule.topic,)))
        if groups is None:
            return None
        return Target(groups, None)
