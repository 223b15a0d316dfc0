"""The control plane's per-group transition history (coordinator/control/groupview.py,
``GroupTracker``): the last TRANSITIONS_KEPT transitions of a group, oldest dropped first."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from rallypoint.clock import FakeClock
from rallypoint.control.events import EventHub
from rallypoint.control.groupview import TRANSITIONS_KEPT, GroupTracker, _transitions_json
from rallypoint.groups.events import Transition

pytestmark = pytest.mark.unit


def test_a_group_keeps_its_last_transitions_oldest_dropped_first() -> None:
    tracker = GroupTracker(SimpleNamespace(clock=FakeClock()), EventHub())  # type: ignore[arg-type]
    for gen in range(TRANSITIONS_KEPT + 7):
        tracker.on_group_event(Transition("g", 0, "Stable", "PreparingRebalance", gen, "m", 1, f"r{gen}"))
    kept = _transitions_json(tracker._transitions["g"])
    assert len(kept) == TRANSITIONS_KEPT
    assert [t["generation"] for t in kept] == list(range(7, TRANSITIONS_KEPT + 7))
    first = {"time_ms": tracker.now_ms(), "from": "Stable", "to": "PreparingRebalance", "reason": "r7", "generation": 7}
    assert kept[0] == first
    assert tracker._generation["g"] == TRANSITIONS_KEPT + 6
