"""NOT_LEADER_OR_FOLLOWER for a partition this node does not lead (docs/cluster.md,
"Leadership"), with the current leader where the version carries it (KIP-951: Produce v10+
and Fetch v12+ put ``current_leader`` in the partition and the leader's address in
``node_endpoints``, so the client goes there without a Metadata round trip)."""

from __future__ import annotations

from typing import Any

from rallypoint.protocol.errors import ErrorCode

from ..broker import RequestContext


def not_leader(ctx: RequestContext, topic: str, partition: int) -> ErrorCode | None:
    """The error for a partition whose leader is another node (or none: LEADER_NOT_AVAILABLE
    is not what Kafka says to a data request; it says NOT_LEADER_OR_FOLLOWER), None when this
    node leads it."""
    cluster = ctx.broker.cluster
    if cluster.single or cluster.leader(topic, partition) == ctx.node_id:
        return None
    return ErrorCode.NOT_LEADER_OR_FOLLOWER


class LeaderHints:
    """The ``current_leader`` of each refused partition and the ``node_endpoints`` to send."""

    def __init__(self, ctx: RequestContext) -> None:
        self.ctx = ctx
        self.nodes: dict[int, tuple[str, int]] = {}

    def current_leader(self, topic: str, partition: int) -> dict[str, int]:
        cluster = self.ctx.broker.cluster
        leader = cluster.leader(topic, partition)
        if leader is None:
            return {"leader_id": -1, "leader_epoch": -1}
        ep = cluster.endpoint(leader)
        if ep is None and leader == self.ctx.broker.node_id:  # not listening (in-process use)
            ep = (self.ctx.broker.advertised_host, self.ctx.broker.advertised_port)
        if ep is not None:
            self.nodes[leader] = ep
        return {"leader_id": leader, "leader_epoch": 0}

    def node_endpoints(self) -> list[dict[str, Any]]:
        return [{"node_id": n, "host": h, "port": p, "rack": None} for n, (h, p) in sorted(self.nodes.items())]
