"""What the coordinator wrote, per record key: the value the log acknowledged last and the values
appended since, not yet acknowledged.

Kafka's coordinator runtime keeps its state in timeline data structures (``TimelineHashMap``
over a ``SnapshotRegistry``): a record is replayed into memory when it is appended, reads that
must only see durable data read at the last committed offset, and a failed write reverts to
that snapshot.  This is the same idea per key (docs/groups.md,
"Records are applied when appended"):

* ``append`` replays a batch at once: the *current* view (what later writes build on: retention,
  DeleteGroups, OffsetDelete, topic deletion) includes it;
* ``settle(write, ok)`` when the log answers: on success the batch's values become the
  *committed* view (what a restart would load; OffsetFetch reads it); on failure they are
  dropped and the current view falls back to the values before them — later batches that
  touched the same keys keep theirs.

Committed offsets are kept for every group; GroupMetadata values are kept so that a group can
be rebuilt from what is durable (docs/groups.md, "Internal errors").
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Generic, TypeVar

from msgspec import Struct
from rallypoint.protocol.offsets_schema import GroupMetadataValue, OffsetCommitKey, OffsetCommitValue

from .persist import Key, Record

V = TypeVar("V")
TopicPartition = tuple[str, int]


class _Versions(Struct, Generic[V], gc=False):
    """One key's values: the last one the log acknowledged and those appended since, by write id.

    One per committed partition and per group, so kept small: ``pending`` is a tuple (the empty
    one is shared; rarely more than one write is in flight per key), and the collector does not
    track it (values and tuples of them never refer back to it)."""

    committed: V | None = None
    committed_by: int = 0  # id of the write that committed it (0: loaded)
    pending: tuple[tuple[int, V | None], ...] = ()  # (write id, value), append order

    def append(self, write_id: int, value: V | None) -> None:
        self.pending = (*self.pending, (write_id, value))

    def current(self) -> V | None:
        return self.pending[-1][1] if self.pending else self.committed

    def settle(self, write_id: int, ok: bool) -> None:
        mine = [v for w, v in self.pending if w == write_id]
        if not mine:
            return
        self.pending = tuple((w, v) for w, v in self.pending if w != write_id)
        if ok and write_id >= self.committed_by:
            self.committed = mine[-1]
            self.committed_by = write_id

    def idle(self) -> bool:
        return self.committed is None and not self.pending


def _readable(versions: _Versions[OffsetCommitValue]) -> OffsetCommitValue | None:
    """What OffsetFetch sees of one partition: the acknowledged value, unless a deletion of it
    is appended and not yet acknowledged."""
    if versions.committed is None or any(v is None for _w, v in versions.pending):
        return None
    return versions.committed


class Timeline:
    def __init__(self) -> None:
        self._offsets: dict[str, dict[TopicPartition, _Versions[OffsetCommitValue]]] = {}
        self._groups: dict[str, _Versions[GroupMetadataValue]] = {}
        self._writes: dict[int, list[Key]] = {}

    # ----------------------------------------------------------------------- writing

    def append(self, write_id: int, records: Sequence[Record]) -> None:
        keys: list[Key] = []
        for key, value in records:
            if isinstance(key, OffsetCommitKey):
                assert value is None or isinstance(value, OffsetCommitValue)
                by_tp = self._offsets.setdefault(key.group, {})
                by_tp.setdefault((key.topic, key.partition), _Versions()).append(write_id, value)
            else:
                assert value is None or isinstance(value, GroupMetadataValue)
                self._groups.setdefault(key.group, _Versions()).append(write_id, value)
            keys.append(key)
        self._writes[write_id] = keys

    def settle(self, write_id: int, ok: bool) -> None:
        for key in self._writes.pop(write_id, ()):
            if isinstance(key, OffsetCommitKey):
                by_tp = self._offsets.get(key.group)
                if by_tp is None:
                    continue
                tp = (key.topic, key.partition)
                versions = by_tp.get(tp)
                if versions is None:
                    continue
                versions.settle(write_id, ok)
                if versions.idle():
                    del by_tp[tp]
                    if not by_tp:
                        del self._offsets[key.group]
            else:
                gv = self._groups.get(key.group)
                if gv is None:
                    continue
                gv.settle(write_id, ok)
                if gv.idle():
                    del self._groups[key.group]

    def load(
        self, group_id: str, value: GroupMetadataValue | None, offsets: dict[TopicPartition, OffsetCommitValue]
    ) -> None:
        """Install what the log replayed for one group (nothing of it is pending)."""
        self._groups.pop(group_id, None)
        if value is not None:
            self._groups[group_id] = _Versions(value)
        self._offsets.pop(group_id, None)
        if offsets:
            self._offsets[group_id] = {tp: _Versions(v) for tp, v in offsets.items()}

    def promote(self, group_id: str, tp: TopicPartition, value: OffsetCommitValue | None, write_id: int) -> None:
        """A transaction's COMMIT marker is durable: its offset (written by ``write_id``, a
        tombstone when None) becomes the committed one unless a later write committed one
        already (Kafka compares record offsets; write ids follow the log order of a partition)."""
        by_tp = self._offsets.setdefault(group_id, {})
        versions = by_tp.setdefault(tp, _Versions())
        if write_id >= versions.committed_by:
            versions.committed = value
            versions.committed_by = write_id
        if versions.idle():
            del by_tp[tp]
        if not by_tp:
            del self._offsets[group_id]

    def group_ids(self) -> list[str]:
        """Every group with a record or offsets here."""
        return list(dict.fromkeys([*self._groups, *self._offsets]))

    def forget(self, group_id: str) -> None:
        """The group left this coordinator (its partition moved): nothing of it stays."""
        self._groups.pop(group_id, None)
        self._offsets.pop(group_id, None)

    def clear(self) -> None:
        self._offsets.clear()
        self._groups.clear()
        self._writes.clear()

    # ----------------------------------------------------------------------- reading

    def current_offsets(self, group_id: str) -> dict[TopicPartition, OffsetCommitValue]:
        """Committed offsets including the appended, unacknowledged ones (what writes build on)."""
        out: dict[TopicPartition, OffsetCommitValue] = {}
        for tp, versions in self._offsets.get(group_id, {}).items():
            v = versions.current()
            if v is not None:
                out[tp] = v
        return out

    def committed_offsets(self, group_id: str) -> dict[TopicPartition, OffsetCommitValue]:
        """Offsets the log acknowledged (what a restart would load)."""
        out: dict[TopicPartition, OffsetCommitValue] = {}
        for tp, versions in self._offsets.get(group_id, {}).items():
            if versions.committed is not None:
                out[tp] = versions.committed
        return out

    def readable_offsets(self, group_id: str) -> dict[TopicPartition, OffsetCommitValue]:
        """What OffsetFetch answers: acknowledged offsets, less those whose deletion (a
        tombstone) is appended but not yet acknowledged — a deletion shows at once, a commit
        once it is durable (docs/groups.md, "OffsetFetch")."""
        out: dict[TopicPartition, OffsetCommitValue] = {}
        for tp, versions in self._offsets.get(group_id, {}).items():
            value = _readable(versions)
            if value is not None:
                out[tp] = value
        return out

    def readable_offset(self, group_id: str, tp: TopicPartition) -> OffsetCommitValue | None:
        """:meth:`readable_offsets` of one partition, without reading the group's others."""
        by_tp = self._offsets.get(group_id)
        versions = None if by_tp is None else by_tp.get(tp)
        return None if versions is None else _readable(versions)

    def pending_writes(self, group_id: str) -> set[int]:
        """Writes of this group's offsets the log has not answered yet."""
        return {w for versions in self._offsets.get(group_id, {}).values() for w, _ in versions.pending}

    def committed_group(self, group_id: str) -> GroupMetadataValue | None:
        gv = self._groups.get(group_id)
        return None if gv is None else gv.committed

    def current_group(self, group_id: str) -> GroupMetadataValue | None:
        """The group's last appended GroupMetadata value (None: never written, or a tombstone)."""
        gv = self._groups.get(group_id)
        return None if gv is None else gv.current()

    def group_ids_with_offsets(self) -> Iterator[str]:
        return iter(list(self._offsets))

    def is_settled(self) -> bool:
        return not self._writes
