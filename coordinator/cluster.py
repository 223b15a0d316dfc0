"""Several brokers in one process: the nodes, who leads what, and where each node listens
(docs/cluster.md).

``rallypoint.brokers`` = N gives nodes ``node.id`` … ``node.id``+N−1, each with its own
listeners.  All nodes share one event loop, one topic store and one set of coordinators; what
makes them separate brokers to a client is only *which node answers what*:

* every topic partition and every ``__consumer_offsets`` / ``__transaction_state`` partition has
  a leader node.  The preferred leader of partition p is node ``(start + p) mod N`` in node
  order: ``start`` is 0 for internal topics (so offsets partition p is led by the p-th node,
  round-robin) and the CRC-32 of the topic name for the others (Kafka picks a random start per
  topic; this one is stable across restarts);
* a leader set with the control plane (a partition move) overrides the preferred one;
* a stopped node leads nothing: its partitions go to the next live node in node order, unless
  it was stopped *offline*, when they stay leaderless until it starts again;
* the coordinator of a group is the leader of its ``__consumer_offsets`` partition (Kafka's
  hash); of a transactional id, the leader of its ``__transaction_state`` partition.

With one node (the default) every question has the answer "this node" and costs nothing.
"""

from __future__ import annotations

import zlib
from contextvars import ContextVar

from msgspec import Struct, field

from .topics.store import OFFSETS_TOPIC, TRANSACTION_TOPIC

# The node of the listener the current connection came in on (set per connection task by the
# server, like the listener's endpoint).
CURRENT_NODE: ContextVar[int | None] = ContextVar("rallypoint_node", default=None)
# The name of that listener: Metadata answers with every node's endpoint of the same listener.
CURRENT_LISTENER: ContextVar[str | None] = ContextVar("rallypoint_listener", default=None)


class Cluster(Struct):
    """The nodes of this process: their advertised endpoints, which are up, and the leaders set by hand."""

    nodes: list[int]
    # node -> listener name -> advertised (host, port); filled by the server once it listens
    endpoints: dict[int, dict[str, tuple[str, int]]] = field(default_factory=dict)
    up: set[int] = field(default_factory=set)
    offline: set[int] = field(default_factory=set)  # stopped with their partitions leaderless
    moved: dict[tuple[str, int], int] = field(default_factory=dict)  # (topic, partition) -> leader set by hand
    version: int = 0  # moves on every change of leadership or liveness (Metadata's cache key)

    def __post_init__(self) -> None:
        if not self.up:
            self.up = set(self.nodes)

    @classmethod
    def of(cls, first_node: int, count: int) -> Cluster:
        return cls([first_node + i for i in range(count)])

    @property
    def single(self) -> bool:
        return len(self.nodes) == 1

    @property
    def first(self) -> int:
        return self.nodes[0]

    def current(self) -> int:
        """The node the current request came in on."""
        node = CURRENT_NODE.get()
        return self.nodes[0] if node is None else node

    # ------------------------------------------------------------------ leadership

    def preferred(self, topic: str, partition: int) -> int:
        n = len(self.nodes)
        if n == 1:
            return self.nodes[0]
        moved = self.moved.get((topic, partition))
        if moved is not None:
            return moved
        start = 0 if topic in (OFFSETS_TOPIC, TRANSACTION_TOPIC) else zlib.crc32(topic.encode()) % n
        return self.nodes[(start + partition) % n]

    def leader(self, topic: str, partition: int) -> int | None:
        """The node leading the partition now; None when it has no leader (offline)."""
        node = self.preferred(topic, partition)
        if node in self.up:
            return node
        if node in self.offline:
            return None
        i = self.nodes.index(node)
        for k in range(1, len(self.nodes)):
            candidate = self.nodes[(i + k) % len(self.nodes)]
            if candidate in self.up:
                return candidate
        return None

    def leads(self, topic: str, partition: int) -> bool:
        """Whether the current request's node leads the partition."""
        return len(self.nodes) == 1 or self.leader(topic, partition) == self.current()

    def group_coordinator(self, offsets_partition: int) -> int | None:
        return self.leader(OFFSETS_TOPIC, offsets_partition)

    def txn_coordinator(self, txn_partition: int) -> int | None:
        return self.leader(TRANSACTION_TOPIC, txn_partition)

    # ------------------------------------------------------------------ endpoints

    def endpoint(self, node: int, listener: str | None = None) -> tuple[str, int] | None:
        """The advertised (host, port) of ``node`` on ``listener`` (default: the current
        connection's listener, else the node's first)."""
        eps = self.endpoints.get(node)
        if not eps:
            return None
        name = listener if listener is not None else CURRENT_LISTENER.get()
        if name is not None and name in eps:
            return eps[name]
        return next(iter(eps.values()))

    def live_brokers(self) -> list[tuple[int, str, int]]:
        """(node, host, port) of every running node, on the current connection's listener."""
        out = []
        for node in self.nodes:
            if node in self.up:
                ep = self.endpoint(node)
                if ep is not None:
                    out.append((node, ep[0], ep[1]))
        return out

    # ------------------------------------------------------------------ changes

    def move(self, topic: str, partition: int, node: int) -> None:
        if node not in self.nodes:
            raise ValueError(f"no node {node} (nodes: {self.nodes})")
        self.moved[(topic, partition)] = node
        self.version += 1

    def stop(self, node: int, offline: bool = False) -> None:
        self.up.discard(node)
        if offline:
            self.offline.add(node)
        self.version += 1

    def start(self, node: int) -> None:
        self.up.add(node)
        self.offline.discard(node)
        self.version += 1
