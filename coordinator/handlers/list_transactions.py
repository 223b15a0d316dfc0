"""ListTransactions (66), v0-2: transactional ids and their states, for tools
(TransactionStateManager.listTransactionStates).  Filters: state names (unknown ones echoed in
``unknown_state_filters``), producer ids, v1 ``duration_filter`` (transactions running longer than
that many ms), v2 ``transactional_id_pattern`` (an RE2 full match; a bad pattern is
INVALID_REGULAR_EXPRESSION).  Dead ids are never listed."""

from __future__ import annotations

from typing import Any

from rallypoint.protocol.errors import ErrorCode
from rallypoint.protocol.offsets_schema import partition_for

from ..broker import RequestContext
from ..groups.consumer_model import RegexError, compile_regex
from ..transactions.machine import STATE_NAMES, TxnState

API_KEY = 66


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    broker = ctx.broker
    known = {name for state, name in STATE_NAMES.items() if state != TxnState.DEAD}
    wanted_states = set(request.state_filters)
    unknown = [s for s in request.state_filters if s not in STATE_NAMES.values()]
    pids = {int(p) for p in request.producer_id_filters}
    duration = int(getattr(request, "duration_filter", -1))
    pattern = getattr(request, "transactional_id_pattern", None)
    rx = None
    if pattern:
        try:
            rx = compile_regex(pattern)
        except RegexError:
            return {
                "throttle_time": 0,
                "error_code": ErrorCode.INVALID_REGULAR_EXPRESSION,
                "unknown_state_filters": [],
                "transaction_states": [],
            }
    now = broker.clock.now_ms()
    out = []
    cluster = broker.cluster
    n_partitions = broker.config["transaction.state.log.num.partitions"]
    for txn_id, t in sorted(broker.transactions.machine.visible().items()):
        if not cluster.single and cluster.txn_coordinator(partition_for(txn_id, n_partitions)) != ctx.node_id:
            continue  # a node lists the transactional ids it coordinates (docs/cluster.md)
        name = STATE_NAMES[t.state]
        if name not in known:
            continue
        if wanted_states and name not in wanted_states:
            continue
        if pids and t.producer_id not in pids:
            continue
        if duration >= 0 and (t.start_ms < 0 or now - t.start_ms <= duration):
            continue
        if rx is not None and rx.fullmatch(txn_id) is None:
            continue
        out.append({"transactional_id": txn_id, "producer_id": t.producer_id, "transaction_state": name})
    return {
        "throttle_time": 0,
        "error_code": ErrorCode.NONE,
        "unknown_state_filters": unknown,
        "transaction_states": out,
    }
