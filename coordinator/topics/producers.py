"""Idempotent-producer state per partition (Kafka's ``ProducerStateEntry``/``ProducerAppendInfo``).

Rules, from storage/.../log/ProducerAppendInfo.java and ProducerStateEntry.java:

* each producer id keeps its epoch and the metadata of its last 5 batches
  (``NUM_BATCHES_TO_RETAIN``);
* a batch whose epoch equals the entry's and whose [first, last] sequence equals one of those
  5 is a duplicate: the append is skipped and the original offsets are returned
  (``UnifiedLog.analyzeAndValidateProducerState``);
* epoch lower than the entry's → INVALID_PRODUCER_EPOCH (``checkProducerEpoch``);
* a new (higher) epoch must start at sequence 0 unless the entry has no epoch yet;
* same epoch: the first sequence must follow the last one (wrapping at INT32_MAX), unless the
  entry has no epoch (an unknown producer: any sequence is accepted) →
  OUT_OF_ORDER_SEQUENCE_NUMBER otherwise (``checkSequence``).
"""

from __future__ import annotations

from collections import deque

from msgspec import Struct, field
from rallypoint.protocol.errors import ErrorCode
from rallypoint.protocol.records import INT32_MAX, NO_SEQUENCE, BatchHeader, decrement_sequence

from .log_validator import BatchError

NUM_BATCHES_TO_RETAIN = 5
NO_PRODUCER_EPOCH = -1


class BatchMetadata(Struct, frozen=True):
    """One of a producer's last batches (Kafka's ``BatchMetadata``): last sequence and offset, delta, time."""

    last_seq: int
    last_offset: int
    offset_delta: int
    timestamp: int

    @property
    def first_seq(self) -> int:
        return decrement_sequence(self.last_seq, self.offset_delta)

    @property
    def first_offset(self) -> int:
        return self.last_offset - self.offset_delta


class ProducerEntry(Struct):
    """One producer id's state in a partition (Kafka's ``ProducerStateEntry``)."""

    producer_id: int
    epoch: int = NO_PRODUCER_EPOCH
    batches: deque[BatchMetadata] = field(default_factory=lambda: deque(maxlen=NUM_BATCHES_TO_RETAIN))
    # first offset of the producer's open transaction in this partition (None: none open)
    current_txn_first_offset: int | None = None
    last_timestamp: int = -1

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    def find_duplicate(self, h: BatchHeader) -> BatchMetadata | None:
        if h.producer_epoch != self.epoch:
            return None
        first, last = h.base_sequence, h.last_sequence
        for b in self.batches:
            if b.first_seq == first and b.last_seq == last:
                return b
        return None

    def check(self, h: BatchHeader) -> None:
        """Raise BatchError if the batch may not be appended after this entry."""
        epoch = h.producer_epoch
        if epoch < self.epoch:
            raise BatchError(
                ErrorCode.INVALID_PRODUCER_EPOCH,
                f"Epoch of producer {self.producer_id} is {epoch}, "
                f"which is smaller than the last seen epoch {self.epoch}",
            )
        first = h.base_sequence
        if epoch != self.epoch:
            if first != 0 and self.epoch != NO_PRODUCER_EPOCH:
                raise BatchError(
                    ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                    f"Invalid sequence number for new epoch of producer {self.producer_id}: {epoch} (request epoch), "
                    f"{first} (seq. number), {self.epoch} (current producer epoch)",
                )
            return
        if self.epoch == NO_PRODUCER_EPOCH:
            return
        last = self.last_seq
        if not (first == last + 1 or (first == 0 and last == INT32_MAX)):
            raise BatchError(
                ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER,
                f"Out of order sequence number for producer {self.producer_id}: {first} (incoming seq. number), "
                f"{last} (current end sequence number)",
            )

    def check_transactional(self, h: BatchHeader) -> None:
        """``ProducerAppendInfo.checkProducerEpoch`` and the transaction rule: a plain batch
        while the producer has a transaction open here is INVALID_TXN_STATE."""
        if h.is_transactional:
            return
        if self.current_txn_first_offset is not None:
            raise BatchError(
                ErrorCode.INVALID_TXN_STATE,
                f"Expected transactional write from producer {self.producer_id} at offset "
                f"{self.current_txn_first_offset} in partition, but found non-transactional data",
            )

    def add(self, h: BatchHeader, base_offset: int) -> None:
        if h.producer_epoch != self.epoch:
            self.batches.clear()
            self.epoch = h.producer_epoch
        self.batches.append(
            BatchMetadata(h.last_sequence, base_offset + h.last_offset_delta, h.last_offset_delta, h.max_timestamp)
        )
        self.last_timestamp = h.max_timestamp
        if h.is_transactional and self.current_txn_first_offset is None:
            self.current_txn_first_offset = base_offset  # the batch starts a transaction here

    def check_marker(self, epoch: int) -> None:
        """``ProducerAppendInfo.appendEndTxnMarker`` (transaction version 1): the marker's epoch
        must be at least the producer's."""
        if epoch < self.epoch:
            raise BatchError(
                ErrorCode.INVALID_PRODUCER_EPOCH,
                f"Epoch of producer {self.producer_id} at offset {self.last_offset} is {epoch}, "
                f"which is smaller than the last seen epoch {self.epoch}",
            )

    def end_txn(self, epoch: int) -> int | None:
        """A marker was written: the epoch moves up to the marker's (batches forgotten, as
        ``maybeUpdateProducerEpoch``), the open transaction closes; returns its first offset."""
        if epoch != self.epoch:
            self.batches.clear()
            self.epoch = epoch
        first, self.current_txn_first_offset = self.current_txn_first_offset, None
        return first


class ProducerStates:
    """The producer entries of one partition."""

    def __init__(self) -> None:
        self._entries: dict[int, ProducerEntry] = {}

    def get(self, producer_id: int) -> ProducerEntry | None:
        return self._entries.get(producer_id)

    def entry(self, producer_id: int) -> ProducerEntry:
        e = self._entries.get(producer_id)
        if e is None:
            e = self._entries[producer_id] = ProducerEntry(producer_id)
        return e

    def entries(self) -> list[ProducerEntry]:
        return list(self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def last_offsets(self) -> frozenset[int]:
        """The last offset of each producer's newest batch (log compaction keeps that batch,
        emptied if need be, so the producer's state survives: Kafka's ``LogCleaner``)."""
        return frozenset(e.last_offset for e in self._entries.values())

    def truncate_head(self, log_start_offset: int) -> None:
        """Forget producers whose last write is gone (``ProducerStateManager.truncateHead``)."""
        gone = [pid for pid, e in self._entries.items() if e.last_offset < log_start_offset]
        for pid in gone:
            del self._entries[pid]
