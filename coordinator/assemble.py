"""Build the broker and wire its parts together: each part gets what it needs, explicitly."""

from __future__ import annotations

from .broker import Broker
from .clock import Clock
from .config import Config
from .groups.consumer_runtime import ConsumerGroupsRuntime
from .groups.runtime import GroupsRuntime
from .storage import OffsetsLog


def build_broker(cfg: Config, clock: Clock | None = None) -> Broker:
    broker = Broker(cfg, clock)
    groups = GroupsRuntime.from_config(cfg, broker.clock)
    offsets_log = OffsetsLog.from_config(cfg, broker.data_dir, broker.clock, loader=groups.load)
    groups.offsets_log = offsets_log
    broker.groups = groups
    broker.offsets_log = offsets_log
    # KIP-848 consumer groups: their own coordinator on the same offsets log
    consumer_groups = ConsumerGroupsRuntime.from_config(cfg, broker.clock, broker.topics)
    consumer_groups.offsets_log = offsets_log
    consumer_groups.machine.classic_members = lambda gid: (
        len(g.members) if (g := groups.machine.groups.get(gid)) is not None else None
    )
    offsets_log.consumer_loader = consumer_groups.load_raw
    broker.consumer_groups = consumer_groups
    broker.add_component(broker.topics)
    broker.add_component(groups)
    broker.add_component(consumer_groups)
    broker.add_component(offsets_log)  # after the groups runtime: its start() loads into it
    return broker
