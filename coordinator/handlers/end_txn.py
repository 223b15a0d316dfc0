"""EndTxn (26), v0-4: commit or abort the transaction (KafkaApis.handleEndTxnRequest +
TransactionCoordinator.endTransactionWithTV1; docs/transactions.md, "Ending a transaction").

The answer comes once PrepareCommit/PrepareAbort is saved; the markers are written after it.
PRODUCER_FENCED is answered INVALID_PRODUCER_EPOCH before v2.  v5 (an epoch bump at every
transaction, the newer protocol) is not served."""

from __future__ import annotations

from typing import Any

from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext

API_KEY = 26


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    txn_id = request.transactional_id
    if not txn_id:
        return {"throttle_time": 0, "error_code": ErrorCode.INVALID_REQUEST}
    pid, epoch, commit = int(request.producer_id), int(request.producer_epoch), bool(request.committed)
    txns = ctx.broker.transactions
    code = ErrorCode(await txns.call(lambda t, now: txns.machine.end_txn(t, txn_id, pid, epoch, commit, now)))
    if code == ErrorCode.PRODUCER_FENCED and ctx.api_version < 2:
        code = ErrorCode.INVALID_PRODUCER_EPOCH
    return {"throttle_time": 0, "error_code": code}
