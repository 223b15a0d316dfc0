"""DescribeConfigs (32), AlterConfigs (33), IncrementalAlterConfigs (44) with the admin clients
of confluent-kafka, kafka-python and aiokafka against a broker process, across a restart, and
raw requests of every version (docs/configs.md)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from rallypoint.protocol.errors import ErrorCode

from tests.support import BrokerProcess, WireClient, create_topic

E = ErrorCode

pytestmark = pytest.mark.clients


@pytest.fixture
def broker(broker_factory: Callable[..., BrokerProcess]) -> BrokerProcess:
    return broker_factory()


def test_confluent_admin_describes_alters_and_the_change_survives_a_restart(broker: BrokerProcess) -> None:
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource

    create_topic(broker, "ck", 1)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topic = ConfigResource(ConfigResource.Type.TOPIC, "ck")

    def describe() -> dict[str, ConfigEntry]:
        return admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, "ck")])[topic].result(30)  # type: ignore[no-any-return]

    before = describe()
    assert (
        before["retention.ms"].value == "604800000"
        and before["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    )
    broker_cfg = admin.describe_configs([ConfigResource(ConfigResource.Type.BROKER, "1")])
    entries = next(iter(broker_cfg.values())).result(30)
    assert entries["num.partitions"].source in (
        ConfigSource.DEFAULT_CONFIG.value,
        ConfigSource.STATIC_BROKER_CONFIG.value,
    )

    def incremental(*ops: ConfigEntry) -> None:
        res = ConfigResource(ConfigResource.Type.TOPIC, "ck", incremental_configs=list(ops))
        admin.incremental_alter_configs([res])[res].result(30)

    incremental(ConfigEntry("retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET))
    incremental(ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND))
    after = describe()
    assert (after["retention.ms"].value, after["retention.ms"].source) == (
        "3600000",
        ConfigSource.DYNAMIC_TOPIC_CONFIG.value,
    )
    assert after["cleanup.policy"].value == "delete,compact"
    incremental(ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SUBTRACT))
    assert describe()["cleanup.policy"].value == "compact"
    with pytest.raises(Exception, match=r"INVALID_CONFIG|Unknown topic config"):
        incremental(ConfigEntry("no.such.config", "1", incremental_operation=AlterConfigOpType.SET))
    with pytest.raises(Exception, match=r"INVALID_CONFIG|Invalid value"):
        incremental(ConfigEntry("retention.ms", "soon", incremental_operation=AlterConfigOpType.SET))
    assert describe()["retention.ms"].value == "3600000"  # nothing changed by the refused ones

    broker.restart()
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    again = describe()
    assert (again["retention.ms"].value, again["retention.ms"].source) == (
        "3600000",
        ConfigSource.DYNAMIC_TOPIC_CONFIG.value,
    )
    assert again["cleanup.policy"].value == "compact"


def test_kafka_python_admin_describes_and_alters(broker: BrokerProcess) -> None:
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

    create_topic(broker, "kp", 1)
    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    try:
        admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, "kp", configs={"retention.ms": "7200000"})])
        described = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "kp")])
        retention = described["topic"]["kp"]["retention.ms"]
        assert (retention["value"], retention["config_source"]) == ("7200000", "DYNAMIC_TOPIC_CONFIG")
        broker_side = admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, "1")], config_filter="all")
        delay = broker_side["broker"]["1"]["group.initial.rebalance.delay.ms"]  # set by the fixture
        assert (delay["value"], delay["config_source"], delay["read_only"]) == ("0", "STATIC_BROKER_CONFIG", True)
    finally:
        admin.close()


def test_aiokafka_admin_describes_and_alters(broker: BrokerProcess) -> None:
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    create_topic(broker, "aio", 1)

    async def run() -> str:
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap)
        await admin.start()
        try:
            await admin.alter_configs(
                [ConfigResource(ConfigResourceType.TOPIC, "aio", configs={"retention.ms": "60000"})]
            )
            (resp,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "aio")])
            (result,) = resp.resources
            return next(str(c[1]) for c in result[4] if c[0] == "retention.ms")
        finally:
            await admin.close()

    assert asyncio.run(run()) == "60000"


def test_raw_describe_v1_to_v4_and_errors_per_resource(broker: BrokerProcess) -> None:
    create_topic(broker, "raw", 1)
    for version in range(1, 5):
        with WireClient(broker.host, broker.port) as c:
            resp = c.call(
                32,
                version,
                {
                    "resources": [
                        {"resource_type": 2, "resource_name": "raw", "configuration_keys": ["retention.ms"]},
                        {"resource_type": 2, "resource_name": "missing", "configuration_keys": None},
                    ],
                    "include_synonyms": True,
                    "include_documentation": version >= 3,
                },
            )
        ok, missing = resp.results
        assert int(ok.error_code) == 0 and [x.name for x in ok.configs] == ["retention.ms"]
        if version >= 3:
            assert ok.configs[0].documentation.startswith("How long data is kept")
        assert (
            int(missing.error_code) == E.UNKNOWN_TOPIC_OR_PARTITION
            and missing.error_message == "Topic missing does not exist"
        )


def test_topic_configs_take_effect_log_append_time_and_max_message_bytes(broker: BrokerProcess) -> None:
    """Done with the admin client: LogAppendTime stamps batches with the broker's time (consumers
    see it, the produce answer carries it); a lowered max.message.bytes refuses larger batches."""
    import time

    from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource

    create_topic(broker, "lat", 1, configs={"message.timestamp.type": "LogAppendTime"})
    create_topic(broker, "small", 1)
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    res = ConfigResource(
        ConfigResource.Type.TOPIC,
        "small",
        incremental_configs=[ConfigEntry("max.message.bytes", "2000", incremental_operation=AlterConfigOpType.SET)],
    )
    admin.incremental_alter_configs([res])[res].result(30)

    before = int(time.time() * 1000)
    p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    p.produce("lat", value=b"old", timestamp=1000, partition=0)  # a producer's time from 1970
    assert p.flush(30) == 0
    errors: list[str] = []
    p.produce("small", value=b"x" * 5000, partition=0, on_delivery=lambda err, msg: errors.append(str(err)))
    p.flush(30)  # its own batch: the next one must not share it
    p.produce("small", value=b"fits", partition=0, on_delivery=lambda err, msg: errors.append(str(err)))
    assert p.flush(30) == 0
    assert len(errors) == 2 and "MSG_SIZE_TOO_LARGE" in errors[0] and errors[1] == "None", errors

    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "lat-g"})
    try:
        c.assign([TopicPartition("lat", 0, -2)])
        deadline = time.monotonic() + 30
        msg = None
        while msg is None and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                msg = m
    finally:
        c.close()
    assert msg is not None and msg.value() == b"old"
    kind, ts = msg.timestamp()
    assert kind == TIMESTAMP_LOG_APPEND_TIME and before <= ts <= int(time.time() * 1000) + 1000


def test_kafka_python_admin_sets_and_describes_broker_logger_levels(broker: BrokerProcess) -> None:
    """BROKER_LOGGER (8): every logger with its level; a change of one logger (its children
    inherit it); an unknown logger is INVALID_CONFIG.  (confluent-kafka has no BROKER_LOGGER.)"""
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap)
    logger_1 = ConfigResource(ConfigResourceType.BROKER_LOGGER, "1")

    def levels() -> dict[str, str]:
        described = admin.describe_configs([logger_1])["broker_logger"]["1"]
        assert {e["config_source"] for e in described.values()} == {"DYNAMIC_BROKER_LOGGER_CONFIG"}
        return {name: e["value"] for name, e in described.items()}

    try:
        before = levels()
        assert before["root"] == "INFO" and before["rallypoint"] == before["rallypoint.groups"] == "INFO"
        change = ConfigResource(ConfigResourceType.BROKER_LOGGER, "1", configs={"rallypoint": "WARN"})
        assert admin.alter_configs([change]) == {"broker_logger": {"1": "OK"}}  # sent as IncrementalAlterConfigs
        after = levels()
        assert after["rallypoint"] == after["rallypoint.groups"] == "WARN" and after["root"] == "INFO"
    finally:
        admin.close()
    with WireClient(broker.host, broker.port) as c:  # kafka-python refuses unknown names itself
        r = c.call(
            44,
            1,
            {
                "resources": [
                    {
                        "resource_type": 8,
                        "resource_name": "1",
                        "configs": [{"name": "no.such", "config_operation": 0, "value": "DEBUG"}],
                    }
                ],
                "validate_only": False,
            },
        )
        (resp,) = r.responses
        assert (resp.error_code, resp.error_message) == (E.INVALID_CONFIG, "Logger no.such does not exist!")
