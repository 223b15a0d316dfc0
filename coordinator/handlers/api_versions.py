"""ApiVersions (18): the served ranges from protocol/apis.py."""

from __future__ import annotations

from typing import Any

from protocol.apis import SERVED_APIS
from protocol.errors import ErrorCode

API_KEY = 18


def api_keys_list() -> list[dict[str, int]]:
    return [
        {"api_key": a.key, "min_version": a.min_version, "max_version": a.max_version}
        for a in sorted(SERVED_APIS.values(), key=lambda a: a.key)
    ]


def unsupported_version_body() -> dict[str, Any]:
    """Kafka answers an ApiVersions version it does not know in v0 format with
    UNSUPPORTED_VERSION and its ranges, so the client can retry with one it can use."""
    return {"error_code": ErrorCode.UNSUPPORTED_VERSION, "api_keys": api_keys_list()}


async def handle(ctx: Any, request: Any) -> dict[str, Any]:
    return {
        "error_code": ErrorCode.NONE,
        "api_keys": api_keys_list(),
        "throttle_time": 0,
        "finalized_features_epoch": -1,
    }
