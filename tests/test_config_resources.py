"""The config resources behind DescribeConfigs, AlterConfigs and IncrementalAlterConfigs
(``rallypoint.config_resources``, docs/configs.md): sources, synonyms, validation, all or
nothing per resource, list operations, group configs and their file."""

from __future__ import annotations

from pathlib import Path

import pytest
from rallypoint import config, logger
from rallypoint.assemble import build_topics
from rallypoint.config_resources import (
    APPEND,
    BROKER,
    BROKER_LOGGER,
    DEFAULT_CONFIG,
    DELETE,
    DYNAMIC_BROKER_LOGGER_CONFIG,
    DYNAMIC_TOPIC_CONFIG,
    GROUP,
    GROUP_CONFIG,
    SET,
    STATIC_BROKER_CONFIG,
    SUBTRACT,
    TOPIC,
    ConfigRequestError,
    ConfigResources,
)
from rallypoint.groups.group_configs import GroupConfigStore
from rallypoint.protocol.errors import ErrorCode

E = ErrorCode

pytestmark = pytest.mark.unit


def resources(tmp_path: Path, **settings: str) -> ConfigResources:
    cfg = config.load({"data.dir": str(tmp_path), **settings}, env={})
    store = build_topics(cfg)
    store.create("t", 1)
    return ConfigResources(cfg, store, GroupConfigStore(cfg, tmp_path), cfg["node.id"])


def value(entries: list, name: str) -> tuple[str | None, int]:  # type: ignore[type-arg]
    (e,) = [e for e in entries if e.name == name]
    return e.value, e.source


def test_topic_configs_default_dynamic_and_their_synonyms(tmp_path: Path) -> None:
    r = resources(tmp_path, **{"log.retention.bytes": "5000"})
    entries = r.describe(TOPIC, "t", None)
    assert value(entries, "retention.ms") == ("604800000", DEFAULT_CONFIG)
    assert value(entries, "retention.bytes") == ("5000", STATIC_BROKER_CONFIG)  # its broker synonym was set
    r.incremental_alter(TOPIC, "t", [("retention.ms", SET, "1234")], validate_only=False)
    (e,) = r.describe(TOPIC, "t", ["retention.ms"])
    assert (e.value, e.source) == ("1234", DYNAMIC_TOPIC_CONFIG)
    assert e.synonyms == (("retention.ms", "1234", 1), ("log.retention.ms", "604800000", DEFAULT_CONFIG))
    with pytest.raises(ConfigRequestError) as err:
        r.describe(TOPIC, "nope", None)
    assert err.value.code == E.UNKNOWN_TOPIC_OR_PARTITION


def test_a_bad_change_changes_nothing_of_its_resource(tmp_path: Path) -> None:
    r = resources(tmp_path)
    r.incremental_alter(TOPIC, "t", [("retention.ms", SET, "1000")], False)
    cases = [
        ([("retention.ms", SET, "2000"), ("no.such.config", SET, "1")], E.INVALID_CONFIG, "Unknown topic config name"),
        ([("retention.ms", SET, "2000"), ("segment.bytes", SET, "12")], E.INVALID_CONFIG, "Invalid value 12"),
        ([("retention.ms", APPEND, "5")], E.INVALID_REQUEST, "append is not allowed for config key: retention.ms"),
        ([("retention.ms", SET, "1"), ("retention.ms", DELETE, None)], E.INVALID_REQUEST, "duplicate config keys"),
    ]
    for ops, code, message in cases:
        with pytest.raises(ConfigRequestError) as err:
            r.incremental_alter(TOPIC, "t", ops, False)
        assert err.value.code == code and message in err.value.message, (ops, err.value.message)
        assert value(r.describe(TOPIC, "t", None), "retention.ms") == ("1000", DYNAMIC_TOPIC_CONFIG)
    r.incremental_alter(TOPIC, "t", [("retention.ms", SET, "7")], validate_only=True)  # checked, not applied
    assert value(r.describe(TOPIC, "t", None), "retention.ms") == ("1000", DYNAMIC_TOPIC_CONFIG)


