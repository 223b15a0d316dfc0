"""Segment files of the offsets log: names, listing, and recovery (sync, no asyncio).

Layout (Kafka's): ``<data.dir>/__consumer_offsets-<N>/<base offset, 20 digits>.log``.  A segment
holds whole v2 record batches back to back; its name is the offset of its first record (after
compaction the first record may be later than the name says, never earlier).  The last segment
of a partition is the active one, the only one ever appended to.

Recovery rules (docs/offsets-log-format.md, "Recovery at start-up"):

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
from pathlib import Path
from typing import Final, Protocol

from msgspec import Struct, field
from rallypoint.protocol.records import (
    LOG_OVERHEAD,
    CorruptBatchError,
    Record,
    RecordBatch,
    RecordsError,
    TornBatchError,
    UnsupportedBatchError,
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

    def __init__(self, path: Path, position: int, reason: str, *, unsupported: bool = False) -> None:
        super().__init__(
            f"offsets log segment {path} is corrupt at byte {position}: {reason}. "
            "The broker will not start on it, since skipping it could bring back older committed offsets. "
            f"Inspect it with `rallypoint dump-log {path}`; then restore it from a backup, or move the "
            "segment (and the partition's later segments) out of the directory to accept losing its records."
        )
        self.path = path
        self.position = position
        self.reason = reason
        self.unsupported = unsupported  # a valid batch of a kind rallypoint cannot read (magic < 2)


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


class Segment(Struct):
    """One segment file of a partition: base offset, path, valid size, next offset and batch count."""

    base_offset: int
    path: Path
    size: int  # bytes of whole, valid batches
    next_offset: int  # last offset + 1 of its last batch, or base_offset when empty
    batches: int = 0


class RecoveryReport(Struct):
    """What recovery repaired: truncated tails, finished cleaner swaps and removed leftovers."""

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


def torn_tail_reason(buf: bytes | mmap.mmap, pos: int) -> str | None:
    """Why the bytes from ``pos`` to the end of a partition's *last* segment, where reading
    stopped, are a torn tail that recovery truncates; None when they are corruption.

    Torn: a batch cut short, bytes that are all zero, or a final batch that fails its header
    checks (CRC) and whose length reaches exactly the end.  A complete batch with a good CRC
    whose records do not decode is corruption: no crash writes that.
    """
    size = len(buf)
    try:
        read_header(buf, pos)
    except TornBatchError as e:
        return str(e)
    except CorruptBatchError as e:
        if buf[pos:].count(0) == size - pos:
            return "zero bytes after the last batch"
        length = int.from_bytes(buf[pos + 8 : pos + 12], "big", signed=True)
        if pos + LOG_OVERHEAD + length == size:
            return str(e)
        return None
    except RecordsError:
        return None
    return None


# A compiled scan bound to its sink: (segment, position, expected offset) -> (position after
# the last batch taken, the offset after it, batches taken, records in them).
BatchScan = Callable[[mmap.mmap, int, int], tuple[int, int, int, int]]


class FastSink(Protocol):
    """Where a compiled scan puts the records of the batches it takes: the replay's
    (docs/offsets-log-format.md, "Recovery at start-up"; ``StateBuilder`` in loader.py) or the
    pipeline's (pipeline/decode.py)."""

    fast_records: int  # records taken by the scan

    def scanner(self) -> BatchScan | None:
        """The scan, or None when it is not built or switched off (then every batch is
        yielded)."""
        ...


class SegmentReader:
    """The batches of one segment file, read by the recovery rules (module docstring).

    Iterating yields each batch in order (records decoded when ``decode``); afterwards
    :attr:`segment` holds its valid size and next offset, and :attr:`torn` (position, reason) the
    torn tail of a last segment, if any.  Anything else invalid raises :class:`CorruptLogError`
    at its batch, after every good batch before it was yielded.  ``expected_from``: the offset
    the partition's previous segment ended at (batches may not go below it).

    With ``fast`` (and the compiled scan built), the ordinary batches -- plain offset commits
    and group records, checked as this checks them -- go to ``fast`` without being yielded; the
    others are yielded in their place in the log.
    """

    def __init__(
        self,
        path: Path,
        base_offset: int,
        expected_from: int = 0,
        *,
        is_last: bool,
        decode: bool = True,
        fast: FastSink | None = None,
    ):
        self.path = path
        self.is_last = is_last
        self.decode = decode
        self.fast = fast
        self.expected_from = expected_from
        self.segment = Segment(base_offset, path, 0, base_offset)
        self.torn: tuple[int, str] | None = None

    def __iter__(self) -> Iterator[RecordBatch]:
        seg = self.segment
        path = self.path
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                pos = 0
                expected = max(seg.base_offset, self.expected_from)
                fast = self.fast
                scan = fast.scanner() if fast is not None and self.decode else None
                while pos < size:
                    if scan is not None:
                        assert fast is not None
                        pos, expected, batches, taken = scan(mm, pos, expected)
                        if batches:
                            fast.fast_records += taken
                            seg.size = pos
                            seg.next_offset = expected
                            seg.batches += batches
                            if pos >= size:
                                break
                    try:
                        h = read_header(mm, pos)
                    except RecordsError as e:
                        why = torn_tail_reason(mm, pos) if self.is_last else None
                        if why is not None:
                            self.torn = (pos, why)
                            return
                        if isinstance(e, TornBatchError):
                            raise CorruptLogError(path, pos, f"incomplete batch in a closed segment ({e})") from None
                        raise CorruptLogError(
                            path, pos, str(e), unsupported=isinstance(e, UnsupportedBatchError)
                        ) from None
                    if h.base_offset < expected:
                        raise CorruptLogError(
                            path, pos, f"batch base offset {h.base_offset} is below the expected {expected}"
                        )
                    records: tuple[Record, ...] = ()
                    if self.decode:
                        try:
                            records = decode_records(mm, h)
                        except RecordsError as e:
                            raise CorruptLogError(
                                path, pos, str(e), unsupported=isinstance(e, UnsupportedBatchError)
                            ) from None
                    pos = h.end
                    expected = h.next_offset
                    seg.size = pos
                    seg.next_offset = h.next_offset
                    seg.batches += 1
                    yield RecordBatch(h, records)


def scan_segment(
    path: Path,
    base_offset: int,
    expected_from: int,
    *,
    is_last: bool,
    on_batch: Callable[[RecordBatch], None] | None = None,
    fast: FastSink | None = None,
) -> tuple[Segment, tuple[int, str] | None]:
    """Read and verify one segment; feed decoded batches to ``on_batch`` (the ordinary ones to
    ``fast`` instead, when given: :class:`SegmentReader`).

    Returns the segment (its valid size) and, for a torn tail of the last segment, (position,
    reason) of the bytes to truncate.  Raises :class:`CorruptLogError` for anything else.
    """
    reader = SegmentReader(path, base_offset, expected_from, is_last=is_last, decode=on_batch is not None, fast=fast)
    for batch in reader:
        if on_batch is not None:
            on_batch(batch)
    return reader.segment, reader.torn


def recover_partition(
    pdir: Path,
    *,
    on_batch: Callable[[RecordBatch], None] | None = None,
    repair: bool = True,
    report: RecoveryReport | None = None,
    fast: FastSink | None = None,
) -> list[Segment]:
    """Verify (and with ``repair``, fix a torn tail of) one partition directory.

    Batches are fed to ``on_batch`` in offset order (ordinary ones to ``fast`` when given:
    :class:`SegmentReader`).  Returns its segments, last = active.
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
        seg, torn = scan_segment(path, base, expected, is_last=is_last, on_batch=on_batch, fast=fast)
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
