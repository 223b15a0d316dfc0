"""Reading for Fetch: KIP-74 size limits, long polling, per-partition results.

After ReplicaManager.fetchMessages/readFromLog and DelayedFetch:

* partitions are read in order; until one returns data, the first batch is returned even if
  larger than the limits (``minOneMessage``); each partition gets at most
  min(partition_max_bytes, what is left of max_bytes);
* the answer is immediate when max_wait ≤ 0, nothing readable was asked, min_bytes are
  available, or a partition had an error; otherwise the fetch parks until enough bytes
  arrive (counted as min(available, partition_max_bytes) per partition), a partition is
  deleted or truncated past the fetch offset, the broker shuts down, or max_wait passes —
  then it reads again.  Waiting uses one asyncio.Event per fetch registered with each
  partition's log, set by every append: no polling.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from msgspec import Struct
from rallypoint.protocol.errors import ErrorCode

from .partition import LEADER_EPOCH, OffsetOutOfRange, PartitionLog

# Kafka's fetch.max.bytes broker default: caps a request's max_bytes.
BROKER_FETCH_MAX_BYTES = 57671680


class ReadSpec(Struct):
    """One partition to read: its log (None if unknown) and the request's parameters."""

    log: PartitionLog | None
    fetch_offset: int
    partition_max_bytes: int
    current_leader_epoch: int = -1
    error: ErrorCode = ErrorCode.NONE  # set for partitions known to be erroneous up front


def error_data(index: int, code: ErrorCode) -> dict[str, Any]:
    """``FetchResponse.partitionResponse(tp, error)``: -1 offsets, empty records."""
    return {
        "partition_index": index,
        "error_code": code,
        "high_watermark": -1,
        "last_stable_offset": -1,
        "log_start_offset": -1,
        "aborted_transactions": None,
        "preferred_read_replica": -1,
        "records": b"",
    }


def _epoch_error(current_leader_epoch: int) -> ErrorCode | None:
    """``Partition.localLogWithEpochOrThrow``: the client's view of the leader epoch."""
    if current_leader_epoch < 0 or current_leader_epoch == LEADER_EPOCH:
        return None
    if current_leader_epoch > LEADER_EPOCH:
        return ErrorCode.UNKNOWN_LEADER_EPOCH
    return ErrorCode.FENCED_LEADER_EPOCH


def read_all(
    specs: Sequence[tuple[int, ReadSpec]], max_bytes: int, read_committed: bool
) -> tuple[list[dict[str, Any]], int, bool]:
    """(partition data in order, bytes read, any partition error) — ``readFromLog``."""
    out: list[dict[str, Any]] = []
    limit = max_bytes
    min_one = True
    total = 0
    errored = False
    for index, spec in specs:
        plog = spec.log
        if spec.error != ErrorCode.NONE:
            # Found erroneous before reading (KafkaApis' "erroneous" list): does not make the
            # fetch answer early.
            out.append(error_data(index, spec.error))
            continue
        if plog is None or plog.deleted:
            out.append(error_data(index, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
            errored = True
            continue
        epoch_error = _epoch_error(spec.current_leader_epoch)
        if epoch_error is not None:
            out.append(error_data(index, epoch_error))
            errored = True
            continue
        lso = plog.last_stable_offset
        try:
            res = plog.read(
                spec.fetch_offset, min(spec.partition_max_bytes, limit), min_one, lso if read_committed else None
            )
        except OffsetOutOfRange:
            out.append(error_data(index, ErrorCode.OFFSET_OUT_OF_RANGE))
            errored = True
            continue
        n = len(res.records)
        if n > 0:
            min_one = False
        limit = max(0, limit - n)
        total += n
        out.append(
            {
                "partition_index": index,
                "error_code": ErrorCode.NONE,
                "high_watermark": res.high_watermark,
                "last_stable_offset": lso,
                "log_start_offset": res.log_start_offset,
                # read_committed: the aborted transactions the client must skip (null otherwise)
                "aborted_transactions": [
                    {"producer_id": pid, "first_offset": first}
                    for pid, first in plog.aborted_between(spec.fetch_offset, lso)
                ]
                if read_committed and plog.aborted_txns
                else ([] if read_committed else None),
                "preferred_read_replica": -1,
                "records": res.records,
            }
        )
    return out, total, errored


def _can_complete(specs: Sequence[tuple[int, ReadSpec]], min_bytes: int, read_committed: bool) -> bool:
    """``DelayedFetch.tryComplete``."""
    accumulated = 0
    for _index, spec in specs:
        plog = spec.log
        if spec.error != ErrorCode.NONE:
            continue
        if plog is None or plog.deleted:
            return True
        off = spec.fetch_offset
        if off > plog.next_offset or off < plog.log_start_offset:
            return True  # truncated under us: answer with the error now
        upper = plog.last_stable_offset if read_committed else None
        accumulated += min(plog.bytes_available(off, upper), spec.partition_max_bytes)
        if accumulated >= min_bytes:
            return True
    return False


async def fetch(
    specs: Sequence[tuple[int, ReadSpec]],
    *,
    max_wait_ms: int,
    min_bytes: int,
    max_bytes: int,
    read_committed: bool,
    closing: Any,
) -> list[dict[str, Any]]:
    """Read now, or park until the request can complete (``fetchMessages``)."""
    max_bytes = min(max_bytes, BROKER_FETCH_MAX_BYTES)
    min_bytes = min(min_bytes, max_bytes)
    out, total, errored = read_all(specs, max_bytes, read_committed)
    readable = [s for s in specs if s[1].error == ErrorCode.NONE]
    if max_wait_ms <= 0 or not readable or total >= min_bytes or errored or closing():
        return out
    ev = asyncio.Event()
    logs = {id(s.log): s.log for _i, s in readable if s.log is not None}
    for plog in logs.values():
        plog.add_waiter(ev)
    deadline = time.monotonic() + max_wait_ms / 1000
    try:
        while not _can_complete(specs, min_bytes, read_committed) and not closing():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            ev.clear()
            try:
                await asyncio.wait_for(ev.wait(), remaining)
            except TimeoutError:
                break
    finally:
        for plog in logs.values():
            plog.remove_waiter(ev)
    out, _total, _errored = read_all(specs, max_bytes, read_committed)
    return out
