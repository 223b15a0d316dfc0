"""Listeners, SASL mechanisms and the per-connection authenticator, in process (docs/security.md)."""

from __future__ import annotations

import json
import ssl
from pathlib import Path
from typing import Any

import pytest
from kafka.net.sasl.scram import ScramClient  # an independent SCRAM client implementation
from rallypoint import config as config_mod
from rallypoint.protocol import codec
from rallypoint.protocol.errors import ErrorCode
from rallypoint.security import listeners as listeners_mod
from rallypoint.security.certs import generate
from rallypoint.security.credentials import CredentialStore, parse_users
from rallypoint.security.sasl import SaslAuthenticator, State
from rallypoint.security.scram import ScramError, ScramServer, make_credential
from rallypoint.security.tls import server_context

pytestmark = pytest.mark.unit

USERS = {"alice": "alice-secret", "bob": "bob-secret"}


def store(tmp_path: Path | None = None, users: dict[str, str] | None = None) -> CredentialStore:
    return CredentialStore(USERS if users is None else users, 4096, tmp_path)


# ---------------------------------------------------------------- listeners


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return generate(tmp_path_factory.mktemp("certs"), ["kafka.example"])


def test_listeners_with_custom_names_and_advertised_endpoints(certs: dict[str, Path]) -> None:
    cfg = config_mod.load(
        {
            "listeners": "INTERNAL://127.0.0.1:0,EXTERNAL://0.0.0.0:9094",
            "advertised.listeners": "EXTERNAL://kafka.example:19094",
            "listener.security.protocol.map": "INTERNAL:PLAINTEXT,EXTERNAL:SASL_SSL",
            "ssl.keystore.location": str(certs["broker.pem"]),
        },
        env={},
    )
    found = listeners_mod.from_config(cfg.values)
    assert [(x.name, x.protocol, x.host, x.port) for x in found] == [
        ("INTERNAL", "PLAINTEXT", "127.0.0.1", 0),
        ("EXTERNAL", "SASL_SSL", "0.0.0.0", 9094),
    ]
    found[0].bound_port = 40001
    assert found[0].advertised("127.0.0.1") == ("127.0.0.1", 40001)
    assert found[1].advertised("127.0.0.1") == ("kafka.example", 19094)
    assert found[1].sasl and found[1].tls and not found[0].sasl


def test_host_port_are_the_plaintext_shorthand() -> None:
    cfg = config_mod.load({"host": "127.0.0.1", "port": "9999", "advertised.listeners": "PLAINTEXT://h:1"}, env={})
    (only,) = listeners_mod.from_config(cfg.values)
    assert (only.name, only.protocol, only.host, only.port) == ("PLAINTEXT", "PLAINTEXT", "127.0.0.1", 9999)
    assert only.advertised("x") == ("h", 1)


def test_controller_listeners_are_not_served() -> None:
    cfg = config_mod.load(
        {
            "listeners": "PLAINTEXT://:9092,CONTROLLER://:9093",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
        },
        env={},
    )
    assert [x.name for x in listeners_mod.from_config(cfg.values)] == ["PLAINTEXT"]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"listeners": "CUSTOM://:1"}, "no security protocol"),
        ({"listeners": "PLAINTEXT://:1,PLAINTEXT://:2"}, "twice"),
        ({"listeners": "PLAINTEXT://:1,SSL://:1", "ssl.keystore.location": "x"}, "port 1 twice"),
        ({"listeners": "PLAINTEXT//:1"}, "NAME://host:port"),
        ({"listener.security.protocol.map": "A:TLS"}, "NAME:PROTOCOL"),
        ({"listeners": "SSL://:0"}, "ssl.keystore.location"),
        ({"sasl.enabled.mechanisms": "GSSAPI"}, "not supported"),
        ({"rallypoint.sasl.users": "alice"}, "user:password"),
        ({"rallypoint.sasl.scram.iterations": "100"}, "outside"),
        ({"listeners": "PLAINTEXT://:0", "advertised.listeners": "OTHER://h:1"}, "not in listeners"),
    ],
)
def test_bad_security_settings_are_refused(overrides: dict[str, str], message: str) -> None:
    with pytest.raises(config_mod.ConfigError, match=message):
        config_mod.load(overrides, env={})


