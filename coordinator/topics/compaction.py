"""Log compaction of a topic partition's closed batches: the latest record of every key stays.

The rules are Kafka's ``LogCleaner`` for magic-v2 batches (docs/configs.md, "Retention and
compaction"):

1. **Key map.**  Over the batches handed in (everything before the active segment), the offset
   of the last record of every key (Kafka's ``OffsetMap``; keys are compared as bytes).
2. **Retain.**  A record stays when it is the last of its key.  A record without a key goes
   (``LogCleaner.shouldRetainRecord`` counts it invalid).  A tombstone (null value) that is the
   last of its key stays until its batch's *delete horizon* has passed: the first pass that
   keeps a tombstone rewrites its batch with the delete-horizon flag set and
   ``baseTimestamp`` = now + ``delete.retention.ms`` (KIP-534); a later pass after that time
   drops it.  Control batches are copied unchanged.
3. **Rewrite.**  A batch that loses nothing (and needs no horizon) is kept byte for byte.  A
   batch that loses every record goes, unless it is a producer's newest batch (kept with no
   records, so idempotent producers keep their sequence state).  Otherwise the batch is rebuilt
   with the same base offset, last offset delta, producer fields and timestamp type; the kept
   records keep their offsets and timestamps.  Rebuilt batches are stored uncompressed (Kafka
   recompresses with the batch's codec; consumers read both).
"""

from __future__ import annotations

from collections.abc import Sequence

from msgspec import Struct, field
from rallypoint.protocol.records import (
    ATTR_COMPRESSION_MASK,
    ATTR_DELETE_HORIZON,
    ATTR_LOG_APPEND_TIME,
    DEFAULT_MAX_UNCOMPRESSED,
    Record,
    RecordsError,
    assemble_batch,
    decode_records,
    encode_records,
    parse_header,
)

NO_TIMESTAMP = -1


class Cleaned(Struct):
    """What one pass produced: the batches that replace those handed in (in order), the offset
    of each one's record with the largest timestamp, and counts for the log."""

    batches: list[bytes] = field(default_factory=list)
    max_ts_offsets: list[int] = field(default_factory=list)
    records_removed: int = 0
    tombstones_removed: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    latest_delete_horizon: int = NO_TIMESTAMP


def clean(
    batches: Sequence[bytes],
    max_ts_offsets: Sequence[int],
    *,
    now_ms: int,
    delete_retention_ms: int,
    keep_empty: frozenset[int] = frozenset(),
    max_uncompressed: int = DEFAULT_MAX_UNCOMPRESSED,
) -> Cleaned:
    """Compact ``batches`` (whole stored batches, oldest first).  ``keep_empty``: last offsets of
    batches to keep even when no record of theirs survives (producers' newest batches)."""
    decoded: list[tuple[Record, ...] | None] = []
    last: dict[bytes, int] = {}
    for b in batches:
        h = parse_header(b)
        recs: tuple[Record, ...] | None = None
        if not h.is_control:
            try:
                recs = decode_records(b, h, max_uncompressed)
            except RecordsError:
                recs = None  # validated on append: not expected; such a batch is kept as it is
        decoded.append(recs)
        for r in recs or ():
            if r.key is not None:
                last[r.key] = r.offset

    out = Cleaned(bytes_before=sum(len(b) for b in batches))
    for b, max_off, recs in zip(batches, max_ts_offsets, decoded, strict=True):
        if recs is None:
            _keep(out, b, max_off)
            continue
        h = parse_header(b)
        horizon = h.delete_horizon_ms
        kept: list[Record] = []
        for r in recs:
            if r.key is None or last.get(r.key) != r.offset:
                out.records_removed += 1
            elif r.value is None and horizon is not None and now_ms >= horizon:
                out.records_removed += 1
                out.tombstones_removed += 1
            else:
                kept.append(r)
        has_tombstone = any(r.value is None for r in kept)
        new_horizon = horizon
        if has_tombstone and horizon is None:
            new_horizon = now_ms + delete_retention_ms
        if has_tombstone and new_horizon is not None:
            out.latest_delete_horizon = max(out.latest_delete_horizon, new_horizon)
        if len(kept) == len(recs) and new_horizon == horizon:
            _keep(out, b, max_off)
            continue
        if not kept and not (h.has_producer_id and h.last_offset in keep_empty):
            continue
        attributes = h.attributes & ~ATTR_COMPRESSION_MASK
        if new_horizon is not None and has_tombstone:
            attributes |= ATTR_DELETE_HORIZON
            base_ts = new_horizon
        else:
            attributes &= ~ATTR_DELETE_HORIZON
            base_ts = kept[0].timestamp if kept else h.max_timestamp
        if h.attributes & ATTR_LOG_APPEND_TIME or not kept:
            max_ts, max_off = h.max_timestamp, (max_off if kept else h.base_offset)
        else:
            best = max(kept, key=lambda r: r.timestamp)  # the first of the largest timestamp
            max_ts, max_off = best.timestamp, best.offset
        header = h._replace(attributes=attributes, base_timestamp=base_ts, max_timestamp=max_ts, record_count=len(kept))
        _keep(out, assemble_batch(header, encode_records(kept, h.base_offset, base_ts)), max_off)
    return out


def _keep(out: Cleaned, batch: bytes, max_ts_offset: int) -> None:
    out.batches.append(batch)
    out.max_ts_offsets.append(max_ts_offset)
    out.bytes_after += len(batch)
