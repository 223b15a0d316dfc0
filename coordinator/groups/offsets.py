"""Committed offsets: OffsetCommit, OffsetFetch, OffsetDelete, retention and deleted topics.

Kafka's counterpart is ``OffsetMetadataManager.java``.  Offsets are kept per group id in the
timeline (``timeline.py``), not in the group: a commit is applied when its record is appended
and acknowledged when the log has it; OffsetFetch answers what the log acknowledged
(docs/groups.md, "Offsets").

The manager knows groups only through two small interfaces — :class:`OffsetsGroup` (may this
member commit? which topics is the group subscribed to? from when do its offsets expire?) and
:class:`GroupDirectory` (find, create, delete a group) — so that any group type that answers
them (KIP-848 consumer groups, later) can keep its offsets here too.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

from msgspec import Struct
from rallypoint.protocol.errors import ErrorCode
from rallypoint.protocol.offsets_schema import OffsetCommitKey, OffsetCommitValue

from . import checks, records
from .context import Context
from .events import (
    CommitRequest,
    CommitResult,
    OffsetDeleteRequest,
    OffsetDeleteResult,
    OffsetFetchGroupRequest,
    OffsetFetchGroupResult,
    OffsetFetchPartition,
    OffsetFetchRequest,
    OffsetFetchResult,
    OffsetFetchTopic,
    TopicErrors,
)
from .persist import Record, response_error

E = ErrorCode


class OffsetsGroup(Protocol):
    """What the offsets manager asks a group (Kafka's ``Group`` interface)."""

    @property
    def group_id(self) -> str: ...

    @property
    def partition(self) -> int: ...

    def validate_offset_commit(
        self, member_id: str, instance_id: str | None, generation_id: int, *, transactional: bool = False
    ) -> ErrorCode | None:
        """None if this member, in this generation (or epoch), may commit; else the error."""
        ...

    def validate_offset_delete(self) -> ErrorCode | None: ...

    def is_subscribed_to(self, topic: str) -> bool: ...

    def offset_expiration_base(self) -> Callable[[OffsetCommitValue], int] | None:
        """From when an offset's retention counts; None: the group's offsets may not expire now."""
        ...

    def is_empty(self) -> bool:
        """May the group be deleted once its offsets are gone?"""
        ...


G = TypeVar("G", bound=OffsetsGroup)


class GroupDirectory(Protocol[G]):
    """What the offsets manager asks of the groups (Kafka's ``GroupMetadataManager``)."""

    def get(self, group_id: str) -> G | None: ...

    def create(self, group_id: str) -> G: ...

    def ids(self) -> list[str]: ...

    def revert_creation(self, group: G, error: ErrorCode, what: str) -> None: ...

    def on_offset_commit(self, group: G, member_id: str) -> None: ...

    def delete(self, group: G, reason: str) -> Callable[[], None]: ...


def java_string_length(s: str) -> int:
    """Java ``String.length()``: UTF-16 code units (offset.metadata.max.bytes is checked so)."""
    if s.isascii():  # one code unit a character (most metadata is empty)
        return len(s)
    return len(s.encode("utf-16-le")) // 2


class _StableFetch(Struct):
    """A RequireStable OffsetFetch waiting for the writes that were pending when it came."""

    token: int
    request: OffsetFetchRequest
    waiting_for: set[int]


TopicPartition = tuple[str, int]


class OffsetsManager(Generic[G]):
    def __init__(self, ctx: Context, groups: GroupDirectory[G]) -> None:
        self.ctx = ctx
        self.groups = groups
        self._stable_fetches: list[_StableFetch] = []
        ctx.settled_hooks.append(self._release_stable_fetches)
        # Transactional offsets not yet committed or aborted (Kafka's
        # ``pendingTransactionalOffsets``): producer id -> group -> partition -> (write id, value)
        self.txn_pending: dict[int, dict[str, dict[TopicPartition, tuple[int, OffsetCommitValue | None]]]] = {}

    # ================================================================ OffsetCommit

    @staticmethod
    def _all_partitions(req: CommitRequest, error: ErrorCode) -> CommitResult:
        return CommitResult(
            tuple(TopicErrors(t.name, tuple((p.partition, error) for p in t.partitions)) for t in req.topics)
        )

    def commit(self, token: int, req: CommitRequest) -> None:
        """``commitOffset`` (docs/groups.md, "OffsetCommit")."""
        ctx = self.ctx
        err = checks.request(ctx, req.group_id, validate_id=False)
        if err is not None:
            ctx.respond(token, self._all_partitions(req, err))
            return
        group = self.groups.get(req.group_id)
        created = False
        transactional = req.producer is not None
        if group is None:
            if req.generation_id < 0:
                # Admin clients and manual assignment: a "simple" group is created.
                group = self.groups.create(req.group_id)
                created = True
            else:
                # validateOffsetCommit: GROUP_ID_NOT_FOUND from OffsetCommit v9 (TxnOffsetCommit
                # v6), ILLEGAL_GENERATION before.
                newer = req.api_version >= (6 if transactional else 9)
                code = E.GROUP_ID_NOT_FOUND if newer else E.ILLEGAL_GENERATION
                ctx.respond(token, self._all_partitions(req, code))
                return
        err = group.validate_offset_commit(
            req.member_id, req.group_instance_id, req.generation_id, transactional=transactional
        )
        if err is not None:
            ctx.respond(token, self._all_partitions(req, err))
            return
        self.groups.on_offset_commit(group, req.member_id)

        expire = None if req.retention_time_ms == -1 else ctx.now + req.retention_time_ms
        topics: list[TopicErrors] = []
        batch: list[Record] = []
        for t in req.topics:
            parts: list[tuple[int, ErrorCode]] = []
            for p in t.partitions:
                meta = p.metadata if p.metadata is not None else ""
                if java_string_length(meta) > ctx.config.metadata_max_bytes:
                    parts.append((p.partition, E.OFFSET_METADATA_TOO_LARGE))
                    continue
                parts.append((p.partition, E.NONE))
                value = OffsetCommitValue(
                    offset=p.offset,
                    metadata=meta,
                    commit_timestamp=ctx.now,
                    leader_epoch=p.leader_epoch,
                    expire_timestamp=expire,
                    topic_id=t.topic_id,
                )
                batch.append(records.offset_commit(group.group_id, t.name, p.partition, value))
            topics.append(TopicErrors(t.name, tuple(parts)))
        result = CommitResult(tuple(topics))
        if not batch:
            ctx.respond(token, result)
            return

        def after(error: ErrorCode | None) -> None:
            if error is not None and created:
                self.groups.revert_creation(group, response_error(error), "its first offset commit was not written")

        if req.producer is not None:
            self._commit_transactional(token, req, group, batch, result, after)
            return
        ctx.append_then_respond(
            group.partition,
            batch,
            token,
            result,
            lambda code: self._all_partitions(req, code),
            after=after,
            groups=(group.group_id,),
        )

    # ========================================================= transactional offsets

    def _commit_transactional(
        self,
        token: int,
        req: CommitRequest,
        group: G,
        batch: list[Record],
        result: CommitResult,
        after: Callable[[ErrorCode | None], None],
    ) -> None:
        """TxnOffsetCommit: the records go to the log in a transactional batch; their offsets
        are pending for the producer until its marker (``OffsetMetadataManager.replay`` with a
        producer id; docs/transactions.md, "Transactional offsets")."""
        assert req.producer is not None
        pid = req.producer[0]
        gid = group.group_id
        ctx = self.ctx

        def done(error: ErrorCode | None) -> None:
            after(error)
            if error is not None:  # the batch is not in the log: its offsets were never pending
                staged = self.txn_pending.get(pid, {}).get(gid, {})
                for tp in [tp for tp, (w, _v) in staged.items() if w == wid]:
                    del staged[tp]
                self._prune(pid, gid)
            ctx.respond(token, result if error is None else self._all_partitions(req, response_error(error)))

        wid = ctx.append(group.partition, batch, done, groups=(gid,), producer=req.producer)
        staged = self.txn_pending.setdefault(pid, {}).setdefault(gid, {})
        for key, value in batch:
            assert isinstance(key, OffsetCommitKey)
            assert value is None or isinstance(value, OffsetCommitValue)
            staged[(key.topic, key.partition)] = (wid, value)

    def _prune(self, pid: int, gid: str) -> None:
        by_group = self.txn_pending.get(pid)
        if by_group is not None and not by_group.get(gid, True):
            del by_group[gid]
        if by_group is not None and not by_group:
            del self.txn_pending[pid]

    def complete_transaction(self, token: int, partition: int, producer_id: int, epoch: int, commit: bool) -> None:
        """WriteTxnMarkers for ``__consumer_offsets-<partition>``: the control batch is written,
        then the producer's pending offsets of the groups in this partition are committed (only
        where no later commit exists) or dropped (``replayEndTransactionMarker``)."""
        ctx = self.ctx

        def done(error: ErrorCode | None) -> None:
            if error is None:
                by_group = self.txn_pending.get(producer_id, {})
                for gid in [g for g in by_group if ctx.partition_for(g) == partition]:
                    staged = by_group.pop(gid)
                    if commit:
                        for tp, (w, value) in staged.items():
                            ctx.timeline.promote(gid, tp, value, w)
                    ctx.touched.add(gid)
                if not by_group:
                    self.txn_pending.pop(producer_id, None)
            ctx.respond(token, E.NONE if error is None else response_error(error))

        ctx.append(partition, [], done, producer=(producer_id, epoch), marker=commit)

    def load_pending(self, producer_id: int, group_id: str, offsets: dict[TopicPartition, OffsetCommitValue]) -> None:
        """Offsets of a transaction without a marker in the log at start-up (write id 0)."""
        staged = self.txn_pending.setdefault(producer_id, {}).setdefault(group_id, {})
        for tp, v in offsets.items():
            staged[tp] = (0, v)

    def _open_transactions(self, group_id: str) -> set[TopicPartition]:
        """Partitions of the group with a pending transactional offset (``openTransactions``)."""
        out: set[TopicPartition] = set()
        for by_group in self.txn_pending.values():
            out.update(by_group.get(group_id, ()))
        return out

    # ================================================================= OffsetFetch

    def fetch(self, token: int, req: OffsetFetchRequest) -> None:
        """``fetchOffsets`` (docs/groups.md, "OffsetFetch")."""
        if req.require_stable:
            # Java coordinator: a RequireStable fetch is a write operation, answered once the
            # writes pending before it are done (GroupCoordinatorService.fetchOffsets); it never
            # needs UNSTABLE_OFFSET_COMMIT without transactions.
            waiting: set[int] = set()
            for g in req.groups:
                if checks.request(self.ctx, g.group_id, validate_id=False) is None:
                    waiting.update(self.ctx.timeline.pending_writes(g.group_id))
            if waiting:
                self._stable_fetches.append(_StableFetch(token, req, waiting))
                return
        self.ctx.respond(token, self._fetch_now(req))

    def _release_stable_fetches(self, write_id: int) -> None:
        still: list[_StableFetch] = []
        for w in self._stable_fetches:
            w.waiting_for.discard(write_id)
            if w.waiting_for:
                still.append(w)
            else:
                self.ctx.respond(w.token, self._fetch_now(w.request))
        self._stable_fetches = still

    def _fetch_now(self, req: OffsetFetchRequest) -> OffsetFetchResult:
        return OffsetFetchResult(tuple(self._fetch_group(g, req.require_stable) for g in req.groups))

    def _fetch_group(self, req: OffsetFetchGroupRequest, require_stable: bool = False) -> OffsetFetchGroupResult:
        err = checks.request(self.ctx, req.group_id, validate_id=False)
        if err is not None:
            return OffsetFetchGroupResult(req.group_id, err)
        # What the log acknowledged (Kafka reads at the last committed offset), less offsets
        # being deleted.  RequireStable: a partition with a pending transactional offset is
        # UNSTABLE_OFFSET_COMMIT (docs/transactions.md, "Transactional offsets").
        timeline = self.ctx.timeline
        unstable = self._open_transactions(req.group_id) if require_stable and self.txn_pending else set()
        if req.topics is None:
            offsets = timeline.readable_offsets(req.group_id)
            by_topic: dict[str, list[OffsetFetchPartition]] = {}
            for (topic, part), v in offsets.items():
                if (topic, part) in unstable:
                    continue
                by_topic.setdefault(topic, []).append(OffsetFetchPartition(part, v.offset, v.leader_epoch, v.metadata))
            for topic, part in sorted(unstable):
                by_topic.setdefault(topic, []).append(OffsetFetchPartition(part, error=E.UNSTABLE_OFFSET_COMMIT))
            return OffsetFetchGroupResult(
                req.group_id, E.NONE, tuple(OffsetFetchTopic(t, tuple(ps)) for t, ps in by_topic.items())
            )
        topics = []
        ids = req.topic_ids or {}
        for name, parts in req.topics:
            out = []
            asked = ids.get(name)
            for p in parts:
                # the named partitions only: a group's other committed partitions are not read
                c = timeline.readable_offset(req.group_id, (name, p))
                if c is not None and asked is not None and c.topic_id is not None and c.topic_id != asked:
                    c = None  # committed for another topic of that name (deleted and recreated)
                if (name, p) in unstable:
                    out.append(OffsetFetchPartition(p, error=E.UNSTABLE_OFFSET_COMMIT))
                elif c is None:
                    out.append(OffsetFetchPartition(p))
                else:
                    out.append(OffsetFetchPartition(p, c.offset, c.leader_epoch, c.metadata))
            topics.append(OffsetFetchTopic(name, tuple(out)))
        return OffsetFetchGroupResult(req.group_id, E.NONE, tuple(topics))

    def forget_partition(self, partition: int) -> None:
        """Pending transactional offsets of the groups of a partition that moved away (the log
        hands them over again when it is loaded)."""
        for pid in list(self.txn_pending):
            by_group = self.txn_pending[pid]
            for gid in [g for g in by_group if self.ctx.partition_for(g) == partition]:
                del by_group[gid]
            if not by_group:
                del self.txn_pending[pid]

    def shutdown(self) -> None:
        """Waiting RequireStable fetches are answered now (the coordinator is inactive)."""
        for waiter in self._stable_fetches:
            self.ctx.respond(waiter.token, self._fetch_now(waiter.request))
        self._stable_fetches.clear()

    # ================================================================ OffsetDelete

    def delete(self, token: int, req: OffsetDeleteRequest) -> None:
        """``deleteOffsets`` (docs/groups.md, "OffsetDelete")."""
        ctx = self.ctx
        err = checks.request(ctx, req.group_id)
        if err is not None:
            ctx.respond(token, OffsetDeleteResult(err))
            return
        group = self.groups.get(req.group_id)
        if group is None:
            ctx.respond(token, OffsetDeleteResult(E.GROUP_ID_NOT_FOUND))
            return
        err = group.validate_offset_delete()
        if err is not None:
            ctx.respond(token, OffsetDeleteResult(err))
            return
        current = ctx.timeline.current_offsets(group.group_id)
        topics: list[TopicErrors] = []
        batch: list[Record] = []
        for name, parts in req.topics:
            if group.is_subscribed_to(name):
                topics.append(TopicErrors(name, tuple((p, E.GROUP_SUBSCRIBED_TO_TOPIC) for p in parts)))
                continue
            for p in parts:
                if current.pop((name, p), None) is not None:
                    batch.append(records.offset_tombstone(group.group_id, name, p))
            topics.append(TopicErrors(name, tuple((p, E.NONE) for p in parts)))
        result = OffsetDeleteResult(E.NONE, tuple(topics))
        if not batch:
            ctx.respond(token, result)
            return
        ctx.append_then_respond(group.partition, batch, token, result, OffsetDeleteResult, groups=(group.group_id,))

    # ================================================= DeleteGroups, deleted topics

    def delete_all(self, group_id: str) -> list[Record]:
        """Tombstones for every offset of the group, those still being written included
        (``deleteAllOffsets``)."""
        return [records.offset_tombstone(group_id, t, p) for (t, p) in self.ctx.timeline.current_offsets(group_id)]

    def topics_deleted(self, topics: list[str]) -> None:
        """Topics were deleted: their committed offsets go, with tombstones
        (``onPartitionsDeleted``; docs/groups.md, "Deleted topics")."""
        ctx = self.ctx
        names = set(topics)
        by_partition: dict[int, list[Record]] = {}
        for gid in ctx.timeline.group_ids_with_offsets():
            gone = [tp for tp in ctx.timeline.current_offsets(gid) if tp[0] in names]
            if gone:
                by_partition.setdefault(ctx.partition_for(gid), []).extend(
                    records.offset_tombstone(gid, t, p) for t, p in gone
                )
        for partition, batch in by_partition.items():
            ctx.append_logged(partition, batch, "deleted-topic tombstones")
        if by_partition:
            ctx.note("offsets of deleted topics removed", topics=sorted(names))

    # ===================================================================== retention

    def expire(self) -> None:
        """One retention pass (``GroupCoordinatorShard.cleanupGroupMetadata``; docs/groups.md,
        "Offsets retention"): expired offsets get tombstones; an Empty group left without
        offsets is deleted."""
        ctx = self.ctx
        by_partition: dict[int, tuple[list[Record], list[Callable[[], None]]]] = {}
        expired_count = 0
        dead: list[str] = []
        for gid in self.groups.ids():
            group = self.groups.get(gid)
            if group is None:
                continue
            batch, reverts = by_partition.setdefault(group.partition, ([], []))
            before = len(batch)
            had_offsets = bool(ctx.timeline.current_offsets(gid))
            if self._cleanup_expired_offsets(group, batch) and group.is_empty():
                reverts.append(
                    self.groups.delete(group, "all offsets expired" if had_offsets else "empty group expired")
                )
                batch.append(records.group_tombstone(gid))
                dead.append(gid)
            expired_count += len(batch) - before
        if expired_count:
            ctx.note("offsets expired", tombstones=expired_count, dead_groups=dead)
        for partition, (batch, reverts) in by_partition.items():
            if not batch:
                continue

            def after(error: ErrorCode | None, reverts: list[Callable[[], None]] = reverts) -> None:
                if error is not None:
                    for revert in reverts:  # the tombstones' offsets came back with the timeline
                        revert()

            ctx.append_logged(partition, batch, "expiry tombstones", after=after)

    def _cleanup_expired_offsets(self, group: G, batch: list[Record]) -> bool:
        """``cleanupExpiredOffsets``: True when the group has no offsets left.  An offset whose
        commit is still being written is judged by that commit (it is applied already)."""
        ctx = self.ctx
        current = ctx.timeline.current_offsets(group.group_id)
        if not current:
            return True
        base = group.offset_expiration_base()
        if base is None:
            return False
        all_expired = True
        for (topic, part), v in current.items():
            if group.is_subscribed_to(topic):
                all_expired = False
                continue
            if v.expire_timestamp is not None:
                expired = ctx.now >= v.expire_timestamp
            else:
                expired = ctx.now - base(v) >= ctx.config.retention_ms
            if expired:
                batch.append(records.offset_tombstone(group.group_id, topic, part))
            else:
                all_expired = False
        return all_expired
