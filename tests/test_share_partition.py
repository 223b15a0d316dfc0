"""The share-partition record-state machine (docs/share-groups.md, "Record states"), on explicit
clocks: nothing here sleeps."""

from __future__ import annotations

import pytest
from rallypoint.protocol.errors import ErrorCode
from rallypoint.share.partition import (
    AckBatch,
    AckType,
    Acquired,
    LogBatch,
    RecordState,
    SharePartition,
    StateBatch,
    ack_batches_error,
)

pytestmark = pytest.mark.unit

T0 = 1_000_000
LOCK = 30_000


def batches(*ranges: tuple[int, int]) -> list[LogBatch]:
    return [LogBatch(a, b) for a, b in ranges]


def acquire(sp: SharePartition, member: str, *ranges: tuple[int, int], n: int = 500, now: int = T0) -> list[Acquired]:
    runs, _ = sp.acquire(member, batches(*ranges), max_records=n, now_ms=now, lock_ms=LOCK)
    return runs


def ack(sp: SharePartition, member: str, first: int, last: int, *types: AckType) -> ErrorCode:
    return sp.acknowledge(member, [AckBatch(first, last, tuple(int(t) for t in types))])


def test_acquire_counts_deliveries_and_accept_moves_the_start() -> None:
    sp = SharePartition(0)
    assert acquire(sp, "a", (0, 4)) == [Acquired(0, 4, 1)]
    assert sp.end_offset == 5 and sp.start_offset == 0
    assert acquire(sp, "b", (0, 4)) == []  # all held
    assert ack(sp, "a", 0, 2, AckType.ACCEPT) == ErrorCode.NONE
    assert sp.start_offset == 3
    assert sp.state_of(3) == (RecordState.ACQUIRED, 1, "a")


def test_release_redelivers_with_a_higher_count_and_archives_at_the_limit() -> None:
    sp = SharePartition(0, delivery_limit=3)
    for n in (1, 2, 3):
        assert acquire(sp, "a", (0, 0)) == [Acquired(0, 0, n)]
        assert ack(sp, "a", 0, 0, AckType.RELEASE) == ErrorCode.NONE
    # the third delivery reached the limit: archived, never delivered again
    assert sp.start_offset == 1
    assert acquire(sp, "a", (0, 0)) == []


def test_reject_and_gap_archive() -> None:
    sp = SharePartition(0)
    acquire(sp, "a", (0, 2))
    assert ack(sp, "a", 0, 2, AckType.REJECT, AckType.GAP, AckType.ACCEPT) == ErrorCode.NONE
    assert sp.start_offset == 3
    assert acquire(sp, "a", (0, 2)) == []


def test_acknowledging_what_another_member_holds_is_invalid_record_state_and_changes_nothing() -> None:
    sp = SharePartition(0)
    acquire(sp, "a", (0, 1))
    acquire(sp, "b", (2, 3))
    # one bad offset in the partition's batches: nothing applies
    assert sp.acknowledge("a", [AckBatch(0, 1, (1,)), AckBatch(2, 2, (1,))]) == ErrorCode.INVALID_RECORD_STATE
    assert sp.state_of(0) == (RecordState.ACQUIRED, 1, "a")
    assert ack(sp, "a", 5, 5, AckType.ACCEPT) == ErrorCode.INVALID_RECORD_STATE  # never acquired
    assert ack(sp, "b", 2, 3, AckType.ACCEPT) == ErrorCode.NONE
    assert ack(sp, "b", 2, 3, AckType.ACCEPT) == ErrorCode.INVALID_RECORD_STATE  # already acknowledged


def test_lock_expires_exactly_at_its_deadline() -> None:
    sp = SharePartition(0)
    acquire(sp, "a", (0, 1), now=T0)
    assert sp.next_deadline() == T0 + LOCK
    assert sp.expire_locks(T0 + LOCK - 1) == 0
    assert sp.state_of(0) == (RecordState.ACQUIRED, 1, "a")
    assert sp.expire_locks(T0 + LOCK) == 2
    assert sp.state_of(0) == (RecordState.AVAILABLE, 1, "")
    assert sp.next_deadline() is None
    # the member whose lock expired cannot acknowledge any more; the next holder can
    assert acquire(sp, "b", (0, 1), now=T0 + LOCK) == [Acquired(0, 1, 2)]
    assert ack(sp, "a", 0, 1, AckType.ACCEPT) == ErrorCode.INVALID_RECORD_STATE
    assert ack(sp, "b", 0, 1, AckType.ACCEPT) == ErrorCode.NONE


def test_an_acknowledged_lock_does_not_expire_later_acquisitions() -> None:
    sp = SharePartition(0)
    acquire(sp, "a", (0, 0), now=T0)
    ack(sp, "a", 0, 0, AckType.RELEASE)
    acquire(sp, "a", (0, 0), now=T0 + 10_000)  # a second lock on the same offset
    assert sp.expire_locks(T0 + LOCK) == 0  # the first lock is dead
    assert sp.expire_locks(T0 + 10_000 + LOCK) == 1


