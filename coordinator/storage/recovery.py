"""Start-up replay of the offsets log (sync, no asyncio): verify, repair a torn tail, rebuild.

``replay_partition`` is the pure-ish function recovery tests drive: a partition directory in,
its segments and (groups, offsets) out.  ``OffsetsLog.start`` runs it for every partition,
moves groups found outside their partition (:func:`plan_moves`) and hands the result to the
groups runtime (docs/offsets-log-format.md, "Recovery at start-up").
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from msgspec import Struct, field
from rallypoint.protocol.offsets_schema import (
    GroupMetadataKey,
    Key,
    Value,
    partition_for,
)

from .errors import OffsetsLogStartError
from .loader import PartitionState, ReplayRedo, StateBuilder
from .segments import (
    CorruptLogError,
    RecoveryReport,
    Segment,
    list_partition_dirs,
    list_segments,
    recover_partition,
)


class PartitionReplay(Struct):
    """One partition replayed: its segments, rebuilt state, repairs, size and where damage stopped it."""

    partition: int
    segments: list[Segment]
    state: PartitionState
    report: RecoveryReport
    bytes: int
    damage: CorruptLogError | None = None  # with stop_at_damage: where reading stopped


def replay_partition(
    pdir: Path, partition: int = -1, *, repair: bool = True, stop_at_damage: bool = False
) -> PartitionReplay:
    """Verify every batch of one partition directory (truncating a torn tail when ``repair``)
    and rebuild its groups and offsets (last record per key wins, tombstones delete).

    The broker's start raises :class:`CorruptLogError` at damage; readers of a copy (the
    pipeline's oracle, tools) pass ``stop_at_damage`` to get the state of the batches before it,
    with ``damage`` saying where it stopped and ``segments`` left empty.
    """
    report = RecoveryReport()
    try:
        return _replay(pdir, partition, repair, stop_at_damage, report, fast=True)
    except ReplayRedo:
        # a key the compiled scan took does not decode, or two of its raw keys are one key:
        # the reference path reads every batch (what the first pass repaired is repaired and
        # already in ``report``)
        return _replay(pdir, partition, repair, stop_at_damage, report, fast=False)


def _replay(
    pdir: Path, partition: int, repair: bool, stop_at_damage: bool, report: RecoveryReport, *, fast: bool
) -> PartitionReplay:
    builder = StateBuilder()
    try:
        segments = recover_partition(
            pdir, on_batch=builder.add, repair=repair, report=report, fast=builder if fast else None
        )
    except CorruptLogError as e:
        if not stop_at_damage:
            raise
        return PartitionReplay(partition, [], builder.result(), report, 0, e)
    return PartitionReplay(partition, segments, builder.result(), report, sum(s.size for s in segments))


class Moves(Struct):
    """Records to append so that every group lives in its own partition."""

    # partition → records of groups that belong there, found elsewhere
    copies: dict[int, list[tuple[Key, Value]]] = field(default_factory=lambda: defaultdict(list))
    # partition → tombstones for what was copied out of it
    tombstones: dict[int, list[Key]] = field(default_factory=lambda: defaultdict(list))
    groups: set[str] = field(default_factory=set)

    def __bool__(self) -> bool:
        return bool(self.tombstones)


def plan_moves(states: dict[int, PartitionState], num_partitions: int) -> Moves:
    """Move every group (metadata and offsets) found outside ``partition_for(group)`` home.

    Data directories written before ``partition_for`` followed Kafka's ``Utils.abs`` placed
    every group with a negative hash in another partition.  Each such record is copied to its
    home partition (unless the home partition holds the same key already: a copy made by an
    earlier start that crashed before its tombstones) and a tombstone replaces it where it was.
    ``states`` are updated in place to what the log will hold; the copies must be written (and
    synced) before the tombstones.
    """
    moves = Moves()
    for partition, st in sorted(states.items()):
        for group, value in list(st.groups.items()):
            home = partition_for(group, num_partitions)
            if home == partition:
                continue
            del st.groups[group]
            moves.tombstones[partition].append(GroupMetadataKey(group))
            moves.groups.add(group)
            target = states[home].groups
            if group not in target:
                target[group] = value
                moves.copies[home].append((GroupMetadataKey(group), value))
        for key, offset in list(st.offsets.items()):
            home = partition_for(key.group, num_partitions)
            if home == partition:
                continue
            del st.offsets[key]
            moves.tombstones[partition].append(key)
            moves.groups.add(key.group)
            if key not in states[home].offsets:
                states[home].offsets[key] = offset
                moves.copies[home].append((key, offset))
    return moves


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
    "Moves",
    "PartitionCountError",
    "PartitionReplay",
    "check_partition_dirs",
    "plan_moves",
    "replay_partition",
]
