"""TxnOffsetCommit (28), v0-4: offsets committed as part of a transaction, sent to the group
coordinator (KafkaApis.handleTxnOffsetCommitRequest, GroupCoordinatorService.
commitTransactionalOffsets; docs/transactions.md, "Transactional offsets").

* unknown topics and partitions answer UNKNOWN_TOPIC_OR_PARTITION before the coordinator;
* the transaction must hold the group's ``__consumer_offsets`` partition (AddOffsetsToTxn):
  the verification Kafka's partition writer does — a fenced producer gets
  INVALID_PRODUCER_EPOCH, a partition not in the transaction INVALID_TXN_STATE (v0-3) or
  TRANSACTION_ABORTABLE (v4);
* then the group's rules: a consumer group's member epoch, a classic group's member and
  generation (no REBALANCE_IN_PROGRESS, no "group must be Empty" rule for transactional
  commits); the offsets are written in a transactional batch and stay pending until the
  transaction's marker.  Before v2, COORDINATOR_LOAD_IN_PROGRESS is answered
  COORDINATOR_NOT_AVAILABLE.
"""

from __future__ import annotations

from typing import Any

from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext
from ..groups.events import CommitRequest
from ..topics.store import OFFSETS_TOPIC
from ._groups_common import TopicErrorsBuilder, commit_topics

API_KEY = 28


def verification_error(code: ErrorCode, api_version: int) -> ErrorCode:
    """What the client sees of a failed transaction check (``AddPartitionsToTxnManager``)."""
    if code == ErrorCode.PRODUCER_FENCED:
        return ErrorCode.INVALID_PRODUCER_EPOCH
    if code in (ErrorCode.TRANSACTION_ABORTABLE, ErrorCode.CONCURRENT_TRANSACTIONS):
        return ErrorCode.TRANSACTION_ABORTABLE if api_version >= 4 else ErrorCode.INVALID_TXN_STATE
    return code


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    version = ctx.api_version
    broker = ctx.broker
    out = TopicErrorsBuilder()
    valid = commit_topics(ctx, request.topics, out)

    def every(code: ErrorCode) -> None:
        for t in valid:
            for p in t.partitions:
                out.add(t.name, p.partition, code)

    group_id = request.group_id
    pid, epoch = int(request.producer_id), int(request.producer_epoch)
    generation = int(getattr(request, "generation_id", -1))
    member_id = str(getattr(request, "member_id", ""))
    instance_id = getattr(request, "group_instance_id", None)
    if valid and not group_id:
        every(ErrorCode.INVALID_GROUP_ID)
        valid = []
    if valid:
        tp = (OFFSETS_TOPIC, broker.groups.partition_for(group_id))
        err = broker.transactions.machine.verify(request.transactional_id or "", pid, epoch, tp)
        if err is not None:
            every(verification_error(err, version))
            valid = []
    if valid and broker.consumer_groups.is_consumer_group(group_id):
        code = broker.consumer_groups.machine.validate_offset_commit(
            group_id, member_id, generation, version, transactional=True, instance_id=instance_id
        )
        if code is not None and code != ErrorCode.NONE:
            if code == ErrorCode.STALE_MEMBER_EPOCH:
                code = ErrorCode.ILLEGAL_GENERATION  # before v6
            every(code)
            valid = []
        generation, member_id, instance_id = -1, "", None
    if valid:
        result = await broker.groups.commit_offsets(
            CommitRequest(
                group_id=group_id,
                generation_id=generation,
                member_id=member_id,
                group_instance_id=instance_id,
                retention_time_ms=-1,
                topics=tuple(valid),
                api_version=version,
                producer=(pid, epoch),
            )
        )
        out.merge(result.topics)
    topics = out.as_list()
    if version < 2:
        for t in topics:
            for p in t["partitions"]:
                if p["error_code"] == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
                    p["error_code"] = ErrorCode.COORDINATOR_NOT_AVAILABLE
    return {"throttle_time": 0, "topics": topics}
