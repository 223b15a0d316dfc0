"""Broker configuration with Kafka's property names.

Precedence: command-line flags (``--host``, ``--config key=value`` ...) > environment
variables ``KAFKA_<KEY>`` (dots → underscores, upper case, as the apache/kafka image does) >
defaults.  Unknown keys and bad values raise :class:`ConfigError` before anything listens.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any, Final

from msgspec import Struct, field


class ConfigError(ValueError):
    pass


def _bool(v: str) -> bool:
    s = v.strip().lower()
    if s in ("true", "1", "yes"):
        return True
    if s in ("false", "0", "no"):
        return False
    raise ValueError(f"not a boolean: {v!r}")


def _int_range(lo: int, hi: int = 2**63 - 1) -> Callable[[str], int]:
    def parse(v: str) -> int:
        n = int(v.strip())
        if not lo <= n <= hi:
            raise ValueError(f"{n} is outside [{lo}, {hi}]")
        return n

    return parse


def _choice(*options: str) -> Callable[[str], str]:
    def parse(v: str) -> str:
        s = v.strip().lower()
        if s not in options:
            raise ValueError(f"{v!r} is not one of {', '.join(options)}")
        return s

    return parse


def _str(v: str) -> str:
    return v.strip()


def _ratio(v: str) -> float:
    x = float(v.strip())
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"{x} is outside [0, 1]")
    return x


INT32_MAX: Final = 2**31 - 1


class Setting(Struct, frozen=True):
    """One accepted config key: how its value is parsed, its default and its line in the README's table."""

    key: str
    parse: Callable[[str], Any]
    default: Any
    doc: str
    # For a setting without a default of its own (``default`` None): what is used instead, as
    # the README's config table shows it.
    default_doc: str = ""