def test_list_configs_append_to_the_default_and_subtract(tmp_path: Path) -> None:
    r = resources(tmp_path)
    r.incremental_alter(TOPIC, "t", [("cleanup.policy", APPEND, "compact")], False)
    assert value(r.describe(TOPIC, "t", None), "cleanup.policy") == ("delete,compact", DYNAMIC_TOPIC_CONFIG)
    r.incremental_alter(TOPIC, "t", [("cleanup.policy", APPEND, "compact")], False)  # no duplicate
    r.incremental_alter(TOPIC, "t", [("cleanup.policy", SUBTRACT, "delete")], False)
    assert value(r.describe(TOPIC, "t", None), "cleanup.policy") == ("compact", DYNAMIC_TOPIC_CONFIG)
    r.incremental_alter(TOPIC, "t", [("cleanup.policy", DELETE, None)], False)
    assert value(r.describe(TOPIC, "t", None), "cleanup.policy") == ("delete", DEFAULT_CONFIG)


def test_alter_configs_replaces_the_whole_set(tmp_path: Path) -> None:
    r = resources(tmp_path)
    r.incremental_alter(TOPIC, "t", [("retention.ms", SET, "1000"), ("segment.ms", SET, "5000")], False)
    r.alter(TOPIC, "t", {"segment.ms": "6000"}, False)
    entries = r.describe(TOPIC, "t", None)
    assert value(entries, "segment.ms") == ("6000", DYNAMIC_TOPIC_CONFIG)
    assert value(entries, "retention.ms") == ("604800000", DEFAULT_CONFIG)  # not given: removed


def test_broker_configs_are_static_and_sensitive_ones_hidden(tmp_path: Path) -> None:
    r = resources(tmp_path, **{"num.partitions": "3", "ssl.key.password": "hush"})
    entries = {e.name: e for e in r.describe(BROKER, "1", None)}
    assert (entries["num.partitions"].value, entries["num.partitions"].source) == ("3", STATIC_BROKER_CONFIG)
    assert entries["auto.create.topics.enable"].source == DEFAULT_CONFIG and entries["num.partitions"].read_only
    assert entries["ssl.key.password"].value is None and entries["ssl.key.password"].sensitive
    assert r.describe(BROKER, "", ["num.partitions"])[0].value == "3"  # "" = the cluster default resource
    with pytest.raises(ConfigRequestError) as err:
        r.describe(BROKER, "7", None)
    assert err.value.code == E.INVALID_REQUEST and "Unexpected broker id" in err.value.message
    with pytest.raises(ConfigRequestError) as err:
        r.incremental_alter(BROKER, "1", [("num.partitions", SET, "5")], False)
    assert err.value.code == E.INVALID_CONFIG


def test_group_configs_are_checked_kept_and_survive_a_restart(tmp_path: Path) -> None:
    r = resources(tmp_path)
    assert value(r.describe(GROUP, "g", None), "share.auto.offset.reset") == ("latest", DEFAULT_CONFIG)
    assert r.groups.get("g", "consumer.session.timeout.ms") == "45000"
    r.incremental_alter(GROUP, "g", [("share.auto.offset.reset", SET, "earliest")], False)
    with pytest.raises(ConfigRequestError) as err:  # below group.consumer.min.session.timeout.ms
        r.incremental_alter(GROUP, "g", [("consumer.session.timeout.ms", SET, "1000")], False)
    assert err.value.code == E.INVALID_CONFIG
    with pytest.raises(ConfigRequestError) as err:
        r.incremental_alter(GROUP, "g", [("group.initial.rebalance.delay.ms", SET, "1")], False)
    assert err.value.message == "Unknown group config name: group.initial.rebalance.delay.ms"
    again = resources(tmp_path / "x")
    again.groups = GroupConfigStore(config.load({"data.dir": str(tmp_path)}, env={}), tmp_path)  # re-read the file
    assert again.groups.get("g", "share.auto.offset.reset") == "earliest"
    assert value(r.describe(GROUP, "g", None), "share.auto.offset.reset") == ("earliest", GROUP_CONFIG)
    assert again.groups.get("other", "share.auto.offset.reset") == "latest"


@pytest.fixture
def log_levels() -> object:
    """Leave the process's logger levels as they were."""
    saved = dict(logger._set)
    yield None
    logger._set.clear()
    logger._set.update(saved)
    logger._recompute()


