"""SCRAM users managed with admin clients (docs/security.md, "Users and credentials"):
AlterUserScramCredentials / DescribeUserScramCredentials from confluent-kafka's AdminClient;
the new user logs in with real clients, survives a restart, is refused after deletion; no
password is found in plain text under the data dir; Kafka's validation errors."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kafka.net.sasl.scram import ScramClient
from rallypoint.protocol.errors import ErrorCode

from tests.support import BrokerProcess, WireClient
from tests.support.broker import free_port
from tests.support.secure_clients import Sec, confluent_roundtrip, kafka_python_roundtrip

pytestmark = pytest.mark.clients


def scram_login(port: int, user: str, password: str, mechanism: str) -> tuple[int, str | None]:
    """(error code, message) of a SCRAM login over the wire."""
    with WireClient("127.0.0.1", port) as c:
        assert c.call(17, 1, {"mechanism": mechanism}).error_code == ErrorCode.NONE
        client = ScramClient(user, password, mechanism)
        r = c.call(36, 2, {"auth_bytes": client.first_message()})
        if r.error_code != ErrorCode.NONE:
            return r.error_code, r.error_message
        client.process_server_first_message(r.auth_bytes)
        r = c.call(36, 2, {"auth_bytes": client.final_message()})
        if r.error_code == ErrorCode.NONE:
            client.process_server_final_message(r.auth_bytes)
        return r.error_code, r.error_message


def admin(bootstrap: str) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap, **Sec("SASL_PLAINTEXT", "SCRAM-SHA-256").librdkafka()})


def describe(a: Any, users: list[str] | None = None) -> dict[str, list[tuple[str, int]]]:
    futures = a.describe_user_scram_credentials(users)
    if users is None:
        got = futures.result(timeout=20)
    else:
        got = {u: f.result(timeout=20) for u, f in futures.items()}
    return {u: sorted((i.mechanism.name, i.iterations) for i in d.scram_credential_infos) for u, d in got.items()}


def alter(a: Any, alterations: list[Any]) -> None:
    for f in a.alter_user_scram_credentials(alterations).values():
        f.result(timeout=20)


def test_admin_managed_scram_users(broker_factory: Callable[..., BrokerProcess], tmp_path: Path) -> None:
    from confluent_kafka.admin import (
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialDeletion,
        UserScramCredentialUpsertion,
    )

    plain_port, sasl_port = free_port(), free_port()
    data_dir = tmp_path / "data"
    b = broker_factory(
        config={
            "listeners": f"PLAINTEXT://127.0.0.1:{plain_port},SASL_PLAINTEXT://127.0.0.1:{sasl_port}",
            "rallypoint.sasl.users": "alice:alice-secret",
        },
        data_dir=data_dir,
    )
    sasl = f"127.0.0.1:{sasl_port}"
    a = admin(sasl)
    assert describe(a) == {"alice": [("SCRAM_SHA_256", 4096), ("SCRAM_SHA_512", 4096)]}
    alter(
        a,
        [
            UserScramCredentialUpsertion(
                "carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 8192), b"carol-secret"
            ),
            UserScramCredentialUpsertion(
                "dave", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), b"dave-secret"
            ),
        ],
    )
    assert describe(a, ["carol", "dave"]) == {"carol": [("SCRAM_SHA_256", 8192)], "dave": [("SCRAM_SHA_512", 4096)]}
    alter(a, [UserScramCredentialUpsertion("carol", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 4096), b"c2")])
    # real clients log in as the new users
    carol = Sec("SASL_PLAINTEXT", "SCRAM-SHA-256", user="carol", password="carol-secret")
    assert confluent_roundtrip(sasl, carol, "scram-admin-1", "g-scram-1") == [b"confluent-kafka"]
    assert scram_login(sasl_port, "carol", "c2", "SCRAM-SHA-512")[0] == ErrorCode.NONE
    assert scram_login(sasl_port, "carol", "carol-secret", "SCRAM-SHA-512")[0] == ErrorCode.SASL_AUTHENTICATION_FAILED
    # never in plain text on disk
    for path in data_dir.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            for secret in (b"carol-secret", b"dave-secret", b"alice-secret", b"c2,"):
                assert secret not in data, f"{secret!r} in {path}"
    # a restart keeps them
    b.restart()
    dave = Sec("SASL_PLAINTEXT", "SCRAM-SHA-512", user="dave", password="dave-secret")
    assert kafka_python_roundtrip(sasl, dave, "scram-admin-2", "g-scram-2") == [b"kafka-python"]
    assert scram_login(sasl_port, "carol", "carol-secret", "SCRAM-SHA-256")[0] == ErrorCode.NONE
    a = admin(sasl)
    assert describe(a, ["carol"]) == {"carol": [("SCRAM_SHA_256", 8192), ("SCRAM_SHA_512", 4096)]}
    # deleted: refused, with Kafka's message, also after a restart
    alter(a, [UserScramCredentialDeletion("carol", ScramMechanism.SCRAM_SHA_256)])
    refused = (
        ErrorCode.SASL_AUTHENTICATION_FAILED,
        "Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-256",
    )
    assert scram_login(sasl_port, "carol", "carol-secret", "SCRAM-SHA-256") == refused
    b.restart()
    assert scram_login(sasl_port, "carol", "carol-secret", "SCRAM-SHA-256") == refused
    assert scram_login(sasl_port, "carol", "c2", "SCRAM-SHA-512")[0] == ErrorCode.NONE


def test_kafka_validation_errors(broker_factory: Callable[..., BrokerProcess]) -> None:
    b = broker_factory(config={"rallypoint.sasl.users": "alice:alice-secret"})
    up = {"mechanism": 1, "iterations": 4096, "salt": b"s" * 16, "salted_password": b"p" * 32}
    with WireClient("127.0.0.1", b.port) as c:
        r = c.call(
            51,
            0,
            {
                "deletions": [{"name": "nobody", "mechanism": 1}, {"name": "", "mechanism": 1}],
                "upsertions": [
                    {"name": "x", **up, "iterations": 100},
                    {"name": "y", **up, "iterations": 20000},
                    {"name": "z", **up, "mechanism": 3},
                    {"name": "w", **up},
                    {"name": "w", **up},
                ],
            },
        )
        got = {res.user: (res.error_code, res.error_message) for res in r.results}
        assert got == {
            "nobody": (ErrorCode.RESOURCE_NOT_FOUND, "Attempt to delete a user credential that does not exist"),
            "": (ErrorCode.UNACCEPTABLE_CREDENTIAL, "Username must not be empty"),
            "x": (ErrorCode.UNACCEPTABLE_CREDENTIAL, "Too few iterations"),
            "y": (ErrorCode.UNACCEPTABLE_CREDENTIAL, "Too many iterations"),
            "z": (ErrorCode.UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism"),
            "w": (ErrorCode.DUPLICATE_RESOURCE, "A user credential cannot be altered twice in the same request"),
        }
        r = c.call(50, 0, {"users": [{"name": "alice"}, {"name": "ghost"}, {"name": "alice"}]})
        got = {res.user: (res.error_code, res.error_message) for res in r.results}
        assert got == {
            "alice": (
                ErrorCode.DUPLICATE_RESOURCE,
                "Cannot describe SCRAM credentials for the same user twice in a single request: alice",
            ),
            "ghost": (ErrorCode.RESOURCE_NOT_FOUND, "Attempt to describe a user credential that does not exist: ghost"),
        }
