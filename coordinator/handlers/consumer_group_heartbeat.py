"""ConsumerGroupHeartbeat (68), v0-1: the KIP-848 consumer protocol (docs/consumer-groups.md).

v1 (what librdkafka sends, and only that) adds SubscribedTopicRegex and requires a
client-generated member id even on the join.
"""

from __future__ import annotations

import uuid
from typing import Any

from rallypoint.protocol.codec import ms
from rallypoint.protocol.errors import ErrorCode

from ..groups.consumer_events import ConsumerHeartbeat, ConsumerHeartbeatResult
from ._groups_common import client_host, heartbeat_body

API_KEY = 68


def _owned(topic_partitions: Any) -> dict[uuid.UUID, frozenset[int]] | None:
    if topic_partitions is None:
        return None
    out: dict[uuid.UUID, set[int]] = {}
    for tp in topic_partitions:
        out.setdefault(tp.topic_id, set()).update(int(p) for p in tp.partitions)
    return {t: frozenset(ps) for t, ps in out.items()}


async def handle(ctx: Any, request: Any) -> dict[str, Any]:
    names = request.subscribed_topic_names
    req = ConsumerHeartbeat(
        group_id=request.group_id,
        member_id=request.member_id,
        member_epoch=int(request.member_epoch),
        instance_id=request.instance_id,
        rack_id=request.rack_id,
        rebalance_timeout_ms=ms(request.rebalance_timeout),
        subscribed_topic_names=tuple(names) if names is not None else None,
        subscribed_topic_regex=getattr(request, "subscribed_topic_regex", None),
        server_assignor=request.server_assignor,
        topic_partitions=_owned(request.topic_partitions),
        client_id=ctx.client_id or "",
        client_host=client_host(ctx),
        api_version=ctx.api_version,
    )
    if ctx.broker.share_groups.machine.is_share_group(request.group_id):
        # GroupMetadataManager.getOrMaybeCreateConsumerGroup: another kind of group holds the id
        message = f"Group {request.group_id} is not a consumer group"
        return heartbeat_body(ConsumerHeartbeatResult(ErrorCode.GROUP_ID_NOT_FOUND, message))
    return heartbeat_body(await ctx.broker.consumer_groups.heartbeat(req))
