"""SaslAuthenticate (36) outside authentication (docs/security.md, "SASL").

The server's authenticator takes the SaslAuthenticate requests of an exchange; one reaching a
handler is out of place (a listener without SASL, or after authentication completed), as in
Kafka's ``KafkaApis.handleSaslAuthenticateRequest``: ILLEGAL_SASL_STATE.
"""

from __future__ import annotations

from typing import Any

from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext

API_KEY = 36


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    return {
        "error_code": ErrorCode.ILLEGAL_SASL_STATE,
        "error_message": "SaslAuthenticate request received after successful authentication",
        "auth_bytes": b"",
    }
