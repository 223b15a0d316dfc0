"""A plain-Python, single-process replay of offsets logs: the reference ``offsets_latest``.

Spec §B.3 (Kafka's ``GroupMetadataManager.doLoadGroupsAndOffsets``): per ``__consumer_offsets``
partition, batches in log order; a non-transactional offset record puts (or, as a tombstone,
deletes) its key; transactional ones are staged per producer id, promoted by a COMMIT marker only
where the staged record's batch offset is newer than the loaded one, and dropped by ABORT.  Reading
a partition stops at its first damaged batch, as a log recovery truncates there.

Used by the tests (as an oracle independent of the Spark code) and by bench/pipeline.py (as the
single-process baseline).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rallypoint.protocol import offsets_schema as schema
from rallypoint.protocol import records as rec

from .decode import SegmentFile

# (broker, log_partition, group, topic, partition)
Key = tuple[str, int, str, str, int]


@dataclass
class ReplayResult:
    offsets: dict[Key, schema.OffsetCommitValue]
    records: int
    damaged_segments: int


def replay(files: Iterable[SegmentFile]) -> ReplayResult:
    by_partition: dict[tuple[str, int], list[SegmentFile]] = {}
    for f in files:
        by_partition.setdefault((f.broker, f.log_partition), []).append(f)
    out: dict[Key, schema.OffsetCommitValue] = {}
    records = damaged = 0
    for (broker, lp), segs in sorted(by_partition.items()):
        loaded: dict[Key, tuple[int, schema.OffsetCommitValue]] = {}
        pending: dict[int, dict[Key, tuple[int, schema.OffsetCommitValue | None]]] = {}
        next_offset = 0  # offsets must not go backwards, across segments too (the broker's recovery)
        for seg in sorted(segs, key=lambda s: s.base_offset):
            if seg.base_offset < next_offset:
                damaged += 1
                break
            expected = next_offset = seg.base_offset
            try:
                for batch in rec.iter_file_batches(seg.path):
                    h = batch.header
                    if h.base_offset < expected:  # offsets going backwards: corruption (outside the CRC)
                        raise rec.CorruptBatchError(f"batch base offset {h.base_offset} < {expected}", h.position)
                    expected = next_offset = h.next_offset
                    records += len(batch.records)
                    if h.is_control:
                        staged = pending.pop(h.producer_id, {})
                        if batch.records and rec.control_type(batch.records[0]) == rec.CONTROL_COMMIT:
                            for k, (boff, v) in staged.items():
                                if v is not None and (k not in loaded or loaded[k][0] < boff):
                                    loaded[k] = (boff, v)
                        continue
                    for r in batch.records:
                        if r.key is None:
                            continue
                        try:
                            key = schema.decode_key(r.key)
                            if not isinstance(key, schema.OffsetCommitKey):
                                continue
                            k = (broker, lp, key.group, key.topic, key.partition)
                            v = None if r.value is None else schema.decode_offset_commit_value(r.value)
                        except schema.OffsetsSchemaError:
                            continue
                        if h.is_transactional:
                            p = pending.setdefault(h.producer_id, {})
                            if v is None:
                                p.pop(k, None)
                            else:
                                p[k] = (h.base_offset, v)
                        elif v is None:
                            loaded.pop(k, None)
                        else:
                            loaded[k] = (h.base_offset, v)
            except (rec.RecordsError, OSError):
                damaged += 1
                break  # the rest of this partition is past the damage
        out.update({k: v for k, (_b, v) in loaded.items()})
    return ReplayResult(out, records, damaged)
