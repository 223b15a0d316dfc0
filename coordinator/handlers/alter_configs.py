"""AlterConfigs (33), v0-2 (docs/configs.md, "Altering"): each resource's dynamic configs
become exactly the given set (what is not given is removed), all or nothing per resource;
``validate_only`` checks and changes nothing."""

from __future__ import annotations

from typing import Any

from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext
from ..config_resources import ConfigRequestError

API_KEY = 33


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    resources = ctx.broker.config_resources
    responses = []
    for r in request.resources:
        code, message = ErrorCode.NONE, None
        names = [c.name for c in r.configs]
        try:
            if len(set(names)) != len(names):
                raise ConfigRequestError(ErrorCode.INVALID_REQUEST, "Error due to duplicate config keys")
            configs = {c.name: c.value for c in r.configs}
            resources.alter(int(r.resource_type), r.resource_name, configs, bool(request.validate_only))
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
