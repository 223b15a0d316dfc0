"""ApiVersions (18): the advertised table, v3+ client software validation, unsupported versions."""

from __future__ import annotations

import logging
import struct
from types import SimpleNamespace

import pytest
from kafka.admin import KafkaAdminClient
from rallypoint.handlers import api_versions
from rallypoint.protocol import codec
from rallypoint.protocol.apis import SERVED_APIS
from rallypoint.protocol.errors import ErrorCode

from tests.support import BrokerProcess, FrameProxy, WireClient

pytestmark = pytest.mark.wire

WAIT = 10.0


@pytest.mark.parametrize(
    "value",
    ["kafka-python", "3.0.12", "librdkafka", "2.16.0", "confluent-kafka-python", "2.16.1-rdkafka-2.16.0", "a", "A.b-9"],
)
def test_valid_software_names(value: str) -> None:
    req = SimpleNamespace(client_software_name=value, client_software_version=value)
    assert api_versions.is_valid(3, req)


@pytest.mark.parametrize("value", ["", "-x", "x-", ".x", "x.", "a b", "a_b", "über", "a/b", "1.0\n"])
def test_invalid_software_names(value: str) -> None:
    assert not api_versions.is_valid(3, SimpleNamespace(client_software_name=value, client_software_version="1"))
    assert not api_versions.is_valid(4, SimpleNamespace(client_software_name="ok", client_software_version=value))
    assert api_versions.is_valid(2, SimpleNamespace())  # before v3 there is nothing to check


@pytest.mark.parametrize("version", range(SERVED_APIS[18].min_version, SERVED_APIS[18].max_version + 1))
def test_the_cached_answer_is_byte_identical_to_the_generic_encoder(version: int) -> None:
    """The answer is encoded once per version (``encoded_answer``): the same bytes, frame and
    all, as encoding the answer's dict through the generic path on every request."""
    cached = codec.encode_response(18, version, 7, api_versions.encoded_answer(version))
    assert cached == codec.encode_response(18, version, 7, api_versions.answer(version))
    assert api_versions.encoded_answer(version) is api_versions.encoded_answer(version)


@pytest.mark.parametrize("version", range(SERVED_APIS[18].min_version, SERVED_APIS[18].max_version + 1))
def test_every_version_advertises_exactly_the_served_table(shared_broker: BrokerProcess, version: int) -> None:
    with WireClient(shared_broker.host, shared_broker.port) as c:
        resp = c.call(18, version, {"client_software_name": "t", "client_software_version": "1"})
    assert int(resp.error_code) == 0
    got = {(k.api_key, k.min_version, k.max_version) for k in resp.api_keys}
    assert got == {(a.key, a.min_version, a.max_version) for a in SERVED_APIS.values()}


@pytest.mark.parametrize(
    ("name", "version"), [("bad name", "1.0"), ("ok", "-1"), ("", "1")], ids=["space", "leading-dash", "empty"]
)
def test_v3_invalid_software_gets_invalid_request_and_the_connection_stays(
    shared_broker: BrokerProcess, name: str, version: str
) -> None:
    with WireClient(shared_broker.host, shared_broker.port) as c:
        resp = c.call(18, 3, {"client_software_name": name, "client_software_version": version})
        assert int(resp.error_code) == ErrorCode.INVALID_REQUEST
        assert resp.api_keys == ()  # Kafka's getErrorResponse carries no API list
        ok = c.call(18, 3, {"client_software_name": "fixed", "client_software_version": "1"})
        assert int(ok.error_code) == 0


def test_v99_over_a_raw_socket(shared_broker: BrokerProcess) -> None:
    with WireClient(shared_broker.host, shared_broker.port) as c:
        # header v2 (ApiVersions >= 3 is flexible) and a body we cannot know: never parsed
        c.send_raw(struct.pack(">i", 15) + b"\x00\x12\x00\x63\x00\x00\x00\x2a\x00\x01x\x00\x00\xff\xff")
        frame = c.recv_frame()
    assert frame[:4] == b"\x00\x00\x00\x2a"  # correlation id, header v0
    corr, resp = codec.decode_response_frame(18, 0, frame)  # v0 body
    assert corr == 42
    assert int(resp.error_code) == ErrorCode.UNSUPPORTED_VERSION
    assert [(k.api_key, k.min_version, k.max_version) for k in resp.api_keys] == [(18, 0, 4)]


@pytest.mark.clients
def test_kafka_python_falls_back_after_unsupported_version(broker: BrokerProcess) -> None:
    """kafka-python sends its highest ApiVersions; a proxy turns the first one into v99, so the
    client gets our v0 UNSUPPORTED_VERSION answer, must retry with our advertised maximum and
    then work normally."""

    def bump_first_api_versions(n: int, frame: bytes) -> bytes:
        if n == 0 and struct.unpack_from(">h", frame)[0] == 18:
            return frame[:2] + struct.pack(">h", 99) + frame[4:]
        return frame

    proxy = FrameProxy((broker.host, broker.port), bump_first_api_versions)
    logging.getLogger("kafka").setLevel(logging.WARNING)
    admin = None
    try:
        admin = KafkaAdminClient(
            bootstrap_servers=proxy.bootstrap, request_timeout_ms=5000, bootstrap_timeout_ms=int(WAIT * 1000)
        )
        cluster = admin.describe_cluster()
        assert [b["port"] for b in cluster["brokers"]] == [broker.port]
    finally:
        if admin is not None:
            admin.close()
        proxy.close()
    api_versions_sent = [v for k, v in proxy.seen if k == 18]
    assert len(api_versions_sent) >= 2, proxy.seen
    assert api_versions_sent[1] == SERVED_APIS[18].max_version  # the retry, at our maximum
