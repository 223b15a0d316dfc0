"""Log compaction of closed segments (sync; the offsets log runs it in a background thread).

A pass over one partition:

1. **Key map.**  Read every closed segment and the active segment up to a snapshot of its size;
   remember the offset of the last record of every key in non-transactional batches (Kafka's
   ``OffsetMap``), and the set of keys that appear in transactional batches.  A key's identity
   is its decoded ``OffsetCommitKey`` / ``GroupMetadataKey`` (so a v0 and a v1 offset key for the
   same partition are one key), or its raw bytes when it does not decode.
2. **Rewrite**, oldest segment first, in groups of consecutive closed segments whose sizes add
   up to at most ``offsets.topic.segment.bytes`` (Kafka's ``groupSegmentsBySize``).  A record of a
   non-transactional batch is kept when it is the last of its key; a tombstone that is the last
   of its key is kept until ``log.cleaner.delete.retention.ms`` after its own timestamp (and
   forever when its key also appears in a transactional batch).  Kept records keep their
   offsets and timestamps and are re-batched (uncompressed, up to 1 MiB per batch; offsets in a
   batch may have gaps).  Transactional and control batches are copied unchanged, and a
   re-batched batch never spans one: so a loaded offset's batch base offset and the base offset
   of any transactional batch compare as before cleaning, which the loader relies on when it
   promotes a committed transaction (``olderThan``).  The active segment is never touched, so
   appends never wait for the cleaner.
3. **Install, crash-safe.**  The new content is written to ``<base>.log.cleaned`` and fsynced.
   A one-segment group is then installed by ``rename(<base>.log.cleaned, <base>.log)`` and a
   directory fsync.  A group of several segments is first renamed to
   ``<base>-<end>.log.swap`` (``end`` = base offset of the next segment) and the directory
   fsynced: from then on the swap is committed, and recovery completes it (deletes the group's
   other segments, renames the swap over ``<base>.log``).  A crash before that point leaves a
   ``.cleaned`` file that recovery deletes, and the old segments intact.  An installed segment
   left empty is deleted.

Why the result loads the same (Kafka's promise for compacted topics: loading before and after
cleaning gives the same groups and offsets):
only records followed by a later record of the same key are dropped, plus old tombstones that
are last for their key — and every older record of that key lies in an older segment, which
this pass rewrites first (groups are installed oldest first).  Transactional records never
supersede anything here, so an aborted transaction cannot hide an older committed offset.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable
from pathlib import Path
from typing import Final

from msgspec import Struct, field
from rallypoint.protocol.offsets_schema import OffsetsSchemaError, UnknownKey, decode_key
from rallypoint.protocol.records import Record, decode_records, encode_batch, scan_batches

from .segments import CLEANED_SUFFIX, Segment, fsync_dir, swap_name

MAX_CLEANED_BATCH_BYTES: Final = 1 << 20


class CleanerStopped(Exception):
    """The pass was asked to stop; nothing of the unfinished group was installed."""


class CleanResult(Struct):
    """What one cleaner pass over a partition did: the segments it replaced, and its counts."""

    # (base offsets replaced, new segment or None when it came out empty), in offset order
    replaced: list[tuple[list[int], Segment | None]] = field(default_factory=list)
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_kept: int = 0
    tombstones_dropped: int = 0
    next_tombstone_expiry: int | None = None  # when the next kept tombstone becomes removable


class _KeyIds:
    """Raw key bytes → identity (decoded key, or the bytes), cached: keys repeat a lot."""

    def __init__(self) -> None:
        self._cache: dict[bytes, object] = {}

    def __call__(self, raw: bytes) -> object:
        ident = self._cache.get(raw)
        if ident is None:
            try:
                key = decode_key(raw)
                ident = raw if isinstance(key, UnknownKey) else key
            except OffsetsSchemaError:
                ident = raw
            if len(self._cache) < 1_000_000:
                self._cache[raw] = ident
        return ident


def _read(path: Path, limit: int | None = None) -> bytes | mmap.mmap:
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size if limit is None else limit
        if size == 0:
            return b""
        return mmap.mmap(f.fileno(), size, access=mmap.ACCESS_READ)


def _close(buf: bytes | mmap.mmap) -> None:
    if isinstance(buf, mmap.mmap):
        buf.close()


def build_key_map(
    sources: list[tuple[Path, int]], key_id: Callable[[bytes], object]
) -> tuple[dict[object, int], set[object], int]:
    """(key → offset of its last non-transactional record, keys in transactional batches, bytes)."""
    last: dict[object, int] = {}
    txn_keys: set[object] = set()
    total = 0
    for path, limit in sources:
        buf = _read(path, limit)
        try:
            for h in scan_batches(buf):
                if h.is_control:
                    continue
                recs = decode_records(buf, h)
                if h.is_transactional:
                    for r in recs:
                        if r.key is not None:
                            txn_keys.add(key_id(r.key))
                    continue
                for r in recs:
                    if r.key is not None:
                        last[key_id(r.key)] = r.offset
            total += len(buf)
        finally:
            _close(buf)
    return last, txn_keys, total


def group_by_size(closed: list[Segment], max_bytes: int) -> list[list[Segment]]:
    groups: list[list[Segment]] = []
    cur: list[Segment] = []
    cur_size = 0
    for seg in closed:
        if cur and cur_size + seg.size > max_bytes:
            groups.append(cur)
            cur, cur_size = [], 0
        cur.append(seg)
        cur_size += seg.size
    if cur:
        groups.append(cur)
    return groups


def clean_partition(
    pdir: Path,
    closed: list[Segment],
    active: Segment,
    *,
    now_ms: int,
    delete_retention_ms: int,
    segment_bytes: int,
    should_stop: Callable[[], bool] = lambda: False,
    crash_hook: Callable[[str], None] | None = None,
) -> CleanResult:
    """Compact ``closed`` (consecutive closed segments, oldest first); ``active.size`` is the
    snapshot of the active segment used for the key map.  See the module docstring."""
    res = CleanResult()
    if not closed:
        return res
    key_id = _KeyIds()
    sources = [(s.path, s.size) for s in closed] + [(active.path, active.size)]
    last, txn_keys, res.bytes_read = build_key_map(sources, key_id)
    bases_after = [s.base_offset for s in closed[1:]] + [active.base_offset]
    next_base = dict(zip((s.base_offset for s in closed), bases_after, strict=True))

    def hook(point: str) -> None:
        if crash_hook is not None:
            crash_hook(point)

    for group in group_by_size(closed, segment_bytes):
        if should_stop():
            raise CleanerStopped()
        base = group[0].base_offset
        end = next_base[group[-1].base_offset]
        cleaned = pdir / (f"{base:020d}" + CLEANED_SUFFIX)
        try:
            new_seg = _write_group(cleaned, group, last, txn_keys, key_id, now_ms, delete_retention_ms, res)
        except BaseException:
            cleaned.unlink(missing_ok=True)  # a failed write leaves the old segments in place
            raise
        res.bytes_written += new_seg.size
        hook("cleaned_written")
        if len(group) == 1:
            os.replace(cleaned, new_seg.path)
            fsync_dir(pdir)
            hook("installed")
        else:
            swap = pdir / swap_name(base, end)
            os.replace(cleaned, swap)
            fsync_dir(pdir)
            hook("swap_committed")
            for seg in group[1:]:
                seg.path.unlink()
            hook("old_segments_deleted")
            os.replace(swap, new_seg.path)
            fsync_dir(pdir)
            hook("installed")
        if new_seg.size == 0:
            new_seg.path.unlink()
            fsync_dir(pdir)
            res.replaced.append(([s.base_offset for s in group], None))
        else:
            res.replaced.append(([s.base_offset for s in group], new_seg))
    return res


def _write_group(
    cleaned: Path,
    group: list[Segment],
    last: dict[object, int],
    txn_keys: set[object],
    key_id: Callable[[bytes], object],
    now_ms: int,
    delete_retention_ms: int,
    res: CleanResult,
) -> Segment:
    """Write the kept content of ``group`` to ``cleaned`` (fsynced); the segment it will become."""
    base = group[0].base_offset
    new_seg = Segment(base, group[0].path, 0, base)
    with open(cleaned, "wb") as out:
        pending: list[Record] = []
        pending_bytes = 0
        pending_epoch = 0

        def flush_pending() -> None:
            nonlocal pending, pending_bytes
            if pending:
                blob = encode_batch(pending, partition_leader_epoch=pending_epoch)
                out.write(blob)
                new_seg.size += len(blob)
                new_seg.batches += 1
                new_seg.next_offset = pending[-1].offset + 1
                pending, pending_bytes = [], 0

        for seg in group:
            buf = _read(seg.path, seg.size)
            try:
                for h in scan_batches(buf):
                    if h.is_control or h.is_transactional:
                        flush_pending()
                        out.write(buf[h.position : h.end])
                        new_seg.size += h.size
                        new_seg.batches += 1
                        new_seg.next_offset = h.next_offset
                        continue
                    for r in decode_records(buf, h):
                        res.records_read += 1
                        if r.key is not None:
                            ident = key_id(r.key)
                            if last.get(ident, -1) > r.offset:
                                continue  # superseded by a later record of the same key
                            if r.value is None and ident not in txn_keys:
                                expiry = r.timestamp + delete_retention_ms
                                if now_ms >= expiry:
                                    res.tombstones_dropped += 1
                                    continue
                                if res.next_tombstone_expiry is None or expiry < res.next_tombstone_expiry:
                                    res.next_tombstone_expiry = expiry
                        res.records_kept += 1
                        if not pending:
                            pending_epoch = h.partition_leader_epoch
                        pending.append(r)
                        pending_bytes += 32 + len(r.key or b"") + len(r.value or b"")
                        if pending_bytes >= MAX_CLEANED_BATCH_BYTES:
                            flush_pending()
            finally:
                _close(buf)
        flush_pending()
        out.flush()
        os.fsync(out.fileno())
    return new_seg
