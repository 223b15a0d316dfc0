"""Consumer-group records through the offsets log: appended already encoded, handed back raw
and in log order at start-up, then replayed by the runtime (docs/consumer-groups.md,
"Persistence")."""

from __future__ import annotations

from pathlib import Path

import pytest
from rallypoint.clock import FakeClock
from rallypoint.groups.consumer import ConsumerGroupConfig, StaticTopics
from rallypoint.groups.consumer_events import ConsumerHeartbeat
from rallypoint.groups.consumer_runtime import ConsumerGroupsRuntime
from rallypoint.protocol.consumer_group_records import GroupMetadataKey, decode_record
from rallypoint.protocol.offsets_schema import OffsetCommitKey, OffsetCommitValue
from rallypoint.storage import OffsetsLog

pytestmark = pytest.mark.unit


async def test_runtime_writes_and_a_new_runtime_replays(tmp_path: Path) -> None:
    topics = StaticTopics()
    topics.create("t", 4)
    cfg = ConsumerGroupConfig(assignment_interval_ms=0, num_partitions=3)
    clock = FakeClock()

    log = OffsetsLog(tmp_path, num_partitions=3, cleaner=False)
    rt = ConsumerGroupsRuntime(cfg, clock, topics, offsets_log=log)
    log.consumer_loader = rt.load_raw
    await log.start()
    await rt.start()
    r = await rt.heartbeat(
        ConsumerHeartbeat("g", "m1", 0, rebalance_timeout_ms=1000, subscribed_topic_names=("t",), topic_partitions={})
    )
    assert r.member_epoch == 2 and sum(map(len, r.assignment.values())) == 4
    p = rt.machine.partition_for("g")
    await log.append(p, [(OffsetCommitKey("g", "t", 0), OffsetCommitValue(5, "", 0))])  # classic records alongside
    await rt.stop()
    await log.stop()

    seen: list[tuple[int, list[tuple[bytes, bytes | None]]]] = []
    log2 = OffsetsLog(tmp_path, num_partitions=3, cleaner=False)
    rt2 = ConsumerGroupsRuntime(cfg, clock, topics, offsets_log=log2)

    def take(partition: int, records: list[tuple[bytes, bytes | None]]) -> None:
        seen.append((partition, list(records)))
        rt2.load_raw(partition, records)

    log2.consumer_loader = take
    await log2.start()
    await rt2.start()
    try:
        raw = next(recs for part, recs in seen if part == p)
        assert decode_record(*raw[0])[0].record_type == 5  # member metadata first, in log order
        assert (GroupMetadataKey("g"), None) not in [decode_record(*x) for x in raw]
        g = rt2.machine.groups["g"]
        assert (g.epoch, g.assignment_epoch, set(g.members)) == (2, 2, {"m1"})
        # the member continues at its epoch
        r = await rt2.heartbeat(ConsumerHeartbeat("g", "m1", 2))
        assert (r.error, r.member_epoch) == (0, 2)
    finally:
        await rt2.stop()
        await log2.stop()
