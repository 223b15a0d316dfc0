"""InitProducerId (22), v0-6: producer ids for idempotent and transactional producers.

KafkaApis.handleInitProducerIdRequest + TransactionCoordinator.handleInitProducerId:

* v3+: producer_id and producer_epoch must both be -1 or both be set, else INVALID_REQUEST;
* no transactional id: a fresh producer id with epoch 0 ("if the transactional id is null, then
  always blindly accept the request and return a new producerId"); producer ids are unique
  across restarts (reserved on disk in blocks);
* a transactional id: the transaction coordinator (``transactions/machine.py``); ``""`` is
  INVALID_REQUEST; PRODUCER_FENCED is answered INVALID_PRODUCER_EPOCH before v4;
* v6 two-phase commit (``enable_2pc``): TRANSACTIONAL_ID_AUTHORIZATION_FAILED, as Kafka with
  ``transaction.two.phase.commit.enable=false``; ``keep_prepared_txn``: UNSUPPORTED_VERSION.
"""

from __future__ import annotations

from typing import Any

from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext
from ..transactions.machine import InitResult

API_KEY = 22


def _error(code: ErrorCode) -> dict[str, Any]:
    return {"throttle_time": 0, "error_code": code, "producer_id": -1, "producer_epoch": -1}


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    pid = int(getattr(request, "producer_id", -1))
    epoch = int(getattr(request, "producer_epoch", -1))
    if (pid == -1) != (epoch == -1):
        return _error(ErrorCode.INVALID_REQUEST)
    txn_id = request.transactional_id
    if txn_id is None:
        return {
            "throttle_time": 0,
            "error_code": ErrorCode.NONE,
            "producer_id": ctx.broker.topics.next_producer_id(),
            "producer_epoch": 0,
        }
    if txn_id == "":
        return _error(ErrorCode.INVALID_REQUEST)
    if getattr(request, "enable2_pc", False) or getattr(request, "enable_2pc", False):
        return _error(ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    if getattr(request, "keep_prepared_txn", False):
        return _error(ErrorCode.UNSUPPORTED_VERSION)
    timeout = request.transaction_timeout
    timeout_ms = int(timeout.total_seconds() * 1000) if hasattr(timeout, "total_seconds") else int(timeout)
    expected = (pid, epoch) if pid != -1 else None
    txns = ctx.broker.transactions
    result = await txns.call(lambda t, now: txns.machine.init_producer_id(t, txn_id, timeout_ms, expected, now))
    if not isinstance(result, InitResult):  # the coordinator stopped
        return _error(ErrorCode(result))
    code = result.error
    if code == ErrorCode.PRODUCER_FENCED and ctx.api_version < 4:
        code = ErrorCode.INVALID_PRODUCER_EPOCH
    return {
        "throttle_time": 0,
        "error_code": code,
        "producer_id": result.producer_id,
        "producer_epoch": result.producer_epoch,
    }
