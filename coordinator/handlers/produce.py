"""Produce (0): append one record batch per partition, idempotence checks, acks 0/1/-1.

Follows KafkaApis.handleProduceRequest and ReplicaManager.appendRecords:

* transactional records without a transactional id → TRANSACTIONAL_ID_AUTHORIZATION_FAILED
  for every partition (KafkaApis); a transactional batch must come from the transaction's
  current epoch and go to a partition of the transaction (``_verify_transaction``);
* acks other than 0, 1, -1 → INVALID_REQUIRED_ACKS for every partition;
* unknown topic or partition → UNKNOWN_TOPIC_OR_PARTITION (Kafka does not auto-create topics
  on Produce; producers' Metadata requests do that), unknown topic id (v13) → UNKNOWN_TOPIC_ID;
* ``ProduceRequest.validateRecords`` → INVALID_RECORD / UNSUPPORTED_COMPRESSION_TYPE;
* internal topics (``__consumer_offsets``) → INVALID_TOPIC_EXCEPTION ("Cannot append to internal
  topic", ReplicaManager.appendToLocalLog);
* then the log's own checks: size, CRC, batch rules and every record walked
  (``topics/log_validator.py``; the walk yields to other connections between slices), a key on
  every record of a compacted topic (INVALID_RECORD with a record error otherwise), then
  producer state (``PartitionLog.append_client_batch``).  A refused batch is never stored.

With acks=0 there is no response; if any partition failed the connection is closed, as Kafka
does so the producer refreshes its metadata.
"""

from __future__ import annotations

import asyncio
from typing import Any

from rallypoint.protocol.errors import ErrorCode
from rallypoint.protocol.records import ATTR_TRANSACTIONAL, MAGIC, BatchHeader, CorruptBatchError, split_batches

from ..broker import CloseConnection, RequestContext
from ..logger import get as get_logger
from ..topics.log_validator import (
    BatchError,
    Checked,
    check_keys,
    check_records,
    validate_client_batch,
    validate_produce_records,
)
from ._leadership import LeaderHints, not_leader

API_KEY = 0

log = get_logger("rallypoint.produce")


def _error(
    index: int,
    code: ErrorCode,
    log_start_offset: int = -1,
    message: str | None = None,
    record_errors: tuple[tuple[int, str], ...] = (),
) -> dict[str, Any]:
    return {
        "index": index,
        "error_code": code,
        "base_offset": -1,
        "log_append_time": None,
        "log_start_offset": log_start_offset,
        "record_errors": [{"batch_index": i, "batch_index_error_message": m} for i, m in record_errors],
        "error_message": message,
    }


def _has_transactional_records(request: Any) -> bool:
    for topic in request.topic_data:
        for part in topic.partition_data:
            data = part.records
            if not data:
                continue
            try:
                spans = split_batches(data)
            except CorruptBatchError:
                continue
            for pos, _size in spans:
                if len(data) > pos + 22 and data[pos + 16] == MAGIC and data[pos + 22] & ATTR_TRANSACTIONAL:
                    return True
    return False


async def _walk_records(data: bytes, h: BatchHeader, max_uncompressed: int) -> Checked:
    """Every record of the batch walked, letting other connections run between slices."""
    for step in check_records(data, h, max_uncompressed):
        if step is None:
            await asyncio.sleep(0)
        else:
            return step
    raise AssertionError("check_records ends with its summary")


