"""SaslHandshake (17) outside authentication (docs/security.md, "SASL").

On a SASL listener the server's authenticator takes handshakes (the first one, and KIP-368
re-authentication); one reaching a handler came over a listener without SASL, as in Kafka's
``KafkaApis.handleSaslHandshakeRequest``: ILLEGAL_SASL_STATE.
"""

from __future__ import annotations

from typing import Any

from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext

API_KEY = 17


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    return {"error_code": ErrorCode.ILLEGAL_SASL_STATE, "mechanisms": []}