# Every key we accept, with its default: the only place a default is written.  Parts built
# without a Config (unit tests) take theirs from here through :func:`default`; the README's
# config table is generated from it (:func:`markdown_table`, ``make readme``; a test compares).
SETTINGS: Final[dict[str, Setting]] = {
    s.key: s
    for s in (
        Setting("host", _str, "127.0.0.1", "address to bind"),
        Setting("port", _int_range(0, 65535), 9092, "port to bind (0 = any free port)"),
        Setting("advertised.host", _str, None, "host clients are told to connect to", "(host)"),
        Setting("advertised.port", _int_range(0, 65535), None, "port clients are told", "(bound port)"),
        Setting(
            "advertised.listeners",
            _str,
            None,
            "Kafka's `NAME://host:port,...`: what each listener advertises",
        ),
        # Listeners, SASL and TLS: docs/security.md
        Setting(
            "listeners",
            _str,
            None,
            "Kafka's `NAME://host:port,...`; several at once; when set, host/port are not used",
            "PLAINTEXT://(host):(port)",
        ),
        Setting(
            "listener.security.protocol.map",
            _str,
            "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL",
            "listener name → security protocol (custom names allowed)",
        ),
        Setting("controller.listener.names", _str, None, "listeners not served (a KRaft controller's)"),
        Setting(
            "sasl.enabled.mechanisms",
            _str,
            "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
            "mechanisms SASL listeners offer (of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)",
        ),
        Setting(
            "rallypoint.sasl.users",
            _str,
            None,
            "`user:password,...`: users of PLAIN and both SCRAM mechanisms (passwords kept in memory only)",
        ),
        Setting(
            "rallypoint.sasl.scram.iterations",
            _int_range(4096, 16384),
            4096,
            "iterations of the SCRAM credentials derived from rallypoint.sasl.users",
        ),
        Setting(
            "connections.max.reauth.ms",
            _int_range(0, 2**62),
            0,
            "SASL session lifetime: re-authenticate before it ends or the connection is closed (0 = none)",
        ),
        Setting(
            "connection.failed.authentication.delay.ms",
            _int_range(0, INT32_MAX),
            100,
            "a connection that failed authentication is closed this long after its answer",
        ),
        Setting(
            "sasl.server.max.receive.size",
            _int_range(1, INT32_MAX),
            524288,
            "largest frame before authentication completes",
        ),
        Setting("ssl.keystore.type", _choice("pem"), "pem", "only PEM (KIP-651)"),
        Setting("ssl.keystore.location", _str, None, "PEM file: PKCS#8 key and certificate chain"),
        Setting("ssl.keystore.key", _str, None, "inline PEM private key (instead of a location)"),
        Setting("ssl.keystore.certificate.chain", _str, None, "inline PEM certificate chain"),
        Setting("ssl.key.password", _str, None, "password of an encrypted private key"),
        Setting("ssl.truststore.type", _choice("pem"), "pem", "only PEM (KIP-651)"),
        Setting("ssl.truststore.location", _str, None, "PEM file: CAs that client certificates are checked with"),
        Setting("ssl.truststore.certificates", _str, None, "inline PEM CA certificates"),
        Setting(
            "ssl.client.auth",
            _choice("none", "requested", "required"),
            "none",
            "mutual TLS: ask for / require a client certificate",
        ),
        Setting("data.dir", _str, "/tmp/rallypoint-data", "directory of topic data, offsets log, metadata"),
        Setting("node.id", _int_range(0, INT32_MAX), 1, "broker id in Metadata"),
        # several brokers in one process: docs/cluster.md
        Setting("rallypoint.brokers", _int_range(1, 64), 1, "brokers (nodes) served by this process"),
        Setting(
            "rallypoint.advertised.listeners",
            _str,
            "",
            "host:port advertised by each node, comma-separated in node order",
        ),
        Setting("socket.request.max.bytes", _int_range(1, INT32_MAX), 104857600, "largest request frame"),
        # Connection and request limits: docs/reliability.md, "Limits".
        Setting(
            "socket.send.buffer.bytes",
            _int_range(-1, INT32_MAX),
            102400,
            "SO_SNDBUF of client connections (-1 = the OS default)",
        ),
        Setting(
            "socket.receive.buffer.bytes",
            _int_range(-1, INT32_MAX),
            102400,
            "SO_RCVBUF of client connections (-1 = the OS default)",
        ),
        Setting(
            "queued.max.requests",
            _int_range(1, INT32_MAX),
            500,
            "requests read and not yet handed to their handler, all connections together; "
            "at the limit no connection reads more",
        ),
        Setting(
            "queued.max.request.bytes",
            _int_range(-(2**63)),
            -1,
            "bytes of requests being read or served, all connections together (Kafka's memory pool): "
            "while none are left, no connection reads another request; at least socket.request.max.bytes; "
            "<= 0: no limit",
        ),
        Setting("max.connections", _int_range(0, INT32_MAX), INT32_MAX, "connections at once; more are closed"),
        Setting(
            "max.connections.per.ip",
            _int_range(0, INT32_MAX),
            INT32_MAX,
            "connections from one address; more are closed",
        ),
        Setting(
            "connections.max.idle.ms",
            _int_range(-1, 2**62),
            600000,
            "close a connection with no traffic for this long (-1 = never)",
        ),
        Setting(
            "rallypoint.connection.max.queued.response.bytes",
            _int_range(1, INT32_MAX),
            65536,
            "answers held for a peer that does not read them; above it its requests wait",
        ),
        Setting(
            "rallypoint.request.max.elements",
            _int_range(1, INT32_MAX),
            100000,
            "array elements and tagged fields in one request; more closes the connection",
        ),
        Setting("auto.create.topics.enable", _bool, True, "create topics on Metadata/Produce"),
        Setting("num.partitions", _int_range(1, 100000), 1, "partitions of auto-created topics"),
        Setting(
            "rallypoint.create.max.partitions",
            _int_range(1, INT32_MAX),
            10000,
            "new partitions one CreateTopics or CreatePartitions may add (Kafka: 10000)",
        ),
        Setting("rallypoint.max.broker.partitions", _int_range(1, INT32_MAX), 50000, "partitions of all topics"),
        Setting(
            "rallypoint.auto.create.topics.max.per.request",
            _int_range(0, INT32_MAX),
            1000,
            "topics one Metadata request may auto-create",
        ),
        Setting("message.max.bytes", _int_range(0, INT32_MAX), 1048588, "largest record batch a producer may send"),
        Setting(
            "rallypoint.max.uncompressed.batch.bytes",
            _int_range(1024, INT32_MAX),
            16 * 1024 * 1024,
            "most bytes a produced compressed batch may decompress to",
        ),
        # durable topic data: docs/data-plane.md, "Durable topic data"
        Setting(
            "rallypoint.log.storage",
            _choice("disk", "memory"),
            "disk",
            "topic data in segment files under data.dir (disk), or in memory only (memory: the fastest tests)",
        ),
        Setting(
            "log.flush.interval.messages",
            _int_range(1),
            2**63 - 1,
            "fsync a partition's log after this many messages (default: leave it to the OS)",
        ),
        Setting(
            "log.flush.interval.ms",
            _int_range(0),
            2**63 - 1,
            "fsync a partition's log this long after a write (default: leave it to the OS)",
        ),
        Setting("log.retention.bytes", _int_range(-1), 256 * 1024 * 1024, "per-partition bytes kept"),
        # topic data retention and compaction: docs/configs.md, "Retention and compaction"
        Setting("log.retention.ms", _int_range(-1), 604800000, "how long topic data is kept (-1: forever)"),
        Setting("log.retention.check.interval.ms", _int_range(1), 300000, "how often time-based retention runs"),
        Setting("log.segment.bytes", _int_range(1024 * 1024, INT32_MAX), 1073741824, "segment size of topic data"),
        Setting("log.roll.ms", _int_range(1), 604800000, "age at which an active segment is rolled"),
        Setting("log.cleaner.backoff.ms", _int_range(0), 15000, "pause of the log cleaner between checks"),
        Setting(
            "log.cleaner.min.cleanable.ratio", _ratio, 0.5, "dirty share of a compacted log that starts a cleaning"
        ),
        Setting("group.initial.rebalance.delay.ms", _int_range(0, INT32_MAX), 0, "initial rebalance delay"),
        Setting("group.min.session.timeout.ms", _int_range(0, INT32_MAX), 6000, "smallest session timeout"),
        Setting("group.max.session.timeout.ms", _int_range(0, INT32_MAX), 1800000, "largest session timeout"),
        Setting("group.max.size", _int_range(1, INT32_MAX), INT32_MAX, "members per group"),
        # consumer groups (KIP-848): docs/consumer-groups.md, "Configuration"
        Setting(
            "max.request.partition.size.limit",
            _int_range(1, INT32_MAX),
            2000,
            "partitions one DescribeTopicPartitions answer holds at most",
        ),
        Setting("group.consumer.session.timeout.ms", _int_range(1, INT32_MAX), 45000, "consumer-group session timeout"),
        Setting("group.consumer.min.session.timeout.ms", _int_range(1, INT32_MAX), 45000, "its lower bound"),
        Setting("group.consumer.max.session.timeout.ms", _int_range(1, INT32_MAX), 60000, "its upper bound"),
        Setting("group.consumer.heartbeat.interval.ms", _int_range(1, INT32_MAX), 5000, "consumer-group heartbeat"),
        Setting("group.consumer.min.heartbeat.interval.ms", _int_range(1, INT32_MAX), 5000, "its lower bound"),
        Setting("group.consumer.max.heartbeat.interval.ms", _int_range(1, INT32_MAX), 15000, "its upper bound"),
        Setting("group.consumer.max.size", _int_range(1, INT32_MAX), INT32_MAX, "members per consumer group"),
        Setting("group.consumer.assignors", _str, "uniform,range", "server assignors; the first is the default"),
        Setting(
            "group.consumer.migration.policy",
            _choice("bidirectional", "upgrade", "downgrade", "disabled"),
            "bidirectional",
            "classic <-> consumer group conversions",
        ),
        Setting(
            "group.consumer.assignment.interval.ms",
            _int_range(0, INT32_MAX),
            1000,
            "least time between two target assignments of a group",
        ),
        # share groups: docs/share-groups.md, "Configuration"
        Setting("group.share.session.timeout.ms", _int_range(1, INT32_MAX), 45000, "share-group session timeout"),
        Setting("group.share.min.session.timeout.ms", _int_range(1, INT32_MAX), 45000, "its lower bound"),
        Setting("group.share.max.session.timeout.ms", _int_range(1, INT32_MAX), 60000, "its upper bound"),
        Setting("group.share.heartbeat.interval.ms", _int_range(1, INT32_MAX), 5000, "share-group heartbeat"),
        Setting("group.share.min.heartbeat.interval.ms", _int_range(1, INT32_MAX), 5000, "its lower bound"),
        Setting("group.share.max.heartbeat.interval.ms", _int_range(1, INT32_MAX), 15000, "its upper bound"),
        Setting(
            "group.share.record.lock.duration.ms",
            _int_range(1000, 3600000),
            30000,
            "how long a share consumer holds the records it acquired",
        ),
        Setting("group.share.min.record.lock.duration.ms", _int_range(1000, 30000), 15000, "its lower bound"),
        Setting("group.share.max.record.lock.duration.ms", _int_range(30000, 3600000), 60000, "its upper bound"),
        Setting(
            "group.share.delivery.count.limit",
            _int_range(2, 10),
            5,
            "deliveries of a record before it is archived",
        ),
        Setting(
            "group.share.partition.max.record.locks",
            _int_range(100, 10000),
            2000,
            "records in flight per share partition",
        ),
        Setting("group.share.max.size", _int_range(1, 1000), 200, "members per share group"),
        Setting("group.share.max.share.sessions", _int_range(1, INT32_MAX), 2000, "share sessions per broker"),
        Setting("offsets.topic.num.partitions", _int_range(1, 10000), 50, "partitions of `__consumer_offsets`"),
        # transactions: docs/transactions.md, "Configuration"
        Setting(
            "transaction.state.log.num.partitions", _int_range(1, 10000), 50, "partitions of `__transaction_state`"
        ),
        Setting("transaction.max.timeout.ms", _int_range(1, INT32_MAX), 900000, "longest transaction timeout"),
        Setting(
            "rallypoint.max.transactional.ids",
            _int_range(1, 1_000_000),
            10000,
            "transactional ids the coordinator keeps at most",
        ),
        Setting(
            "transactional.id.expiration.ms",
            _int_range(1, INT32_MAX),
            604800000,
            "idle time after which a transactional id is forgotten",
        ),
        Setting(
            "transaction.abort.timed.out.transaction.cleanup.interval.ms",
            _int_range(1, INT32_MAX),
            10000,
            "how often timed-out transactions are aborted",
        ),
        Setting(
            "transaction.remove.expired.transaction.cleanup.interval.ms",
            _int_range(1, INT32_MAX),
            3600000,
            "how often expired transactional ids are removed",
        ),
        Setting("offsets.topic.segment.bytes", _int_range(1024, INT32_MAX), 104857600, "offsets log segment size"),
        Setting("offset.metadata.max.bytes", _int_range(0, INT32_MAX), 4096, "largest commit metadata"),
        Setting("offsets.retention.minutes", _int_range(1, INT32_MAX), 10080, "offset retention"),
        Setting("offsets.retention.check.interval.ms", _int_range(1, 2**62), 600000, "how often offsets expire"),
        Setting("log.cleaner.delete.retention.ms", _int_range(0, 2**62), 86400000, "how long tombstones are kept"),
        Setting(
            "rallypoint.offsets.flush",
            _choice("always", "interval", "never"),
            "always",
            "fsync policy of the offsets log",
        ),
        Setting("rallypoint.offsets.flush.interval.ms", _int_range(1, INT32_MAX), 1000, "fsync interval"),
        Setting(
            "rallypoint.control.port",
            _int_range(-1, 65535),
            None,
            "control HTTP port (docs/control.md); unset: 9644, or a free port when 9644 is taken; 0 = any; -1 = off",
        ),
        Setting("rallypoint.control.token", _str, None, "bearer token the control endpoints then require"),
        Setting(
            "rallypoint.control.request.log.size",
            _int_range(0, 10_000_000),
            10000,
            "request log entries kept (0 = off)",
        ),
    )
}


