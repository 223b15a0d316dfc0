"""bench/share_groups.py keeps running: its measurement with the smallest workload (1 and 4
share consumers on rallypoint, 1 on librdkafka's mock, 2,000 records, short settling times).
A run raises unless every record was delivered once and acknowledged."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.clients

FAST_HEARTBEAT = {"group.share.heartbeat.interval.ms": "500", "group.share.min.heartbeat.interval.ms": "100"}


def test_share_groups_bench_delivers_and_acknowledges_every_record() -> None:
    from bench.common import mock_peer, rallypoint
    from bench.share_groups import BROKER, delivered_per_s

    with rallypoint({**BROKER, **FAST_HEARTBEAT}) as ep:
        assert delivered_per_s(ep, 1, 2000, settle_s=1.0) > 100
        assert delivered_per_s(ep, 4, 2000, settle_s=1.5) > 100
    with mock_peer() as ep:
        assert delivered_per_s(ep, 1, 2000, settle_s=1.5) > 100
