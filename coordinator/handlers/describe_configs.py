"""DescribeConfigs (32), v1-4 (docs/configs.md, "Describing").

Resources are answered one by one, in request order; an error concerns only its resource
(``ConfigHelper.describeConfigs``).  Synonyms from v1 when asked for (``include_synonyms``);
``config_type`` and, with ``include_documentation``, ``documentation`` from v3.
"""

from __future__ import annotations

from typing import Any

from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext
from ..config_resources import ConfigRequestError

API_KEY = 32


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    resources = ctx.broker.config_resources
    synonyms = bool(getattr(request, "include_synonyms", False))
    docs = bool(getattr(request, "include_documentation", False))
    results = []
    for r in request.resources:
        keys = list(r.configuration_keys) if r.configuration_keys is not None else None
        result: dict[str, Any] = {
            "resource_type": r.resource_type,
            "resource_name": r.resource_name,
            "error_code": ErrorCode.NONE,
            "error_message": None,
            "configs": [],
        }
        try:
            entries = resources.describe(int(r.resource_type), r.resource_name, keys)
        except ConfigRequestError as e:
            result["error_code"], result["error_message"] = e.code, e.message
        else:
            result["configs"] = [
                {
                    "name": e.name,
                    "value": e.value,
                    "read_only": e.read_only,
                    "config_source": e.source,
                    "is_sensitive": e.sensitive,
                    "synonyms": [{"name": n, "value": v, "source": s} for n, v, s in e.synonyms] if synonyms else [],
                    "config_type": e.config_type,
                    "documentation": e.documentation if docs else None,
                }
                for e in entries
            ]
        results.append(result)
    return {"throttle_time": 0, "results": results}