def default(key: str) -> Any:
    """The default of setting ``key`` (KeyError for an unknown key)."""
    return SETTINGS[key].default


def _render_default(setting: Setting) -> str:
    value = setting.default
    if value is None:
        return setting.default_doc
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def markdown_table() -> str:
    """The README's config table (between its ``config-table`` markers), rendered from SETTINGS."""
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for s in SETTINGS.values():
        rows.append(f"| `{s.key}` | {_render_default(s)} | {s.doc} |")
    return "\n".join(rows) + "\n"


def env_name(key: str) -> str:
    return "KAFKA_" + key.replace(".", "_").upper()


class Config(Struct):
    """The broker's settings: every key's value after defaults, environment variables and overrides."""

    values: dict[str, Any] = field(default_factory=dict)
    explicit: frozenset[str] = frozenset()  # keys set by the environment or an override (not defaults)

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def get(self, key: str) -> Any:
        return self.values[key]

    @property
    def advertised_host(self) -> str:
        h = self.values["advertised.host"]
        if h:
            return str(h)
        host = str(self.values["host"])
        return "127.0.0.1" if host in ("0.0.0.0", "::", "") else host


# Env vars of the apache/kafka image that we read but that are not settings of ours.
_IGNORED_ENV: Final = {
    "KAFKA_HEAP_OPTS",
    "KAFKA_OPTS",
    "KAFKA_LOG4J_OPTS",
    "KAFKA_JMX_OPTS",
    "KAFKA_PROCESS_ROLES",
    "KAFKA_CONTROLLER_QUORUM_VOTERS",
    "KAFKA_INTER_BROKER_LISTENER_NAME",
    "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
    "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
    "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
    "KAFKA_CLUSTER_ID",
    "KAFKA_BROKER_ID",
    "KAFKA_LOG_DIRS",
    "KAFKA_VERSION",
}

