"""Real clients over SASL_PLAINTEXT (docs/security.md): kafka-python, aiokafka, confluent-kafka
and kcat produce, consume in a group and commit with PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512; a
wrong password fails on each, in its own form, with the broker's error 58; KIP-368
re-authentication with confluent-kafka; Metadata advertises the listener the client came in on."""

from __future__ import annotations

import json
import logging
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from rallypoint.protocol import codec
from rallypoint.protocol.errors import ErrorCode

from tests.support import BrokerProcess, WireClient, wait_until
from tests.support.secure_clients import (
    Sec,
    aiokafka_roundtrip,
    committed,
    confluent_roundtrip,
    kafka_python_roundtrip,
    kcat_args,
    kcat_roundtrip,
)

pytestmark = pytest.mark.clients

MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
PLAIN_FAILED = "Authentication failed: Invalid username or password"


def sasl_config(**extra: str) -> dict[str, str]:
    return {
        "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
        "rallypoint.sasl.users": "alice:alice-secret,bob:bob-secret",
        "group.initial.rebalance.delay.ms": "0",
        **extra,
    }


@pytest.fixture(scope="module")
def sasl_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(data_dir=tmp_path_factory.mktemp("sasl"), config=sasl_config())
    b.start()
    yield b
    b.kill()


def endpoints(b: BrokerProcess) -> tuple[str, str]:
    """(plaintext bootstrap, sasl bootstrap)."""
    return f"127.0.0.1:{b.listener_port('PLAINTEXT')}", f"127.0.0.1:{b.listener_port('SASL_PLAINTEXT')}"


def names(tag: str) -> tuple[str, str]:
    u = uuid.uuid4().hex[:8]
    return f"sec-{tag}-{u}", f"g-{tag}-{u}"


def test_listening_line_lists_every_listener(sasl_broker: BrokerProcess) -> None:
    (ev,) = sasl_broker.events("listening")
    assert [u.split("://")[0] for u in ev["listeners"]] == ["PLAINTEXT", "SASL_PLAINTEXT"]
    assert ev["security_protocols"] == {"PLAINTEXT": "PLAINTEXT", "SASL_PLAINTEXT": "SASL_PLAINTEXT"}
    assert ev["port"] == sasl_broker.listener_port("PLAINTEXT")


