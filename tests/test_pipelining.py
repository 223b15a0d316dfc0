"""Pipelined requests: answers are coalesced into fewer socket writes, never reordered or lost."""

from __future__ import annotations

import struct
import time
from collections.abc import Callable

import pytest
from rallypoint.protocol import codec

from tests.support import BrokerProcess, WireClient

pytestmark = pytest.mark.wire


def _api_versions(corr: int) -> bytes:
    return codec.encode_request(18, 3, corr, {"client_software_name": "t", "client_software_version": "1"}, "t")


def test_pipelined_burst_answered_in_order_in_one_read(broker: BrokerProcess) -> None:
    with WireClient(broker.host, broker.port) as c:
        c.send_raw(b"".join(_api_versions(i) for i in range(1, 201)))
        for i in range(1, 201):
            corr, msg = codec.decode_response_frame(18, 3, c.recv_frame())
            assert (corr, int(msg.error_code)) == (i, 0)


def test_answers_before_a_bad_request_are_delivered_before_the_close(broker: BrokerProcess) -> None:
    """Requests 1-5 are answered; the 6th (unknown API key) closes the connection afterwards."""
    bad = struct.pack(">i", 10) + struct.pack(">hhi", 9999, 0, 6) + b"\x00\x00"
    with WireClient(broker.host, broker.port) as c:
        c.send_raw(b"".join(_api_versions(i) for i in range(1, 6)) + bad)
        got = [codec.decode_response_frame(18, 3, c.recv_frame())[0] for _ in range(5)]
        assert got == [1, 2, 3, 4, 5]
        assert c.is_closed_by_peer(timeout=5)
    with WireClient(broker.host, broker.port) as c2:  # the broker carries on
        assert int(c2.call(18, 3, {"client_software_name": "t", "client_software_version": "1"}).error_code) == 0


def test_answers_before_a_waiting_request_go_out_while_it_waits(broker_factory: Callable[..., BrokerProcess]) -> None:
    """An answer made before a request that waits (a JoinGroup held for the group's initial
    rebalance delay) is sent at once, not when the waiting request is answered; the answers
    after it keep their order."""
    delay_ms = 3000
    broker = broker_factory(config={"group.initial.rebalance.delay.ms": str(delay_ms)})
    join = {
        "group_id": "pipelined-join",
        "session_timeout": 10_000,
        "rebalance_timeout": 10_000,
        "member_id": "",
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b""}],
    }
    with WireClient(broker.host, broker.port) as c:
        c.send_raw(_api_versions(1) + codec.encode_request(11, 3, 2, join, "t") + _api_versions(3))
        start = time.monotonic()
        corr, msg = codec.decode_response_frame(18, 3, c.recv_frame())
        first_after = time.monotonic() - start
        assert (corr, int(msg.error_code)) == (1, 0)
        assert first_after < delay_ms / 1000 / 2, f"the first answer waited {first_after:.2f} s for the JoinGroup"
        corr, joined = codec.decode_response_frame(11, 3, c.recv_frame())
        assert (corr, int(joined.error_code)) == (2, 0)
        assert time.monotonic() - start >= delay_ms / 1000 / 2  # it did wait for the delay
        assert codec.decode_response_frame(18, 3, c.recv_frame())[0] == 3
