"""Bad input against a real broker process: only the offending connection suffers.

One broker serves the whole module, so every case also proves the broker survived all the
cases before it.  A ``keeper`` connection is opened before any bad one and must keep getting
answers throughout.  Each rejected connection produces exactly one log line.
"""

from __future__ import annotations

import signal
import socket
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from rallypoint.protocol import codec, framing
from rallypoint.protocol.errors import ErrorCode

from tests.support import BrokerProcess, WireClient, wait_until

pytestmark = pytest.mark.wire

WAIT = 5.0
GOOD_AV3 = {"client_software_name": "keeper", "client_software_version": "1.0"}


@dataclass
class Rig:
    broker: BrokerProcess
    keeper: WireClient


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    broker = BrokerProcess(
        data_dir=tmp_path_factory.mktemp("bad-input"), config={"group.initial.rebalance.delay.ms": "0"}
    ).start()
    keeper = WireClient(broker.host, broker.port, timeout=WAIT, client_id="keeper")
    assert int(keeper.call(18, 3, GOOD_AV3).error_code) == 0
    try:
        yield Rig(broker, keeper)
    finally:
        keeper.close()
        broker.kill()


def rejections(broker: BrokerProcess) -> list[dict[str, Any]]:
    return [e for e in broker.events() if str(e.get("event", "")).startswith("closing connection")]


def wait_for_count(get: Callable[[], list[Any]], n: int, timeout: float = WAIT) -> list[Any]:
    def enough() -> list[Any] | None:
        items = get()
        return items if len(items) >= n else None

    return wait_until(enough, timeout, f"{n} log lines", step=0.02)


def raw_socket(broker: BrokerProcess) -> socket.socket:
    s = socket.create_connection((broker.host, broker.port), timeout=WAIT)
    s.settimeout(WAIT)
    return s


def closed_by_broker(s: socket.socket, timeout: float = WAIT) -> bool:
    s.settimeout(timeout)
    try:
        while True:
            data = s.recv(65536)
            if not data:
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def request_bytes(api_key: int, version: int, body: bytes, corr: int = 1, header_version: int = 1) -> bytes:
    return framing.frame(framing.encode_request_header(api_key, version, corr, "bad", header_version) + body)


def api_versions_body() -> bytes:
    return codec.encode_message(codec.build_request(18, 0, {}))


# Each case: bytes to send; the broker must close the connection and log one line.
CLOSING_CASES: dict[str, bytes] = {
    "http-garbage": b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",
    "binary-garbage": struct.pack(">i", 8) + b"\xde\xad\xbe\xef" * 2,
    "size-minus-one": struct.pack(">i", -1),
    "size-zero": struct.pack(">i", 0),
    "size-int32-max": struct.pack(">i", 2**31 - 1),  # and nothing else: closed without waiting for 2 GiB
    "shorter-than-a-header": struct.pack(">i", 3) + b"\x00\x12\x00",
    "unknown-api-key-9999": request_bytes(9999, 0, api_versions_body()),
    # Metadata v12 with a topics array claiming ~2**34 entries: kio's native reader would abort
    # the whole process on this (it reserves the capacity first).
    "metadata-huge-array": request_bytes(3, 12, framing.write_uvarint(2**34) + b"\x00", header_version=2),
    "metadata-truncated-body": request_bytes(3, 4, struct.pack(">i", 2) + b"\x00\x05ab"),
    # more elements than rallypoint.request.max.elements (100,000), in a legal 200 KB frame
    "metadata-too-many-elements": request_bytes(3, 1, struct.pack(">i", 100_001) + b"\x00\x00" * 100_001),
    # a non-nullable array sent as null (Kafka: "non-nullable field topics was serialized as null")
    "create-topics-null-topics": request_bytes(19, 4, struct.pack(">i", -1) + struct.pack(">i?", 1000, False)),
    "join-group-null-protocols": request_bytes(
        11,
        5,
        b"\x00\x01g" + struct.pack(">ii", 10000, 10000) + b"\x00\x00\xff\xff\x00\x08consumer" + struct.pack(">i", -1),
    ),
    "metadata-unsupported-version": request_bytes(3, 99, b"\x00", header_version=2),
}


def assert_broker_healthy(rig: Rig) -> None:
    assert rig.broker.proc is not None and rig.broker.proc.poll() is None, "broker died"
    assert int(rig.keeper.call(18, 3, GOOD_AV3).error_code) == 0, "keeper connection lost its answers"
    with WireClient(rig.broker.host, rig.broker.port, timeout=WAIT) as fresh:
        md = fresh.call(3, 12, {"topics": None})
        assert md.brokers[0].port == rig.broker.port


