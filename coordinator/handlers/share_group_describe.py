"""ShareGroupDescribe (77), v1 (docs/share-groups.md, "Describe and list").

A group id that is not a share group is GROUP_ID_NOT_FOUND, as Kafka answers.
"""

from __future__ import annotations

from typing import Any

from rallypoint.protocol.errors import ErrorCode

from .consumer_group_describe import AUTHZ_OPS_UNSET, GROUP_AUTHORIZED_OPERATIONS

API_KEY = 77


def _assignment(ctx: Any, assignment: dict[Any, frozenset[int]]) -> dict[str, Any]:
    tps = []
    for tid, ps in sorted(assignment.items(), key=lambda kv: str(kv[0])):
        topic = ctx.broker.topics.by_id(tid)
        tps.append({"topic_id": tid, "topic_name": topic.name if topic else "", "partitions": sorted(ps)})
    return {"topic_partitions": tps}


async def handle(ctx: Any, request: Any) -> dict[str, Any]:
    include_ops = bool(request.include_authorized_operations)
    machine = ctx.broker.share_groups.machine
    groups = []
    for gid in request.group_ids:
        g = machine.groups.get(gid)
        if g is None:
            groups.append(
                {
                    "error_code": ErrorCode.GROUP_ID_NOT_FOUND,
                    "error_message": f"Group {gid} not found.",
                    "group_id": gid,
                    "group_state": "",
                    "group_epoch": 0,
                    "assignment_epoch": 0,
                    "assignor_name": "",
                    "members": [],
                    "authorized_operations": AUTHZ_OPS_UNSET,
                }
            )
            continue
        groups.append(
            {
                "error_code": ErrorCode.NONE,
                "error_message": None,
                "group_id": gid,
                "group_state": g.state,
                "group_epoch": g.epoch,
                "assignment_epoch": g.assignment_epoch,
                "assignor_name": "simple",
                "members": [
                    {
                        "member_id": m.member_id,
                        "rack_id": m.rack_id,
                        "member_epoch": m.epoch,
                        "client_id": m.client_id,
                        "client_host": m.client_host,
                        "subscribed_topic_names": list(m.subscribed),
                        "assignment": _assignment(ctx, m.assignment),
                    }
                    for m in g.members.values()
                ],
                "authorized_operations": GROUP_AUTHORIZED_OPERATIONS if include_ops else AUTHZ_OPS_UNSET,
            }
        )
    return {"throttle_time": 0, "groups": groups}