def test_tls_material_is_checked_before_anything_listens(certs: dict[str, Path], tmp_path: Path) -> None:
    base = {"listeners": "SSL://127.0.0.1:0"}
    with pytest.raises(config_mod.ConfigError, match=r"cannot load the PEM keystore .*/missing\.pem"):
        config_mod.load({**base, "ssl.keystore.location": str(tmp_path / "missing.pem")}, env={})
    with pytest.raises(config_mod.ConfigError, match="cannot load the PEM keystore"):
        config_mod.load({**base, "ssl.keystore.location": str(certs["ca.pem"])}, env={})  # no key in it
    with pytest.raises(config_mod.ConfigError, match=r"needs ssl\.truststore"):
        config_mod.load(
            {**base, "ssl.keystore.location": str(certs["broker.pem"]), "ssl.client.auth": "required"}, env={}
        )
    text = certs["broker.pem"].read_text()
    i = text.index("-----BEGIN CERTIFICATE-----")
    cfg = config_mod.load({**base, "ssl.keystore.key": text[:i], "ssl.keystore.certificate.chain": text[i:]}, env={})
    assert server_context(cfg.values).verify_mode == ssl.CERT_NONE
    with pytest.raises(config_mod.ConfigError, match="go together"):
        config_mod.load({**base, "ssl.keystore.key": text[:i]}, env={})


def test_listener_settings_from_the_environment() -> None:
    cfg = config_mod.load(
        env={
            "KAFKA_LISTENERS": "EXTERNAL://:0",
            "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "EXTERNAL:SASL_PLAINTEXT",
            "KAFKA_RALLYPOINT_SASL_USERS": "alice:alice-secret",
            "KAFKA_SASL_ENABLED_MECHANISMS": "SCRAM-SHA-512",
        }
    )
    assert [x.protocol for x in listeners_mod.from_config(cfg.values)] == ["SASL_PLAINTEXT"]
    assert parse_users(cfg["rallypoint.sasl.users"]) == {"alice": "alice-secret"}
    assert cfg["sasl.enabled.mechanisms"] == "SCRAM-SHA-512"


# ---------------------------------------------------------------- mechanisms


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_exchange_with_an_independent_client(mechanism: str) -> None:
    creds = store()
    server = ScramServer(mechanism, lambda u: creds.scram(mechanism, u))
    client = ScramClient("alice", "alice-secret", mechanism)
    server_first = server.evaluate(client.first_message())
    assert b",i=4096" in server_first
    client.process_server_first_message(server_first)
    server_final = server.evaluate(client.final_message())
    client.process_server_final_message(server_final)  # raises if the server's signature is wrong
    assert server.complete and server.user == "alice"


@pytest.mark.parametrize(("user", "password"), [("alice", "wrong"), ("nobody", "alice-secret")])
def test_scram_wrong_password_and_unknown_user_fail_alike(user: str, password: str) -> None:
    creds = store()
    server = ScramServer("SCRAM-SHA-256", lambda u: creds.scram("SCRAM-SHA-256", u))
    client = ScramClient(user, password, "SCRAM-SHA-256")
    with pytest.raises(ScramError) as e:
        client.process_server_first_message(server.evaluate(client.first_message()))
        server.evaluate(client.final_message())
    assert not e.value.public  # the client is told Kafka's generic text, not this one
    assert not server.complete


def test_scram_iterations_and_salt_are_kept() -> None:
    c1 = make_credential("SCRAM-SHA-512", "pw", 8192)
    c2 = make_credential("SCRAM-SHA-512", "pw", 8192)
    assert c1.iterations == 8192 and c1.salt != c2.salt and c1.stored_key != c2.stored_key
    assert CredentialStore(USERS, 5000, None).scram("SCRAM-SHA-256", "bob").iterations == 5000  # type: ignore[union-attr]


def test_credentials_file_holds_no_password(tmp_path: Path) -> None:
    s = store(tmp_path)
    s.upsert("SCRAM-SHA-256", "carol", make_credential("SCRAM-SHA-256", "carol-secret", 4096))
    s.delete("SCRAM-SHA-512", "alice")
    s.save()
    text = (tmp_path / "scram-credentials.json").read_text()
    assert "carol-secret" not in text and "alice-secret" not in text
    doc = json.loads(text)["credentials"]
    assert doc["SCRAM-SHA-512"]["alice"] is None and set(doc["SCRAM-SHA-256"]["carol"]) >= {"salt", "stored_key"}
    again = store(tmp_path)  # a restart: the changes are back, the deletion too
    assert again.scram("SCRAM-SHA-256", "carol") is not None
    assert again.scram("SCRAM-SHA-512", "alice") is None and again.scram("SCRAM-SHA-256", "alice") is not None


# ---------------------------------------------------------------- the authenticator