def test_broker_loggers_are_described_set_inherited_and_deleted(tmp_path: Path, log_levels: object) -> None:
    r = resources(tmp_path)
    node = str(r.node_id)
    child = logger.get("rallypoint.testchild.deep")
    logger.get("rallypoint.testchild")
    described = {e.name: (e.value, e.source) for e in r.describe(BROKER_LOGGER, node, None)}
    root_level = described["root"][0]
    assert described["rallypoint.testchild.deep"] == (root_level, DYNAMIC_BROKER_LOGGER_CONFIG)
    r.incremental_alter(BROKER_LOGGER, node, [("rallypoint.testchild", SET, "ERROR")], validate_only=False)
    levels = {e.name: e.value for e in r.describe(BROKER_LOGGER, node, None)}
    assert levels["rallypoint.testchild"] == levels["rallypoint.testchild.deep"] == "ERROR"  # inherited
    assert not child.enabled(logger.LEVELS["WARN"]) and child.enabled(logger.LEVELS["ERROR"])
    r.incremental_alter(BROKER_LOGGER, node, [("rallypoint.testchild.deep", SET, "DEBUG")], validate_only=True)
    assert not child.enabled(logger.LEVELS["DEBUG"])  # validate_only changed nothing
    r.incremental_alter(BROKER_LOGGER, node, [("rallypoint.testchild.deep", SET, "DEBUG")], validate_only=False)
    assert child.enabled(logger.LEVELS["DEBUG"])
    r.incremental_alter(
        BROKER_LOGGER,
        node,
        [("rallypoint.testchild.deep", DELETE, None), ("rallypoint.testchild", DELETE, None)],
        validate_only=False,
    )
    assert {e.name: e.value for e in r.describe(BROKER_LOGGER, node, None)}["rallypoint.testchild.deep"] == root_level


@pytest.mark.parametrize(
    ("name", "ops", "code", "message"),
    [
        ("1", [("no.such.logger", SET, "INFO")], E.INVALID_CONFIG, "Logger no.such.logger does not exist!"),
        (
            "1",
            [("root", SET, "LOUD")],
            E.INVALID_CONFIG,
            "Cannot set the log level of root to LOUD as it is not a supported log level. "
            "Valid log levels are DEBUG, ERROR, FATAL, INFO, TRACE, WARN",
        ),
        ("1", [("root", DELETE, None)], E.INVALID_REQUEST, "Removing the log level of the root logger is not allowed"),
        (
            "1",
            [("root", APPEND, "INFO")],
            E.INVALID_REQUEST,
            "APPEND operation is not allowed for the BROKER_LOGGER resource",
        ),
        ("1", [("root", SET, None)], E.INVALID_REQUEST, "Null value not supported for : root"),
        ("", [("root", SET, "INFO")], E.INVALID_REQUEST, "Node id must be an integer, but it is: "),
        ("7", [("root", SET, "INFO")], E.INVALID_REQUEST, "Unexpected node id. Expected 1, but received 1"),
        # the first op is valid, the second is not: nothing is applied
        ("1", [("root", SET, "ERROR"), ("nope", SET, "INFO")], E.INVALID_CONFIG, "Logger nope does not exist!"),
    ],
)
def test_broker_logger_changes_kafka_refuses(
    tmp_path: Path,
    log_levels: object,
    name: str,
    ops: list,
    code: ErrorCode,
    message: str,  # type: ignore[type-arg]
) -> None:
    r = resources(tmp_path, **{"node.id": "1"})
    before = {e.name: e.value for e in r.describe(BROKER_LOGGER, "1", None)}
    with pytest.raises(ConfigRequestError) as err:
        r.incremental_alter(BROKER_LOGGER, name, ops, validate_only=False)
    assert (err.value.code, err.value.message) == (code, message)
    assert {e.name: e.value for e in r.describe(BROKER_LOGGER, "1", None)} == before
    with pytest.raises(ConfigRequestError) as legacy:
        r.alter(BROKER_LOGGER, "1", {"root": "INFO"}, validate_only=False)
    assert (legacy.value.code, legacy.value.message) == (E.INVALID_REQUEST, "Unknown resource type 8")


def test_every_topic_broker_and_group_config_has_documentation(tmp_path: Path) -> None:
    r = resources(tmp_path)
    for kind, name in ((TOPIC, "t"), (BROKER, "1"), (GROUP, "g")):
        missing = [e.name for e in r.describe(kind, name, None) if not e.documentation]
        assert missing == [], (kind, missing)
