"""Topic-level configs: Kafka's names, light validation, effective values.

``retention.bytes``, ``max.message.bytes`` and ``message.timestamp.type`` change broker
behaviour here; the others are accepted and reported (CreateTopics v5+ answers with the
effective configs) so tools that set them work (docs/configs.md, "What takes effect").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from msgspec import Struct
from rallypoint.protocol.errors import ErrorCode

from .errors import TopicError

# Kafka's DescribeConfigs/CreateTopics config sources.
SOURCE_TOPIC = 1
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5

_LONG_MIN = -(2**63)


def _int(lo: int = _LONG_MIN, hi: int = 2**63 - 1) -> Callable[[str], None]:
    def check(v: str) -> None:
        n = int(v.strip())
        if not lo <= n <= hi:
            raise ValueError(f"Value must be at least {lo}" if n < lo else f"Value must be no more than {hi}")

    return check


def _ratio(v: str) -> None:
    x = float(v)
    if not 0.0 <= x <= 1.0:
        raise ValueError("Value must be at least 0" if x < 0 else "Value must be no more than 1")


def _bool(v: str) -> None:
    if v.strip().lower() not in ("true", "false"):
        raise ValueError("Expected value to be either true or false")


def _choice(*options: str) -> Callable[[str], None]:
    def check(v: str) -> None:
        for part in v.split(","):
            if part.strip() not in options:
                raise ValueError(f"String must be one of: {', '.join(options)}")

    return check


def _any(v: str) -> None:
    return None


def _timestamp_type(v: str) -> None:
    if v not in ("CreateTime", "LogAppendTime"):
        raise ValueError("String must be one of: CreateTime, LogAppendTime")


INT32_MAX = 2**31 - 1

# name -> (validator, default).  Defaults are Kafka 4.0's; a None default is taken from the
# broker config (see ``effective``).
TOPIC_CONFIGS: dict[str, tuple[Callable[[str], None], str | None]] = {
    "cleanup.policy": (_choice("delete", "compact"), "delete"),
    "compression.type": (_choice("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"), "producer"),
    "compression.gzip.level": (_int(-1, 9), "-1"),
    "compression.lz4.level": (_int(1, 17), "9"),
    "compression.zstd.level": (_int(-131072, 22), "3"),
    "delete.retention.ms": (_int(0), "86400000"),
    "file.delete.delay.ms": (_int(0), "60000"),
    "flush.messages": (_int(1), str(2**63 - 1)),
    "flush.ms": (_int(0), str(2**63 - 1)),
    "follower.replication.throttled.replicas": (_any, ""),
    "index.interval.bytes": (_int(0, INT32_MAX), "4096"),
    "leader.replication.throttled.replicas": (_any, ""),
    "local.retention.bytes": (_int(-2), "-2"),
    "local.retention.ms": (_int(-2), "-2"),
    "max.compaction.lag.ms": (_int(1), str(2**63 - 1)),
    "max.message.bytes": (_int(0, INT32_MAX), None),
    "message.timestamp.after.max.ms": (_int(0), "3600000"),
    "message.timestamp.before.max.ms": (_int(0), str(2**63 - 1)),
    "message.timestamp.type": (_timestamp_type, "CreateTime"),
    "min.cleanable.dirty.ratio": (_ratio, "0.5"),
    "min.compaction.lag.ms": (_int(0), "0"),
    "min.insync.replicas": (_int(1, INT32_MAX), "1"),
    "preallocate": (_bool, "false"),
    "remote.log.copy.disable": (_bool, "false"),
    "remote.log.delete.on.disable": (_bool, "false"),
    "remote.storage.enable": (_bool, "false"),
    "retention.bytes": (_int(), None),
    "retention.ms": (_int(-1), "604800000"),
    "segment.bytes": (_int(1024 * 1024, INT32_MAX), "1073741824"),
    "segment.index.bytes": (_int(4, INT32_MAX), "10485760"),
    "segment.jitter.ms": (_int(0), "0"),
    "segment.ms": (_int(1), "604800000"),
    "unclean.leader.election.enable": (_bool, "false"),
}

# topic config -> broker setting supplying its default
BROKER_DEFAULTS: dict[str, str] = {
    "retention.bytes": "log.retention.bytes",
    "max.message.bytes": "message.max.bytes",
    "retention.ms": "log.retention.ms",
    "segment.bytes": "log.segment.bytes",
    "segment.ms": "log.roll.ms",
    "delete.retention.ms": "log.cleaner.delete.retention.ms",
    "min.cleanable.dirty.ratio": "log.cleaner.min.cleanable.ratio",
    "flush.messages": "log.flush.interval.messages",
    "flush.ms": "log.flush.interval.ms",
}


class LogPolicy(Struct, frozen=True):
    """A topic's effective retention, segment and compaction settings (its dynamic configs over
    the broker's defaults): what its partitions' logs obey (docs/configs.md, "Retention and
    compaction")."""

    delete: bool = True  # cleanup.policy holds "delete": retention applies
    compact: bool = False  # cleanup.policy holds "compact": the cleaner applies
    retention_bytes: int = -1
    retention_ms: int = -1
    segment_bytes: int = 1073741824
    roll_ms: int = 604800000  # segment.ms; for compacted topics at most max.compaction.lag.ms
    delete_retention_ms: int = 86400000
    min_cleanable_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = 2**63 - 1
    log_append_time: bool = False
    # fsync the partition's log after this many messages / this long (durable topic data)
    flush_messages: int = 2**63 - 1
    flush_ms: int = 2**63 - 1
    # the broker's memory bound per partition (log.retention.bytes), kept by compact-only topics
    # too, where Kafka would keep everything on disk (docs/configs.md, "Retention and compaction")
    memory_bytes: int = -1


def policy(configs: Mapping[str, str], broker_values: Mapping[str, Any]) -> LogPolicy:
    """The :class:`LogPolicy` of a topic with dynamic ``configs``."""

    def get(name: str) -> str:
        if name in configs:
            return configs[name]
        if name in BROKER_DEFAULTS:
            return str(broker_values[BROKER_DEFAULTS[name]])
        return TOPIC_CONFIGS[name][1] or ""

    policies = {p.strip() for p in get("cleanup.policy").split(",") if p.strip()}
    compact = "compact" in policies
    max_lag = int(get("max.compaction.lag.ms"))
    roll_ms = int(get("segment.ms"))
    return LogPolicy(
        delete="delete" in policies,
        compact=compact,
        retention_bytes=int(get("retention.bytes")),
        retention_ms=int(get("retention.ms")),
        segment_bytes=int(get("segment.bytes")),
        roll_ms=min(roll_ms, max_lag) if compact else roll_ms,  # LogConfig.maxSegmentMs
        delete_retention_ms=int(get("delete.retention.ms")),
        min_cleanable_ratio=float(get("min.cleanable.dirty.ratio")),
        min_compaction_lag_ms=int(get("min.compaction.lag.ms")),
        max_compaction_lag_ms=max_lag,
        log_append_time=get("message.timestamp.type") == "LogAppendTime",
        flush_messages=int(get("flush.messages")),
        flush_ms=int(get("flush.ms")),
        memory_bytes=int(broker_values["log.retention.bytes"]),
    )


def validate(configs: Mapping[str, str | None]) -> dict[str, str]:
    """Raise TopicError(INVALID_CONFIG) as Kafka's ``LogConfig.validate`` would."""
    out: dict[str, str] = {}
    for name, value in configs.items():
        spec = TOPIC_CONFIGS.get(name)
        if spec is None:
            raise TopicError(ErrorCode.INVALID_CONFIG, f"Unknown topic config name: {name}")
        if value is None:
            raise TopicError(ErrorCode.INVALID_CONFIG, f"Null value not supported for topic configs: {name}")
        try:
            spec[0](value)
        except ValueError as e:
            raise TopicError(ErrorCode.INVALID_CONFIG, f"Invalid value {value} for configuration {name}: {e}") from None
        out[name] = value
    return out


def effective(configs: Mapping[str, str], broker_values: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every topic config with its value and source, sorted by name (CreateTopics v5+)."""
    result = []
    for name in sorted(TOPIC_CONFIGS):
        if name in configs:
            value, source = configs[name], SOURCE_TOPIC
        elif name in BROKER_DEFAULTS:
            value, source = str(broker_values[BROKER_DEFAULTS[name]]), SOURCE_DEFAULT
        else:
            value, source = TOPIC_CONFIGS[name][1] or "", SOURCE_DEFAULT
        result.append(
            {"name": name, "value": value, "read_only": False, "config_source": source, "is_sensitive": False}
        )
    return result


# What each topic config means, as DescribeConfigs (v3+) answers with ``include_documentation``;
# "(no effect here)" marks the ones a one-process in-memory broker accepts and stores only.
TOPIC_DOCS: dict[str, str] = {
    "cleanup.policy": "How old data goes: 'delete' (by age and size), 'compact' (latest value per key), or both.",
    "compression.type": "Compression of stored batches; 'producer' keeps the producer's codec. (No effect here.)",
    "compression.gzip.level": "gzip level when compression.type is gzip. (No effect here.)",
    "compression.lz4.level": "lz4 level when compression.type is lz4. (No effect here.)",
    "compression.zstd.level": "zstd level when compression.type is zstd. (No effect here.)",
    "delete.retention.ms": "How long a tombstone stays in a compacted topic after the cleaner first keeps it.",
    "file.delete.delay.ms": "Delay before a deleted segment file is removed. (No effect here.)",
    "flush.messages": "Messages between forced fsyncs of the log. (No effect here.)",
    "flush.ms": "Time between forced fsyncs of the log. (No effect here.)",
    "follower.replication.throttled.replicas": "Replicas throttled as followers. (No effect here.)",
    "index.interval.bytes": "Bytes between offset-index entries. (No effect here.)",
    "leader.replication.throttled.replicas": "Replicas throttled as leaders. (No effect here.)",
    "local.retention.bytes": "Bytes kept locally with tiered storage. (No effect here.)",
    "local.retention.ms": "Time data is kept locally with tiered storage. (No effect here.)",
    "max.compaction.lag.ms": "Longest time a record may stay uncompacted; also caps segment.ms of compacted topics.",
    "max.message.bytes": "Largest record batch a producer may append (MESSAGE_TOO_LARGE above it).",
    "message.timestamp.after.max.ms": "How far ahead of the broker's clock a record timestamp may be.",
    "message.timestamp.before.max.ms": "How far behind the broker's clock a record timestamp may be.",
    "message.timestamp.type": "CreateTime keeps producers' timestamps; LogAppendTime stamps batches with the broker's.",
    "min.cleanable.dirty.ratio": "Share of uncleaned bytes at which the cleaner compacts a partition.",
    "min.compaction.lag.ms": "Shortest time a record stays uncompacted.",
    "min.insync.replicas": "Replicas that must acknowledge acks=all writes. (One replica here.)",
    "preallocate": "Preallocate segment files. (No effect here.)",
    "remote.log.copy.disable": "Stop copying segments to tiered storage. (No effect here.)",
    "remote.log.delete.on.disable": "Delete tiered data when tiered storage is disabled. (No effect here.)",
    "remote.storage.enable": "Tiered storage for the topic. (No effect here.)",
    "retention.bytes": "Most bytes a partition keeps before its oldest batches go (-1: no limit).",
    "retention.ms": "How long data is kept before it is deleted (-1: forever).",
    "segment.bytes": "Size at which the active segment is rolled.",
    "segment.index.bytes": "Size of a segment's offset index. (No effect here.)",
    "segment.jitter.ms": "Random jitter subtracted from segment.ms. (No effect here.)",
    "segment.ms": "Age at which the active segment is rolled.",
    "unclean.leader.election.enable": "Allow out-of-sync replicas to become leader. (No effect here.)",
}
