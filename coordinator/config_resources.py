"""Config resources for DescribeConfigs (32), AlterConfigs (33) and IncrementalAlterConfigs
(44): what each resource type holds and how a change is checked and applied
(docs/configs.md).  Kafka's counterparts: ``ConfigHelper`` (describe), ``ConfigAdminManager``
and ``ControllerConfigurationValidator`` (alter).

Resource types: TOPIC (2) — the topic configs of ``topics/configs.py``, dynamic overrides kept
with the topic in topics.json; BROKER (4) — the broker's settings, all static here (described,
never altered); BROKER_LOGGER (8) — the level of each logger (``logger.py``); GROUP (32) —
``groups/group_configs.py``.  Every change of one resource is
checked completely before any of it is applied (all or nothing per resource).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from msgspec import Struct
from rallypoint.protocol.errors import ErrorCode

from . import logger
from .config import SETTINGS, Config
from .groups.group_configs import GROUP_CONFIGS, GROUP_DOCS, GroupConfigError, GroupConfigStore
from .topics import configs as topic_configs
from .topics.errors import TopicError
from .topics.store import TopicStore

E = ErrorCode

TOPIC: Final = 2
BROKER: Final = 4
BROKER_LOGGER: Final = 8
GROUP: Final = 32

# DescribeConfigs config_source
DYNAMIC_TOPIC_CONFIG: Final = 1
DYNAMIC_BROKER_CONFIG: Final = 2
STATIC_BROKER_CONFIG: Final = 4
DEFAULT_CONFIG: Final = 5
DYNAMIC_BROKER_LOGGER_CONFIG: Final = 6
GROUP_CONFIG: Final = 8

# DescribeConfigs config_type
T_BOOLEAN, T_STRING, T_INT, T_LONG, T_DOUBLE, T_LIST, T_PASSWORD = 1, 2, 3, 5, 6, 7, 9

# IncrementalAlterConfigs operations
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3

# Topic configs by type (for config_type and for APPEND/SUBTRACT, which only lists take).
_TOPIC_LISTS: Final = frozenset(
    {"cleanup.policy", "follower.replication.throttled.replicas", "leader.replication.throttled.replicas"}
)
_TOPIC_TYPES: Final[dict[str, int]] = {
    **{name: T_LONG for name in topic_configs.TOPIC_CONFIGS},
    **{name: T_LIST for name in _TOPIC_LISTS},
    "compression.type": T_STRING,
    "message.timestamp.type": T_STRING,
    "min.cleanable.dirty.ratio": T_DOUBLE,
    "preallocate": T_BOOLEAN,
    "remote.log.copy.disable": T_BOOLEAN,
    "remote.log.delete.on.disable": T_BOOLEAN,
    "remote.storage.enable": T_BOOLEAN,
    "unclean.leader.election.enable": T_BOOLEAN,
    "compression.gzip.level": T_INT,
    "compression.lz4.level": T_INT,
    "compression.zstd.level": T_INT,
    "index.interval.bytes": T_INT,
    "max.message.bytes": T_INT,
    "min.insync.replicas": T_INT,
    "segment.bytes": T_INT,
    "segment.index.bytes": T_INT,
}


class ConfigRequestError(Exception):
    """One resource's error: Kafka's code and message."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Entry(Struct, frozen=True):
    """One config of a resource as DescribeConfigs answers it: value, source, flags, type and synonyms."""

    name: str
    value: str | None
    source: int
    read_only: bool
    sensitive: bool
    config_type: int
    synonyms: tuple[tuple[str, str | None, int], ...] = ()
    documentation: str | None = None


