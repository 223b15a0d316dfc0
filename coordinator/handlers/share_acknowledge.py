"""ShareAcknowledge (79), v1: acknowledge acquired records outside a fetch; epoch -1 closes the
share session (docs/share-groups.md, "Share sessions")."""

from __future__ import annotations

from typing import Any

from rallypoint.protocol.errors import ErrorCode

from ._share_common import acks_of, node_endpoints, topic_responses

API_KEY = 79


async def handle(ctx: Any, request: Any) -> dict[str, Any]:
    if not request.group_id or not request.member_id:
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.INVALID_REQUEST,
            "error_message": "GroupId and MemberId must be set",
            "responses": [],
            "node_endpoints": [],
        }
    answer = await ctx.broker.share_groups.acknowledge(
        request.group_id,
        request.member_id,
        int(request.share_session_epoch),
        ctx.connection_id,
        acks_of(request.topics),
    )
    return {
        "throttle_time": 0,
        "error_code": answer.error,
        "error_message": answer.error_message,
        "responses": topic_responses(ctx, answer, fetch=False) if answer.error == ErrorCode.NONE else [],
        "node_endpoints": node_endpoints(ctx),
    }
