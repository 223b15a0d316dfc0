"""SSL and SASL_SSL listeners with real clients (docs/security.md, "TLS"): certificates from
``rallypoint certs``, the host name checked by every client; PEM keystores as a file or inline;
mutual TLS; a TLS client on a plaintext port and a plaintext client on a TLS port fail fast
without hurting other connections."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from rallypoint.protocol.errors import ErrorCode

from tests.support import ROOT, BrokerProcess, WireClient
from tests.support.secure_clients import (
    Sec,
    aiokafka_roundtrip,
    committed,
    confluent_roundtrip,
    kafka_python_roundtrip,
    kcat_roundtrip,
)

pytestmark = pytest.mark.clients

CLIENTS = ["kafka-python", "aiokafka", "confluent-kafka", "kcat"]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("certs")
    r = subprocess.run(
        [sys.executable, "-m", "rallypoint", "certs", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert {p.name for p in out.iterdir()} >= {"ca.pem", "broker.pem"}
    return out


def tls_config(certs: Path, **extra: str) -> dict[str, str]:
    return {
        "listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0,SASL_SSL://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0",
        # clients reach the TLS listeners as "localhost" (port 0: the bound port is advertised)
        "advertised.listeners": "SSL://localhost:0,SASL_SSL://localhost:0",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(certs / "broker.pem"),
        "rallypoint.sasl.users": "alice:alice-secret",
        "group.initial.rebalance.delay.ms": "0",
        **extra,
    }


@pytest.fixture(scope="module")
def tls_broker(certs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    b = BrokerProcess(data_dir=tmp_path_factory.mktemp("tls"), config=tls_config(certs))
    b.start()
    yield b
    b.kill()


def run(client: str, kcat: str, bootstrap: str, sec: Sec, topic: str, group: str) -> list[bytes]:
    if client == "kafka-python":
        return kafka_python_roundtrip(bootstrap, sec, topic, group)
    if client == "aiokafka":
        return aiokafka_roundtrip(bootstrap, sec, topic, group)
    if client == "confluent-kafka":
        return confluent_roundtrip(bootstrap, sec, topic, group)
    return kcat_roundtrip(kcat, bootstrap, sec, topic, group)


@pytest.mark.parametrize("client", CLIENTS)
def test_client_over_ssl_with_hostname_checked(tls_broker: BrokerProcess, certs: Path, client: str, kcat: str) -> None:
    u = uuid.uuid4().hex[:8]
    topic, group = f"ssl-{client}-{u}", f"g-ssl-{client}-{u}"
    bootstrap = f"localhost:{tls_broker.listener_port('SSL')}"
    got = run(client, kcat, bootstrap, Sec("SSL", ca=str(certs / "ca.pem")), topic, group)
    assert got == [client.encode()]
    assert committed(f"127.0.0.1:{tls_broker.listener_port('PLAINTEXT')}", group, topic) == 1


@pytest.mark.parametrize("client", CLIENTS)
def test_client_over_sasl_ssl(tls_broker: BrokerProcess, certs: Path, client: str, kcat: str) -> None:
    u = uuid.uuid4().hex[:8]
    topic, group = f"saslssl-{client}-{u}", f"g-saslssl-{client}-{u}"
    bootstrap = f"localhost:{tls_broker.listener_port('SASL_SSL')}"
    mechanism = {"kafka-python": "SCRAM-SHA-256", "aiokafka": "PLAIN"}.get(client, "SCRAM-SHA-512")
    got = run(client, kcat, bootstrap, Sec("SASL_SSL", mechanism, ca=str(certs / "ca.pem")), topic, group)
    assert got == [client.encode()]
    assert committed(f"127.0.0.1:{tls_broker.listener_port('PLAINTEXT')}", group, topic) == 1


def test_the_certificate_names_are_checked(tls_broker: BrokerProcess, certs: Path) -> None:
    ctx = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    port = tls_broker.listener_port("SSL")
    for good in ("localhost", "127.0.0.1"):
        with socket.create_connection(("127.0.0.1", port), 5) as raw, ctx.wrap_socket(raw, server_hostname=good):
            pass
    with socket.create_connection(("127.0.0.1", port), 5) as raw, pytest.raises(ssl.SSLCertVerificationError):
        ctx.wrap_socket(raw, server_hostname="elsewhere.example")


def test_tls_client_on_plaintext_port_fails_fast(tls_broker: BrokerProcess) -> None:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    for name in ("PLAINTEXT", "SASL_PLAINTEXT"):
        port = tls_broker.listener_port(name)
        t0 = time.monotonic()
        with socket.create_connection(("127.0.0.1", port), 5) as raw, pytest.raises((ssl.SSLError, OSError)):
            ctx.wrap_socket(raw, server_hostname="localhost")
        assert time.monotonic() - t0 < 3
        with WireClient("127.0.0.1", port) as c:  # the listener serves on
            assert c.call(18, 2, {}).error_code == ErrorCode.NONE
    assert tls_broker.events("closing connection: bad frame size")
    assert tls_broker.events("closing connection: bad frame size during SASL authentication")


@pytest.mark.parametrize("listener", ["SSL", "SASL_SSL"])
def test_plaintext_client_on_tls_port_fails_fast(tls_broker: BrokerProcess, listener: str) -> None:
    port = tls_broker.listener_port(listener)
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with socket.create_connection(("127.0.0.1", port), 5) as other_raw, ctx.wrap_socket(other_raw) as other:
        t0 = time.monotonic()
        with WireClient("127.0.0.1", port, timeout=5) as c:
            c.send(18, 2, {})
            assert c.is_closed_by_peer(timeout=3)
        assert time.monotonic() - t0 < 3
        # a TLS connection opened before is still served
        other.sendall(bytes.fromhex("0000000a00120002000000010000"))  # ApiVersions v2, client id ""
        assert len(other.recv(4)) == 4


def _split_pem(path: Path) -> tuple[str, str]:
    text = path.read_text()
    i = text.index("-----BEGIN CERTIFICATE-----")
    return text[:i], text[i:]


def test_inline_pem_keystore_and_mutual_tls(
    broker_factory: Callable[..., BrokerProcess], certs: Path, tmp_path: Path
) -> None:
    from confluent_kafka import Producer

    key, chain = _split_pem(certs / "broker.pem")
    cfg = tls_config(
        certs,
        **{
            "listeners": "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0",
            "advertised.listeners": "SSL://localhost:0",
            "ssl.keystore.key": key,
            "ssl.keystore.certificate.chain": chain,
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(certs / "ca.pem"),
            "ssl.client.auth": "required",
        },
    )
    del cfg["ssl.keystore.location"]
    b = broker_factory(config=cfg)
    bootstrap = f"localhost:{b.listener_port('SSL')}"
    base = {"bootstrap.servers": bootstrap, **Sec("SSL", ca=str(certs / "ca.pem")).librdkafka()}
    client_pem = str(certs / "client.pem")
    p = Producer({**base, "ssl.certificate.location": client_pem, "ssl.key.location": client_pem})
    p.produce("mtls", b"with a client certificate")
    assert p.flush(30) == 0
    errors: list[str] = []
    reports: list[object] = []
    p2 = Producer({**base, "error_cb": lambda e: errors.append(str(e)), "message.timeout.ms": 3000})
    p2.produce("mtls", b"without", on_delivery=lambda err, _msg: reports.append(err))
    p2.flush(10)
    assert len(reports) == 1 and reports[0] is not None, "a client without a certificate got through"
    assert errors


def test_kafkajs_over_sasl_ssl(
    tls_broker: BrokerProcess, certs: Path, node_js: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    u = uuid.uuid4().hex[:8]
    topic, group = f"saslssl-kafkajs-{u}", f"g-saslssl-kafkajs-{u}"
    bootstrap = f"localhost:{tls_broker.listener_port('SASL_SSL')}"
    r = node_js("sasl.js", bootstrap, "SCRAM-SHA-256", "alice", "alice-secret", topic, group, str(certs / "ca.pem"))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"value": "kafkajs"}
    assert committed(f"127.0.0.1:{tls_broker.listener_port('PLAINTEXT')}", group, topic) == 1
