"""A topic partition's segment files on disk (``rallypoint.log.storage=disk``): Kafka's layout.

``<data.dir>/<topic>-<partition>/`` holds ``<base offset, 20 digits>.log`` segments of record
batches exactly as they are served (base offset and leader epoch patched in, as Kafka's log
holds them), ``partition.metadata`` (the topic id, Kafka's format) and
``leader-epoch-checkpoint``.  The names and the cleaner's swap protocol are the offsets log's
(:mod:`rallypoint.storage.segments`); so is the batch codec.  Kafka's ``.index`` /
``.timeindex`` files are not written: the per-batch index is rebuilt in memory when the partition
is loaded (docs/data-plane.md, "Durable topic data").

Positions: the partition keeps one *global* byte position per batch across all its segments;
segment ``k`` holds global positions ``[start, start + size)``.  This class maps them to files.
Writes go to the OS at once (``os.write`` on the active segment); fsync only by the topic's
flush policy, on a roll is not needed (Kafka leaves it to the OS too), and on a clean shutdown.
"""

from __future__ import annotations

import bisect
import os
import shutil
import threading
import uuid
from pathlib import Path

from msgspec import Struct

from ..storage.segments import CLEANED_SUFFIX, fsync_dir, segment_name, swap_name

PARTITION_METADATA = "partition.metadata"
LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
DELETE_SUFFIX = "-delete"


def partition_dir_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def parse_partition_dir_name(name: str) -> tuple[str, int] | None:
    topic, sep, index = name.rpartition("-")
    if not sep or not topic or not index.isdigit():
        return None
    return topic, int(index)