@pytest.mark.parametrize("case", list(CLOSING_CASES), ids=list(CLOSING_CASES))
def test_bad_frame_closes_only_its_connection(rig: Rig, case: str) -> None:
    before = len(rejections(rig.broker))
    s = raw_socket(rig.broker)
    try:
        s.sendall(CLOSING_CASES[case])
        assert closed_by_broker(s), f"{case}: connection left open"
    finally:
        s.close()
    lines = wait_for_count(lambda: rejections(rig.broker), before + 1)
    time.sleep(0.05)  # a second line for the same connection would arrive now
    new = rejections(rig.broker)[before:]
    assert len(new) == 1, new
    assert_broker_healthy(rig)
    assert len(lines) == before + 1


def test_truncated_frame_then_close(rig: Rig) -> None:
    """A size, fewer bytes than it announced, then the client goes away."""
    before = len(rejections(rig.broker))
    s = raw_socket(rig.broker)
    s.sendall(struct.pack(">i", 100) + b"\x00\x12\x00\x00\x00\x00\x00\x01\x00")
    s.shutdown(socket.SHUT_WR)
    assert closed_by_broker(s)
    s.close()
    new = wait_for_count(lambda: rejections(rig.broker)[before:], 1)
    assert [e["event"] for e in new] == ["closing connection: truncated frame"]
    assert_broker_healthy(rig)


def test_api_versions_v99_is_answered_in_v0_format_and_the_connection_stays(rig: Rig) -> None:
    before = len(rejections(rig.broker))
    s = raw_socket(rig.broker)
    try:
        s.sendall(request_bytes(18, 99, b"\x00\x00\x00garbage-we-never-parse", corr=1234, header_version=2))
        (size,) = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))
        corr, resp = codec.decode_response_frame(18, 0, s.recv(size, socket.MSG_WAITALL))
        assert corr == 1234
        assert int(resp.error_code) == ErrorCode.UNSUPPORTED_VERSION
        assert [(k.api_key, k.min_version, k.max_version) for k in resp.api_keys] == [(18, 0, 4)]
        # the client retries on the same connection with a version both know
        s.sendall(codec.encode_request(18, 3, 1235, GOOD_AV3))
        (size,) = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))
        corr, resp = codec.decode_response_frame(18, 3, s.recv(size, socket.MSG_WAITALL))
        assert corr == 1235 and int(resp.error_code) == 0
    finally:
        s.close()
    assert len(rejections(rig.broker)) == before
    assert_broker_healthy(rig)


def test_many_concurrent_connections(rig: Rig) -> None:
    clients = [WireClient(rig.broker.host, rig.broker.port, timeout=WAIT) for _ in range(200)]
    try:
        corrs = [c.send(3, 12, {"topics": None}) for c in clients]
        for c, corr in zip(clients, corrs, strict=True):
            assert c.receive(3, 12, corr).brokers[0].port == rig.broker.port
    finally:
        for c in clients:
            c.close()
    assert_broker_healthy(rig)


def test_pipelined_requests_are_answered_in_order(rig: Rig) -> None:
    plan = [(18, v % 5) if i % 2 else (3, v % 14) for i, v in enumerate(range(60))]
    with WireClient(rig.broker.host, rig.broker.port, timeout=WAIT) as c:
        frames = b""
        for i, (key, version) in enumerate(plan):
            body = GOOD_AV3 if key == 18 else {"topics": None if version else []}
            frames += codec.encode_request(key, version, 1000 + i, body, "pipeline")
        c.send_raw(frames)  # all at once, before reading anything
        for i, (key, version) in enumerate(plan):
            corr, msg = codec.decode_response_frame(key, version, c.recv_frame())
            assert corr == 1000 + i
            assert int(getattr(msg, "error_code", 0)) == 0


def test_no_connection_ever_failed_with_an_exception(rig: Rig) -> None:
    """After all of the above (module order), the broker logged no traceback."""
    assert not [e for e in rig.broker.events() if e.get("level") in ("error", "critical")]


def test_sigterm_exits_zero_quickly_with_a_stopped_event(tmp_path: Path) -> None:
    broker = BrokerProcess(data_dir=tmp_path, config={}).start()
    try:
        idle = WireClient(broker.host, broker.port, timeout=WAIT)
        assert int(idle.call(18, 3, GOOD_AV3).error_code) == 0
        partial = raw_socket(broker)
        partial.sendall(struct.pack(">i", 50) + b"\x00\x03")  # mid-frame
        started = time.monotonic()
        rc = broker.stop(signal.SIGTERM, timeout=WAIT)
        elapsed = time.monotonic() - started
        assert rc == 0
        assert elapsed < 2.0, f"shutdown took {elapsed:.2f}s"
        assert broker.events("stopped")
        assert idle.is_closed_by_peer(1.0)
        idle.close()
        partial.close()
    finally:
        broker.kill()
