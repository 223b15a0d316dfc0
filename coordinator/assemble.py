"""Build the broker and wire its parts together: each part gets what it needs, explicitly.

    topics       TopicStore      data plane: topics, partitions, producer ids (data.dir/topics.json)
    groups       GroupsRuntime   classic group coordinator; writes its records to offsets_log
    offsets_log  OffsetsLog      __consumer_offsets segments; at start it replays them into groups

Start order is registration order (topics, groups, offsets_log: the log's start() loads the
groups it replays into the already started runtime); stop order is the reverse.
"""

from __future__ import annotations

from .broker import Broker, data_dir
from .clock import Clock, SystemClock
from .config import Config
from .groups.runtime import GroupsRuntime
from .storage import OffsetsLog
from .topics import TopicStore


def build_topics(cfg: Config) -> TopicStore:
    return TopicStore(
        default_partitions=cfg["num.partitions"],
        auto_create=cfg["auto.create.topics.enable"],
        data_dir=data_dir(cfg),
        retention_bytes=cfg["log.retention.bytes"],
        max_message_bytes=cfg["message.max.bytes"],
    )


def build_broker(cfg: Config, clock: Clock | None = None) -> Broker:
    clock = clock or SystemClock()
    groups = GroupsRuntime.from_config(cfg, clock)
    offsets_log = OffsetsLog.from_config(cfg, data_dir(cfg), clock, loader=groups.load)
    groups.offsets_log = offsets_log
    broker = Broker(cfg, clock=clock, topics=build_topics(cfg), groups=groups, offsets_log=offsets_log)
    broker.add_component(broker.topics)
    broker.add_component(groups)
    broker.add_component(offsets_log)  # after the groups runtime: its start() loads into it
    return broker
