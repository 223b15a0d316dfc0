"""Loading durable topic data at start, and the log directory's checkpoint files.

Recovery follows Kafka's ``LogLoader`` (docs/data-plane.md, "Durable topic data"):

* A directory a deletion left half-done (``*-delete``) is removed; cleaner leftovers are
  finished as for the offsets log (``finish_cleaner_leftovers``); a partition directory whose
  ``partition.metadata`` names another topic id (an older topic of the same name) is removed.
* Every batch header of every segment is read in order, rebuilding the in-memory index and the
  producer and transaction state.  After a clean shutdown (``.kafka_cleanshutdown`` present)
  CRCs are not checked; otherwise they are from the segment holding the recovery point
  (``recovery-point-offset-checkpoint``) on.
* The first invalid batch there — cut short, a CRC mismatch, impossible lengths, an offset going
  backwards — ends the log: the segment is truncated at it and later segments are deleted, with
  one warning naming the partition and the bytes cut (Kafka's ``LogSegment.recover`` and
  ``LogLoader.recoverLog`` do the same).  The next append gets the offset after the last valid
  batch.
* The log start offset is the larger of the first segment's base and
  ``log-start-offset-checkpoint`` (DeleteRecords writes it before it answers).
"""

from __future__ import annotations

import mmap
import os
import time
import uuid
from pathlib import Path

from msgspec import Struct, field
from rallypoint.protocol.records import RecordsError, read_header

from ..logger import get as get_logger
from ..storage.segments import RecoveryReport, finish_cleaner_leftovers, list_segments
from .partition import PartitionLog
from .segment_files import SegmentFiles, read_topic_id, write_small_file

log = get_logger("rallypoint.topics")

CLEAN_SHUTDOWN = ".kafka_cleanshutdown"
LOG_START_CHECKPOINT = "log-start-offset-checkpoint"
RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOCK_FILE = ".lock"


def read_checkpoint(path: Path) -> dict[tuple[str, int], int]:
    """Kafka's ``OffsetCheckpointFile``: version 0, a count, then ``topic partition offset``
    lines.  A missing or malformed file reads as empty (what it would bound is then re-derived
    from the segments)."""
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return {}
    if len(lines) < 2 or lines[0].strip() != "0":
        return {}
    out: dict[tuple[str, int], int] = {}
    for line in lines[2:]:
        parts = line.split()
        if len(parts) == 3 and parts[1].isdigit():
            try:
                out[(parts[0], int(parts[1]))] = int(parts[2])
            except ValueError:
                continue
    return out


def write_checkpoint(path: Path, entries: dict[tuple[str, int], int]) -> None:
    body = "".join(f"{t} {p} {o}\n" for (t, p), o in sorted(entries.items()))
    write_small_file(path, f"0\n{len(entries)}\n{body}")


class LoadReport(Struct):
    """What loading the durable topic data found: counts, truncations, clean shutdown and time taken."""

    partitions: int = 0
    segments: int = 0
    batches: int = 0
    bytes: int = 0
    truncated: list[tuple[str, int, str, int, int, str]] = field(default_factory=list)
    clean_shutdown: bool = False
    millis: float = 0.0


def open_partition(
    pdir: Path,
    topic: str,
    index: int,
    topic_id: uuid.UUID,
    *,
    saved_next: int,
    log_start: int | None,
    recovery_point: int | None,
    clean: bool,
    now_ms: int,
    report: LoadReport,
) -> PartitionLog:
    """The partition's log, loaded from ``pdir`` by the recovery rules (module docstring)."""
    files = SegmentFiles(pdir, topic_id)
    if pdir.is_dir():
        tid = read_topic_id(pdir)
        if tid is not None and tid != topic_id:
            log.warning("stale partition directory removed", topic=topic, partition=index, path=str(pdir))
            files.delete()
    segs = []
    if pdir.is_dir():
        finish_cleaner_leftovers(pdir, RecoveryReport())
        segs = list_segments(pdir)
    if not segs:
        start = max(saved_next, log_start or 0)
        return PartitionLog(topic, index, start, start, files=files)
    plog = PartitionLog(topic, index, segs[0][0], files=files)
    gpos = 0
    cut: tuple[Path, int, str] | None = None
    for k, (base, path) in enumerate(segs):
        if cut is not None:  # after an invalid batch: later segments go
            report.truncated.append((topic, index, str(path), 0, path.stat().st_size, "after the truncation point"))
            path.unlink()
            continue
        verify = not clean and (recovery_point is None or k + 1 == len(segs) or segs[k + 1][0] > recovery_point)
        size = path.stat().st_size
        valid = 0
        if size:
            with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                expected = max(base, plog.next_offset)
                while valid < size:
                    try:
                        h = read_header(mm, valid, verify_crc=verify)
                        if h.base_offset < expected:
                            raise RecordsError(f"base offset {h.base_offset} below the expected {expected}", valid)
                    except RecordsError as e:
                        cut = (path, valid, str(e))
                        break
                    plog.load_batch(mm, h)
                    report.batches += 1
                    valid = h.end
                    expected = h.next_offset
        if cut is not None:
            report.truncated.append((topic, index, str(path), valid, size - valid, cut[2]))
            with open(path, "r+b") as out:
                out.truncate(valid)
                out.flush()
                os.fsync(out.fileno())
        if valid == 0 and k + 1 < len(segs) and cut is None:
            path.unlink()  # an empty closed segment holds nothing
            continue
        files.adopt(base, path, gpos, valid)
        gpos += valid
        report.segments += 1
        report.bytes += valid
    for t, p, where, pos, nbytes, why in report.truncated:
        if t == topic and p == index:
            log.warning(
                "partition log truncated at recovery",
                topic=t,
                partition=p,
                segment=where,
                position=pos,
                bytes_cut=nbytes,
                reason=why,
            )
    plog.finish_load(log_start or 0, now_ms)
    report.partitions += 1
    return plog


def load_clean_marker(data_dir: Path) -> bool:
    """Whether the last run ended cleanly; the marker is removed (this run has not)."""
    marker = data_dir / CLEAN_SHUTDOWN
    if marker.exists():
        marker.unlink()
        return True
    return False


def mark_clean(data_dir: Path) -> None:
    write_small_file(data_dir / CLEAN_SHUTDOWN, "")


def elapsed_ms(t0: float) -> float:
    return round((time.monotonic() - t0) * 1000, 1)
