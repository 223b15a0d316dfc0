"""Configuration: defaults, precedence, refusal of bad settings, advertised address, stable ids."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from rallypoint import cli, probe
from rallypoint import config as config_mod
from rallypoint.assemble import build_topics
from rallypoint.clock import SystemClock
from rallypoint.groups.model import GroupConfig
from rallypoint.protocol import codec
from rallypoint.storage import OffsetsLog
from rallypoint.topics import TopicStore

from tests.support import ROOT, BrokerProcess, WireClient

pytestmark = pytest.mark.wire

# ------------------------------------------------------------------------------ in-process


def test_defaults() -> None:
    cfg = config_mod.load({}, env={})
    assert cfg.values == {key: s.default for key, s in config_mod.SETTINGS.items()}
    assert cfg["port"] == 9092
    assert cfg["group.initial.rebalance.delay.ms"] == 0
    assert cfg["auto.create.topics.enable"] is True
    assert cfg.advertised_host == "127.0.0.1"


def test_parts_built_without_a_config_take_the_settings_table_defaults(tmp_path: Path) -> None:
    """Defaults are written once, in SETTINGS; parts built bare (unit tests) agree with a broker."""
    cfg = config_mod.load({"data.dir": str(tmp_path)}, env={})
    assert GroupConfig() == GroupConfig.from_settings(cfg.get)
    bare, wired = OffsetsLog(tmp_path), OffsetsLog.from_config(cfg, tmp_path, SystemClock(), loader=None)
    for attr in ("num_partitions", "segment_bytes", "flush", "flush_interval_ms", "delete_retention_ms"):
        assert getattr(bare, attr) == getattr(wired, attr), attr
    bare_topics, wired_topics = TopicStore(), build_topics(cfg)
    for attr in ("default_partitions", "auto_create", "retention_bytes", "max_message_bytes"):
        assert getattr(bare_topics, attr) == getattr(wired_topics, attr), attr


def test_flag_help_shows_the_settings_table_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.parse_serve_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag, key in cli.SETTING_FLAGS.items():
        setting = config_mod.SETTINGS[key]
        shown = setting.default_doc.strip("()") if setting.default is None else setting.default
        assert f"config {key}, default {shown}" in text, flag
    with pytest.raises(SystemExit):
        probe.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"{config_mod.default('host')}" in text and f"default: {config_mod.default('port')}" in text


def test_env_overrides_defaults_and_flags_override_env() -> None:
    env = {"KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "3000", "KAFKA_NUM_PARTITIONS": "4"}
    cfg = config_mod.load({}, env=env)
    assert cfg["group.initial.rebalance.delay.ms"] == 3000
    assert cfg["num.partitions"] == 4
    cfg = config_mod.load({"group.initial.rebalance.delay.ms": "500"}, env=env)
    assert cfg["group.initial.rebalance.delay.ms"] == 500
    assert cfg["num.partitions"] == 4


def test_cli_flags_beat_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KAFKA_PORT", "7000")
    monkeypatch.setenv("KAFKA_DATA_DIR", "/nonexistent/env")
    monkeypatch.setenv("KAFKA_AUTO_CREATE_TOPICS_ENABLE", "false")
    cfg, _args = cli.parse_serve_args(["--port", "7001", "--data-dir", str(tmp_path), "-c", "num.partitions=2"])
    assert cfg["port"] == 7001
    assert cfg["data.dir"] == str(tmp_path)
    assert cfg["num.partitions"] == 2
    assert cfg["auto.create.topics.enable"] is False  # from the environment: no flag given


def test_kafka_image_env_names() -> None:
    env = {"KAFKA_LOG_DIRS": "/var/lib/kafka", "KAFKA_NODE_ID": "3", "KAFKA_HEAP_OPTS": "-Xmx1G", "KAFKA_FOO_BAR": "x"}
    cfg = config_mod.load({}, env=env)
    assert cfg["data.dir"] == "/var/lib/kafka"
    assert cfg["node.id"] == 3


def test_advertised_listeners_parsing() -> None:
    cfg = config_mod.load({}, env={"KAFKA_ADVERTISED_LISTENERS": "PLAINTEXT://localhost:19092,CONTROLLER://x:9093"})
    assert (cfg.advertised_host, cfg["advertised.port"]) == ("localhost", 19092)
    cfg = config_mod.load({"advertised.listeners": "PLAINTEXT://[::1]:9094"}, env={})
    assert (cfg.advertised_host, cfg["advertised.port"]) == ("::1", 9094)
    cfg = config_mod.load({"advertised.listeners": "PLAINTEXT://:9095"}, env={})  # empty host: the default
    assert (cfg.advertised_host, cfg["advertised.port"]) == ("127.0.0.1", 9095)
    cfg = config_mod.load({"advertised.listeners": "kafka.local"}, env={})
    assert (cfg.advertised_host, cfg["advertised.port"]) == ("kafka.local", None)
    # an explicit advertised.host wins over the listener's host
    cfg = config_mod.load(
        {"advertised.host": "kafka.example"}, env={"KAFKA_ADVERTISED_LISTENERS": "PLAINTEXT://localhost:19092"}
    )
    assert (cfg.advertised_host, cfg["advertised.port"]) == ("kafka.example", 19092)


@pytest.mark.parametrize(
    ("overrides", "env", "message"),
    [
        ({"unknown.key": "1"}, {}, "unknown config key 'unknown.key'"),
        ({"num.partitions": "zero"}, {}, "bad value for num.partitions from --config num.partitions"),
        ({"num.partitions": "0"}, {}, "bad value for num.partitions"),
        ({"port": "70000"}, {}, "bad value for port"),
        ({"auto.create.topics.enable": "maybe"}, {}, "bad value for auto.create.topics.enable"),
        ({}, {"KAFKA_NUM_PARTITIONS": "x"}, "from environment variable KAFKA_NUM_PARTITIONS"),
        ({"advertised.listeners": "PLAINTEXT://"}, {}, "bad advertised.listeners"),
        ({"advertised.listeners": "PLAINTEXT://h:port"}, {}, "bad advertised.listeners"),
        ({"group.min.session.timeout.ms": "9", "group.max.session.timeout.ms": "8"}, {}, "larger than"),
    ],
)
def test_bad_settings_raise_config_error(overrides: dict[str, str], env: dict[str, str], message: str) -> None:
    with pytest.raises(config_mod.ConfigError, match=message.replace(".", r"\.")):
        config_mod.load(overrides, env=env)


# ------------------------------------------------------------------------- the CLI process


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "rallypoint", "--port", "0", "--log-format", "json", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env=full_env,
        cwd=ROOT,
    )


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["--config", "unknown.key=1"], {}, "rallypoint: error: unknown config key 'unknown.key'"),
        (["--config", "num.partitions=many"], {}, "rallypoint: error: bad value for num.partitions"),
        (["--config", "num.partitions"], {}, "rallypoint: error: --config expects KEY=VALUE"),
        ([], {"KAFKA_SOCKET_REQUEST_MAX_BYTES": "-5"}, "KAFKA_SOCKET_REQUEST_MAX_BYTES"),
        (["--no-such-flag"], {}, "unrecognized arguments: --no-such-flag"),
    ],
    ids=["unknown-key", "bad-value", "no-equals", "bad-env", "unknown-flag"],
)
def test_cli_refuses_bad_configuration_before_listening(
    tmp_path: Path, args: list[str], env: dict[str, str], message: str
) -> None:
    proc = run_cli("--data-dir", str(tmp_path / "d"), *args, env=env)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "listening" not in proc.stdout + proc.stderr


def test_cli_help_exits_zero() -> None:
    proc = run_cli("--help")
    assert proc.returncode == 0
    assert "--config" in proc.stdout


# ------------------------------------------------------------------------ a running broker


def test_advertised_listeners_env_reaches_metadata(broker_factory: Callable[..., BrokerProcess]) -> None:
    b = broker_factory(env={"KAFKA_ADVERTISED_LISTENERS": "PLAINTEXT://localhost:19092"})
    with WireClient(b.host, b.port) as c:
        for version in (0, 4, 12):
            md = c.call(3, version, {"topics": None if version else []})
            assert [(x.node_id, x.host, x.port) for x in md.brokers] == [(1, "localhost", 19092)]
    assert b.events("listening")[0]["advertised"] == "localhost:19092"


def _cluster_id(b: BrokerProcess) -> str:
    with WireClient(b.host, b.port) as c:
        md_id = c.call(3, 12, {"topics": None}).cluster_id
    assert md_id == b.events("listening")[-1]["cluster_id"]
    return str(md_id)


def test_cluster_id_is_stable_per_data_dir(broker_factory: Callable[..., BrokerProcess], tmp_path: Path) -> None:
    first = broker_factory(data_dir=tmp_path / "one")
    cid = _cluster_id(first)
    assert len(cid) == 22  # a base64url UUID, like Kafka's
    first.restart()
    assert _cluster_id(first) == cid
    other = broker_factory(data_dir=tmp_path / "two")
    assert _cluster_id(other) != cid


def test_topic_ids_are_stable_while_the_broker_runs(broker: BrokerProcess) -> None:
    with WireClient(broker.host, broker.port) as c:
        created = c.call(3, 12, {"topics": [{"name": "ids"}], "allow_auto_topic_creation": True})
        topic_id = created.topics[0].topic_id
        assert isinstance(topic_id, uuid.UUID) and topic_id.int != 0
    for _ in range(3):
        with WireClient(broker.host, broker.port) as c:
            again = codec.to_dict(c.call(3, 10, {"topics": None}))
            assert [(t["name"], t["topic_id"]) for t in again["topics"]] == [("ids", topic_id)]
            by_id = c.call(3, 12, {"topics": [{"topic_id": topic_id, "name": None}]})
            assert [(t.name, t.topic_id, int(t.error_code)) for t in by_id.topics] == [("ids", topic_id, 0)]
