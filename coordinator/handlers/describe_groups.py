"""DescribeGroups (15), v0-6 (docs/groups.md, "DescribeGroups and ListGroups"; v6 = KIP-1043:
unknown groups → GROUP_ID_NOT_FOUND)."""

from __future__ import annotations

from typing import Any

from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext

API_KEY = 15

AUTHZ_OPS_UNSET = -2147483648
# With no authorizer every operation a group supports is authorized: READ(3), DELETE(6),
# DESCRIBE(8) (AclEntry.supportedOperations(GROUP)), as a bit field (Utils.to32BitField).
GROUP_AUTHORIZED_OPERATIONS = (1 << 3) | (1 << 6) | (1 << 8)


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    version = ctx.api_version
    include_ops = version >= 3 and bool(getattr(request, "include_authorized_operations", False))
    result = await ctx.broker.groups.describe(request.groups, version)
    groups: list[dict[str, Any]] = []
    consumer = ctx.broker.consumer_groups
    for g in result.groups:
        if consumer.is_consumer_group(g.group_id):
            # docs/consumer-groups.md, "Describe and list"
            groups.append(
                {
                    "error_code": ErrorCode.GROUP_ID_NOT_FOUND if version >= 6 else ErrorCode.NONE,
                    "error_message": f"Group {g.group_id} is not a classic group." if version >= 6 else None,
                    "group_id": g.group_id,
                    "group_state": "Dead",
                    "protocol_type": "",
                    "protocol_data": "",
                    "members": [],
                    "authorized_operations": AUTHZ_OPS_UNSET,
                }
            )
            continue
        ops = GROUP_AUTHORIZED_OPERATIONS if include_ops and g.error == ErrorCode.NONE else AUTHZ_OPS_UNSET
        groups.append(
            {
                "error_code": g.error,
                "error_message": g.error_message,
                "group_id": g.group_id,
                "group_state": g.state,
                "protocol_type": g.protocol_type,
                "protocol_data": g.protocol_data,
                "members": [
                    {
                        "member_id": m.member_id,
                        "group_instance_id": m.group_instance_id,
                        "client_id": m.client_id,
                        "client_host": m.client_host,
                        "member_metadata": m.metadata,
                        "member_assignment": m.assignment,
                    }
                    for m in g.members
                ],
                "authorized_operations": ops,
            }
        )
    return {"throttle_time": 0, "groups": groups}
