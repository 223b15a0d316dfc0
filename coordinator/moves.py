"""Leadership changes of a running cluster (docs/cluster.md, "Moving things"): a partition's
leader set by hand, a group's coordinator moved, a node stopped or started.

A data partition changes leader at once: the next request to the old node gets
NOT_LEADER_OR_FOLLOWER, and the client finds the new leader.  A ``__consumer_offsets`` partition
moves its groups as Kafka's coordinator does when the partition changes leader: the old node
*unloads* them (their parked JoinGroups and SyncGroups answered NOT_COORDINATOR, everything of
them dropped from memory) once the partition's queued writes are on disk, and the new node
*loads* them by replaying the partition — the start-up path — while its requests for them get
COORDINATOR_LOAD_IN_PROGRESS.  Offsets and members (static and dynamic) come back from the log,
so a Stable group is Stable again at the same generation and nobody rebalances.  Every group of
the partition moves with it.  A partition whose leader is stopped offline is unloaded and stays
so until its node starts again.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from .logger import get as get_logger
from .topics.store import OFFSETS_TOPIC

if TYPE_CHECKING:
    from .broker import Broker

log = get_logger("rallypoint.cluster")


class Moves:
    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.loading: set[int] = set()  # __consumer_offsets partitions being moved

    def _offsets_partitions(self) -> int:
        return int(self.broker.groups.config.num_partitions)

    def coordinators(self) -> dict[int, int | None]:
        cluster = self.broker.cluster
        return {p: cluster.group_coordinator(p) for p in range(self._offsets_partitions())}

    async def settle(self, before: dict[int, int | None]) -> list[dict[str, object]]:
        """After a change of the cluster: move every ``__consumer_offsets`` partition whose
        coordinator changed.  Returns what moved (partition, from, to, groups, ms)."""
        after = self.coordinators()
        moved = []
        for p, old in before.items():
            new = after.get(p)
            if new != old:
                moved.append(await self._move(p, old, new))
        return moved

    async def _move(self, partition: int, old: int | None, new: int | None) -> dict[str, object]:
        b = self.broker
        t0 = time.monotonic()
        self.loading.add(partition)
        groups = 0
        try:
            if old is not None:
                await b.offsets_log.drain(partition)
                groups = sum(1 for g in b.groups.machine.groups.values() if g.partition == partition)
                b.groups.unload_partition(partition)
                b.consumer_groups.unload_partition(partition)
                b.share_groups.unload_partition(partition)
            if new is not None:
                state = await b.offsets_log.replay(partition)
                b.offsets_log.hand_over(partition, state)
        finally:
            self.loading.discard(partition)
        ms = round((time.monotonic() - t0) * 1000, 1)
        log.info("coordinator moved", partition=partition, old=old, new=new, groups=groups, ms=ms)
        return {"partition": partition, "from": old, "to": new, "groups": groups, "ms": ms}

    async def move_partition(self, topic: str, partition: int, node: int) -> list[dict[str, object]]:
        before = self.coordinators()
        self.broker.cluster.move(topic, partition, node)
        log.info("partition leader set", topic=topic, partition=partition, node=node)
        if topic != OFFSETS_TOPIC:
            return []
        return await self.settle(before)
