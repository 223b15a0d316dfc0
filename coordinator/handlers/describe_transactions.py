"""DescribeTransactions (65), v0: the state of transactional ids, for tools
(TransactionCoordinator.handleDescribeTransactions): ``""`` is INVALID_REQUEST, an unknown or
Dead id TRANSACTIONAL_ID_NOT_FOUND; else its producer id and epoch, state name, timeout,
start time (-1 when no transaction runs) and partitions."""

from __future__ import annotations

from typing import Any

from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext
from ..transactions.machine import STATE_NAMES, TxnState

API_KEY = 65


def _missing(txn_id: str, code: ErrorCode) -> dict[str, Any]:
    return {
        "error_code": code,
        "transactional_id": txn_id,
        "transaction_state": "",
        "transaction_timeout": 0,
        "transaction_start_time": -1,
        "producer_id": -1,
        "producer_epoch": -1,
        "topics": [],
    }


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    txns = ctx.broker.transactions.machine.visible()
    states = []
    for txn_id in request.transactional_ids:
        if txn_id == "":
            states.append(_missing(txn_id, ErrorCode.INVALID_REQUEST))
            continue
        t = txns.get(txn_id)
        if t is None or t.state == TxnState.DEAD:
            states.append(_missing(txn_id, ErrorCode.TRANSACTIONAL_ID_NOT_FOUND))
            continue
        by_topic: dict[str, list[int]] = {}
        for topic, p in sorted(t.partitions):
            by_topic.setdefault(topic, []).append(p)
        states.append(
            {
                "error_code": ErrorCode.NONE,
                "transactional_id": txn_id,
                "transaction_state": STATE_NAMES[t.state],
                "transaction_timeout": t.timeout_ms,
                "transaction_start_time": t.start_ms,
                "producer_id": t.producer_id,
                "producer_epoch": t.producer_epoch,
                "topics": [{"topic": name, "partitions": ps} for name, ps in by_topic.items()],
            }
        )
    return {"throttle_time": 0, "transaction_states": states}
