"""OffsetFetch (9), v1-10 (docs/groups.md, "OffsetFetch"): v2 null topics = all, v7 RequireStable,
v8 many groups, v9 member id and epoch (KIP-848 groups), v10 topics named by id.

v0 (ZooKeeper) is rejected by KRaft brokers and is not in the codec.  v10: an unknown topic id
answers UNKNOWN_TOPIC_ID for its partitions; an offset committed under another id of the topic's
name is not returned; every topic in the answer carries its id (zero for a topic that no longer
exists) (docs/consumer-groups.md, "Offsets").
"""

from __future__ import annotations

import uuid
from typing import Any

from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext
from ..groups.events import (
    OffsetFetchGroupRequest,
    OffsetFetchGroupResult,
    OffsetFetchPartition,
    OffsetFetchRequest,
    OffsetFetchResult,
)
from ._groups_common import ZERO_UUID

API_KEY = 9


def _check_consumer_members(ctx: Any, request: Any, result: OffsetFetchResult) -> OffsetFetchResult:
    """OffsetFetch v9 member check for consumer groups (docs/consumer-groups.md, "Offsets")."""
    machine = ctx.broker.consumer_groups.machine
    checks = {
        g.group_id: machine.validate_offset_fetch(
            g.group_id, getattr(g, "member_id", None), getattr(g, "member_epoch", -1)
        )
        for g in request.groups
    }
    out = []
    for g in result.groups:
        err = checks.get(g.group_id)
        out.append(g if err is None or err == ErrorCode.NONE else OffsetFetchGroupResult(g.group_id, err))
    return OffsetFetchResult(tuple(out))


def _topics(topics: Any) -> tuple[tuple[str, tuple[int, ...]], ...] | None:
    if topics is None:
        return None
    # kio decodes an int32 array as a tuple of ints: taken as it is
    return tuple([(t.name, t.partition_indexes) for t in topics])


class _V10Group:
    """One group of a v10 request with its topic ids resolved to names."""

    def __init__(self, ctx: Any, group: Any) -> None:
        self.request = group
        self.named: list[tuple[str, tuple[int, ...]]] | None = None if group.topics is None else []
        self.ids: dict[str, uuid.UUID] = {}
        for t in group.topics or ():
            parts = tuple(int(p) for p in t.partition_indexes)
            topic = ctx.broker.topics.by_id(t.topic_id) if t.topic_id is not None else None
            if topic is not None:
                assert self.named is not None
                self.named.append((topic.name, parts))
                self.ids[topic.name] = t.topic_id

    def in_request_order(self, answered: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The answer's topics in the request's order, an unknown id answered UNKNOWN_TOPIC_ID."""
        by_name = {t["name"]: t for t in answered}
        out = []
        for t in self.request.topics:
            topic = next((name for name, tid in self.ids.items() if tid == t.topic_id), None)
            if topic is not None and topic in by_name:
                out.append(by_name[topic])
            else:
                unknown = ErrorCode.UNKNOWN_TOPIC_ID
                out.append(
                    {
                        "topic_id": t.topic_id or ZERO_UUID,
                        "partitions": [
                            _partition(OffsetFetchPartition(int(p), error=unknown)) for p in t.partition_indexes
                        ],
                    }
                )
        return out

    def fetch_request(self) -> OffsetFetchGroupRequest:
        topics = None if self.named is None else tuple(self.named)
        return OffsetFetchGroupRequest(self.request.group_id, topics, self.ids)


def _partition(p: Any) -> dict[str, Any]:
    return {
        "partition_index": p.partition,
        "committed_offset": p.offset,
        "committed_leader_epoch": p.leader_epoch,
        "metadata": p.metadata,
        "error_code": p.error,
    }


def _topic_id(ctx: Any, name: str) -> uuid.UUID:
    t = ctx.broker.topics.get(name)
    return t.topic_id if t is not None else ZERO_UUID


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    version = ctx.api_version
    require_stable = bool(getattr(request, "require_stable", False))
    v10: dict[str, _V10Group] = {}
    if version >= 10:
        v10 = {g.group_id: _V10Group(ctx, g) for g in request.groups}
        groups = tuple(v.fetch_request() for v in v10.values())
    elif version >= 8:
        groups = tuple(OffsetFetchGroupRequest(g.group_id, _topics(g.topics)) for g in request.groups)
    else:
        groups = (OffsetFetchGroupRequest(request.group_id, _topics(request.topics)),)
    result = await ctx.broker.groups.fetch_offsets(OffsetFetchRequest(groups, require_stable))
    if version >= 9:
        result = _check_consumer_members(ctx, request, result)
    if version >= 8:
        out_groups = []
        for g in result.groups:
            topics: list[dict[str, Any]] = [
                {
                    "name": t.name,
                    "topic_id": _topic_id(ctx, t.name) if version >= 10 else None,
                    "partitions": [_partition(p) for p in t.partitions],
                }
                for t in g.topics
            ]
            resolved = v10.get(g.group_id)
            if resolved is not None and g.error == ErrorCode.NONE and resolved.named is not None:
                topics = resolved.in_request_order(topics)
            out_groups.append({"group_id": g.group_id, "error_code": g.error, "topics": topics})
        return {"throttle_time": 0, "groups": out_groups}
    (g,) = result.groups
    if version < 2 and g.error != ErrorCode.NONE:
        # No top-level error before v2: the group error goes on every requested partition
        # (OffsetFetchResponse; Kafka's Scala coordinator built them from the request).
        topics = [
            {
                "name": name,
                "partitions": [
                    {
                        "partition_index": p,
                        "committed_offset": -1,
                        "committed_leader_epoch": -1,
                        "metadata": "",
                        "error_code": g.error,
                    }
                    for p in parts
                ],
            }
            for name, parts in groups[0].topics or ()
        ]
        return {"throttle_time": 0, "topics": topics}
    return {
        "throttle_time": 0,
        "error_code": g.error,
        "topics": [{"name": t.name, "partitions": [_partition(p) for p in t.partitions]} for t in g.topics],
    }