_ENV_ALIASES: Final = {"KAFKA_LOG_DIRS": "data.dir", "KAFKA_BROKER_ID": "node.id"}


def _parse_listener(value: str) -> tuple[str | None, int | None]:
    """``PLAINTEXT://host:port[,...]`` → (host, port) of the first listener.

    An empty host (``PLAINTEXT://:9092``) leaves the advertised host at its default, as a
    Kafka listener with an empty host means "this machine".
    """
    first = value.split(",")[0].strip()
    if "://" in first:
        first = first.split("://", 1)[1]
    if first.startswith("["):  # [ipv6]:port
        host, _, rest = first[1:].partition("]")
        port = rest.lstrip(":")
    elif ":" in first:
        host, _, port = first.rpartition(":")
    else:
        host, port = first, ""
    if not host and not port:
        raise ValueError(f"no host or port in listener {value!r}")
    return (host or None), (int(port) if port else None)


def load(overrides: Mapping[str, str] | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Merge defaults < environment < overrides (already stringly, Kafka property names)."""
    env = os.environ if env is None else env
    raw: dict[str, tuple[str, str]] = {}  # key -> (value, where it came from)
    for name, value in env.items():
        if not name.startswith("KAFKA_") or name in _IGNORED_ENV - set(_ENV_ALIASES):
            continue
        key = _ENV_ALIASES.get(name) or name[len("KAFKA_") :].lower().replace("_", ".")
        if key not in SETTINGS:
            # Unknown KAFKA_* variables are other tools' business (the apache/kafka image
            # accepts any broker property); we only refuse unknown keys given to us directly.
            continue
        raw[key] = (value, f"environment variable {name}")
    for key, value in (overrides or {}).items():
        if key not in SETTINGS:
            raise ConfigError(f"unknown config key {key!r} (known keys: see README)")
        raw[key] = (value, f"--config {key}")
    values = {k: s.default for k, s in SETTINGS.items()}
    for key, (value, where) in raw.items():
        try:
            values[key] = SETTINGS[key].parse(value)
        except (ValueError, TypeError) as e:
            raise ConfigError(f"bad value for {key} from {where}: {e}") from None
    if values["advertised.listeners"] and not values["listeners"]:
        try:
            host, port = _parse_listener(values["advertised.listeners"])
        except ValueError as e:
            raise ConfigError(f"bad advertised.listeners: {e}") from None
        if "advertised.host" not in raw and host is not None:
            values["advertised.host"] = host
        if "advertised.port" not in raw and port is not None:
            values["advertised.port"] = port
    if values["group.min.session.timeout.ms"] > values["group.max.session.timeout.ms"]:
        raise ConfigError("group.min.session.timeout.ms is larger than group.max.session.timeout.ms")
    pool, frame = values["queued.max.request.bytes"], values["socket.request.max.bytes"]
    if 0 < pool < frame:
        # SocketServer's SimpleMemoryPool refuses a pool smaller than one request.
        raise ConfigError(f"queued.max.request.bytes ({pool}) must be at least socket.request.max.bytes ({frame})")
    _check_consumer_group_settings(values)
    _check_security_settings(values)
    return Config(values, frozenset(raw))


def _check_security_settings(values: Mapping[str, Any]) -> None:
    """Listeners, SASL users and mechanisms, TLS material: refused before anything listens."""
    from .security import listeners as listeners_mod
    from .security.credentials import parse_users
    from .security.sasl import parse_mechanisms

    try:
        found = listeners_mod.from_config(values)
        parse_mechanisms(values["sasl.enabled.mechanisms"])
        parse_users(values["rallypoint.sasl.users"])
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if any(listener.tls for listener in found):
        has_location = bool(values["ssl.keystore.location"])
        has_inline = bool(values["ssl.keystore.key"] or values["ssl.keystore.certificate.chain"])
        if has_location == has_inline:
            raise ConfigError(
                "an SSL or SASL_SSL listener needs ssl.keystore.location, or ssl.keystore.key and "
                "ssl.keystore.certificate.chain (PEM), but not both"
            )
        if has_inline and not (values["ssl.keystore.key"] and values["ssl.keystore.certificate.chain"]):
            raise ConfigError("ssl.keystore.key and ssl.keystore.certificate.chain go together")
        from .security.tls import server_context

        try:
            server_context(values)  # the files are read and checked now, before anything listens
        except ValueError as e:
            raise ConfigError(str(e)) from None


def _check_consumer_group_settings(values: Mapping[str, Any]) -> None:
    """Kafka's ``GroupCoordinatorConfig`` checks of the ``group.consumer.*`` keys."""
    p = "group.consumer."
    for what in ("session.timeout.ms", "heartbeat.interval.ms"):
        lo, v, hi = values[p + "min." + what], values[p + what], values[p + "max." + what]
        if not lo <= v <= hi:
            raise ConfigError(f"{p}{what} ({v}) must be between {p}min.{what} ({lo}) and {p}max.{what} ({hi})")
    if values[p + "heartbeat.interval.ms"] >= values[p + "session.timeout.ms"]:
        raise ConfigError(f"{p}heartbeat.interval.ms must be less than {p}session.timeout.ms")
    names = [a.strip() for a in str(values[p + "assignors"]).split(",") if a.strip()]
    if not names or len(set(names)) != len(names) or any(n not in ("uniform", "range") for n in names):
        raise ConfigError(
            f"{p}assignors must list distinct assignors among uniform, range (got {values[p + 'assignors']!r})"
        )
    s = "group.share."
    for what in ("session.timeout.ms", "heartbeat.interval.ms", "record.lock.duration.ms"):
        lo, v, hi = values[s + "min." + what], values[s + what], values[s + "max." + what]
        if not lo <= v <= hi:
            raise ConfigError(f"{s}{what} ({v}) must be between {s}min.{what} ({lo}) and {s}max.{what} ({hi})")