def test_metadata_advertises_the_listener_the_client_came_in_on(sasl_broker: BrokerProcess) -> None:
    plain_port = sasl_broker.listener_port("PLAINTEXT")
    with WireClient("127.0.0.1", plain_port) as c:
        md = c.call(3, 12, {"topics": None, "allow_auto_topic_creation": False})
        assert [(b.host, b.port) for b in md.brokers] == [("127.0.0.1", plain_port)]
    sasl_port = sasl_broker.listener_port("SASL_PLAINTEXT")
    with WireClient("127.0.0.1", sasl_port) as c:
        assert c.call(17, 1, {"mechanism": "PLAIN"}).error_code == ErrorCode.NONE
        r = c.call(36, 2, {"auth_bytes": b"\0alice\0alice-secret"})
        assert r.error_code == ErrorCode.NONE
        md = c.call(3, 12, {"topics": None, "allow_auto_topic_creation": False})
        assert [(b.host, b.port) for b in md.brokers] == [("127.0.0.1", sasl_port)]
        found: list[int] = []

        def coordinator_port() -> bool:
            fc = c.call(10, 4, {"key_type": 0, "coordinator_keys": ["g"]})
            found.append(fc.coordinators[0].port)
            return fc.coordinators[0].error_code == ErrorCode.NONE

        wait_until(coordinator_port, 10, "a coordinator")
        assert found[-1] == sasl_port


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("client", ["kafka-python", "aiokafka", "confluent-kafka", "kcat"])
def test_client_produces_consumes_and_commits_over_sasl(
    sasl_broker: BrokerProcess, client: str, mechanism: str, kcat: str
) -> None:
    plain, sasl = endpoints(sasl_broker)
    topic, group = names(client)
    sec = Sec("SASL_PLAINTEXT", mechanism)
    if client == "kafka-python":
        got = kafka_python_roundtrip(sasl, sec, topic, group)
    elif client == "aiokafka":
        got = aiokafka_roundtrip(sasl, sec, topic, group)
    elif client == "confluent-kafka":
        got = confluent_roundtrip(sasl, sec, topic, group)
    else:
        got = kcat_roundtrip(kcat, sasl, sec, topic, group)
    assert got == [client.encode()]
    assert committed(plain, group, topic) == 1
    ok = [e for e in sasl_broker.events("sasl authenticated") if e["mechanism"] == mechanism]
    assert ok and all(e["principal"] == "User:alice" for e in ok)


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_kafkajs_over_sasl(
    sasl_broker: BrokerProcess, mechanism: str, node_js: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    plain, sasl = endpoints(sasl_broker)
    topic, group = names("kafkajs")
    r = node_js("sasl.js", sasl, mechanism, "alice", "alice-secret", topic, group, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"value": "kafkajs"}
    assert committed(plain, group, topic) == 1
    r = node_js("sasl.js", sasl, mechanism, "alice", "wrong", topic + "-x", group + "-x", timeout=60)
    assert r.returncode == 1
    err = json.loads(r.stderr.strip().splitlines()[-1])
    expected = PLAIN_FAILED if mechanism == "PLAIN" else "invalid credentials with SASL mechanism"
    assert err["name"] == "KafkaJSSASLAuthenticationError" and expected in err["message"], err
    assert nothing_stored(plain, topic + "-x", group + "-x")


def refusals(b: BrokerProcess, after: int) -> list[dict[str, object]]:
    return b.events("closing connection: SASL authentication failed")[after:]


def nothing_stored(plain: str, topic: str, group: str) -> bool:
    with WireClient("127.0.0.1", int(plain.rpartition(":")[2])) as c:
        md = c.call(3, 12, {"topics": [{"name": topic}], "allow_auto_topic_creation": False})
    return md.topics[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and committed(plain, group, topic) is None


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_wrong_password_kafka_python_logs_58(
    sasl_broker: BrokerProcess, mechanism: str, caplog: pytest.LogCaptureFixture
) -> None:
    from kafka import KafkaProducer
    from kafka.errors import KafkaError

    plain, sasl = endpoints(sasl_broker)
    topic, group = names("kp-bad")
    before = len(refusals(sasl_broker, 0))
    caplog.set_level(logging.ERROR, logger="kafka")  # whatever level an earlier test left it at
    with pytest.raises(KafkaError):
        p = KafkaProducer(
            bootstrap_servers=sasl,
            bootstrap_timeout_ms=4000,
            **Sec("SASL_PLAINTEXT", mechanism, password="bad").kafka_python(),
        )
        p.send(topic, b"x").get(5)
    assert "[Error 58] SaslAuthenticationFailedError" in caplog.text
    assert refusals(sasl_broker, before)
    assert nothing_stored(plain, topic, group)


def test_wrong_password_aiokafka_logs_58(sasl_broker: BrokerProcess, caplog: pytest.LogCaptureFixture) -> None:
    import asyncio

    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaError

    plain, sasl = endpoints(sasl_broker)
    topic, group = names("aio-bad")
    caplog.set_level(logging.ERROR, logger="aiokafka")

    async def run() -> None:
        p = AIOKafkaProducer(
            bootstrap_servers=sasl, request_timeout_ms=4000, **Sec("SASL_PLAINTEXT", "PLAIN", password="bad").aiokafka()
        )
        try:
            await p.start()
        finally:
            await p.stop()

    with pytest.raises(KafkaError):
        asyncio.run(run())
    assert f"[Error 58] SaslAuthenticationFailed: {PLAIN_FAILED}" in caplog.text
    assert nothing_stored(plain, topic, group)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_wrong_password_confluent_reports_authentication(sasl_broker: BrokerProcess, mechanism: str) -> None:
    from confluent_kafka import KafkaError, Producer

    plain, sasl = endpoints(sasl_broker)
    topic, group = names("ck-bad")
    errors: list[KafkaError] = []
    p = Producer(
        {
            "bootstrap.servers": sasl,
            "error_cb": errors.append,
            **Sec("SASL_PLAINTEXT", mechanism, password="bad").librdkafka(),
        }
    )
    p.produce(topic, b"x")
    wait_until(lambda: (p.poll(0.1), errors)[1], 15, "an error from librdkafka")
    p.purge()
    p.flush(1)
    err = errors[0]
    assert err.code() == KafkaError._AUTHENTICATION
    expected = PLAIN_FAILED if mechanism == "PLAIN" else "invalid credentials with SASL mechanism SCRAM-SHA-512"
    assert expected in err.str()
    assert nothing_stored(plain, topic, group)


def test_wrong_password_kcat_fails(sasl_broker: BrokerProcess, kcat: str) -> None:
    plain, sasl = endpoints(sasl_broker)
    topic, group = names("kcat-bad")
    sec = Sec("SASL_PLAINTEXT", "SCRAM-SHA-256", password="bad")
    r = subprocess.run(
        [kcat, "-b", sasl, *kcat_args(sec), "-X", "message.timeout.ms=3000", "-P", "-t", topic],
        input=b"x\n",
        capture_output=True,
        timeout=30,
    )
    assert r.returncode != 0
    assert (
        b"SASL authentication error: Authentication failed during authentication due to invalid credentials" in r.stderr
    )
    assert nothing_stored(plain, topic, group)


def test_other_connections_are_unaffected_by_a_refused_one(sasl_broker: BrokerProcess) -> None:
    sasl_port = sasl_broker.listener_port("SASL_PLAINTEXT")
    with WireClient("127.0.0.1", sasl_port) as good, WireClient("127.0.0.1", sasl_port) as bad:
        assert good.call(17, 1, {"mechanism": "PLAIN"}).error_code == ErrorCode.NONE
        assert bad.call(17, 1, {"mechanism": "PLAIN"}).error_code == ErrorCode.NONE
        r = bad.call(36, 2, {"auth_bytes": b"\0alice\0nope"})
        assert (r.error_code, r.error_message) == (ErrorCode.SASL_AUTHENTICATION_FAILED, PLAIN_FAILED)
        assert bad.is_closed_by_peer()
        assert good.call(36, 2, {"auth_bytes": b"\0alice\0alice-secret"}).error_code == ErrorCode.NONE
        assert good.call(3, 12, {"topics": None, "allow_auto_topic_creation": False}).brokers


def test_unsupported_mechanism_and_requests_before_authentication(broker_factory: Callable[..., BrokerProcess]) -> None:
    b = broker_factory(config=sasl_config(**{"sasl.enabled.mechanisms": "SCRAM-SHA-512"}))
    port = b.listener_port("SASL_PLAINTEXT")
    with WireClient("127.0.0.1", port) as c:
        r = c.call(17, 1, {"mechanism": "PLAIN"})
        assert (r.error_code, list(r.mechanisms)) == (ErrorCode.UNSUPPORTED_SASL_MECHANISM, ["SCRAM-SHA-512"])
        assert c.is_closed_by_peer()
    with WireClient("127.0.0.1", port) as c:
        c.send(3, 12, {"topics": None, "allow_auto_topic_creation": False})
        assert c.is_closed_by_peer()
    # ApiVersions is answered before the handshake, and lists the SASL APIs
    with WireClient("127.0.0.1", port) as c:
        keys = {k.api_key: (k.min_version, k.max_version) for k in c.call(18, 2, {}).api_keys}
        assert keys[17] == (0, 1) and keys[36] == (0, 2)
    # a SaslHandshake on a PLAINTEXT listener: ILLEGAL_SASL_STATE, as KafkaApis answers
    with WireClient("127.0.0.1", b.listener_port("PLAINTEXT")) as c:
        assert c.call(17, 1, {"mechanism": "PLAIN"}).error_code == ErrorCode.ILLEGAL_SASL_STATE


def test_session_expiry_closes_and_reauthentication_extends(broker_factory: Callable[..., BrokerProcess]) -> None:
    b = broker_factory(config=sasl_config(**{"connections.max.reauth.ms": "1500"}))
    port = b.listener_port("SASL_PLAINTEXT")
    metadata = {"topics": None, "allow_auto_topic_creation": False}

    def login(c: WireClient) -> int:
        assert c.call(17, 1, {"mechanism": "PLAIN"}).error_code == ErrorCode.NONE
        r = c.call(36, 2, {"auth_bytes": b"\0alice\0alice-secret"})
        assert r.error_code == ErrorCode.NONE
        return int(codec.ms(r.session_lifetime))

    with WireClient("127.0.0.1", port) as c:
        assert login(c) == 1500
        time.sleep(1.0)
        assert login(c) == 1500  # re-authenticated on the same connection: a new session
        time.sleep(1.0)  # 2 s after the first login, 1 s into the second session
        assert c.call(3, 12, metadata).brokers
        time.sleep(0.7)
        c.send(3, 12, metadata)  # after expiry: closed, not answered
        assert c.is_closed_by_peer()
    wait_until(lambda: b.events("closing connection: SASL session expired"), 5, "the expiry line")


def test_confluent_kafka_reauthenticates(broker_factory: Callable[..., BrokerProcess], tmp_path: Path) -> None:
    b = broker_factory(config=sasl_config(**{"connections.max.reauth.ms": "2000"}))
    plain, sasl = endpoints(b)
    topic, group = names("reauth")
    got = confluent_roundtrip(sasl, Sec("SASL_PLAINTEXT", "SCRAM-SHA-256"), topic, group, run_s=5.0)
    assert got == [b"confluent-kafka"]
    assert committed(plain, group, topic) == 1
    assert b.events("sasl reauthenticated"), "librdkafka did not re-authenticate"
    assert not b.events("closing connection: SASL session expired")
