"""The transaction coordinator machine on a fake clock (docs/transactions.md): no sockets, no
sleeps; persisted state and markers are reported back by hand."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from rallypoint.protocol.errors import ErrorCode as E
from rallypoint.transactions.machine import (
    InitResult,
    Persist,
    Respond,
    TxnConfig,
    TxnMachine,
    TxnState,
    WriteMarkers,
)

pytestmark = pytest.mark.unit

T0 = 1_000_000


class Driver:
    """Runs the machine: persists succeed (or fail) at once unless held; answers collected."""

    def __init__(self, **config: Any) -> None:
        pids = itertools.count(100)
        self.m = TxnMachine(TxnConfig(**config), lambda: next(pids))
        self.now = T0
        self.answers: dict[int, object] = {}
        self.markers: list[WriteMarkers] = []
        self.fail: E | None = None
        self.hold = False
        self.held: list[int] = []
        self._tokens = itertools.count(1)

    def apply(self, effects: list[Any]) -> None:
        for e in effects:
            if isinstance(e, Respond):
                self.answers[e.token] = e.result
            elif isinstance(e, Persist):
                if self.hold:
                    self.held.append(e.write_id)
                else:
                    self.apply(self.m.persisted(e.write_id, self.fail, self.now))
            elif isinstance(e, WriteMarkers):
                self.markers.append(e)

    def release(self) -> None:
        held, self.held = self.held, []
        for w in held:
            self.apply(self.m.persisted(w, self.fail, self.now))

    def call(self, fn: Any, *args: Any) -> object:
        token = next(self._tokens)
        self.apply(fn(token, *args, self.now))
        return self.answers.pop(token, None)

    def init(self, txn: str = "t", timeout: int = 60000, expected: tuple[int, int] | None = None) -> InitResult:
        r = self.call(self.m.init_producer_id, txn, timeout, expected)
        assert isinstance(r, InitResult), r
        return r

    def add(self, txn: str, pid: int, epoch: int, *tps: tuple[str, int]) -> object:
        return self.call(self.m.add_partitions, txn, pid, epoch, list(tps))

    def end(self, txn: str, pid: int, epoch: int, commit: bool) -> object:
        return self.call(self.m.end_txn, txn, pid, epoch, commit)

    def finish_markers(self) -> None:
        markers, self.markers = self.markers, []
        for mk in markers:
            self.apply(self.m.markers_written(mk.transactional_id, self.now))

    def state(self, txn: str = "t") -> TxnState:
        return self.m.txns[txn].state


def test_init_gives_epoch_0_then_bumps_and_validates_the_timeout() -> None:
    d = Driver(max_timeout_ms=60000)
    r = d.init()
    assert (r.error, r.producer_id, r.producer_epoch) == (E.NONE, 100, 0)
    assert d.init().producer_epoch == 1
    assert d.init(timeout=0).error == E.INVALID_TRANSACTION_TIMEOUT
    assert d.init(timeout=60001).error == E.INVALID_TRANSACTION_TIMEOUT
    assert d.state() == TxnState.EMPTY


def test_a_failed_save_undoes_the_transition_and_answers_kafkas_error() -> None:
    d = Driver()
    d.fail = E.KAFKA_STORAGE_ERROR
    assert d.init().error == E.NOT_COORDINATOR
    assert "t" not in d.m.txns  # the id was created by the failed write: gone again
    d.fail = None
    r = d.init()
    d.fail = E.NOT_ENOUGH_REPLICAS
    assert d.add("t", r.producer_id, 0, ("a", 0)) == E.COORDINATOR_NOT_AVAILABLE
    assert d.state() == TxnState.EMPTY and d.m.txns["t"].partitions == set()


def test_one_transition_at_a_time() -> None:
    d = Driver()
    r = d.init()
    d.hold = True
    token = next(d._tokens)
    d.apply(d.m.add_partitions(token, "t", r.producer_id, 0, [("a", 0)], d.now))
    assert token not in d.answers  # waits for the save
    assert d.add("t", r.producer_id, 0, ("b", 0)) == E.CONCURRENT_TRANSACTIONS
    assert d.end("t", r.producer_id, 0, True) == E.CONCURRENT_TRANSACTIONS
    assert d.m.visible()["t"].state == TxnState.EMPTY  # describe shows the saved state
    d.hold = False
    d.release()
    assert d.answers.pop(token) == E.NONE and d.state() == TxnState.ONGOING


def test_add_partitions_checks_in_kafkas_order() -> None:
    d = Driver()
    r = d.init()
    pid = r.producer_id
    assert d.add("nope", pid, 0, ("a", 0)) == E.INVALID_PRODUCER_ID_MAPPING
    assert d.add("t", pid + 1, 0, ("a", 0)) == E.INVALID_PRODUCER_ID_MAPPING
    assert d.add("t", pid, 1, ("a", 0)) == E.PRODUCER_FENCED
    assert d.add("t", pid, 0, ("a", 0)) == E.NONE
    start = d.m.txns["t"].start_ms
    d.now += 5
    assert d.add("t", pid, 0, ("a", 0)) == E.NONE  # nothing new: no write
    assert d.add("t", pid, 0, ("b", 1)) == E.NONE
    assert d.m.txns["t"].partitions == {("a", 0), ("b", 1)} and d.m.txns["t"].start_ms == start


@pytest.mark.parametrize(
    ("state", "commit", "answer"),
    [
        (TxnState.EMPTY, True, E.INVALID_TXN_STATE),
        (TxnState.EMPTY, False, E.INVALID_TXN_STATE),
        (TxnState.COMPLETE_COMMIT, True, E.NONE),
        (TxnState.COMPLETE_COMMIT, False, E.INVALID_TXN_STATE),
        (TxnState.COMPLETE_ABORT, False, E.NONE),
        (TxnState.COMPLETE_ABORT, True, E.INVALID_TXN_STATE),
        (TxnState.PREPARE_COMMIT, True, E.CONCURRENT_TRANSACTIONS),
        (TxnState.PREPARE_COMMIT, False, E.INVALID_TXN_STATE),
        (TxnState.PREPARE_ABORT, False, E.CONCURRENT_TRANSACTIONS),
        (TxnState.PREPARE_ABORT, True, E.INVALID_TXN_STATE),
    ],
)
def test_end_txn_state_table(state: TxnState, commit: bool, answer: E) -> None:
    d = Driver()
    r = d.init()
    d.m.txns["t"].state = state
    assert d.end("t", r.producer_id, 0, commit) == answer


def test_end_txn_answers_after_prepare_then_markers_then_complete() -> None:
    d = Driver()
    r = d.init()
    d.add("t", r.producer_id, 0, ("a", 0), ("__consumer_offsets", 3))
    assert d.end("t", r.producer_id, 0, True) == E.NONE
    assert d.state() == TxnState.PREPARE_COMMIT
    (mk,) = d.markers
    assert (mk.commit, mk.producer_id, mk.producer_epoch) == (True, r.producer_id, 0)
    assert mk.partitions == {("a", 0), ("__consumer_offsets", 3)}
    assert d.add("t", r.producer_id, 0, ("a", 0)) == E.CONCURRENT_TRANSACTIONS  # until Complete*
    d.finish_markers()
    assert d.state() == TxnState.COMPLETE_COMMIT and d.m.txns["t"].partitions == set()
    assert d.end("t", r.producer_id, 0, True) == E.NONE  # a retry


def test_init_during_an_open_transaction_fences_and_aborts_it() -> None:
    d = Driver()
    r = d.init()
    d.add("t", r.producer_id, 0, ("a", 0))
    assert d.init().error == E.CONCURRENT_TRANSACTIONS
    assert d.state() == TxnState.PREPARE_ABORT and d.m.txns["t"].producer_epoch == 1
    (mk,) = d.markers
    assert (mk.commit, mk.producer_epoch) == (False, 1)  # the marker carries the fencing epoch
    assert d.init().error == E.CONCURRENT_TRANSACTIONS  # markers not written yet
    d.finish_markers()
    again = d.init()
    assert (again.error, again.producer_epoch) == (E.NONE, 2)
    assert d.end("t", r.producer_id, 0, True) == E.PRODUCER_FENCED  # the zombie


def test_timed_out_transactions_are_fenced_and_aborted_on_the_clock() -> None:
    d = Driver()
    r = d.init(timeout=1000)
    d.add("t", r.producer_id, 0, ("a", 0))
    d.now += 1000
    d.apply(d.m.abort_timed_out(d.now))
    assert d.state() == TxnState.ONGOING  # not older than its timeout yet
    d.now += 1
    d.apply(d.m.abort_timed_out(d.now))
    assert d.state() == TxnState.PREPARE_ABORT and d.m.txns["t"].producer_epoch == 1
    d.finish_markers()
    assert d.state() == TxnState.COMPLETE_ABORT
    assert d.end("t", r.producer_id, 0, True) == E.PRODUCER_FENCED


def test_exhausted_epochs_rotate_the_producer_id_and_retries_get_the_same_answer() -> None:
    d = Driver()
    r = d.init()
    d.m.txns["t"].producer_epoch = 32766
    rotated = d.init()
    assert (rotated.producer_id, rotated.producer_epoch) == (r.producer_id + 1, 0)
    bumped = d.init(expected=(rotated.producer_id, 0))
    assert bumped.producer_epoch == 1
    retry = d.init(expected=(rotated.producer_id, 0))  # the answer to the last one was lost
    assert (retry.error, retry.producer_epoch) == (E.NONE, 1)
    assert d.init(expected=(rotated.producer_id + 7, 1)).error == E.PRODUCER_FENCED


def test_idle_ids_expire_and_a_loaded_prepare_writes_its_markers_again() -> None:
    d = Driver(id_expiration_ms=10_000)
    d.init("idle")
    r = d.init("busy")
    d.add("busy", r.producer_id, 0, ("a", 0))
    d.now += 10_000
    d.apply(d.m.expire_ids(d.now))
    assert "idle" not in d.m.txns and "busy" in d.m.txns  # an Ongoing transaction never expires
    d.end("busy", r.producer_id, 0, False)
    saved = d.m.snapshot()
    assert saved["busy"]["state"] == "PrepareAbort" and saved["busy"]["partitions"] == [["a", 0]]
    fresh = Driver()
    fresh.apply(fresh.m.load(saved, T0))
    (mk,) = fresh.markers
    assert (mk.transactional_id, mk.commit, mk.partitions) == ("busy", False, frozenset({("a", 0)}))
    fresh.finish_markers()
    assert fresh.state("busy") == TxnState.COMPLETE_ABORT


def test_verify_is_the_leaders_transaction_check() -> None:
    d = Driver()
    r = d.init()
    pid = r.producer_id
    assert d.m.verify("t", pid, 0, ("a", 0)) == E.TRANSACTION_ABORTABLE  # not added
    d.add("t", pid, 0, ("a", 0))
    assert d.m.verify("t", pid, 0, ("a", 0)) is None
    assert d.m.verify("t", pid, 1, ("a", 0)) == E.PRODUCER_FENCED
    assert d.m.verify("t", pid + 1, 0, ("a", 0)) == E.INVALID_PRODUCER_ID_MAPPING
    assert d.m.verify("x", pid, 0, ("a", 0)) == E.INVALID_PRODUCER_ID_MAPPING


def test_new_ids_past_the_cap_are_refused_and_known_ones_keep_working() -> None:
    d = Driver(max_ids=2)
    assert d.init("a").error == E.NONE and d.init("b").error == E.NONE
    assert d.init("c").error == E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert "c" not in d.m.txns
    assert d.init("a").producer_epoch == 1  # a known id is not new
