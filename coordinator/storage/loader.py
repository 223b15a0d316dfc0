"""Rebuild group metadata and committed offsets from ``__consumer_offsets`` batches
(docs/offsets-log-format.md, "Recovery at start-up").

Pure: batches in, dictionaries out; no I/O, no asyncio.  Mirrors Kafka's loader
(``GroupMetadataManager.doLoadGroupsAndOffsets``, GroupMetadataManager.scala:583-751):

* records are applied in log order and the last record per key wins; a tombstone deletes;
* offset commits in a transactional batch are staged per producer id, promoted by a COMMIT
  control batch and dropped by an ABORT one; a promoted offset replaces a loaded one only if
  its batch offset is newer (``CommitRecordMetadataAndOffset.olderThan``);
* records whose key version is unknown (KIP-848 / share-group records, 3+) are skipped and
  counted, as the Scala loader skips ``UnknownKey``;
* a record whose key does not decode is skipped and counted; so is a key whose last value does
  not decode (Kafka's loader would fail the partition; we load the rest and log it).

Offsets still staged at the end of the log (a transaction without its marker yet) are handed
on as ``pending`` per producer id: the transaction coordinator ends those transactions later
(docs/transactions.md, "Restarts").
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Iterable

from msgspec import Struct, field
from rallypoint.protocol.consumer_group_records import is_consumer_record_type
from rallypoint.protocol.crc import crc32c
from rallypoint.protocol.offsets_schema import (
    GroupMetadataKey,
    GroupMetadataValue,
    OffsetCommitKey,
    OffsetCommitValue,
    OffsetsSchemaError,
    UnknownKey,
    decode_group_metadata_value,
    decode_key,
    decode_offset_commit_value,
    encode_offset_commit_key,
)
from rallypoint.protocol.records import (
    CONTROL_COMMIT,
    RecordBatch,
    compiled_offsets_decoders,
    compiled_offsets_fold,
    compiled_offsets_scan,
    control_type,
)
from rallypoint.protocol.share_group_records import is_share_record_type

from .segments import BatchScan


class PartitionState(Struct):
    """What one ``__consumer_offsets`` partition holds once replayed."""

    groups: dict[str, GroupMetadataValue] = field(default_factory=dict)
    offsets: dict[OffsetCommitKey, OffsetCommitValue] = field(default_factory=dict)
    records: int = 0  # records read
    unknown_records: int = 0  # unknown key versions, skipped
    undecodable_records: int = 0  # known key type, bytes that do not decode; skipped
    first_error: str | None = None  # the first undecodable record, for the log
    dropped_pending: int = 0  # transactional offsets without a marker (counted)
    # ... and themselves: producer id -> offsets staged by its open transaction
    pending: dict[int, dict[OffsetCommitKey, OffsetCommitValue]] = field(default_factory=dict)
    # consumer-group records (KIP-848 key types 3-8 and 16) as (key, value) bytes, in log order
    # (also counted in unknown_records: this loader does not decode them)
    consumer_records: list[tuple[bytes, bytes | None]] = field(default_factory=list)


class ReplayRedo(Exception):
    """The compiled scan took a record whose key does not decode, or two raw keys that decode
    to one key: the partition is replayed again without the scan, so that the reference path
    counts and words every such record and orders such keys."""


class StateBuilder:
    """Feed batches in log order with :meth:`add`, then take :meth:`result`.

    Values are kept as bytes and decoded once, in :meth:`result`: only the last value of each
    key is ever decoded.  Key bytes are decoded once per distinct key.  A last value that does
    not decode is counted in ``undecodable_records`` and its key left out.

    It is also the :class:`~.segments.FastSink` of the compiled replay scan: the scan puts the
    last record of each raw key in :attr:`last` (and the records of other key versions in
    :attr:`others`), and they are folded into the state, in log order, before the next batch
    :meth:`add` takes (unless a transactional batch that only stages offset commits, or a
    marker: a COMMIT puts its staged commits into :attr:`last`) and before
    :meth:`result` (docs/offsets-log-format.md, "Recovery at start-up").  A folded key that does
    not decode raises :class:`ReplayRedo`.
    """

    _KEY_CACHE_MAX = 1 << 20

    def __init__(self) -> None:
        # raw key -> (decoded key or an error message, its canonical bytes): an offset commit
        # key's canonical bytes are the key as written today (version 1, nothing after the
        # partition), one bytes object for every raw form of the key; the state below is keyed
        # by them (a bytes object keeps its hash; a key object hashes its fields every time)
        self._keys: dict[bytes, tuple[OffsetCommitKey | GroupMetadataKey | UnknownKey | str, bytes]] = {}
        self._decoded: dict[bytes, OffsetCommitKey] = {}  # canonical bytes -> key
        self._groups: dict[str, bytes] = {}
        # canonical key -> (base offset of the batch that wrote it, value bytes)
        self._offsets: dict[bytes, tuple[int, bytes]] = {}
        self._pending: dict[int, dict[bytes, tuple[int, bytes | None]]] = {}
        self._state = PartitionState()
        # the compiled scan's sink (FastSink)
        self.last: dict[bytes, tuple[int, bytes | None, bool]] = {}
        self.others: list[tuple[bytes, bytes | None]] = []
        self.fast_records = 0
        self._compiled_fold: Callable[..., str | None] | None = None
        # the compiled readers of the usual key and value forms (None: offsets_schema reads all)
        decoders = compiled_offsets_decoders()
        self._key_parts: Callable[[bytes], tuple[str, str, int, bool] | None] | None = None
        self._value_parts: Callable[[bytes], tuple[int, str, int, int] | None] | None = None
        if decoders is not None:
            self._key_parts, self._value_parts = decoders

    def scanner(self) -> BatchScan | None:
        """The compiled replay scan filling this builder (FastSink), or None."""
        scan, fold = compiled_offsets_scan(), compiled_offsets_fold()
        if scan is None or fold is None:
            return None
        self._compiled_fold = fold

        def bound(segment: mmap.mmap, pos: int, expected: int) -> tuple[int, int, int, int]:
            # the current containers: _fold swaps in new ones
            return scan(segment, pos, expected, self.last, self.others, crc32c)

        return bound

    def _fold(self) -> None:
        """Apply what the compiled scan took since the last fold, as :meth:`add` would have:
        everything here is newer than the state, and :attr:`last` holds each raw key's last
        record in the order :meth:`add`'s dicts would hold the keys (a key tombstoned in the
        meantime is taken anew, at the end).  Two raw keys that decode to one key (versions 0
        and 1 of an offset commit key) raise :class:`ReplayRedo`: their order is the
        reference's to work out."""
        st = self._state
        st.records += self.fast_records
        self.fast_records = 0
        last, others = self.last, self.others
        self.last, self.others = {}, []
        # For each raw key, in ``last``'s order (compiled: ``fold_offsets``; :meth:`scanner` only
        # hands out the scan together with it): its decoded key (``_key``, cached); an offset
        # commit sets or, after a tombstone, drops ``_offsets[canonical bytes]``, a group record
        # ``_groups[group id]``; a second raw key for one key, or a key that is neither, is
        # ReplayRedo.
        if last:
            assert self._compiled_fold is not None
            redo = self._compiled_fold(
                last, self._keys, self._key, OffsetCommitKey, GroupMetadataKey, self._offsets, self._groups
            )
            if redo is not None:
                raise ReplayRedo(redo)
        for raw, value in others:
            key = self._key(raw)[0]
            if type(key) is not UnknownKey:
                raise ReplayRedo(str(key))
            st.unknown_records += 1
            if is_consumer_record_type(key.version) or is_share_record_type(key.version):
                st.consumer_records.append((raw, value))

    def _bad(self, where: str, why: str) -> None:
        self._state.undecodable_records += 1
        if self._state.first_error is None:
            self._state.first_error = f"{where}: {why}"

    def _key(self, raw: bytes) -> tuple[OffsetCommitKey | GroupMetadataKey | UnknownKey | str, bytes]:
        """(the decoded key, or an error message (str) when it does not decode; its canonical
        bytes: see ``_keys``)."""
        got = self._keys.get(raw)
        if got is not None:
            return got
        canon = raw
        key: OffsetCommitKey | GroupMetadataKey | UnknownKey | str
        parts = None if self._key_parts is None else self._key_parts(raw)
        if parts is not None:
            key, canonical = OffsetCommitKey(parts[0], parts[1], parts[2]), parts[3]
        else:
            canonical = False
            try:
                key = decode_key(raw)
            except OffsetsSchemaError as e:
                key = str(e)
        if type(key) is OffsetCommitKey:
            if not canonical:
                encoded = encode_offset_commit_key(key)
                if encoded != raw:
                    canon = encoded
            self._decoded.setdefault(canon, key)
        if len(self._keys) < self._KEY_CACHE_MAX:
            self._keys[raw] = (key, canon)
        return key, canon

    def add(self, batch: RecordBatch) -> None:
        h = batch.header
        st = self._state
        if h.is_control:
            st.records += len(batch.records)
            if batch.records:
                staged = self._pending.pop(h.producer_id, None)
                if staged and control_type(batch.records[0]) == CONTROL_COMMIT:
                    if self.fast_records:
                        self._commit_unfolded(staged)
                        return
                    for canon, (batch_offset, value) in staged.items():
                        if value is None:
                            continue  # a staged tombstone only removed an earlier staged commit
                        loaded = self._offsets.get(canon)
                        if loaded is None or loaded[0] < batch_offset:
                            self._offsets[canon] = (batch_offset, value)
            return
        if self.fast_records and not (h.is_transactional and self._stages_only(batch)):
            self._fold()
        st.records += len(batch.records)
        transactional = h.is_transactional
        base = h.base_offset
        offsets = self._offsets
        for rec in batch.records:
            if rec.key is None:
                self._bad(f"offset {rec.offset}", "record without a key")
                continue
            key, canon = self._key(rec.key)
            if type(key) is OffsetCommitKey:
                if transactional:
                    pending = self._pending.setdefault(h.producer_id, {})
                    if rec.value is None:
                        pending.pop(canon, None)
                    else:
                        pending[canon] = (base, rec.value)
                elif rec.value is None:
                    offsets.pop(canon, None)
                else:
                    offsets[canon] = (base, rec.value)
            elif type(key) is GroupMetadataKey:
                if rec.value is None:
                    self._groups.pop(key.group, None)
                else:
                    self._groups[key.group] = rec.value
            elif type(key) is UnknownKey:
                st.unknown_records += 1  # not decoded here ...
                if not transactional and (is_consumer_record_type(key.version) or is_share_record_type(key.version)):
                    st.consumer_records.append((rec.key, rec.value))  # ... but handed on raw
            else:
                self._bad(f"offset {rec.offset}", str(key))

    def _commit_unfolded(self, staged: dict[bytes, tuple[int, bytes | None]]) -> None:
        """A COMMIT marker while the scan's records are not folded yet: each staged commit goes
        into :attr:`last` as the record the fold will apply, where the fold-then-apply of the
        loop in :meth:`add` would have left it (docs/offsets-log-format.md, "Recovery at
        start-up").  It applies unless the key's latest write (unfolded, else folded) is a value
        written after it; after an unfolded tombstone it applies and the key moves to the end,
        as a dict that popped it would order it.  A staged key whose unfolded record has another
        raw form (a version 0 key) makes the fold see two raw keys for one key: ReplayRedo, and
        the reference replays the partition."""
        last = self.last
        for canon, (batch_offset, value) in staged.items():
            if value is None:
                continue  # a staged tombstone only removed an earlier staged commit
            prev = last.get(canon)
            if prev is None:
                loaded = self._offsets.get(canon)
                if loaded is None or loaded[0] < batch_offset:
                    last[canon] = (batch_offset, value, False)
            elif prev[1] is None:
                del last[canon]
                last[canon] = (batch_offset, value, True)
            elif prev[0] < batch_offset:
                last[canon] = (batch_offset, value, prev[2])

    def _stages_only(self, batch: RecordBatch) -> bool:
        """Whether the records of a transactional batch touch nothing a fold changes: offset
        commits go to the producer's staged offsets, until its marker; only
        a group record would change the state itself.  So what the scan took before such a
        batch can wait for the next fold (docs/offsets-log-format.md, "Recovery at start-up")."""
        for rec in batch.records:
            if rec.key is not None and type(self._key(rec.key)[0]) is GroupMetadataKey:
                return False
        return True

    def result(self) -> PartitionState:
        if self.fast_records:
            self._fold()
        st = self._state
        st.groups = {}
        for group, raw in self._groups.items():
            try:
                st.groups[group] = decode_group_metadata_value(raw)
            except OffsetsSchemaError as e:
                self._bad(f"group {group!r}", str(e))
        st.offsets = {}
        decoded = self._decoded
        value_parts = self._value_parts
        for canon, (_off, raw) in self._offsets.items():
            key = decoded[canon]
            parts = None if value_parts is None else value_parts(raw)
            if parts is not None:
                st.offsets[key] = OffsetCommitValue(parts[0], parts[1], parts[2], parts[3])
                continue
            try:
                st.offsets[key] = decode_offset_commit_value(raw)
            except OffsetsSchemaError as e:
                self._bad(f"offset of {key}", str(e))
        st.dropped_pending = sum(len(p) for p in self._pending.values())
        st.pending = {}
        for pid, staged in self._pending.items():
            for canon, (_off, staged_raw) in staged.items():
                if staged_raw is None:
                    continue
                key = decoded[canon]
                try:
                    st.pending.setdefault(pid, {})[key] = decode_offset_commit_value(staged_raw)
                except OffsetsSchemaError as e:
                    self._bad(f"pending offset of {key}", str(e))
        return st


def rebuild(batches: Iterable[RecordBatch]) -> PartitionState:
    """(groups, offsets) of one partition from its batches in log order."""
    b = StateBuilder()
    for batch in batches:
        b.add(batch)
    return b.result()
