"""Rebuild group metadata and committed offsets from ``__consumer_offsets`` batches (spec §B.3).

Pure: batches in, dictionaries out; no I/O, no asyncio.  Mirrors Kafka's loader
(``GroupMetadataManager.doLoadGroupsAndOffsets``, GroupMetadataManager.scala:583-751):

* records are applied in log order and the last record per key wins; a tombstone deletes;
* offset commits in a transactional batch are staged per producer id, promoted by a COMMIT
  control batch and dropped by an ABORT one; a promoted offset replaces a loaded one only if
  its batch offset is newer (``CommitRecordMetadataAndOffset.olderThan``);
* records whose key version is unknown (KIP-848 / share-group records, 3+) are skipped and
  counted, as the Scala loader skips ``UnknownKey``.

Offsets still staged at the end of the log (a transaction without its marker) are dropped:
rallypoint has no transaction coordinator to finish them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from protocol.offsets_schema import (
    GroupMetadataKey,
    GroupMetadataValue,
    OffsetCommitKey,
    OffsetCommitValue,
    OffsetsSchemaError,
    UnknownKey,
    decode_group_metadata_value,
    decode_key,
    decode_offset_commit_value,
)
from protocol.records import CONTROL_COMMIT, RecordBatch, control_type


@dataclass
class PartitionState:
    """What one ``__consumer_offsets`` partition holds once replayed."""

    groups: dict[str, GroupMetadataValue] = field(default_factory=dict)
    offsets: dict[OffsetCommitKey, OffsetCommitValue] = field(default_factory=dict)
    records: int = 0  # records read
    unknown_records: int = 0  # unknown key versions, skipped
    undecodable_records: int = 0  # known key type, bytes that do not decode; skipped
    first_error: str | None = None  # the first undecodable record, for the log
    dropped_pending: int = 0  # transactional offsets without a marker


class StateBuilder:
    """Feed batches in log order with :meth:`add`, then take :meth:`result`."""

    def __init__(self) -> None:
        self._groups: dict[str, GroupMetadataValue] = {}
        # key -> (base offset of the batch that wrote it, value)
        self._offsets: dict[OffsetCommitKey, tuple[int, OffsetCommitValue]] = {}
        self._pending: dict[int, dict[OffsetCommitKey, tuple[int, OffsetCommitValue | None]]] = {}
        self._state = PartitionState()

    def _bad(self, offset: int, why: str) -> None:
        self._state.undecodable_records += 1
        if self._state.first_error is None:
            self._state.first_error = f"offset {offset}: {why}"

    def add(self, batch: RecordBatch) -> None:
        h = batch.header
        st = self._state
        if h.is_control:
            if batch.records:
                st.records += len(batch.records)
                staged = self._pending.pop(h.producer_id, None)
                if staged and control_type(batch.records[0]) == CONTROL_COMMIT:
                    for okey, (batch_offset, value) in staged.items():
                        if value is None:
                            continue  # a staged tombstone only removed an earlier staged commit
                        loaded = self._offsets.get(okey)
                        if loaded is None or loaded[0] < batch_offset:
                            self._offsets[okey] = (batch_offset, value)
            return
        transactional = h.is_transactional
        for rec in batch.records:
            st.records += 1
            if rec.key is None:
                self._bad(rec.offset, "record without a key")
                continue
            try:
                key = decode_key(rec.key)
                if isinstance(key, UnknownKey):
                    st.unknown_records += 1
                    continue
                if isinstance(key, OffsetCommitKey):
                    ov = None if rec.value is None else decode_offset_commit_value(rec.value)
                    if transactional:
                        pending = self._pending.setdefault(h.producer_id, {})
                        if ov is None:
                            pending.pop(key, None)
                        else:
                            pending[key] = (h.base_offset, ov)
                    elif ov is None:
                        self._offsets.pop(key, None)
                    else:
                        self._offsets[key] = (h.base_offset, ov)
                else:
                    assert isinstance(key, GroupMetadataKey)
                    if rec.value is None:
                        self._groups.pop(key.group, None)
                    else:
                        self._groups[key.group] = decode_group_metadata_value(rec.value)
            except OffsetsSchemaError as e:
                self._bad(rec.offset, str(e))

    def result(self) -> PartitionState:
        st = self._state
        st.groups = dict(self._groups)
        st.offsets = {k: v for k, (_off, v) in self._offsets.items()}
        st.dropped_pending = sum(len(p) for p in self._pending.values())
        return st


def rebuild(batches: Iterable[RecordBatch]) -> PartitionState:
    """(groups, offsets) of one partition from its batches in log order (spec §B.3)."""
    b = StateBuilder()
    for batch in batches:
        b.add(batch)
    return b.result()
