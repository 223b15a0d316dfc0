"""Start-up replay of the offsets log (sync, no asyncio): verify, repair a torn tail, rebuild.

``replay_partition`` is the pure-ish function recovery tests drive: a partition directory in,
its segments and (groups, offsets) out.  ``OffsetsLog.start`` runs it for every partition and
hands the result to the groups runtime (spec §A.13, §B.3).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .errors import OffsetsLogStartError
from .loader import PartitionState, StateBuilder
from .segments import (
    CorruptLogError,
    RecoveryReport,
    Segment,
    list_partition_dirs,
    list_segments,
    recover_partition,
)


@dataclass
class PartitionReplay:
    partition: int
    segments: list[Segment]
    state: PartitionState
    report: RecoveryReport
    bytes: int


def replay_partition(pdir: Path, partition: int = -1, *, repair: bool = True) -> PartitionReplay:
    """Verify every batch of one partition directory (truncating a torn tail when ``repair``)
    and rebuild its groups and offsets (last record per key wins, tombstones delete)."""
    builder = StateBuilder()
    report = RecoveryReport()
    segments = recover_partition(pdir, on_batch=builder.add, repair=repair, report=report)
    return PartitionReplay(partition, segments, builder.result(), report, sum(s.size for s in segments))


class PartitionCountError(OffsetsLogStartError):
    pass


def check_partition_dirs(data_dir: Path, num_partitions: int) -> dict[int, Path]:
    """The existing ``__consumer_offsets-N`` directories, refusing a changed partition count.

    A group's partition is ``hash(group) % offsets.topic.num.partitions``, so a data directory
    written with another count would put groups in the wrong partitions (Kafka cannot change
    the count of an existing ``__consumer_offsets`` either).  All directories are created at
    the first start, so: a directory at or beyond the count means the count shrank; exactly
    ``0..k-1`` with k below the count, holding data, means it grew.  (Other gaps — directories
    removed by hand — are recreated empty.)
    """
    dirs = list_partition_dirs(data_dir)
    beyond = [n for n in dirs if n >= num_partitions]
    if beyond:
        raise PartitionCountError(
            f"{data_dir} holds __consumer_offsets-{max(beyond)} but offsets.topic.num.partitions is "
            f"{num_partitions}; start with the count this data directory was created with "
            f"(at least {max(beyond) + 1})"
        )
    if dirs and list(dirs) == list(range(len(dirs))) and len(dirs) < num_partitions:
        if any(_has_data(p) for p in dirs.values()):
            raise PartitionCountError(
                f"{data_dir} holds __consumer_offsets-0..{len(dirs) - 1} with data but "
                f"offsets.topic.num.partitions is {num_partitions}; start with the count this data directory "
                f"was created with ({len(dirs)})"
            )
    return dirs


def _has_data(pdir: Path) -> bool:
    return any(path.stat().st_size > 0 for _base, path in list_segments(pdir))


__all__ = [
    "CorruptLogError",
    "PartitionCountError",
    "PartitionReplay",
    "check_partition_dirs",
    "replay_partition",
]
