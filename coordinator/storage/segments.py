"""Segment files of the offsets log: names, listing, and recovery (sync, no asyncio).

Layout (Kafka's): ``<data.dir>/__consumer_offsets-<N>/<base offset, 20 digits>.log``.  A segment
holds whole v2 record batches back to back; its name is the offset of its first record (after
compaction the first record may be later than the name says, never earlier).  The last segment
of a partition is the active one, the only one ever appended to.

Recovery rules (docs/offsets-log-format.md, "Recovery"):

* Cleaner leftovers are resolved first: ``*.log.cleaned`` (a cleaning that did not finish) is
  deleted; ``<base>-<end>.log.swap`` (a finished cleaning not yet installed) replaces every
  segment whose base offset is in ``[base, end)`` — see ``coordinator/storage/cleaner.py``.
* Every batch of every segment is read in offset order and its CRC-32C verified.
* A **torn tail** — at the end of the *last* segment, a batch cut short, or a final batch whose
  CRC does not match and that ends exactly at the end of the file, or zero bytes — is what a
  crash during an append leaves.  It is truncated away, with a warning.  Such a batch was never
  acknowledged when ``rallypoint.offsets.flush=always`` (the acknowledgement waits for fsync).
* Anything else invalid — a bad batch followed by more bytes, a bad batch in an older
  segment (segments are fsynced before a roll), offsets going backwards, an unsupported batch —
  stops the broker with :class:`CorruptLogError`, naming the file and byte position.  We do not
  guess: dropping or quarantining a segment could silently bring back older committed offsets.
"""

from __future__ import annotations

import mmap
import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from rallypoint.protocol.records import (
    CorruptBatchError,
    RecordBatch,
    RecordsError,
    TornBatchError,
    decode_records,
    read_header,
)

from .errors import OffsetsLogStartError

TOPIC: Final = "__consumer_offsets"
LOG_SUFFIX: Final = ".log"
CLEANED_SUFFIX: Final = ".log.cleaned"
SWAP_SUFFIX: Final = ".log.swap"
_SEGMENT_RE = re.compile(r"^(\d{20})\.log$")
_PARTITION_RE = re.compile(r"^__consumer_offsets-(\d+)$")
_SWAP_RE = re.compile(r"^(\d{20})-(\d{20})\.log\.swap$")


class CorruptLogError(OffsetsLogStartError):
    """The offsets log cannot be read safely; the broker refuses to start."""

    def __init__(self, path: Path, position: int, reason: str) -> None:
        super().__init__(
            f"offsets log segment {path} is corrupt at byte {position}: {reason}. "
            "The broker will not start on it, since skipping it could bring back older committed offsets. "
            f"Inspect it with `rallypoint dump-log {path}`; then restore it from a backup, or move the "
            "segment (and the partition's later segments) out of the directory to accept losing its records."
        )
        self.path = path
        self.position = position
        self.reason = reason


def segment_name(base_offset: int) -> str:
    return f"{base_offset:020d}{LOG_SUFFIX}"


def swap_name(base_offset: int, end_offset: int) -> str:
    return f"{base_offset:020d}-{end_offset:020d}{SWAP_SUFFIX}"


def partition_dir(data_dir: Path, partition: int) -> Path:
    return data_dir / f"{TOPIC}-{partition}"


def parse_segment_name(name: str) -> int | None:
    m = _SEGMENT_RE.match(name)
    return int(m.group(1)) if m else None


def parse_partition_dir(name: str) -> int | None:
    m = _PARTITION_RE.match(name)
    return int(m.group(1)) if m else None


def list_partition_dirs(data_dir: Path) -> dict[int, Path]:
    if not data_dir.is_dir():
        return {}
    out: dict[int, Path] = {}
    for entry in data_dir.iterdir():
        n = parse_partition_dir(entry.name)
        if n is not None and entry.is_dir():
            out[n] = entry
    return dict(sorted(out.items()))


def list_segments(pdir: Path) -> list[tuple[int, Path]]:
    """(base offset, path) of the ``.log`` segments of a partition directory, in offset order."""
    out = []
    for entry in pdir.iterdir():
        base = parse_segment_name(entry.name)
        if base is not None and entry.is_file():
            out.append((base, entry))
    out.sort()
    return out


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class Segment:
    base_offset: int
    path: Path
    size: int  # bytes of whole, valid batches
    next_offset: int  # last offset + 1 of its last batch, or base_offset when empty
    batches: int = 0


@dataclass
class RecoveryReport:
    truncated: list[tuple[Path, int, int, str]] = field(default_factory=list)  # path, position, bytes, why
    swaps_completed: list[Path] = field(default_factory=list)
    leftovers_removed: list[Path] = field(default_factory=list)


