"""Dynamic group configs (Kafka's ``GroupConfig``): per-group overrides set with
Incremental/AlterConfigs on resource type GROUP, described with DescribeConfigs
(docs/configs.md, "Resources").

The store keeps only what was set; :meth:`GroupConfigStore.get` answers the effective value
(the group's override, else the broker default).  It is written to
``<data.dir>/group-configs.json`` (a temporary file renamed over the old one) whenever it
changes, and read at start-up.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from msgspec import Struct

from ..config import Config, default

FILE_NAME: Final = "group-configs.json"


class GroupConfigDef(Struct, frozen=True):
    """One dynamic group config: its broker default, fallback, value check and DescribeConfigs type."""

    name: str
    broker_key: str | None  # the broker setting that is its default (and synonym)
    fallback: str  # default when there is no broker setting
    check: Callable[[str, Mapping[str, Any]], str | None]  # (value, broker values) -> error or None
    config_type: int  # DescribeConfigs ConfigType: 3 INT, 2 STRING


def _int_between(lo_key: str, hi_key: str) -> Callable[[str, Mapping[str, Any]], str | None]:
    def check(value: str, broker: Mapping[str, Any]) -> str | None:
        try:
            n = int(value.strip())
        except ValueError:
            return "Expected value to be a 32-bit integer"
        lo, hi = broker.get(lo_key), broker.get(hi_key)
        if lo is not None and n < int(lo):
            return f"must be greater than or equal to {lo_key} {lo}"
        if hi is not None and n > int(hi):
            return f"must be less than or equal to {hi_key} {hi}"
        return None

    return check


def _reset(value: str, broker: Mapping[str, Any]) -> str | None:
    v = value.strip().lower()
    if v in ("latest", "earliest"):
        return None
    if v.startswith("by_duration:") and len(v) > len("by_duration:"):
        return None  # an ISO-8601 duration (Kafka parses it with java.time.Duration)
    return "String must be one of: latest, earliest, by_duration:<ISO-8601 duration>"


def _isolation(value: str, broker: Mapping[str, Any]) -> str | None:
    if value.strip().lower() in ("read_committed", "read_uncommitted"):
        return None
    return "String must be one of: read_committed, read_uncommitted"


GROUP_CONFIGS: Final[dict[str, GroupConfigDef]] = {
    d.name: d
    for d in (
        GroupConfigDef(
            "consumer.session.timeout.ms",
            "group.consumer.session.timeout.ms",
            "45000",
            _int_between("group.consumer.min.session.timeout.ms", "group.consumer.max.session.timeout.ms"),
            3,
        ),
        GroupConfigDef(
            "consumer.heartbeat.interval.ms",
            "group.consumer.heartbeat.interval.ms",
            "5000",
            _int_between("group.consumer.min.heartbeat.interval.ms", "group.consumer.max.heartbeat.interval.ms"),
            3,
        ),
        GroupConfigDef(
            "share.session.timeout.ms",
            "group.share.session.timeout.ms",
            "45000",
            _int_between("group.share.min.session.timeout.ms", "group.share.max.session.timeout.ms"),
            3,
        ),
        GroupConfigDef(
            "share.heartbeat.interval.ms",
            "group.share.heartbeat.interval.ms",
            "5000",
            _int_between("group.share.min.heartbeat.interval.ms", "group.share.max.heartbeat.interval.ms"),
            3,
        ),
        GroupConfigDef(
            "share.record.lock.duration.ms",
            "group.share.record.lock.duration.ms",
            "30000",
            _int_between("group.share.min.record.lock.duration.ms", "group.share.max.record.lock.duration.ms"),
            3,
        ),
        GroupConfigDef("share.auto.offset.reset", None, "latest", _reset, 2),
        GroupConfigDef("share.isolation.level", None, "read_uncommitted", _isolation, 2),
    )
}


GROUP_DOCS: Final[dict[str, str]] = {
    "consumer.session.timeout.ms": "Session timeout of this consumer group's members (KIP-848).",
    "consumer.heartbeat.interval.ms": "Heartbeat interval this consumer group's members are told.",
    "share.session.timeout.ms": "Session timeout of this share group's members.",
    "share.heartbeat.interval.ms": "Heartbeat interval this share group's members are told.",
    "share.record.lock.duration.ms": "How long a share-group member holds a record it acquired.",
    "share.auto.offset.reset": "Where a share group starts reading a partition: earliest, latest or by_duration.",
    "share.isolation.level": "read_committed or read_uncommitted records for this share group.",
}


class GroupConfigError(ValueError):
    pass


class GroupConfigStore:
    """Every group's dynamic configs (``broker.group_configs``)."""

    def __init__(self, config: Config | None = None, data_dir: Path | None = None) -> None:
        self.broker: dict[str, Any] = dict(config.values) if config is not None else {}
        self.path = data_dir / FILE_NAME if data_dir is not None else None
        self.overrides: dict[str, dict[str, str]] = {}
        if self.path is not None and self.path.exists():
            loaded = json.loads(self.path.read_text(encoding="utf-8"))
            self.overrides = {str(g): {str(k): str(v) for k, v in c.items()} for g, c in loaded.items()}

    def broker_default(self, name: str) -> str:
        d = GROUP_CONFIGS[name]
        if d.broker_key is None:
            return d.fallback
        value = self.broker.get(d.broker_key)
        return str(value if value is not None else default(d.broker_key))

    def get(self, group_id: str, name: str) -> str:
        """The effective value of ``name`` for ``group_id``."""
        return self.overrides.get(group_id, {}).get(name) or self.broker_default(name)

    def dynamic(self, group_id: str) -> dict[str, str]:
        return dict(self.overrides.get(group_id, {}))

    def check(self, configs: Mapping[str, str]) -> None:
        """GroupConfigError (Kafka: INVALID_CONFIG) for an unknown name or a bad value."""
        for name, value in configs.items():
            d = GROUP_CONFIGS.get(name)
            if d is None:
                raise GroupConfigError(f"Unknown group config name: {name}")
            problem = d.check(value, self.broker)
            if problem is not None:
                raise GroupConfigError(f"Invalid value {value} for configuration {name}: {problem}")

    def replace(self, group_id: str, configs: Mapping[str, str]) -> None:
        """Make ``configs`` the group's whole set of overrides (validated first) and save."""
        self.check(configs)
        if configs:
            self.overrides[group_id] = dict(configs)
        else:
            self.overrides.pop(group_id, None)
        self.save()

    def save(self) -> None:
        if self.path is None:
            return
        tmp = self.path.with_suffix(".json.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.overrides, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
