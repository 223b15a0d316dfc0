"""The transaction coordinator: a sans-IO machine (docs/transactions.md).

Events in — InitProducerId, AddPartitionsToTxn / AddOffsetsToTxn, EndTxn, a persisted state, the
markers written, a timeout sweep — each with ``now_ms``; effects out as data: answer a parked
request, persist the state, write markers, log a transition.  Kafka's counterparts are
``TransactionCoordinator.scala`` (the request rules) and ``TransactionMetadata.java`` (the
transitions); rallypoint serves the original protocol (transaction version 1: the epoch changes
only at InitProducerId and when a producer is fenced).

Rules kept here, in one place:

* a transactional id has a producer id and epoch, a state (Empty, Ongoing, PrepareCommit,
  PrepareAbort, CompleteCommit, CompleteAbort, PrepareEpochFence, Dead), its partitions and
  the time its transaction started;
* one transition at a time: while a state is being persisted (``pending``) or markers are being
  written (Prepare*), other requests get CONCURRENT_TRANSACTIONS;
* every transition is persisted before the request that caused it is answered;
* InitProducerId bumps the epoch (a new producer id when it is exhausted); while a transaction
  is Ongoing it fences it instead: epoch + 1 and the transaction aborted (PrepareAbort), the
  caller told CONCURRENT_TRANSACTIONS so that its retry gets the next epoch;
* a transaction Ongoing past its timeout is fenced and aborted the same way.
"""

from __future__ import annotations

import copy
import enum
import functools
from collections.abc import Callable, Iterable
from typing import Final, TypeAlias

from msgspec import Struct, field
from rallypoint.protocol.errors import ErrorCode

E = ErrorCode
MAX_EPOCH: Final = 32767 - 1  # Short.MaxValue - 1: an epoch this high rotates the producer id
NO_PRODUCER_ID: Final = -1
NO_EPOCH: Final = -1

TopicPartition: TypeAlias = tuple[str, int]


class TxnState(enum.IntEnum):
    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7


STATE_NAMES: Final = {
    TxnState.EMPTY: "Empty",
    TxnState.ONGOING: "Ongoing",
    TxnState.PREPARE_COMMIT: "PrepareCommit",
    TxnState.PREPARE_ABORT: "PrepareAbort",
    TxnState.COMPLETE_COMMIT: "CompleteCommit",
    TxnState.COMPLETE_ABORT: "CompleteAbort",
    TxnState.DEAD: "Dead",
    TxnState.PREPARE_EPOCH_FENCE: "PrepareEpochFence",
}
_COMPLETE: Final = (TxnState.EMPTY, TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT)
_PREPARE: Final = (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)


class TxnConfig(Struct, frozen=True):
    """Kafka's broker settings (docs/transactions.md, "Configuration")."""

    max_timeout_ms: int = 900000  # transaction.max.timeout.ms
    id_expiration_ms: int = 604800000  # transactional.id.expiration.ms
    num_partitions: int = 50  # transaction.state.log.num.partitions
    max_ids: int = 10000  # rallypoint.max.transactional.ids (docs/reliability.md, "Limits")


class TxnMetadata(Struct):
    """One transactional id's state (Kafka's ``TransactionMetadata``); :meth:`to_json` is what is saved."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: TxnState = TxnState.EMPTY
    partitions: set[TopicPartition] = field(default_factory=set)
    start_ms: int = -1
    last_update_ms: int = -1
    last_producer_epoch: int = NO_EPOCH  # not persisted (Kafka's lastProducerEpoch)
    pending: bool = False  # a transition is being persisted

    def to_json(self) -> dict[str, object]:
        return {
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
            "timeout_ms": self.timeout_ms,
            "state": STATE_NAMES[self.state],
            "partitions": sorted([t, p] for t, p in self.partitions),
            "start_ms": self.start_ms,
            "last_update_ms": self.last_update_ms,
        }

    @classmethod
    def from_json(cls, txn_id: str, d: dict[str, object]) -> TxnMetadata:
        by_name = {v: k for k, v in STATE_NAMES.items()}
        parts = d.get("partitions") or []
        assert isinstance(parts, list)
        return cls(
            txn_id,
            int(d["producer_id"]),  # type: ignore[call-overload]
            int(d["producer_epoch"]),  # type: ignore[call-overload]
            int(d["timeout_ms"]),  # type: ignore[call-overload]
            by_name[str(d["state"])],
            {(str(t), int(p)) for t, p in parts},
            int(d.get("start_ms", -1)),  # type: ignore[call-overload]
            int(d.get("last_update_ms", -1)),  # type: ignore[call-overload]
        )


# ----------------------------------------------------------------------------- effects


class Respond(Struct, frozen=True):
    """Release the request parked under ``token`` with ``result``."""

    token: int
    result: object


class Persist(Struct, frozen=True):
    """Save the coordinator's state (every transactional id), then report with :meth:`TxnMachine.persisted`."""

    write_id: int


