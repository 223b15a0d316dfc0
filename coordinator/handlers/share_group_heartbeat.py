"""ShareGroupHeartbeat (76), v1: share-group membership (docs/share-groups.md, "Membership").

v1 is the only version (librdkafka 2.16 sends it): the client makes its member id.
"""

from __future__ import annotations

from typing import Any

from ..share.membership import ShareHeartbeat
from ._groups_common import client_host, heartbeat_body

API_KEY = 76


async def handle(ctx: Any, request: Any) -> dict[str, Any]:
    names = request.subscribed_topic_names
    r = await ctx.broker.share_groups.heartbeat(
        ShareHeartbeat(
            group_id=request.group_id,
            member_id=request.member_id,
            member_epoch=int(request.member_epoch),
            rack_id=request.rack_id,
            subscribed_topic_names=tuple(names) if names is not None else None,
            client_id=ctx.client_id or "",
            client_host=client_host(ctx),
        )
    )
    return heartbeat_body(r, sorted)
