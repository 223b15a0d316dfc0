"""AddPartitionsToTxn (24), v0-3: the client adds partitions to its transaction.

KafkaApis.handleAddPartitionsToTxnRequest + TransactionCoordinator.handleAddPartitionsToTransaction
(docs/transactions.md, "Requests"):

* an unknown topic or partition fails the whole request: those partitions answer
  UNKNOWN_TOPIC_OR_PARTITION, the others OPERATION_NOT_ATTEMPTED;
* otherwise every partition carries the coordinator's answer; PRODUCER_FENCED is answered
  INVALID_PRODUCER_EPOCH before v2.

v4+ (the broker-to-broker batch form with ``verify_only``) is not served: with one broker there
is no other leader to send it; the check it does happens inside Produce and TxnOffsetCommit.
"""

from __future__ import annotations

from typing import Any

from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext

API_KEY = 24


def _answer(by_topic: dict[str, dict[int, ErrorCode]]) -> dict[str, Any]:
    return {
        "throttle_time": 0,
        "results_by_topic_v3_and_below": [
            {
                "name": name,
                "results_by_partition": [
                    {"partition_index": p, "partition_error_code": code} for p, code in parts.items()
                ],
            }
            for name, parts in by_topic.items()
        ],
    }


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    txn_id = request.v3_and_below_transactional_id
    pid = int(request.v3_and_below_producer_id)
    epoch = int(request.v3_and_below_producer_epoch)
    wanted = [(t.name, int(p)) for t in request.v3_and_below_topics for p in t.partitions]
    if not txn_id:
        return _answer(_all(wanted, ErrorCode.INVALID_REQUEST))
    unknown = {tp for tp in wanted if ctx.broker.topics.partition(tp[0], tp[1]) is None}
    if unknown:
        out: dict[str, dict[int, ErrorCode]] = {}
        for name, p in wanted:
            code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if (name, p) in unknown else ErrorCode.OPERATION_NOT_ATTEMPTED
            out.setdefault(name, {})[p] = code
        return _answer(out)
    txns = ctx.broker.transactions
    code = ErrorCode(await txns.call(lambda t, now: txns.machine.add_partitions(t, txn_id, pid, epoch, wanted, now)))
    if code == ErrorCode.PRODUCER_FENCED and ctx.api_version < 2:
        code = ErrorCode.INVALID_PRODUCER_EPOCH
    return _answer(_all(wanted, code))


def _all(wanted: list[tuple[str, int]], code: ErrorCode) -> dict[str, dict[int, ErrorCode]]:
    out: dict[str, dict[int, ErrorCode]] = {}
    for name, p in wanted:
        out.setdefault(name, {})[p] = code
    return out