class WriteMarkers(Struct, frozen=True):
    """Write a COMMIT or ABORT marker with this producer id and epoch to every partition, then
    report with :meth:`TxnMachine.markers_written`."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool
    partitions: frozenset[TopicPartition]


class Note(Struct, frozen=True):
    """Something worth a log line (a state change, a fenced producer)."""

    event: str
    fields: dict[str, object]


Effect: TypeAlias = Respond | Persist | WriteMarkers | Note


class InitResult(Struct, frozen=True):
    """The answer to an InitProducerId request: an error, or the producer id and epoch."""

    error: ErrorCode
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_EPOCH


class _Write(Struct):
    """A transition being saved: the state before it, the answer either way, and what follows success."""

    txn_id: str
    before: TxnMetadata | None  # None: the id was created by this write
    token: int | None
    result: object
    failed: Callable[[ErrorCode], object]
    then: Callable[[], None] | None = None


def append_error(code: ErrorCode) -> ErrorCode:
    """What a client sees when the state could not be saved (``TransactionStateManager``'s
    mapping of append errors)."""
    if code in (E.UNKNOWN_TOPIC_OR_PARTITION, E.NOT_ENOUGH_REPLICAS, E.NOT_ENOUGH_REPLICAS_AFTER_APPEND):
        return E.COORDINATOR_NOT_AVAILABLE
    if code in (E.NOT_LEADER_OR_FOLLOWER, E.KAFKA_STORAGE_ERROR):
        return E.NOT_COORDINATOR
    if code in (E.MESSAGE_TOO_LARGE, E.RECORD_LIST_TOO_LARGE):
        return E.UNKNOWN_SERVER_ERROR
    return code


class TxnMachine:
    def __init__(self, config: TxnConfig, new_producer_id: Callable[[], int]) -> None:
        self.config = config
        self.new_producer_id = new_producer_id
        self.txns: dict[str, TxnMetadata] = {}
        self._writes: dict[int, _Write] = {}
        self._next_write = 0
        self._fx: list[Effect] = []
        self._now = 0

    # ------------------------------------------------------------------ plumbing

    def _begin(self, now_ms: int) -> None:
        self._now = now_ms
        self._fx = []

    def _end(self) -> list[Effect]:
        fx, self._fx = self._fx, []
        return fx

    def _respond(self, token: int | None, result: object) -> None:
        if token is not None:
            self._fx.append(Respond(token, result))

    def _transition(
        self,
        txn: TxnMetadata,
        before: TxnMetadata | None,
        token: int | None,
        result: object,
        failed: Callable[[ErrorCode], object],
        then: Callable[[], None] | None = None,
    ) -> None:
        """``txn`` (already changed in memory) is persisted; the answer waits for it."""
        self._next_write += 1
        txn.pending = True
        txn.last_update_ms = self._now
        self._writes[self._next_write] = _Write(txn.transactional_id, before, token, result, failed, then)
        old = STATE_NAMES[before.state] if before is not None else "-"
        if before is None or before.state != txn.state or before.producer_epoch != txn.producer_epoch:
            self._fx.append(
                Note(
                    "transaction state changed",
                    {
                        "transactional_id": txn.transactional_id,
                        "from_state": old,
                        "to_state": STATE_NAMES[txn.state],
                        "producer_id": txn.producer_id,
                        "producer_epoch": txn.producer_epoch,
                    },
                )
            )
        self._fx.append(Persist(self._next_write))

    def persisted(self, write_id: int, error: ErrorCode | None, now_ms: int) -> list[Effect]:
        """The state written by ``write_id`` is durable (``error`` None) or could not be saved
        (the transition is undone and the request answered with the mapped error)."""
        self._begin(now_ms)
        w = self._writes.pop(write_id, None)
        if w is None:
            return self._end()
        txn = self.txns.get(w.txn_id)
        if error is None:
            if txn is not None:
                txn.pending = False
            self._respond(w.token, w.result)
            if w.then is not None:
                w.then()
        else:
            if w.before is None:
                self.txns.pop(w.txn_id, None)
            else:
                self.txns[w.txn_id] = w.before
            self._respond(w.token, w.failed(append_error(error)))
        return self._end()

    # ------------------------------------------------------------------ InitProducerId

    def init_producer_id(
        self, token: int, txn_id: str, timeout_ms: int, expected: tuple[int, int] | None, now_ms: int
    ) -> list[Effect]:
        """``handleInitProducerId`` for a transactional id (``""`` is refused by the handler)."""
        self._begin(now_ms)
        if timeout_ms <= 0 or timeout_ms > self.config.max_timeout_ms:
            self._respond(token, InitResult(E.INVALID_TRANSACTION_TIMEOUT))
            return self._end()
        txn = self.txns.get(txn_id)
        if txn is None or txn.state == TxnState.DEAD:
            if txn is None and len(self.txns) >= self.config.max_ids:
                # the coordinator's state is bounded: a new id past the cap is refused (fatal for
                # the producer, as a principal without WRITE on the id)
                self._respond(token, InitResult(E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED))
                return self._end()
            txn = TxnMetadata(txn_id, self.new_producer_id(), NO_EPOCH, timeout_ms, last_update_ms=now_ms)
            fresh = True
        else:
            fresh = False
        if txn.pending:
            self._respond(token, InitResult(E.CONCURRENT_TRANSACTIONS))
            return self._end()
        if expected is not None and not self._valid_expected(txn, expected):
            self._respond(token, InitResult(E.PRODUCER_FENCED))
            return self._end()
        if txn.state in _PREPARE or txn.state == TxnState.PREPARE_EPOCH_FENCE:
            self._respond(token, InitResult(E.CONCURRENT_TRANSACTIONS))
            return self._end()
        before = None if fresh else copy.deepcopy(txn)
        if txn.state == TxnState.ONGOING:
            # fence the open transaction: epoch + 1, abort it; the caller retries
            self._fence_and_abort(txn, before, token, InitResult(E.CONCURRENT_TRANSACTIONS), "InitProducerId")
            return self._end()
        # Empty or Complete*: a new epoch (prepareIncrementProducerEpoch)
        if expected is not None and expected[1] != NO_EPOCH and txn.producer_epoch != NO_EPOCH:
            if expected[1] == txn.last_producer_epoch and expected[0] == txn.producer_id:
                self._respond(token, InitResult(E.NONE, txn.producer_id, txn.producer_epoch))  # a retry
                return self._end()
            if expected[1] != txn.producer_epoch:
                self._respond(token, InitResult(E.PRODUCER_FENCED))
                return self._end()
        if txn.producer_epoch >= MAX_EPOCH:
            txn.producer_id, txn.producer_epoch, txn.last_producer_epoch = self.new_producer_id(), 0, NO_EPOCH
        else:
            txn.last_producer_epoch = txn.producer_epoch
            txn.producer_epoch += 1
        txn.timeout_ms = timeout_ms
        txn.state = TxnState.EMPTY
        txn.partitions = set()
        txn.start_ms = -1
        self.txns[txn_id] = txn
        self._transition(
            txn, before, token, InitResult(E.NONE, txn.producer_id, txn.producer_epoch), lambda c: InitResult(c)
        )
        return self._end()

    @staticmethod
    def _valid_expected(txn: TxnMetadata, expected: tuple[int, int]) -> bool:
        """``TransactionCoordinator.isValidProducerId``."""
        pid, _epoch = expected
        return txn.producer_epoch == NO_EPOCH or pid == txn.producer_id

    def _fence_and_abort(
        self, txn: TxnMetadata, before: TxnMetadata | None, token: int | None, result: object, why: str
    ) -> None:
        """``prepareFenceProducerEpoch`` then the internal abort: one transition to
        PrepareAbort at epoch + 1 (the fenced producer's next call gets PRODUCER_FENCED)."""
        if txn.producer_epoch < MAX_EPOCH:
            txn.producer_epoch += 1
        txn.last_producer_epoch = NO_EPOCH
        txn.state = TxnState.PREPARE_ABORT
        self.txns[txn.transactional_id] = txn
        self._fx.append(
            Note(
                "transaction fenced",
                {"transactional_id": txn.transactional_id, "producer_epoch": txn.producer_epoch, "by": why},
            )
        )
        self._transition(txn, before, token, result, lambda c: result, then=lambda: self._send_markers(txn, False))

    # ------------------------------------------------------------------ checks

    def _check(self, txn_id: str, pid: int, epoch: int) -> tuple[TxnMetadata | None, ErrorCode | None]:
        """The common preconditions of AddPartitions/AddOffsets/EndTxn, in Kafka's order."""
        txn = self.txns.get(txn_id)
        if txn is None or txn.state == TxnState.DEAD:
            return None, E.INVALID_PRODUCER_ID_MAPPING
        if txn.pending:
            return txn, E.CONCURRENT_TRANSACTIONS
        if pid != txn.producer_id:
            return txn, E.INVALID_PRODUCER_ID_MAPPING
        if epoch != txn.producer_epoch:
            return txn, E.PRODUCER_FENCED
        return txn, None

    # ------------------------------------------------------------------ AddPartitionsToTxn

    def add_partitions(
        self, token: int, txn_id: str, pid: int, epoch: int, partitions: Iterable[TopicPartition], now_ms: int
    ) -> list[Effect]:
        """``handleAddPartitionsToTransaction``: the result is one error code for every partition."""
        self._begin(now_ms)
        txn, err = self._check(txn_id, pid, epoch)
        if err is None and txn is not None and txn.state in (*_PREPARE, TxnState.PREPARE_EPOCH_FENCE):
            err = E.CONCURRENT_TRANSACTIONS
        if err is not None or txn is None:
            self._respond(token, err)
            return self._end()
        wanted = set(partitions)
        if txn.state == TxnState.ONGOING and wanted <= txn.partitions:
            self._respond(token, E.NONE)  # nothing new: no write
            return self._end()
        before = copy.deepcopy(txn)
        if txn.state != TxnState.ONGOING:
            txn.start_ms = now_ms
        txn.state = TxnState.ONGOING
        txn.partitions |= wanted
        self._transition(txn, before, token, E.NONE, lambda c: c)
        return self._end()

    def verify(self, txn_id: str, pid: int, epoch: int, tp: TopicPartition) -> ErrorCode | None:
        """May this producer append transactional data to ``tp`` now?  (The verify-only
        AddPartitionsToTxn a partition leader sends before a transactional append.)"""
        txn = self.txns.get(txn_id)
        if txn is None or txn.state == TxnState.DEAD or pid != txn.producer_id:
            return E.INVALID_PRODUCER_ID_MAPPING
        if epoch != txn.producer_epoch:
            return E.PRODUCER_FENCED
        if txn.state in (*_PREPARE, TxnState.PREPARE_EPOCH_FENCE):
            return E.CONCURRENT_TRANSACTIONS
        if txn.state != TxnState.ONGOING or tp not in txn.partitions:
            return E.TRANSACTION_ABORTABLE
        return None

    # ------------------------------------------------------------------ EndTxn

    def end_txn(self, token: int, txn_id: str, pid: int, epoch: int, commit: bool, now_ms: int) -> list[Effect]:
        """``endTransactionWithTV1``: the answer comes once Prepare* is persisted; the markers
        follow, then Complete*."""
        self._begin(now_ms)
        txn = self.txns.get(txn_id)
        err: ErrorCode | None
        if txn is None or txn.state == TxnState.DEAD:
            err = E.INVALID_PRODUCER_ID_MAPPING
        elif pid != txn.producer_id:
            err = E.INVALID_PRODUCER_ID_MAPPING
        elif epoch != txn.producer_epoch:
            err = E.PRODUCER_FENCED
        elif txn.pending:
            err = E.CONCURRENT_TRANSACTIONS
        else:
            err = self._end_rule(txn.state, commit)
        if err is not None or txn is None:
            self._respond(token, err)
            return self._end()
        if txn.state != TxnState.ONGOING:
            self._respond(token, E.NONE)  # a retry of a completed EndTxn
            return self._end()
        before = copy.deepcopy(txn)
        txn.state = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        self._transition(txn, before, token, E.NONE, lambda c: c, then=lambda: self._send_markers(txn, commit))
        return self._end()

    @staticmethod
    def _end_rule(state: TxnState, commit: bool) -> ErrorCode | None:
        """The state table of EndTxn (transaction version 1)."""
        if state == TxnState.ONGOING:
            return None
        if state == TxnState.COMPLETE_COMMIT:
            return None if commit else E.INVALID_TXN_STATE
        if state == TxnState.COMPLETE_ABORT:
            return E.INVALID_TXN_STATE if commit else None
        if state == TxnState.PREPARE_COMMIT:
            return E.CONCURRENT_TRANSACTIONS if commit else E.INVALID_TXN_STATE
        if state == TxnState.PREPARE_ABORT:
            return E.INVALID_TXN_STATE if commit else E.CONCURRENT_TRANSACTIONS
        if state == TxnState.PREPARE_EPOCH_FENCE:
            return E.CONCURRENT_TRANSACTIONS
        return E.INVALID_TXN_STATE  # Empty

    def _send_markers(self, txn: TxnMetadata, commit: bool) -> None:
        self._fx.append(
            WriteMarkers(txn.transactional_id, txn.producer_id, txn.producer_epoch, commit, frozenset(txn.partitions))
        )

    def markers_written(self, txn_id: str, now_ms: int) -> list[Effect]:
        """Every marker of the transaction is written: Complete* with no partitions."""
        self._begin(now_ms)
        txn = self.txns.get(txn_id)
        if txn is None or txn.state not in _PREPARE:
            return self._end()
        before = copy.deepcopy(txn)
        txn.state = TxnState.COMPLETE_COMMIT if txn.state == TxnState.PREPARE_COMMIT else TxnState.COMPLETE_ABORT
        txn.partitions = set()
        self._transition(txn, before, None, None, lambda c: None)
        return self._end()

    # ------------------------------------------------------------------ timers

    def abort_timed_out(self, now_ms: int) -> list[Effect]:
        """``abortTimedOutTransactions``: every Ongoing transaction older than its timeout is
        fenced and aborted."""
        self._begin(now_ms)
        for txn in list(self.txns.values()):
            if txn.state == TxnState.ONGOING and not txn.pending and txn.start_ms + txn.timeout_ms < now_ms:
                self._fence_and_abort(txn, copy.deepcopy(txn), None, None, "timeout")
        return self._end()

    def expire_ids(self, now_ms: int) -> list[Effect]:
        """``transactional.id.expiration.ms`` after its last update, an idle id goes."""
        self._begin(now_ms)
        for txn_id, txn in list(self.txns.items()):
            if (
                txn.state in _COMPLETE
                and not txn.pending
                and txn.last_update_ms + self.config.id_expiration_ms <= now_ms
            ):
                before = copy.deepcopy(txn)
                txn.state = TxnState.DEAD
                self._transition(txn, before, None, None, lambda c: None, then=functools.partial(self._forget, txn_id))
        return self._end()

    def _forget(self, txn_id: str) -> None:
        t = self.txns.get(txn_id)
        if t is not None and t.state == TxnState.DEAD:
            del self.txns[txn_id]

    # ------------------------------------------------------------------ reading

    def visible(self) -> dict[str, TxnMetadata]:
        """What DescribeTransactions and ListTransactions show: a transition counts once it is
        saved (as Kafka completes a transition after its append), so a pending id shows its
        state from before."""
        out = dict(self.txns)
        for w in self._writes.values():
            if w.before is None:
                out.pop(w.txn_id, None)
            else:
                out[w.txn_id] = w.before
        return out

    # ------------------------------------------------------------------ persistence

    def snapshot(self) -> dict[str, dict[str, object]]:
        """What is saved: every live transactional id (Dead ones are gone)."""
        return {i: t.to_json() for i, t in sorted(self.txns.items()) if t.state != TxnState.DEAD}

    def load(self, saved: dict[str, dict[str, object]], now_ms: int) -> list[Effect]:
        """Install the saved state; transactions saved in Prepare* have their markers written
        again (``loadTransactionsForTxnTopicPartition``)."""
        self._begin(now_ms)
        self.txns = {i: TxnMetadata.from_json(i, d) for i, d in saved.items()}
        for txn in self.txns.values():
            if txn.state in _PREPARE:
                self._send_markers(txn, txn.state == TxnState.PREPARE_COMMIT)
        return self._end()


__all__ = [
    "STATE_NAMES",
    "Effect",
    "InitResult",
    "Note",
    "Persist",
    "Respond",
    "TxnConfig",
    "TxnMachine",
    "TxnMetadata",
    "TxnState",
    "WriteMarkers",
]
