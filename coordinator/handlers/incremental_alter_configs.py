"""IncrementalAlterConfigs (44), v0-1 (docs/configs.md, "Altering"): SET, DELETE, APPEND and
SUBTRACT (the last two on list configs only) applied to the resource's dynamic configs, all or
nothing per resource; ``validate_only`` checks and changes nothing."""

from __future__ import annotations

from typing import Any

from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext
from ..config_resources import ConfigRequestError

API_KEY = 44


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    resources = ctx.broker.config_resources
    responses = []
    for r in request.resources:
        code, message = ErrorCode.NONE, None
        ops = [(c.name, int(c.config_operation), c.value) for c in r.configs]
        try:
            resources.incremental_alter(int(r.resource_type), r.resource_name, ops, bool(request.validate_only))
        except ConfigRequestError as e:
            code, message = e.code, e.message
        responses.append(
            {
                "error_code": code,
                "error_message": message,
                "resource_type": r.resource_type,
                "resource_name": r.resource_name,
            }
        )
    return {"throttle_time": 0, "responses": responses}