def request(api_key: int, version: int, body: dict[str, Any], corr: int = 7) -> bytes:
    frame = codec.encode_request(api_key, version, corr, body, "test")
    return frame[4:]


def answer(api_key: int, version: int, frame: bytes) -> Any:
    return codec.decode_response_frame(api_key, version, frame[4:])[1]


def auth(reauth_ms: int = 0, mechanisms: list[str] | None = None) -> SaslAuthenticator:
    return SaslAuthenticator(mechanisms or ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"], store(), reauth_ms)


def plain_login(a: SaslAuthenticator, now: int, user: str = "alice", password: str = "alice-secret") -> Any:
    step = a.on_frame(request(17, 1, {"mechanism": "PLAIN"}), now)
    assert not step.close
    step = a.on_frame(request(36, 2, {"auth_bytes": f"\0{user}\0{password}".encode()}), now)
    return step, answer(36, 2, step.answer)


def test_plain_login_and_session_lifetime() -> None:
    a = auth(reauth_ms=10_000)
    assert a.on_frame(request(18, 3, {"client_software_name": "x", "client_software_version": "1"}), 0).delegate
    step, resp = plain_login(a, 1000)
    assert step.complete and resp.error_code == ErrorCode.NONE
    assert resp.session_lifetime.total_seconds() == 10
    assert a.principal == "alice" and not a.expired(10_999) and a.expired(11_000)
    # KIP-368: re-authentication on the same connection extends the session
    a.begin_reauthentication()
    step, resp = plain_login(a, 9000)
    assert step.complete and a.session_expiry_ms == 19_000


def test_wrong_password_answers_58_with_kafkas_message_then_closes() -> None:
    a = auth()
    step, resp = plain_login(a, 0, password="nope")
    assert step.close and resp.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert resp.error_message == "Authentication failed: Invalid username or password"
    assert a.state == State.FAILED


def test_scram_failure_message_is_kafkas_generic_one() -> None:
    a = auth()
    a.on_frame(request(17, 1, {"mechanism": "SCRAM-SHA-512"}), 0)
    client = ScramClient("nobody", "x", "SCRAM-SHA-512")
    step = a.on_frame(request(36, 1, {"auth_bytes": client.first_message()}), 0)
    resp = answer(36, 1, step.answer)
    assert step.close and resp.error_code == ErrorCode.SASL_AUTHENTICATION_FAILED
    assert resp.error_message == (
        "Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512"
    )


def test_disabled_mechanism_gets_the_enabled_list() -> None:
    a = auth(mechanisms=["SCRAM-SHA-256"])
    step = a.on_frame(request(17, 1, {"mechanism": "PLAIN"}), 0)
    resp = answer(17, 1, step.answer)
    assert step.close and resp.error_code == ErrorCode.UNSUPPORTED_SASL_MECHANISM
    assert list(resp.mechanisms) == ["SCRAM-SHA-256"]


@pytest.mark.parametrize("api_key", [3, 0, 36])
def test_any_other_request_before_authentication_closes(api_key: int) -> None:
    a = auth()
    body = request(3, 12, {"topics": None, "allow_auto_topic_creation": False}) if api_key == 3 else None
    if body is None:
        body = api_key.to_bytes(2, "big") + b"\x00\x00" + b"\x00\x00\x00\x01" + b"\xff\xff"
    step = a.on_frame(body, 0)
    assert step.close and not step.answer


def test_v0_handshake_takes_raw_tokens() -> None:
    a = auth()
    step = a.on_frame(request(17, 0, {"mechanism": "PLAIN"}), 0)
    assert answer(17, 0, step.answer).error_code == ErrorCode.NONE
    step = a.on_frame(b"\0alice\0alice-secret", 0)
    assert step.complete and step.answer == b"\x00\x00\x00\x00"  # PLAIN's empty token, size-prefixed


def test_reauthentication_may_not_change_principal_or_mechanism() -> None:
    a = auth()
    plain_login(a, 0)
    a.begin_reauthentication()
    step, resp = plain_login(a, 0, user="bob", password="bob-secret")
    assert (
        step.close
        and resp.error_message == "Cannot change principals during re-authentication from User:alice: User:bob"
    )
    b = auth()
    plain_login(b, 0)
    b.begin_reauthentication()
    assert not b.on_frame(request(17, 1, {"mechanism": "SCRAM-SHA-256"}), 0).close  # Kafka answers the handshake
    assert b.on_frame(request(36, 2, {"auth_bytes": b"n,,n=alice,r=abc"}), 0).close  # ... then closes
