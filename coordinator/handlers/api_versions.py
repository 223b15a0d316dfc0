"""ApiVersions (18): the served ranges from protocol/apis.py.

Kafka's rules (``KafkaApis.handleApiVersionsRequest`` and ``ApiVersionsRequest``):

* a version the broker does not know is answered, not refused: v0 format, UNSUPPORTED_VERSION
  and the broker's own ApiVersions range, so the client retries with a version both know
  (KIP-511; ``ApiVersionsRequest.getErrorResponse``).  The server sends that answer
  (:func:`unsupported_version_body`) without decoding the body.
* from v3 on, ClientSoftwareName and ClientSoftwareVersion must match
  ``[a-zA-Z0-9](?:[a-zA-Z0-9\\-.]*[a-zA-Z0-9])?`` (``ApiVersionsRequest.isValid``), else
  INVALID_REQUEST with no API list.
"""

from __future__ import annotations

import functools
import re
from typing import Any, Final

from rallypoint.protocol import codec
from rallypoint.protocol.apis import API_VERSIONS_KEY, SERVED_APIS
from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext

API_KEY = 18

# ApiVersionsRequest.SOFTWARE_NAME_VERSION_PATTERN (Java's matcher().matches() = fullmatch).
SOFTWARE_NAME_VERSION: Final = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9\-.]*[a-zA-Z0-9])?")


def api_keys_list() -> list[dict[str, int]]:
    return [
        {"api_key": a.key, "min_version": a.min_version, "max_version": a.max_version}
        for a in sorted(SERVED_APIS.values(), key=lambda a: a.key)
    ]


def unsupported_version_body() -> dict[str, Any]:
    """The v0-format answer to an ApiVersions version we do not serve.

    Like Kafka's ``getErrorResponse(UNSUPPORTED_VERSION)``: only ApiVersions' own range.
    """
    own = SERVED_APIS[API_VERSIONS_KEY]
    return {
        "error_code": ErrorCode.UNSUPPORTED_VERSION,
        "api_keys": [{"api_key": own.key, "min_version": own.min_version, "max_version": own.max_version}],
    }


def is_valid(version: int, request: Any) -> bool:
    """Kafka's ``ApiVersionsRequest.isValid``."""
    if version < 3:
        return True
    name = getattr(request, "client_software_name", "")
    software_version = getattr(request, "client_software_version", "")
    return bool(SOFTWARE_NAME_VERSION.fullmatch(name) and SOFTWARE_NAME_VERSION.fullmatch(software_version))


def answer(version: int) -> dict[str, Any]:
    """The answer to a valid request (the same for every client and connection)."""
    del version  # the fields a version lacks are left out by the encoder
    return {
        "error_code": ErrorCode.NONE,
        "api_keys": api_keys_list(),
        "throttle_time": 0,
        "finalized_features_epoch": -1,
    }


@functools.cache  # one per served version (the server refuses the others before the handler)
def encoded_answer(version: int) -> codec.Encoded:
    """:func:`answer`, encoded once: every client asks on every connection, and the list of
    APIs is the largest answer most connections get (test: byte-identical to the encoder)."""
    return codec.encode_body(API_KEY, version, answer(version))


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any] | codec.Encoded:
    if not is_valid(ctx.api_version, request):
        return {"error_code": ErrorCode.INVALID_REQUEST, "throttle_time": 0}
    return encoded_answer(ctx.api_version)