def test_release_member_releases_only_its_records() -> None:
    sp = SharePartition(0)
    acquire(sp, "a", (0, 1))
    acquire(sp, "b", (2, 2))
    assert sp.release_member("a") == 2
    assert sp.state_of(0) == (RecordState.AVAILABLE, 1, "")
    assert sp.state_of(2) == (RecordState.ACQUIRED, 1, "b")
    assert sp.next_fetch_offset() == 0


def test_window_is_capped_by_max_in_flight() -> None:
    sp = SharePartition(0, max_in_flight=100)
    runs = acquire(sp, "a", (0, 149), n=1000)
    assert runs == [Acquired(0, 99, 1)]
    assert sp.window_full()
    assert acquire(sp, "b", (100, 149)) == []
    ack(sp, "a", 0, 9, AckType.ACCEPT)
    assert acquire(sp, "b", (100, 149)) == [Acquired(100, 109, 1)]


def test_max_records_and_redeliveries_first() -> None:
    sp = SharePartition(0)
    acquire(sp, "a", (0, 9))
    ack(sp, "a", 3, 4, AckType.RELEASE)
    sp.acknowledge("a", [AckBatch(0, 2, (1,)), AckBatch(5, 9, (1,))])
    assert sp.next_fetch_offset() == 3
    runs, _ = sp.acquire("b", batches((3, 4), (5, 9), (10, 19)), max_records=4, now_ms=T0, lock_ms=LOCK)
    assert runs == [Acquired(3, 4, 2), Acquired(10, 11, 1)]


def test_gaps_between_batches_and_aborted_records_do_not_hold_the_start() -> None:
    sp = SharePartition(0)
    runs, changed = sp.acquire(
        "a", [LogBatch(0, 1), LogBatch(2, 3, aborted=True), LogBatch(7, 8)], max_records=100, now_ms=T0, lock_ms=LOCK
    )
    assert changed  # the aborted records were archived
    assert runs == [Acquired(0, 1, 1), Acquired(7, 8, 1)]
    ack(sp, "a", 0, 1, AckType.ACCEPT)
    ack(sp, "a", 7, 8, AckType.ACCEPT)
    assert sp.start_offset == 9 == sp.end_offset


def test_log_start_moving_past_the_window_drops_its_records() -> None:
    sp = SharePartition(0)
    acquire(sp, "a", (0, 9))
    assert sp.truncate_to(5)
    assert sp.start_offset == 5
    assert sp.state_of(4) is None
    assert ack(sp, "a", 4, 4, AckType.ACCEPT) == ErrorCode.INVALID_RECORD_STATE
    assert not sp.truncate_to(3)


def test_snapshot_saves_acquired_as_available_and_restores() -> None:
    sp = SharePartition(10)
    acquire(sp, "a", (10, 19))
    ack(sp, "a", 10, 11, AckType.ACCEPT)
    ack(sp, "a", 14, 14, AckType.ACCEPT)
    ack(sp, "a", 15, 15, AckType.REJECT)
    ack(sp, "a", 16, 16, AckType.RELEASE)
    snap = sp.snapshot()
    assert snap == [
        StateBatch(12, 13, RecordState.AVAILABLE, 1),
        StateBatch(14, 14, RecordState.ACKNOWLEDGED, 1),
        StateBatch(15, 15, RecordState.ARCHIVED, 1),
        StateBatch(16, 19, RecordState.AVAILABLE, 1),
    ]
    again = SharePartition(12, state=snap)
    assert again.start_offset == 12 and again.end_offset == 20
    runs, _ = again.acquire("b", batches((10, 19)), max_records=100, now_ms=T0, lock_ms=LOCK)
    assert runs == [Acquired(12, 13, 2), Acquired(16, 19, 2)]  # 14 and 15 are done


@pytest.mark.parametrize(
    ("batch", "ok"),
    [
        ([AckBatch(0, 3, (1,))], True),
        ([AckBatch(0, 3, (1, 2, 3, 0))], True),
        ([AckBatch(0, 3, (1, 2))], False),  # neither one type nor one per offset
        ([AckBatch(3, 2, (1,))], False),
        ([AckBatch(0, 3, (1,)), AckBatch(3, 4, (1,))], False),  # overlap
        ([AckBatch(0, 0, (4,))], False),  # RENEW does not exist in v1
        ([AckBatch(-1, 0, (1,))], False),
    ],
)
def test_acknowledgement_batch_validation(batch: list[AckBatch], ok: bool) -> None:
    assert (ack_batches_error(batch) is None) == ok


def test_a_huge_acknowledgement_range_is_refused_without_walking_it() -> None:
    sp = SharePartition(0)
    acquire(sp, "a", (0, 1))
    assert ack(sp, "a", 0, 2**62, AckType.ACCEPT) == ErrorCode.INVALID_RECORD_STATE
    assert sp.state_of(0) == (RecordState.ACQUIRED, 1, "a")
