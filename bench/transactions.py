"""Transactions per second, side by side with librdkafka's mock cluster: one confluent-kafka
transactional producer committing 1, 10 and 100 messages per transaction (docs/transactions.md).

    python -m bench.transactions [--quick]

The mock accepts the same requests but skips much of the semantics: it writes no markers
read_committed consumers honour, keeps no last stable offset, never fences or times out, and
acknowledges TxnOffsetCommit without applying it; rallypoint saves the coordinator state
(``transactions.json``, fsynced) at every transition and writes real markers.
"""

from __future__ import annotations

import argparse
import time
import uuid
from functools import partial
from typing import Any

from bench.common import Endpoint, side_by_side
from bench.compare import _ensure_topic


def transactions_per_s(ep: Endpoint, per_txn: int, seconds: float) -> float:
    from confluent_kafka import Producer

    topic = f"txn-bench-{per_txn}"
    _ensure_topic(ep, topic)
    p = Producer(
        {"bootstrap.servers": ep.bootstrap, "transactional.id": f"bench-{uuid.uuid4().hex[:8]}", "linger.ms": 0}
    )
    p.init_transactions(30)
    value = b"x" * 100
    done = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        p.begin_transaction()
        for _ in range(per_txn):
            p.produce(topic, value=value, partition=0)
        p.commit_transaction(30)
        done += 1
    return done / (time.perf_counter() - start)


def run(quick: bool = False) -> list[dict[str, Any]]:
    runs = 2 if quick else 3
    seconds = 1.5 if quick else 4.0
    rows: list[dict[str, Any]] = []
    for per_txn in (1, 10, 100):
        name = f"transactions/s, {per_txn} message{'s' if per_txn > 1 else ''} per transaction"
        measure = partial(lambda per, ep: transactions_per_s(ep, per, seconds), per_txn)
        # no fsync, like the mock
        rows.append(side_by_side(name, "txn/s", measure, runs, rallypoint_config={"rallypoint.offsets.flush": "never"}))
    if rows:
        rows[0]["note"] = ((rows[0].get("note", "") + "; ") if rows[0].get("note") else "") + (
            "transactions: the mock writes no markers read_committed consumers honour, keeps LSO = high "
            "watermark, never fences or times out a transaction and acknowledges TxnOffsetCommit without applying "
            "it; rallypoint saves its coordinator state at every transition (fsynced unless "
            "rallypoint.offsets.flush is never) and writes COMMIT/ABORT markers"
        )
    return rows


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    for r in run(p.parse_args().quick):
        print(r)
