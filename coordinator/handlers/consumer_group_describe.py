"""ConsumerGroupDescribe (69), v0-1 (v1 adds Member.MemberType; docs/consumer-groups.md,
"Describe and list").

A group that is not a consumer group (a classic group, or none) is GROUP_ID_NOT_FOUND: the
AdminClient falls back to DescribeGroups on exactly that error.
"""

from __future__ import annotations

from typing import Any

from rallypoint.protocol.errors import ErrorCode

from ..groups.consumer_events import DescribedTopicPartitions

API_KEY = 69

AUTHZ_OPS_UNSET = -2147483648
# No authorizer: every operation a group supports is allowed: READ(3), DELETE(6), DESCRIBE(8)
# (AclEntry.supportedOperations(GROUP)), as a bit field.
GROUP_AUTHORIZED_OPERATIONS = (1 << 3) | (1 << 6) | (1 << 8)


def _assignment(tps: tuple[DescribedTopicPartitions, ...]) -> dict[str, Any]:
    return {
        "topic_partitions": [
            {"topic_id": tp.topic_id, "topic_name": tp.topic_name, "partitions": list(tp.partitions)} for tp in tps
        ]
    }


async def handle(ctx: Any, request: Any) -> dict[str, Any]:
    include_ops = bool(request.include_authorized_operations)
    groups = []
    for g in ctx.broker.consumer_groups.describe(request.group_ids):
        ok = g.error == ErrorCode.NONE
        groups.append(
            {
                "error_code": g.error,
                "error_message": g.error_message,
                "group_id": g.group_id,
                "group_state": g.state if ok else "",
                "group_epoch": g.group_epoch if ok else 0,
                "assignment_epoch": g.assignment_epoch if ok else 0,
                "assignor_name": g.assignor_name,
                "members": [
                    {
                        "member_id": m.member_id,
                        "instance_id": m.instance_id,
                        "rack_id": m.rack_id,
                        "member_epoch": m.member_epoch,
                        "client_id": m.client_id,
                        "client_host": m.client_host,
                        "subscribed_topic_names": list(m.subscribed_topic_names),
                        "subscribed_topic_regex": m.subscribed_topic_regex,
                        "assignment": _assignment(m.assignment),
                        "target_assignment": _assignment(m.target_assignment),
                        "member_type": m.member_type,
                    }
                    for m in g.members
                ],
                "authorized_operations": GROUP_AUTHORIZED_OPERATIONS if include_ops and ok else AUTHZ_OPS_UNSET,
            }
        )
    return {"throttle_time": 0, "groups": groups}