def _verify_transaction(ctx: RequestContext, txn_id: str, plog: Any, h: BatchHeader, tp: tuple[str, int]) -> None:
    """Before a transactional append: a stale epoch is INVALID_PRODUCER_EPOCH (checked first),
    then the transaction coordinator must hold the partition in the producer's transaction —
    the verification Kafka's leader asks for (``AddPartitionsToTxnManager``): a fenced producer
    gets INVALID_PRODUCER_EPOCH, a partition not in the transaction INVALID_TXN_STATE (v10 and
    older) or TRANSACTION_ABORTABLE (v11+)."""
    entry = plog.producers.get(h.producer_id)
    if entry is not None and h.producer_epoch < entry.epoch:
        raise BatchError(
            ErrorCode.INVALID_PRODUCER_EPOCH,
            f"Epoch of producer {h.producer_id} is {h.producer_epoch}, which is smaller than the last seen epoch "
            f"{entry.epoch}",
        )
    err = ctx.broker.transactions.machine.verify(txn_id, h.producer_id, h.producer_epoch, tp)
    if err is None:
        return
    if err == ErrorCode.PRODUCER_FENCED:
        err = ErrorCode.INVALID_PRODUCER_EPOCH
    elif err in (ErrorCode.TRANSACTION_ABORTABLE, ErrorCode.CONCURRENT_TRANSACTIONS):
        err = ErrorCode.TRANSACTION_ABORTABLE if ctx.api_version >= 11 else ErrorCode.INVALID_TXN_STATE
    raise BatchError(err, f"transaction check failed for {tp[0]}-{tp[1]}: {err.name}")


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any] | None:
    broker = ctx.broker
    store = broker.topics
    version = ctx.api_version
    acks = int(request.acks)
    by_id = version >= 13
    max_uncompressed = int(ctx.broker.config["rallypoint.max.uncompressed.batch.bytes"])

    blanket: ErrorCode | None = None
    txn_id = request.transactional_id
    if txn_id is None and _has_transactional_records(request):
        # KafkaApis: transactional records need a transactional id the principal may write
        blanket = ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    elif acks not in (0, 1, -1):
        blanket = ErrorCode.INVALID_REQUIRED_ACKS

    any_error = False
    hints = LeaderHints(ctx)  # docs/cluster.md: partitions another node leads
    responses: list[dict[str, Any]] = []
    for tdata in request.topic_data:
        if by_id:
            topic = store.by_id(tdata.topic_id)
            missing = ErrorCode.UNKNOWN_TOPIC_ID
        else:
            topic = store.get(tdata.name)
            missing = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        parts: list[dict[str, Any]] = []
        for pdata in tdata.partition_data:
            idx = int(pdata.index)
            if blanket is not None:
                parts.append(_error(idx, blanket))
                continue
            plog = topic.partition(idx) if topic is not None else None
            if plog is None:
                parts.append(_error(idx, missing if topic is None else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION))
                continue
            assert topic is not None
            elsewhere = not_leader(ctx, topic.name, idx)
            if elsewhere is not None:
                refused = _error(idx, elsewhere)
                if version >= 10:
                    refused["current_leader"] = hints.current_leader(topic.name, idx)
                parts.append(refused)
                continue
            data = pdata.records or b""
            try:
                pos, size = validate_produce_records(version, data)
            except BatchError as e:
                parts.append(_error(idx, e.code))
                continue
            if topic.is_internal:
                parts.append(_error(idx, ErrorCode.INVALID_TOPIC_EXCEPTION))
                continue
            try:
                h = validate_client_batch(data, pos, size, store.max_message_bytes_for(topic))
                checked = await _walk_records(data, h, max_uncompressed)
                if h.is_transactional:
                    _verify_transaction(ctx, txn_id or "", plog, h, (topic.name, idx))
                policy = store.policy(topic)
                if policy.compact:
                    check_keys(data, h, max_uncompressed, f"{topic.name}-{idx}")
                if plog.deleted:  # the topic went away while the walk yielded
                    raise BatchError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "the partition was deleted")
                now = ctx.broker.clock.now_ms()
                append_time = now if policy.log_append_time else None
                result = plog.append_client_batch(data, pos, size, h, checked, policy=policy, now_ms=now)
            except BatchError as e:
                log.info(
                    "produce refused",
                    topic=topic.name,
                    partition=idx,
                    error=e.code.name,
                    reason=e.message,
                    client_id=ctx.client_id,
                )
                lso = (
                    -1 if e.code in (ErrorCode.CORRUPT_MESSAGE, ErrorCode.MESSAGE_TOO_LARGE) else plog.log_start_offset
                )
                parts.append(_error(idx, e.code, lso, e.error_message, e.record_errors))
                continue
            parts.append(
                {
                    "index": idx,
                    "error_code": ErrorCode.NONE,
                    "base_offset": result.base_offset,
                    "log_append_time": append_time,  # None (-1) for CreateTime topics
                    "log_start_offset": result.log_start_offset,
                    "record_errors": [],
                    "error_message": None,
                }
            )
        any_error = any_error or any(int(p["error_code"]) != 0 for p in parts)
        entry: dict[str, Any] = {"partition_responses": parts}
        if by_id:
            entry["topic_id"] = tdata.topic_id
        else:
            entry["name"] = tdata.name
        responses.append(entry)

    if acks == 0:
        if any_error:
            raise CloseConnection("error in a produce request with acks=0")
        return None
    answer: dict[str, Any] = {"responses": responses, "throttle_time": 0}
    if hints.nodes and version >= 10:
        answer["node_endpoints"] = hints.node_endpoints()
    return answer
