"""Smallest end-to-end check: the broker starts, answers ApiVersions and Metadata, stops cleanly."""

from __future__ import annotations

import signal

import pytest
from rallypoint.protocol import codec

from tests.support import BrokerProcess, WireClient

pytestmark = pytest.mark.wire


def test_starts_answers_and_stops(broker: BrokerProcess) -> None:
    with WireClient(broker.host, broker.port) as c:
        resp = c.call(18, 3, {"client_software_name": "t", "client_software_version": "1"})
        assert int(resp.error_code) == 0
        keys = {k.api_key for k in resp.api_keys}
        assert {18, 3} <= keys
        md = codec.to_dict(c.call(3, 12, {"topics": None}))
        assert md["brokers"][0]["port"] == broker.port
        assert md["cluster_id"]
    assert broker.stop(signal.SIGTERM) == 0
    assert broker.events("stopped"), broker.log_lines[-5:]
