"""InitProducerId (22): producer ids for idempotent producers; no transactions.

KafkaApis.handleInitProducerIdRequest + TransactionCoordinator.handleInitProducerId:

* a transactional id → TRANSACTIONAL_ID_AUTHORIZATION_FAILED (the answer Kafka gives a principal
  without WRITE on it; this broker has no transaction coordinator, so every transactional
  producer fails fast with a clear, fatal error);
* v3+: producer_id and producer_epoch must both be -1 or both be set, else INVALID_REQUEST;
* otherwise a fresh producer id with epoch 0 ("if the transactional id is null, then always
  blindly accept the request and return a new producerId").

Producer ids are unique across restarts (reserved on disk in blocks).
"""

from __future__ import annotations

from typing import Any

from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext

API_KEY = 22


def _error(code: ErrorCode) -> dict[str, Any]:
    return {"throttle_time": 0, "error_code": code, "producer_id": -1, "producer_epoch": -1}


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    if request.transactional_id is not None:
        return _error(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    pid = int(getattr(request, "producer_id", -1))
    epoch = int(getattr(request, "producer_epoch", -1))
    if (pid == -1) != (epoch == -1):
        return _error(ErrorCode.INVALID_REQUEST)
    return {
        "throttle_time": 0,
        "error_code": ErrorCode.NONE,
        "producer_id": ctx.broker.topics.next_producer_id(),
        "producer_epoch": 0,
    }
