"""AddOffsetsToTxn (25), v0-3: the client adds a group's ``__consumer_offsets`` partition to its
transaction, before TxnOffsetCommit (KafkaApis.handleAddOffsetsToTxnRequest: the
AddPartitionsToTxn rules for that one partition; PRODUCER_FENCED is INVALID_PRODUCER_EPOCH
before v2).  v4 belongs to the newer transaction protocol and is not served."""

from __future__ import annotations

from typing import Any

from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext
from ..topics.store import OFFSETS_TOPIC

API_KEY = 25


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    txn_id = request.transactional_id
    if not txn_id:
        return {"throttle_time": 0, "error_code": ErrorCode.INVALID_REQUEST}
    partition = ctx.broker.groups.partition_for(request.group_id)
    pid, epoch = int(request.producer_id), int(request.producer_epoch)
    txns = ctx.broker.transactions
    code = ErrorCode(
        await txns.call(
            lambda t, now: txns.machine.add_partitions(t, txn_id, pid, epoch, [(OFFSETS_TOPIC, partition)], now)
        )
    )
    if code == ErrorCode.PRODUCER_FENCED and ctx.api_version < 2:
        code = ErrorCode.INVALID_PRODUCER_EPOCH
    return {"throttle_time": 0, "error_code": code}
