"""The kill -9 suite's bookkeeping and checks, on made-up histories."""

from __future__ import annotations

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder

from tests.crash.tap import Ledger, batch_record_counts, end_regressions, lost_commits, repeated_offsets

pytestmark = [pytest.mark.unit, pytest.mark.slow]


def _batch(n: int) -> bytes:
    b = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    for i in range(n):
        b.append(i, 0, None, b"v", [])
    return bytes(b.build())


def test_record_counts_of_produced_batches() -> None:
    assert batch_record_counts(_batch(1)) == 1
    assert batch_record_counts(_batch(7) + _batch(3)) == 10
    assert batch_record_counts(b"") == 0


def test_an_acknowledged_commit_must_be_recovered() -> None:
    led = Ledger()
    key = ("g", "t", 0)
    led.commit_sent(*key, 1)
    led.commit_answered(*key, 1, 0)
    led.commit_sent(*key, 2)  # cut by the crash: may or may not be on disk
    snap = led.snapshot()
    assert lost_commits(snap, {key: 1}) == []
    assert lost_commits(snap, {key: 2}) == []
    assert [(x.acked, x.recovered) for x in lost_commits(snap, {key: 0})] == [(1, 0)]
    assert [(x.acked, x.recovered) for x in lost_commits(snap, {})] == [(1, None)]
    # an acknowledgement supersedes what was tried before it
    led.commit_answered(*key, 2, 0)
    assert [x.recovered for x in lost_commits(led.snapshot(), {key: 1})] == [1]


def test_a_refused_commit_is_neither_acknowledged_nor_forgotten() -> None:
    led = Ledger()
    key = ("g", "t", 0)
    led.commit_sent(*key, 5)
    led.commit_answered(*key, 5, 16)  # NOT_COORDINATOR: written or not, nobody was told it was
    snap = led.snapshot()
    assert led.commits_acked == 0 and led.commits_failed == 1
    assert lost_commits(snap, {}) == []  # nothing acknowledged, nothing to lose
    led.commit_sent(*key, 6)
    led.commit_answered(*key, 6, 0)
    led.commit_sent(*key, 7)
    led.commit_answered(*key, 7, 16)
    assert lost_commits(led.snapshot(), {key: 7}) == []  # a failed write may still be on disk
    assert len(lost_commits(led.snapshot(), {key: 5})) == 1


def test_offsets_handed_out_twice() -> None:
    led = Ledger()
    led.produce_answered("t", 0, 0, 10)
    led.produce_answered("t", 0, 10, 5)
    led.produce_answered("t", 1, 0, 3)
    assert repeated_offsets(led.snapshot().produced) == []
    led.produce_answered("t", 0, 12, 4)  # after a crash the partition restarted at 12
    assert repeated_offsets(led.snapshot().produced) == [(("t", 0), 12)]


def test_end_offsets_must_not_go_back() -> None:
    produced = {("t", 0): [(0, 10), (10, 15)], ("t", 1): [(0, 3)]}
    assert end_regressions(produced, {("t", 0): 15, ("t", 1): 1003}) == []
    assert end_regressions(produced, {("t", 0): 14, ("t", 1): 3}) == [(("t", 0), 15, 14)]
    assert end_regressions(produced, {("t", 1): 3}) == [(("t", 0), 15, -1)]