def read_topic_id(pdir: Path) -> uuid.UUID | None:
    """The topic id in ``partition.metadata`` (Kafka's ``PartitionMetadataFile``: ``version: 0``
    then ``topic_id: <base64url id>``); None when missing or unreadable."""
    import base64

    try:
        text = (pdir / PARTITION_METADATA).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "topic_id":
            raw = value.strip()
            try:
                return uuid.UUID(bytes=base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
            except ValueError:
                return None
    return None


def write_small_file(path: Path, text: str) -> None:
    """Write ``text`` to a new file, fsync it and rename it over ``path`` (Kafka's checkpoint
    files are written the same way)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class SegmentFile(Struct):
    """One open segment file: base offset, path, file descriptor and its range of global positions."""

    base_offset: int
    path: Path
    fd: int
    start: int  # global position of its first byte
    size: int

    @property
    def end(self) -> int:
        return self.start + self.size


class SegmentFiles:
    """The segment files of one partition directory (see the module docstring)."""

    def __init__(self, pdir: Path, topic_id: uuid.UUID) -> None:
        self.pdir = pdir
        self.topic_id = topic_id
        self.segments: list[SegmentFile] = []
        self._starts: list[int] = []
        self.unflushed = 0  # messages written since the last fsync
        self.last_flush_ms: int | None = None

    # ------------------------------------------------------------------ opening

    def prepare_dir(self) -> None:
        """Create the directory with its ``partition.metadata`` (before the first segment)."""
        import base64

        if self.pdir.is_dir():
            if read_topic_id(self.pdir) == self.topic_id:
                return
            shutil.rmtree(self.pdir)  # an older topic of the same name left it
        self.pdir.mkdir(parents=True, exist_ok=True)
        tid = base64.urlsafe_b64encode(self.topic_id.bytes).decode().rstrip("=")
        write_small_file(self.pdir / PARTITION_METADATA, f"version: 0\ntopic_id: {tid}\n")
        write_small_file(self.pdir / LEADER_EPOCH_CHECKPOINT, "0\n1\n0 0\n")
        fsync_dir(self.pdir.parent)

    def adopt(self, base_offset: int, path: Path, start: int, size: int) -> None:
        """Take an existing segment file (at load), read-write, positioned at its end."""
        fd = os.open(path, os.O_RDWR | os.O_APPEND)
        self.segments.append(SegmentFile(base_offset, path, fd, start, size))
        self._starts.append(start)

    def roll(self, base_offset: int, start: int) -> None:
        """Open a new active segment named ``base_offset`` whose first byte is global ``start``."""
        if self.segments and self.segments[-1].size == 0:
            last = self.segments[-1]  # an empty active segment: rename it instead
            if last.base_offset == base_offset:
                last.start = self._starts[-1] = start
                return
            self._close_remove(last)
            self.segments.pop()
            self._starts.pop()
        self.prepare_dir()
        path = self.pdir / segment_name(base_offset)
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC, 0o644)
        self.segments.append(SegmentFile(base_offset, path, fd, start, 0))
        self._starts.append(start)

    @property
    def active(self) -> SegmentFile | None:
        return self.segments[-1] if self.segments else None

    # ------------------------------------------------------------------ data

    def write(self, batch: bytes, records: int) -> None:
        """Append one batch to the active segment (the caller rolled one open)."""
        seg = self.segments[-1]
        view = memoryview(batch)
        done = 0
        while done < len(view):
            done += os.write(seg.fd, view[done:])
        seg.size += len(batch)
        self.unflushed += records

    def read(self, start: int, end: int) -> bytes:
        """Global bytes ``[start, end)``; they must lie in one segment."""
        seg = self.segments[bisect.bisect_right(self._starts, start) - 1]
        return os.pread(seg.fd, end - start, start - seg.start)

    def segment_end(self, pos: int) -> int:
        """The global end of the segment holding global position ``pos``."""
        return self.segments[bisect.bisect_right(self._starts, pos) - 1].end

    def flush(self, now_ms: int | None = None) -> None:
        if self.segments and self.unflushed:
            os.fsync(self.segments[-1].fd)
        self.unflushed = 0
        self.last_flush_ms = now_ms

    # ------------------------------------------------------------------ deletion and cleaning

    def drop_before(self, pos: int) -> int:
        """Delete the closed segments wholly before global position ``pos`` (retention,
        DeleteRecords); the active one stays.  Returns how many went."""
        gone = 0
        while len(self.segments) > 1 and self.segments[0].end <= pos:
            self._close_remove(self.segments.pop(0))
            self._starts.pop(0)
            gone += 1
        return gone

    def stage_cleaned(self, base_offset: int, batches: list[bytes]) -> tuple[Path, int] | None:
        """Compaction, first half (any thread: it touches only a new file): write the cleaned
        ``batches`` to ``<base>.log.cleaned`` and fsync it.  (path, size); None for no batches."""
        if not batches:
            return None
        path = self.pdir / f"{base_offset:020d}{CLEANED_SUFFIX}"
        size = 0
        with open(path, "wb") as f:
            for b in batches:
                f.write(b)
                size += len(b)
            f.flush()
            os.fsync(f.fileno())
        return path, size

    def replace_closed(self, upto: int, staged: tuple[Path, int] | None) -> int:
        """Compaction, second half (renames only): the closed segments ending at or before global
        ``upto`` are replaced by the ``staged`` cleaned file (named as the first of them, its first
        byte at global 0; None: they all go); the later segments' global positions shift
        accordingly.  Kafka's swap protocol, so a crash in the middle is finished at the next start
        (``finish_cleaner_leftovers``).  Returns the shift."""
        old = [s for s in self.segments[:-1] if s.start < upto and s.end <= upto]  # never the active one
        rest = self.segments[len(old) :]
        shift = 0
        new: list[SegmentFile] = []
        if old:
            base_offset = old[0].base_offset
            end_offset = rest[0].base_offset if rest else old[-1].base_offset + 1
            swap = self.pdir / swap_name(base_offset, end_offset)
            if staged is not None:
                os.replace(staged[0], swap)
                fsync_dir(self.pdir)
            for s in old:
                self._close_remove(s)
            size = 0
            if staged is not None:
                final = self.pdir / segment_name(base_offset)
                os.replace(swap, final)
                fd = os.open(final, os.O_RDWR | os.O_APPEND)
                size = staged[1]
                new.append(SegmentFile(base_offset, final, fd, 0, size))
            fsync_dir(self.pdir)
            shift = size - old[-1].end
        elif staged is not None:
            staged[0].unlink(missing_ok=True)
        for s in rest:
            s.start += shift
        self.segments = new + rest
        self._starts = [s.start for s in self.segments]
        return shift

    def _close_remove(self, seg: SegmentFile) -> None:
        os.close(seg.fd)
        seg.path.unlink(missing_ok=True)

    def close(self, *, sync: bool = False) -> None:
        for s in self.segments:
            if sync and s is self.segments[-1]:
                os.fsync(s.fd)
            os.close(s.fd)
        self.segments = []
        self._starts = []

    def delete(self) -> None:
        """Close every segment and remove the directory (DeleteTopics): renamed first, so a crash
        in the middle leaves a ``-delete`` directory the next start removes."""
        self.close()
        if not self.pdir.exists():
            return
        doomed = self.pdir.with_name(f"{self.pdir.name}.{uuid.uuid4().hex}{DELETE_SUFFIX}")
        os.replace(self.pdir, doomed)
        # the data goes in the background (its size is the topic's); a crash leaves the
        # -delete directory, which the next start removes
        threading.Thread(target=shutil.rmtree, args=(doomed, True), name="delete-partition", daemon=True).start()


def remove_leftovers(data_dir: Path) -> list[Path]:
    """Directories a deletion interrupted by a crash left (``*-delete``): removed at start."""
    out = []
    if data_dir.is_dir():
        for entry in data_dir.iterdir():
            if entry.is_dir() and entry.name.endswith(DELETE_SUFFIX):
                shutil.rmtree(entry, ignore_errors=True)
                out.append(entry)
    return out
