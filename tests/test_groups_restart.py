"""Groups and offsets across a broker restart, through the offsets log (docs/groups.md,
"Loading and unloading"; docs/offsets-log-format.md, "Recovery at start-up").

Runs when the broker has the ``offsets_log`` component (the offsets-log work); until then it
is skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from rallypoint import config
from rallypoint.assemble import build_broker
from rallypoint.protocol import codec
from rallypoint.protocol.errors import ErrorCode

from tests.support import BrokerProcess, WireClient, ensure_topics, wait_until
from tests.test_groups_wire import join_stable

pytestmark = pytest.mark.wire


def _has_offsets_log(tmp: Path) -> bool:
    return build_broker(config.load({"data.dir": str(tmp)}, env={})).offsets_log is not None


@pytest.mark.slow
def test_committed_offsets_and_group_state_survive_a_restart(
    broker_factory: Callable[..., BrokerProcess], tmp_path: Path
) -> None:
    if not _has_offsets_log(tmp_path / "probe"):
        pytest.fail("no offsets_log component in this build (state is in memory only)")
    b = broker_factory()
    with WireClient(b.host, b.port) as c:
        ensure_topics(c, "tp")
        member, gen = join_stable(c, "rg", session=6000)
        body = {
            "group_id": "rg",
            "generation_id_or_member_epoch": gen,
            "member_id": member,
            "topics": [
                {
                    "name": "tp",
                    "partitions": [{"partition_index": 0, "committed_offset": 42, "committed_metadata": "m"}],
                }
            ],
        }
        assert codec.to_dict(c.call(8, 8, body))["topics"][0]["partitions"][0]["error_code"] == 0
    b.restart()
    with WireClient(b.host, b.port) as c:
        fetched = codec.to_dict(c.call(9, 8, {"groups": [{"group_id": "rg", "topics": None}], "require_stable": True}))
        (p,) = fetched["groups"][0]["topics"][0]["partitions"]
        assert (p["committed_offset"], p["metadata"]) == (42, "m")
        # the group comes back Stable with its member and assignment ...
        g = codec.to_dict(c.call(15, 5, {"groups": ["rg"], "include_authorized_operations": False}))["groups"][0]
        assert g["group_state"] == "Stable" and [m["member_id"] for m in g["members"]] == [member]
        s = c.call(14, 3, {"group_id": "rg", "generation_id": gen, "member_id": member, "assignments": []})
        assert int(s.error_code) == ErrorCode.NONE and s.assignment == b"ASSIGNED"

        # ... and its member, silent since the restart, is expelled after one session timeout
        def state() -> str:
            g = codec.to_dict(c.call(15, 5, {"groups": ["rg"], "include_authorized_operations": False}))["groups"][0]
            return str(g["group_state"])

        wait_until(lambda: state() == "Empty", 15, "the silent member to be expelled", step=0.2, explain=state)
    b.restart()
    with WireClient(b.host, b.port) as c:
        g = codec.to_dict(c.call(15, 5, {"groups": ["rg"], "include_authorized_operations": False}))["groups"][0]
        assert g["group_state"] == "Empty"
        fetched = codec.to_dict(c.call(9, 8, {"groups": [{"group_id": "rg", "topics": None}], "require_stable": False}))
        assert fetched["groups"][0]["topics"][0]["partitions"][0]["committed_offset"] == 42
    loaded = [e for e in b.events("group loaded") if e["group"] == "rg"]
    assert loaded and loaded[-1]["state"] == "Empty" and loaded[-1]["generation"] == gen + 1
