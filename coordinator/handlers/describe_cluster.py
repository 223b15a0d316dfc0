"""DescribeCluster (60), v0-2 (docs/configs.md, "Cluster and topic descriptions").

``KafkaApis.handleDescribeCluster`` on a broker: the brokers (this one, at the address of the
listener the request came in on), the cluster id, the controller id (a broker answering names
one of the live brokers), no rack.  ``endpoint_type`` (v1+) must be 1 (brokers): a broker asked
for controllers answers MISMATCHED_ENDPOINT_TYPE.  Cluster authorized operations: without ACLs,
every operation on the cluster resource, when asked for; else Kafka's "not requested" value.
"""

from __future__ import annotations

from typing import Any, Final

from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext

API_KEY = 60

BROKERS: Final = 1
CONTROLLERS: Final = 2
AUTHZ_OPS_UNSET: Final = -(2**31)
# AclOperation codes on the CLUSTER resource: CREATE 5, ALTER 7, DESCRIBE 8, CLUSTER_ACTION 9,
# DESCRIBE_CONFIGS 10, ALTER_CONFIGS 11, IDEMPOTENT_WRITE 12
CLUSTER_OPERATIONS: Final = sum(1 << op for op in (5, 7, 8, 9, 10, 11, 12))


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    broker = ctx.broker
    endpoint_type = int(getattr(request, "endpoint_type", BROKERS))
    base: dict[str, Any] = {"throttle_time": 0, "endpoint_type": endpoint_type, "cluster_id": broker.cluster_id}
    if endpoint_type != BROKERS:
        wanted = "CONTROLLER" if endpoint_type == CONTROLLERS else f"UNKNOWN({endpoint_type})"
        return {
            **base,
            "error_code": ErrorCode.MISMATCHED_ENDPOINT_TYPE,
            "error_message": (
                f"The request was sent to an endpoint of type BROKER, but we wanted an endpoint of type {wanted}"
            ),
            "controller_id": -1,
            "brokers": [],
            "cluster_authorized_operations": AUTHZ_OPS_UNSET,
        }
    ops = CLUSTER_OPERATIONS if request.include_cluster_authorized_operations else AUTHZ_OPS_UNSET
    return {
        **base,
        "error_code": ErrorCode.NONE,
        "error_message": None,
        "controller_id": broker.controller_id,
        "brokers": [
            {"broker_id": n, "host": h, "port": p, "rack": None, "is_fenced": False} for n, h, p in broker.brokers()
        ],
        "cluster_authorized_operations": ops,
    }
