"""OffsetCommit (8), v2-10 (docs/groups.md, "OffsetCommit").

Unknown topics and partitions are answered UNKNOWN_TOPIC_OR_PARTITION before the coordinator
is asked (``KafkaApis.handleOffsetCommitRequest``); a request with nothing valid left never
reaches the group.  v10 names topics by id (an unknown id: UNKNOWN_TOPIC_ID); those commits are
stored with the topic id (OffsetCommitValue v4, docs/consumer-groups.md, "Offsets").
"""

from __future__ import annotations

from typing import Any

from rallypoint.protocol.codec import ms
from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext
from ..groups.events import CommitRequest
from ._groups_common import TopicErrorsBuilder, commit_topics, resolve_topic_ids

API_KEY = 8


def _topic_id(ctx: Any, name: str) -> Any:
    t = ctx.broker.topics.get(name)
    return t.topic_id if t is not None else None


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    version = ctx.api_version
    out = TopicErrorsBuilder()
    topics = resolve_topic_ids(ctx, request.topics, out) if version >= 10 else request.topics
    valid = commit_topics(ctx, topics, out)
    generation = request.generation_id_or_member_epoch
    member_id = request.member_id
    instance_id = getattr(request, "group_instance_id", None)
    if valid and ctx.broker.consumer_groups.is_consumer_group(request.group_id):
        # A consumer group's member-epoch check (docs/consumer-groups.md, "Offsets"); once it
        # passes, the commit is stored like an admin commit of an offsets-only group.
        err = ctx.broker.consumer_groups.machine.validate_offset_commit(
            request.group_id,
            member_id,
            generation,
            version,
            [(_topic_id(ctx, t.name), p.partition) for t in valid for p in t.partitions],
            instance_id=instance_id,
        )
        if err is not None and err != ErrorCode.NONE:
            for t in valid:
                for p in t.partitions:
                    out.add(t.name, p.partition, err)
            return {"throttle_time": 0, "topics": out.as_list()}
        generation, member_id, instance_id = -1, "", None
    if valid:
        retention = getattr(request, "retention_time", None)
        result = await ctx.broker.groups.commit_offsets(
            CommitRequest(
                group_id=request.group_id,
                generation_id=generation,
                member_id=member_id,
                group_instance_id=instance_id,
                retention_time_ms=ms(retention) if retention is not None else -1,
                topics=tuple(valid),
                api_version=version,
            )
        )
        out.merge(result.topics)
    return {"throttle_time": 0, "topics": out.as_list()}
