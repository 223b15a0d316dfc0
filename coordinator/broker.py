"""The broker: everything a handler may ask, in one object.

The parts (topic store, group coordinator runtime, offsets log, ...) are typed attributes of
:class:`Broker`, built and wired by :func:`rallypoint.assemble.build_broker`.  Parts with a life
cycle are also registered with :meth:`Broker.add_component`; the server starts them before
listening and stops them, in reverse order, on shutdown.
"""

from __future__ import annotations

import inspect
import os
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from msgspec import Struct

from .clock import Clock
from .cluster import Cluster
from .config import Config
from .config_resources import ConfigResources
from .groups.group_configs import GroupConfigStore
from .logger import get as get_logger
from .moves import Moves
from .security.credentials import CredentialStore
from .security.listeners import CURRENT_ENDPOINT

if TYPE_CHECKING:
    from .groups.consumer_runtime import ConsumerGroupsRuntime
    from .groups.runtime import GroupsRuntime
    from .share.runtime import ShareGroupsRuntime
    from .storage import OffsetsLog
    from .topics import TopicStore
    from .transactions.runtime import TransactionsRuntime

log = get_logger("rallypoint.broker")


class Component(Protocol):
    """A part of the broker with a life cycle.

    Optionally also ``async def begin_shutdown(self) -> None``: called once shutdown starts,
    before in-flight requests are awaited; answer any request you hold parked (Kafka's
    coordinator answers NOT_COORDINATOR to pending joins when it unloads a group).
    """

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class CloseConnection(Exception):
    """Raised by a handler to close its connection without answering (Kafka's
    ``closeConnection``, e.g. a failed acks=0 Produce)."""


class RequestContext(Struct):
    """What a handler knows about the request besides its body."""

    broker: Broker
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    client_host: str
    connection_id: int
    node_id: int = -1  # the node whose listener the request came in on (docs/cluster.md)


def data_dir(config: Config) -> Path:
    return Path(config["data.dir"])


def _load_or_make_cluster_id(data_dir: Path, node_id: int) -> str:
    """Kafka keeps ``cluster.id`` in ``meta.properties``; so do we, so it is stable per data dir."""
    data_dir.mkdir(parents=True, exist_ok=True)
    meta = data_dir / "meta.properties"
    if meta.exists():
        for line in meta.read_text().splitlines():
            if line.startswith("cluster.id="):
                return line.split("=", 1)[1].strip()
    # Kafka's cluster ids are base64url UUIDs (22 chars); readable and valid for clients.
    import base64

    cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    tmp = meta.with_suffix(".tmp")
    tmp.write_text(f"version=1\ncluster.id={cid}\nnode.id={node_id}\n")
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    tmp.replace(meta)
    return cid


class Broker:
    """The running broker's parts, as typed attributes; built by :func:`rallypoint.assemble.build_broker`.

    ``topics`` (the in-memory data plane), ``groups`` (the classic group coordinator's runtime),
    ``consumer_groups`` (the KIP-848 consumer-group coordinator's runtime) and ``offsets_log``
    (the ``__consumer_offsets`` log both write to) are given to the constructor, already wired
    to each other; the broker only holds them, knows its identity (node id, cluster id, data
    directory) and runs the life cycle of its components.
    """

    def __init__(
        self,
        config: Config,
        *,
        clock: Clock,
        topics: TopicStore,
        groups: GroupsRuntime,
        consumer_groups: ConsumerGroupsRuntime,
        offsets_log: OffsetsLog,
        transactions: TransactionsRuntime,
        share_groups: ShareGroupsRuntime,
    ) -> None:
        self.config = config
        self.clock = clock
        self.node_id: int = config["node.id"]
        # the nodes this process serves and who leads what (docs/cluster.md)
        self.cluster = Cluster.of(self.node_id, config["rallypoint.brokers"])
        self.moves = Moves(self)  # coordinator moves when leadership changes
        self.data_dir = data_dir(config)
        self.cluster_id = _load_or_make_cluster_id(self.data_dir, self.node_id)
        self.topics = topics
        self.groups = groups
        self.consumer_groups = consumer_groups  # KIP-848 consumer groups
        self.offsets_log = offsets_log
        self.transactions = transactions  # the transaction coordinator (docs/transactions.md)
        self.share_groups = share_groups  # share groups (docs/share-groups.md)
        self.bound_port: int = config["port"]  # the server sets the port it really bound
        # SASL users and SCRAM credentials (docs/security.md, "Users and credentials")
        self.credentials = CredentialStore.from_config(config, self.data_dir)
        # Dynamic group configs and every config resource of DescribeConfigs/AlterConfigs
        # (docs/configs.md)
        self.group_configs = GroupConfigStore(config, self.data_dir)
        self.config_resources = ConfigResources(config, topics, self.group_configs, self.node_id)
        self._components: list[Component] = []

    @property
    def advertised_host(self) -> str:
        """Of the listener the current connection came in on (docs/security.md, "Listeners")."""
        endpoint = CURRENT_ENDPOINT.get()
        return endpoint[0] if endpoint is not None else self.config.advertised_host

    @property
    def advertised_port(self) -> int:
        endpoint = CURRENT_ENDPOINT.get()
        if endpoint is not None:
            return endpoint[1]
        p = self.config["advertised.port"]
        return int(p) if p is not None else self.bound_port

    def brokers(self) -> list[tuple[int, str, int]]:
        """(node id, host, port) of every running node, as the current connection's listener
        advertises them (docs/cluster.md)."""
        if self.cluster.single:
            return [(self.node_id, self.advertised_host, self.advertised_port)]
        return self.cluster.live_brokers()

    @property
    def controller_id(self) -> int:
        """The node named as controller: the first running one (KRaft brokers name the active
        controller; there is none here)."""
        return next((n for n in self.cluster.nodes if n in self.cluster.up), -1)

    def connection_closed(self, connection_id: int) -> None:
        """The server's word that a client connection is gone (share sessions go with it)."""
        self.share_groups.connection_closed(connection_id)

    def add_component(self, component: Component) -> None:
        """Start ``component`` with the broker (in registration order) and stop it in reverse."""
        self._components.append(component)

    async def start(self) -> None:
        for c in self._components:
            await c.start()

    async def begin_shutdown(self) -> None:
        for c in self._components:
            hook = getattr(c, "begin_shutdown", None)
            if hook is None:
                continue
            try:
                # sync hooks (the topic store wakes parked fetches) and async ones alike
                result = hook()
                if inspect.isawaitable(result):
                    await result
            except Exception:
                log.exception("component begin_shutdown failed", component=type(c).__name__)

    async def stop(self) -> None:
        for c in reversed(self._components):
            try:
                await c.stop()
            except Exception:
                log.exception("component stop failed", component=type(c).__name__)
