"""The timeline of appended and acknowledged values (coordinator/groups/timeline.py)."""

from __future__ import annotations

import pytest
from rallypoint.groups.timeline import Timeline
from rallypoint.protocol.offsets_schema import OffsetCommitKey, OffsetCommitValue

pytestmark = pytest.mark.unit


def _value(offset: int) -> OffsetCommitValue:
    return OffsetCommitValue(offset, "", 0)


def test_readable_offset_of_one_partition_agrees_with_the_whole_group() -> None:
    """OffsetFetch naming partitions reads them one by one; it must see what the whole-group
    read sees: acknowledged values, a pending deletion hiding one at once, a pending commit not
    yet visible, a failed write reverting."""
    t = Timeline()
    k = [OffsetCommitKey("g", "t", p) for p in range(5)]
    t.append(1, [(k[0], _value(10)), (k[1], _value(11)), (k[2], _value(12)), (k[3], _value(13))])
    t.settle(1, True)
    t.append(2, [(k[1], None)])  # a tombstone, not yet acknowledged: hidden at once
    t.append(3, [(k[2], _value(22))])  # a newer commit, not yet acknowledged: the old one shows
    t.append(4, [(k[3], _value(33))])
    t.settle(4, False)  # failed: the acknowledged one stays
    t.append(5, [(k[4], _value(44))])  # first commit, pending: nothing yet

    def check() -> None:
        whole = t.readable_offsets("g")
        for key in k:
            tp = (key.topic, key.partition)
            assert t.readable_offset("g", tp) == whole.get(tp), tp
        assert t.readable_offset("other", ("t", 0)) is None
        assert t.readable_offset("g", ("u", 0)) is None

    check()
    assert {tp: v.offset for tp, v in t.readable_offsets("g").items()} == {("t", 0): 10, ("t", 2): 12, ("t", 3): 13}
    t.settle(2, True)
    t.settle(3, True)
    t.settle(5, True)
    check()
    assert {tp: v.offset for tp, v in t.readable_offsets("g").items()} == {
        ("t", 0): 10,
        ("t", 2): 22,
        ("t", 3): 13,
        ("t", 4): 44,
    }