class ConfigResources:
    """The config resources of one broker (``broker.config_resources``)."""

    def __init__(self, config: Config, topics: TopicStore, groups: GroupConfigStore, node_id: int) -> None:
        self.config = config
        self.topics = topics
        self.groups = groups
        self.node_id = node_id

    # ------------------------------------------------------------------ describe

    def describe(self, resource_type: int, name: str, keys: Sequence[str] | None) -> list[Entry]:
        """The resource's configs (only ``keys`` when given); ConfigRequestError otherwise."""
        if resource_type == TOPIC:
            entries = self._topic_entries(name)
        elif resource_type == BROKER:
            self._check_broker(name)
            entries = self._broker_entries()
        elif resource_type == GROUP:
            if not name:
                raise ConfigRequestError(E.INVALID_REQUEST, "Group name must not be empty")
            entries = self._group_entries(name)
        elif resource_type == BROKER_LOGGER:
            self._check_broker(name)
            entries = [
                Entry(logger_name, level, DYNAMIC_BROKER_LOGGER_CONFIG, False, False, T_STRING)
                for logger_name, level in logger.loggers().items()
            ]
        else:
            raise ConfigRequestError(E.INVALID_REQUEST, f"Unsupported resource type {resource_type}")
        if keys is not None:
            wanted = set(keys)
            entries = [e for e in entries if e.name in wanted]
        return entries

    def _topic_entries(self, name: str) -> list[Entry]:
        topic = self.topics.get(name) if name else None
        if topic is None:
            raise ConfigRequestError(E.UNKNOWN_TOPIC_OR_PARTITION, f"Topic {name} does not exist")
        broker = self.topics.broker_values()
        out = []
        for cfg in topic_configs.effective(topic.configs, broker):
            key = cfg["name"]
            synonyms: list[tuple[str, str | None, int]] = []
            if key in topic.configs:
                synonyms.append((key, topic.configs[key], DYNAMIC_TOPIC_CONFIG))
            broker_key = topic_configs.BROKER_DEFAULTS.get(key)
            if broker_key is not None:
                src = STATIC_BROKER_CONFIG if broker_key in self.config.explicit else DEFAULT_CONFIG
                synonyms.append((broker_key, str(broker[broker_key]), src))
            source = DYNAMIC_TOPIC_CONFIG if key in topic.configs else (synonyms[-1][2] if synonyms else DEFAULT_CONFIG)
            out.append(
                Entry(
                    key,
                    cfg["value"],
                    source,
                    False,
                    False,
                    _TOPIC_TYPES.get(key, T_STRING),
                    tuple(synonyms),
                    topic_configs.TOPIC_DOCS.get(key),
                )
            )
        return out

    def _check_broker(self, name: str) -> None:
        if name not in ("", str(self.node_id)):
            raise ConfigRequestError(
                E.INVALID_REQUEST, f"Unexpected broker id, expected {self.node_id} or empty string, but received {name}"
            )

    def _broker_entries(self) -> list[Entry]:
        out = []
        for key in sorted(SETTINGS):
            value = self.config.values.get(key)
            sensitive = "password" in key or key in ("rallypoint.sasl.users", "rallypoint.control.token")
            source = STATIC_BROKER_CONFIG if key in self.config.explicit else DEFAULT_CONFIG
            shown = None if sensitive or value is None else _render(value)
            ctype = T_PASSWORD if sensitive else _setting_type(value)
            out.append(Entry(key, shown, source, True, sensitive, ctype, ((key, shown, source),), SETTINGS[key].doc))
        return out

    def _group_entries(self, group_id: str) -> list[Entry]:
        dynamic = self.groups.dynamic(group_id)
        out = []
        for name, d in sorted(GROUP_CONFIGS.items()):
            synonyms: list[tuple[str, str | None, int]] = []
            if name in dynamic:
                synonyms.append((name, dynamic[name], GROUP_CONFIG))
            if d.broker_key is not None:
                src = STATIC_BROKER_CONFIG if d.broker_key in self.config.explicit else DEFAULT_CONFIG
                synonyms.append((d.broker_key, self.groups.broker_default(name), src))
            source = GROUP_CONFIG if name in dynamic else (synonyms[-1][2] if synonyms else DEFAULT_CONFIG)
            effective = self.groups.get(group_id, name)
            out.append(
                Entry(name, effective, source, False, False, d.config_type, tuple(synonyms), GROUP_DOCS.get(name))
            )
        return out

    # ------------------------------------------------------------------ alter

    def alter(self, resource_type: int, name: str, configs: Mapping[str, str | None], validate_only: bool) -> None:
        """AlterConfigs: the resource's dynamic configs become exactly ``configs``."""
        self._apply(resource_type, name, lambda current: dict(configs), validate_only)

    def incremental_alter(
        self, resource_type: int, name: str, ops: Sequence[tuple[str, int, str | None]], validate_only: bool
    ) -> None:
        """IncrementalAlterConfigs: SET / DELETE / APPEND / SUBTRACT on the dynamic configs."""
        names = [n for n, _op, _v in ops]
        if len(set(names)) != len(names):
            raise ConfigRequestError(E.INVALID_REQUEST, "Error due to duplicate config keys")
        if resource_type == BROKER_LOGGER:
            self._alter_loggers(name, ops, validate_only)
            return

        def change(current: dict[str, str]) -> dict[str, str | None]:
            out: dict[str, str | None] = dict(current)
            for key, op, value in ops:
                if op == SET:
                    out[key] = value
                elif op == DELETE:
                    out.pop(key, None)
                elif op in (APPEND, SUBTRACT):
                    self._check_list(resource_type, key, op)
                    base = out.get(key)
                    if base is None:
                        base = self._default(resource_type, key)
                    items = [v for v in (base or "").split(",") if v]
                    given = [v for v in (value or "").split(",") if v]
                    if op == APPEND:
                        items += [v for v in given if v not in items]
                    else:
                        items = [v for v in items if v not in given]
                    out[key] = ",".join(items)
                else:
                    raise ConfigRequestError(E.INVALID_REQUEST, f"Unknown operation type {op}")
            return out

        self._apply(resource_type, name, change, validate_only)

    def _alter_loggers(self, name: str, ops: Sequence[tuple[str, int, str | None]], validate_only: bool) -> None:
        """Kafka's ``RuntimeLoggerManager``: the resource name must be this node's id; every op
        is checked (in order, the first problem answers) before any is applied; SET gives a
        logger a level, DELETE makes it inherit its parent's again (never the root's);
        APPEND/SUBTRACT are refused.  Levels are not kept across a restart (as log4j's)."""
        nulls = [key for key, op, value in ops if op != DELETE and value is None]
        if nulls:
            raise ConfigRequestError(E.INVALID_REQUEST, "Null value not supported for : " + ", ".join(nulls))
        try:
            node = int(name)
        except ValueError:
            raise ConfigRequestError(E.INVALID_REQUEST, f"Node id must be an integer, but it is: {name}") from None
        if node != self.node_id:
            # (Kafka's message names its own id twice)
            raise ConfigRequestError(
                E.INVALID_REQUEST, f"Unexpected node id. Expected {self.node_id}, but received {self.node_id}"
            )
        valid = ", ".join(sorted(logger.LEVELS))
        for key, op, value in ops:
            if op in (SET, DELETE) and not logger.exists(key):
                raise ConfigRequestError(E.INVALID_CONFIG, f"Logger {key} does not exist!")
            if op == SET and value not in logger.LEVELS:
                raise ConfigRequestError(
                    E.INVALID_CONFIG,
                    f"Cannot set the log level of {key} to {value} as it is not a supported log level. "
                    f"Valid log levels are {valid}",
                )
            if op == DELETE and key == logger.ROOT:
                raise ConfigRequestError(
                    E.INVALID_REQUEST, f"Removing the log level of the {logger.ROOT} logger is not allowed"
                )
            if op in (APPEND, SUBTRACT):
                verb = "APPEND" if op == APPEND else "SUBTRACT"
                raise ConfigRequestError(
                    E.INVALID_REQUEST, f"{verb} operation is not allowed for the BROKER_LOGGER resource"
                )
            if op not in (SET, DELETE):
                raise ConfigRequestError(
                    E.INVALID_REQUEST, f"Unknown operation type {op} is not allowed for the BROKER_LOGGER resource"
                )
        if validate_only:
            return
        for key, op, value in ops:
            logger.set_level(key, value if op == SET else None)

    def _check_list(self, resource_type: int, key: str, op: int) -> None:
        verb = "append" if op == APPEND else "subtract"
        if resource_type == TOPIC:
            if key not in topic_configs.TOPIC_CONFIGS:
                raise ConfigRequestError(E.INVALID_CONFIG, f"Unknown topic config name: {key}")
            if key in _TOPIC_LISTS:
                return
        elif resource_type == GROUP and key not in GROUP_CONFIGS:
            raise ConfigRequestError(E.INVALID_CONFIG, f"Unknown group config name: {key}")
        raise ConfigRequestError(E.INVALID_REQUEST, f"Config value {verb} is not allowed for config key: {key}")

    def _default(self, resource_type: int, key: str) -> str:
        if resource_type == TOPIC:
            spec = topic_configs.TOPIC_CONFIGS[key]
            return spec[1] or ""
        return ""

    def _apply(self, resource_type: int, name: str, change: Any, validate_only: bool) -> None:
        if resource_type == TOPIC:
            topic = self.topics.get(name) if name else None
            if topic is None:
                raise ConfigRequestError(E.UNKNOWN_TOPIC_OR_PARTITION, f"Topic {name} does not exist")
            wanted = change(dict(topic.configs))
            try:
                clean = topic_configs.validate(wanted)
            except TopicError as e:
                raise ConfigRequestError(e.code, e.message) from None
            if not validate_only:
                self.topics.set_configs(name, clean)
        elif resource_type == GROUP:
            if not name:
                raise ConfigRequestError(E.INVALID_REQUEST, "Group name must not be empty")
            wanted = change(self.groups.dynamic(name))
            nulls = [k for k, v in wanted.items() if v is None]
            if nulls:
                raise ConfigRequestError(E.INVALID_REQUEST, f"Null value not supported for: {nulls[0]}")
            try:
                self.groups.check(wanted)
            except GroupConfigError as e:
                raise ConfigRequestError(E.INVALID_CONFIG, str(e)) from None
            if not validate_only:
                self.groups.replace(name, wanted)
        elif resource_type == BROKER_LOGGER:
            # ConfigAdminManager.preprocess: the legacy API cannot change loggers
            raise ConfigRequestError(E.INVALID_REQUEST, f"Unknown resource type {BROKER_LOGGER}")
        elif resource_type == BROKER:
            self._check_broker(name)
            wanted = change({})
            unknown = sorted(k for k in wanted if k not in SETTINGS)
            if unknown:
                raise ConfigRequestError(E.INVALID_CONFIG, f"Unknown broker config name: {unknown[0]}")
            if wanted:
                keys = ", ".join(sorted(wanted))
                raise ConfigRequestError(
                    E.INVALID_CONFIG, f"Cannot update these configs dynamically: Set({keys}) (rallypoint: static)"
                )
        else:
            raise ConfigRequestError(E.INVALID_REQUEST, f"Unsupported resource type {resource_type}")


def _render(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _setting_type(value: Any) -> int:
    if isinstance(value, bool):
        return T_BOOLEAN
    if isinstance(value, int):
        return T_LONG
    if isinstance(value, float):
        return T_DOUBLE
    return T_STRING
