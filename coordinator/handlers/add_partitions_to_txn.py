"""AddPartitionsToTxn (24), v0-3: the client adds partitions to its transaction.

KafkaApis.handleAddPartitionsToTxnRequest + TransactionCoordinator.handleAddPartitionsToTransaction
(docs/transactions.md, "Requests"):

* an unknown topic or partition fails the whole request: those partitions answer
  UNKNOWN_TOPIC_OR_PARTITION, the others OPERATION_NOT_ATTEMPTED;
* otherwise every partition carries the coordinator's answer; PRODUCER_FENCED is answered
  INVALID_PRODUCER_EPOCH before v2.

v4-5, the batch form partition leaders send (``handleAddPartitionsToTxnRequest`` v4+): several
transactions in one request, each answered on its own once all are done; ``verify_only``
answers per partition NONE when it is in the transaction, else TRANSACTION_ABORTABLE (the
producer id, epoch and state errors for all its partitions), changing nothing
(``handleVerifyPartitionsInTransaction``).  rallypoint's own leaders make that check in-process.
"""

from __future__ import annotations

from typing import Any

from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext

API_KEY = 24


def _topic_results(by_topic: dict[str, dict[int, ErrorCode]]) -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "results_by_partition": [{"partition_index": p, "partition_error_code": code} for p, code in parts.items()],
        }
        for name, parts in by_topic.items()
    ]


async def _one(
    ctx: RequestContext, txn_id: str, pid: int, epoch: int, wanted: list[tuple[str, int]], verify: bool
) -> dict[str, dict[int, ErrorCode]]:
    if not txn_id:
        return _all(wanted, ErrorCode.INVALID_REQUEST)
    unknown = {tp for tp in wanted if ctx.broker.topics.partition(tp[0], tp[1]) is None}
    if unknown:
        out: dict[str, dict[int, ErrorCode]] = {}
        for name, p in wanted:
            code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if (name, p) in unknown else ErrorCode.OPERATION_NOT_ATTEMPTED
            out.setdefault(name, {})[p] = code
        return out
    txns = ctx.broker.transactions
    if verify:
        out = {}
        for name, p in wanted:
            err = txns.machine.verify(txn_id, pid, epoch, (name, p))
            out.setdefault(name, {})[p] = ErrorCode.NONE if err is None else err
        return out
    code = ErrorCode(await txns.call(lambda t, now: txns.machine.add_partitions(t, txn_id, pid, epoch, wanted, now)))
    return _all(wanted, code)


async def _batch(ctx: RequestContext, request: Any) -> dict[str, Any]:
    results = []
    for txn in request.transactions:
        wanted = [(t.name, int(p)) for t in txn.topics for p in t.partitions]
        by_topic = await _one(
            ctx, txn.transactional_id, int(txn.producer_id), int(txn.producer_epoch), wanted, bool(txn.verify_only)
        )
        results.append({"transactional_id": txn.transactional_id, "topic_results": _topic_results(by_topic)})
    return {"throttle_time": 0, "error_code": ErrorCode.NONE, "results_by_transaction": results}


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    if ctx.api_version >= 4:
        return await _batch(ctx, request)
    wanted = [(t.name, int(p)) for t in request.v3_and_below_topics for p in t.partitions]
    by_topic = await _one(
        ctx,
        request.v3_and_below_transactional_id,
        int(request.v3_and_below_producer_id),
        int(request.v3_and_below_producer_epoch),
        wanted,
        verify=False,
    )
    if ctx.api_version < 2:  # PRODUCER_FENCED did not exist yet
        for parts in by_topic.values():
            for p, code in parts.items():
                if code == ErrorCode.PRODUCER_FENCED:
                    parts[p] = ErrorCode.INVALID_PRODUCER_EPOCH
    return {"throttle_time": 0, "results_by_topic_v3_and_below": _topic_results(by_topic)}


def _all(wanted: list[tuple[str, int]], code: ErrorCode) -> dict[str, dict[int, ErrorCode]]:
    out: dict[str, dict[int, ErrorCode]] = {}
    for name, p in wanted:
        out.setdefault(name, {})[p] = code
    return out