def finish_cleaner_leftovers(pdir: Path, report: RecoveryReport) -> None:
    """Resolve files a crashed cleaner left (see the module docstring)."""
    changed = False
    for entry in sorted(pdir.iterdir()):
        if entry.name.endswith(CLEANED_SUFFIX):
            entry.unlink()
            report.leftovers_removed.append(entry)
            changed = True
    for entry in sorted(pdir.iterdir()):
        m = _SWAP_RE.match(entry.name)
        if not m:
            continue
        base, end = int(m.group(1)), int(m.group(2))
        for seg_base, seg_path in list_segments(pdir):
            if base < seg_base < end:
                seg_path.unlink()
        os.replace(entry, pdir / segment_name(base))
        report.swaps_completed.append(entry)
        changed = True
    if changed:
        fsync_dir(pdir)


def _zero_tail(buf: mmap.mmap | bytes, pos: int) -> bool:
    n = len(buf) - pos
    return n > 0 and buf[pos:].count(0) == n


def scan_segment(
    path: Path,
    base_offset: int,
    expected_from: int,
    *,
    is_last: bool,
    on_batch: Callable[[RecordBatch], None] | None = None,
) -> tuple[Segment, tuple[int, str] | None]:
    """Read and verify one segment; feed decoded batches to ``on_batch``.

    Returns the segment (its valid size) and, for a torn tail of the last segment, (position,
    reason) of the bytes to truncate.  Raises :class:`CorruptLogError` for anything else.
    """
    seg = Segment(base_offset, path, 0, base_offset)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return seg, None
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            pos = 0
            expected = max(base_offset, expected_from)
            while pos < size:
                try:
                    h = read_header(mm, pos)
                except TornBatchError as e:
                    if is_last:
                        return seg, (pos, str(e))
                    raise CorruptLogError(path, pos, f"incomplete batch in a closed segment ({e})") from None
                except CorruptBatchError as e:
                    if is_last and _zero_tail(mm, pos):
                        return seg, (pos, "zero bytes after the last batch")
                    if is_last and _batch_ends_at_eof(mm, pos, size):
                        return seg, (pos, str(e))
                    raise CorruptLogError(path, pos, str(e)) from None
                except RecordsError as e:
                    raise CorruptLogError(path, pos, str(e)) from None
                if h.base_offset < expected:
                    raise CorruptLogError(
                        path, pos, f"batch base offset {h.base_offset} is below the expected {expected}"
                    )
                if on_batch is not None:
                    try:
                        records = decode_records(mm, h)
                    except RecordsError as e:
                        raise CorruptLogError(path, pos, str(e)) from None
                    on_batch(RecordBatch(h, records))
                pos = h.end
                expected = h.next_offset
                seg.size = pos
                seg.next_offset = h.next_offset
                seg.batches += 1
    return seg, None


def _batch_ends_at_eof(buf: mmap.mmap, pos: int, size: int) -> bool:
    """True when the (CRC-failing) batch at ``pos`` claims exactly the bytes up to the end of file."""
    if size - pos < 12:
        return True
    length = int.from_bytes(buf[pos + 8 : pos + 12], "big", signed=True)
    return pos + 12 + length == size


def recover_partition(
    pdir: Path,
    *,
    on_batch: Callable[[RecordBatch], None] | None = None,
    repair: bool = True,
    report: RecoveryReport | None = None,
) -> list[Segment]:
    """Verify (and with ``repair``, fix a torn tail of) one partition directory.

    Batches are fed to ``on_batch`` in offset order.  Returns its segments, last = active.
    """
    report = report if report is not None else RecoveryReport()
    if repair:
        finish_cleaner_leftovers(pdir, report)
    segments: list[Segment] = []
    listed = list_segments(pdir)
    expected = 0
    for i, (base, path) in enumerate(listed):
        if segments and base < segments[-1].next_offset:
            raise CorruptLogError(
                path,
                0,
                f"segment base offset {base} overlaps the previous segment (ends at {segments[-1].next_offset})",
            )
        is_last = i == len(listed) - 1
        seg, torn = scan_segment(path, base, expected, is_last=is_last, on_batch=on_batch)
        if torn is not None:
            position, why = torn
            dropped = path.stat().st_size - position
            if repair:
                with open(path, "r+b") as f:
                    f.truncate(position)
                    f.flush()
                    os.fsync(f.fileno())
            report.truncated.append((path, position, dropped, why))
        segments.append(seg)
        expected = seg.next_offset
    return segments


def iter_segment_batches(path: Path, *, is_last: bool = True) -> Iterator[RecordBatch]:
    """Batches of one segment file (for tools); stops quietly at a torn tail of a last segment."""
    from rallypoint.protocol.records import iter_file_batches

    try:
        yield from iter_file_batches(path)
    except TornBatchError:
        if not is_last:
            raise
