"""Wire the broker's components together (one place, so each helper adds one line)."""

from __future__ import annotations

from .broker import Broker
from .clock import Clock
from .config import Config
from .groups.runtime import GroupsRuntime
from .log import OffsetsLog


def build_broker(cfg: Config, clock: Clock | None = None) -> Broker:
    broker = Broker(cfg, clock)
    broker.add_component("topics", broker.topics)
    broker.add_component("groups", GroupsRuntime(broker))
    broker.add_component("offsets_log", OffsetsLog.from_broker(broker))  # after "groups": start() loads into it
    return broker
