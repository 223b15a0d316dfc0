"""Topics, their partitions' logs, and what persists across restarts.

Why one module of about 840 lines: ``TopicStore`` is the data plane's one owner of topic state
(topics, partitions, producer ids, the metadata file and its group commit), and every handler
reaches it through this one object; the per-partition log, its segment files and their loading
already live in :mod:`.partition`, :mod:`.segment_files` and :mod:`.durable`.

Topic data is kept in segment files under ``data.dir`` (``rallypoint.log.storage=disk``, the
broker's default: :mod:`.segment_files`, loaded at start by :mod:`.durable`), or in memory only
(``memory``).  Topic metadata persists in ``<data.dir>/topics.json`` (written to a new file
then renamed over the old one): each topic's name, id, internal flag, configs, and each
partition's next offset and *reserved* end offset; plus the producer-id block reserved so far.
Metadata changes (create/delete/partition changes, a new producer-id block) are written before
they are acknowledged: the server awaits :meth:`TopicStore.persist` before sending the answer of
a request that changed them, and concurrent changes share one write (group commit), done off the
event loop.  Offsets are written about every second while they move, and on shutdown.  After a
restart each partition is empty with log start offset = its saved next offset and high
watermark = its reserved end (the same after a clean shutdown), so committed consumer offsets
stay valid and no offset is handed out twice, even after a crash.  With durable data the logs
themselves say where each partition ends, and reservations are not used.

End offsets are reserved like producer ids: a partition hands out offsets only below a
reservation already on disk; the periodic save moves each reservation ahead of the partition's
end by its step, and an append that would pass it saves a new one first, synchronously, and
doubles that partition's step.  See docs/data-plane.md, "Restarts".

The number of partitions the broker holds is capped (``rallypoint.max.broker.partitions``,
docs/reliability.md, "Limits"), so neither memory nor the time a restart takes to rebuild
them can grow without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import threading
import uuid
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rallypoint.protocol.errors import ErrorCode

from ..clock import Clock, SystemClock
from ..config import default
from ..logger import get as get_logger
from ..slicing import Slicer
from ..storage.dirlock import lock_exclusive
from . import compaction, durable
from . import configs as topic_configs
from .errors import TopicError
from .fetch_sessions import FetchSessionCache
from .partition import PartitionLog
from .segment_files import SegmentFiles, parse_partition_dir_name, partition_dir_name, remove_leftovers

log = get_logger("rallypoint.topics")

_LEGAL = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_NAME_LENGTH = 249
OFFSETS_TOPIC = "__consumer_offsets"
TRANSACTION_TOPIC = "__transaction_state"
# Kafka's ``Topic.isInternal`` (clients/.../internals/Topic.java).
INTERNAL_TOPICS = frozenset({OFFSETS_TOPIC, TRANSACTION_TOPIC})
METADATA_TOPIC = "__cluster_metadata"

STATE_FILE = "topics.json"
FLUSH_INTERVAL_S = 1.0
RESERVE_STEP = 1000  # offsets a partition's saved end reservation starts ahead of its end
MAX_RESERVE_STEP = 1 << 24
PRODUCER_ID_BLOCK = 1000
# Partition logs built between two checks of the time slice (build_partitions).
PARTITIONS_PER_SLICE = 100


class TopicStateError(Exception):
    """``topics.json`` cannot be loaded within the configured limits (the broker does not start)."""


def validate_topic_name(name: str) -> None:
    """Kafka's ``Topic.validate``: raises TopicError(INVALID_TOPIC_EXCEPTION)."""
    if not name:
        raise TopicError(ErrorCode.INVALID_TOPIC_EXCEPTION, "Topic name is illegal, it can't be empty")
    if name in (".", ".."):
        raise TopicError(ErrorCode.INVALID_TOPIC_EXCEPTION, 'Topic name cannot be "." or ".."')
    if len(name) > MAX_NAME_LENGTH:
        raise TopicError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"Topic name is illegal, it can't be longer than {MAX_NAME_LENGTH} characters",
        )
    if not _LEGAL.match(name):
        raise TopicError(
            ErrorCode.INVALID_TOPIC_EXCEPTION,
            f"Topic name {name!r} is illegal, it contains a character other than ASCII alphanumerics, '.', '_' and '-'",
        )


def _unify(name: str) -> str:
    """``Topic.unifyCollisionChars``: '.' and '_' collide in metric names."""
    return name.replace(".", "_")


@dataclass
class Topic:
    """One topic: its name, id, partition logs and dynamic config overrides."""

    name: str
    topic_id: uuid.UUID
    num_partitions: int
    is_internal: bool = False
    configs: dict[str, str] = field(default_factory=dict)
    partitions: list[PartitionLog] = field(default_factory=list, repr=False)
    policy: topic_configs.LogPolicy | None = field(default=None, repr=False)  # cached by TopicStore.policy

    def __post_init__(self) -> None:
        while len(self.partitions) < self.num_partitions:
            self.partitions.append(PartitionLog(self.name, len(self.partitions)))

    def partition(self, index: int) -> PartitionLog | None:
        if 0 <= index < len(self.partitions):
            return self.partitions[index]
        return None


class TopicStore:
    def __init__(
        self,
        default_partitions: int = default("num.partitions"),
        auto_create: bool = default("auto.create.topics.enable"),
        *,
        data_dir: Path | None = None,
        retention_bytes: int = default("log.retention.bytes"),
        max_message_bytes: int = default("message.max.bytes"),
        max_partitions: int | None = None,
        log_defaults: Mapping[str, Any] | None = None,
        clock: Clock | None = None,
        cleaner_backoff_ms: int = default("log.cleaner.backoff.ms"),
        retention_check_interval_ms: int = default("log.retention.check.interval.ms"),
        max_uncompressed: int = default("rallypoint.max.uncompressed.batch.bytes"),
        log_storage: str = "memory",
    ) -> None:
        self.default_partitions = default_partitions
        # Most partitions the broker holds, all topics together (None: no cap).
        self.max_partitions = max_partitions
        self._partition_count = 0
        self.auto_create = auto_create
        self.retention_bytes = retention_bytes
        self.max_message_bytes = max_message_bytes
        # broker settings that supply topic config defaults (topic_configs.BROKER_DEFAULTS)
        self._log_defaults = {k: default(k) for k in topic_configs.BROKER_DEFAULTS.values()}
        self._log_defaults.update(log_defaults or {})
        self._log_defaults["log.retention.bytes"] = retention_bytes
        self._log_defaults["message.max.bytes"] = max_message_bytes
        self.clock: Clock = clock or SystemClock()
        self.cleaner_backoff_ms = cleaner_backoff_ms
        self.retention_check_interval_ms = retention_check_interval_ms
        self.max_uncompressed = max_uncompressed
        self._cleaner: asyncio.Task[None] | None = None
        self.data_dir = data_dir
        # topic data in segment files (the broker's default; unit tests build memory stores)
        self.durable = data_dir is not None and log_storage == "disk"
        self._lock_fd: int | None = None
        self._log_starts_saved: dict[tuple[str, int], int] = {}
        # DeleteRecords writes the checkpoint from worker threads (several at once when several
        # connections delete records) while the periodic duty writes it on the event loop: one
        # writer at a time, or two would race for the one temporary file
        self._log_starts_lock = threading.Lock()
        self.load_report: durable.LoadReport | None = None
        self._topics: dict[str, Topic] = {}
        self._by_id: dict[uuid.UUID, Topic] = {}
        self._unified: dict[str, set[str]] = {}
        self._next_producer_id = 0
        self._producer_id_limit = 0  # first id not yet reserved on disk
        self._write_lock = threading.Lock()
        self._generation = 0
        self._written_generation = 0
        self._saved_fingerprint: tuple[int, ...] = ()
        self._mutations = 0  # metadata changes made in memory so far
        self._persisted = 0  # ... of which this many are known to be on disk
        self._writing: asyncio.Future[None] | None = None
        self._flusher: asyncio.Task[None] | None = None
        self._steps: weakref.WeakKeyDictionary[PartitionLog, int] = weakref.WeakKeyDictionary()
        self.closing = False
        self.fetch_sessions = FetchSessionCache()
        if data_dir is not None:
            self._load()

    # ------------------------------------------------------------------ lookup

    def get(self, name: str) -> Topic | None:
        return self._topics.get(name)

    def by_id(self, topic_id: uuid.UUID) -> Topic | None:
        return self._by_id.get(topic_id)

    def all(self) -> list[Topic]:
        return list(self._topics.values())

    def partition(self, name: str, index: int) -> PartitionLog | None:
        t = self._topics.get(name)
        return t.partition(index) if t is not None else None

    def partitions(self) -> Iterator[PartitionLog]:
        for t in self._topics.values():
            yield from t.partitions

    def policy(self, topic: Topic) -> topic_configs.LogPolicy:
        """The topic's retention, segment and compaction settings (cached until its configs change)."""
        p = topic.policy
        if p is None:
            p = topic.policy = topic_configs.policy(topic.configs, self._log_defaults)
        return p

    def max_message_bytes_for(self, topic: Topic) -> int:
        v = topic.configs.get("max.message.bytes")
        return int(v) if v is not None else self.max_message_bytes

    @property
    def partition_count(self) -> int:
        """Partitions of all topics together (internal ones included)."""
        return self._partition_count

    def check_partition_budget(self, additional: int, planned: int = 0) -> None:
        """POLICY_VIOLATION when ``additional`` more partitions (on top of ``planned`` ones
        already promised in the same request) would exceed ``rallypoint.max.broker.partitions``.

        Kafka has no such broker-wide cap (KIP-578 proposed one and was not adopted); its
        answer to a request a policy refuses is POLICY_VIOLATION, so that is ours.
        """
        limit = self.max_partitions
        if limit is not None and self._partition_count + planned + additional > limit:
            raise TopicError(
                ErrorCode.POLICY_VIOLATION,
                f"Adding {additional} partition(s) would exceed this broker's limit of {limit} partitions "
                f"(rallypoint.max.broker.partitions); it holds {self._partition_count}.",
            )

    def broker_values(self) -> dict[str, Any]:
        return dict(self._log_defaults)

    # ------------------------------------------------------------------ create / delete

    def check_create(self, name: str, num_partitions: int | None, configs: Mapping[str, str | None] | None) -> int:
        """Kafka's checks for a new topic; returns the partition count to use."""
        validate_topic_name(name)
        if name == METADATA_TOPIC:
            raise TopicError(ErrorCode.INVALID_REQUEST, f"Creation of internal topic {METADATA_TOPIC} is prohibited.")
        if name in self._topics:
            raise TopicError(ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.")
        colliding = self._unified.get(_unify(name))
        if colliding:
            raise TopicError(
                ErrorCode.INVALID_TOPIC_EXCEPTION,
                f"Topic '{name}' collides with existing topic: {sorted(colliding)[0]}",
            )
        n = self.default_partitions if num_partitions is None or num_partitions == -1 else num_partitions
        if n <= 0:
            raise TopicError(
                ErrorCode.INVALID_PARTITIONS, "Number of partitions was set to an invalid non-positive value."
            )
        if configs:
            topic_configs.validate(configs)
        return n

    def create(
        self,
        name: str,
        num_partitions: int | None = None,
        *,
        is_internal: bool = False,
        topic_id: uuid.UUID | None = None,
        configs: Mapping[str, str | None] | None = None,
        partitions: list[PartitionLog] | None = None,
    ) -> Topic:
        """Create a topic (TopicError on Kafka's refusals).

        Creating an internal topic that already exists returns the existing one, so the
        group coordinator's start-up ``create("__consumer_offsets", n, is_internal=True)`` works
        after a restart restored it from disk.  Internal topics are exempt from the broker's
        partition cap (the coordinator needs them); they still count towards it.
        ``partitions``: logs already built by :meth:`build_partitions`."""
        existing = self._topics.get(name)
        if existing is not None and is_internal and existing.is_internal:
            return existing
        n = self.check_create(name, num_partitions, configs)
        internal = is_internal or name in INTERNAL_TOPICS
        if not internal:
            self.check_partition_budget(n)
        clean = {k: v for k, v in (configs or {}).items() if v is not None}
        topic = Topic(name, topic_id or uuid.uuid4(), n, internal, clean, partitions or [])
        self._add(topic)
        self._attach(topic.partitions)
        log.info("topic created", topic=name, partitions=n, topic_id=str(topic.topic_id), internal=topic.is_internal)
        self._changed()
        return topic

    @staticmethod
    async def build_partitions(name: str, count: int, start: int = 0) -> list[PartitionLog]:
        """Empty partition logs ``start`` .. ``start + count - 1`` of topic ``name``, built in
        slices that yield to the event loop (a large topic does not stall other connections)."""
        out: list[PartitionLog] = []
        slicer = Slicer()
        for first in range(start, start + count, PARTITIONS_PER_SLICE):
            out.extend(PartitionLog(name, i) for i in range(first, min(first + PARTITIONS_PER_SLICE, start + count)))
            await slicer.tick()
        return out

    def _add(self, topic: Topic) -> None:
        self._topics[topic.name] = topic
        self._by_id[topic.topic_id] = topic
        self._unified.setdefault(_unify(topic.name), set()).add(topic.name)
        self._partition_count += len(topic.partitions)

    def auto_create_topic(self, name: str) -> Topic:
        """Auto-creation (Metadata): ``num.partitions`` partitions, default configs."""
        existing = self._topics.get(name)
        if existing is not None:
            return existing
        return self.create(name)

    def set_configs(self, name: str, configs: Mapping[str, str]) -> None:
        """Make ``configs`` (already validated) the topic's dynamic configs: saved before the
        request that changed them is answered (the server awaits :meth:`persist`)."""
        topic = self._topics[name]
        topic.configs = dict(configs)
        topic.policy = None
        self._changed()

    def delete(self, name: str) -> Topic:
        topic = self._topics.get(name)
        if topic is None:
            raise TopicError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "This server does not host this topic-partition.")
        return self._remove(topic)

    def delete_by_id(self, topic_id: uuid.UUID) -> Topic:
        topic = self._by_id.get(topic_id)
        if topic is None:
            raise TopicError(ErrorCode.UNKNOWN_TOPIC_ID, "This server does not host this topic ID.")
        return self._remove(topic)

    def _remove(self, topic: Topic) -> Topic:
        del self._topics[topic.name]
        self._by_id.pop(topic.topic_id, None)
        names = self._unified.get(_unify(topic.name))
        if names is not None:
            names.discard(topic.name)
            if not names:
                del self._unified[_unify(topic.name)]
        self._partition_count -= len(topic.partitions)
        for p in topic.partitions:
            p.deleted = True
            p.notify()
            if p.files is not None:
                try:
                    p.files.delete()
                except OSError as e:  # the next start removes what is left (a -delete directory)
                    log.error("could not delete partition directory", topic=topic.name, error=str(e))
        log.info("topic deleted", topic=topic.name, topic_id=str(topic.topic_id))
        self._changed()
        return topic

    def check_add_partitions(self, name: str, count: int) -> Topic:
        """``ReplicationControlManager.createPartitions`` checks."""
        topic = self._topics.get(name)
        if topic is None:
            raise TopicError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "This server does not host this topic-partition.")
        current = topic.num_partitions
        if count == current:
            raise TopicError(ErrorCode.INVALID_PARTITIONS, f"Topic already has {current} partition(s).")
        if count < current:
            raise TopicError(
                ErrorCode.INVALID_PARTITIONS,
                f"The topic {name} currently has {current} partition(s); {count} would not be an increase.",
            )
        return topic

    def add_partitions(self, name: str, count: int, partitions: list[PartitionLog] | None = None) -> Topic:
        """Grow ``name`` to ``count`` partitions (``partitions``: the new logs, already built
        by :meth:`build_partitions`)."""
        topic = self.check_add_partitions(name, count)
        if not topic.is_internal:
            self.check_partition_budget(count - topic.num_partitions)
        before = len(topic.partitions)
        if partitions and partitions[0].partition == before:
            topic.partitions.extend(partitions[: count - before])
        while len(topic.partitions) < count:
            topic.partitions.append(PartitionLog(topic.name, len(topic.partitions)))
        self._attach(topic.partitions)
        topic.num_partitions = count
        self._partition_count += len(topic.partitions) - before
        log.info("partitions added", topic=name, partitions=count)
        self._changed()
        return topic

    # ------------------------------------------------------------------ producer ids

    def next_producer_id(self) -> int:
        """A fresh producer id; ids are reserved on disk in blocks, like Kafka's controller."""
        if self._next_producer_id >= self._producer_id_limit:
            self._producer_id_limit = self._next_producer_id + PRODUCER_ID_BLOCK
            self._changed()
        pid = self._next_producer_id
        self._next_producer_id += 1
        return pid

    # ------------------------------------------------------------------ life cycle

    async def start(self) -> None:
        if self.durable:
            self._lock_data_dir()
            await asyncio.to_thread(self.load_logs)
        if self.data_dir is not None:
            self._flusher = asyncio.create_task(self._flush_loop(), name="topics-flusher")
        self._cleaner = asyncio.create_task(self._cleaner_loop(), name="log-cleaner")

    def begin_shutdown(self) -> None:
        """Release parked fetches so they answer at once."""
        self.closing = True
        for p in self.partitions():
            p.notify()

    async def stop(self) -> None:
        self.begin_shutdown()
        if self._cleaner is not None:
            self._cleaner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._cleaner
            self._cleaner = None
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
            self._flusher = None
        if self.data_dir is not None:
            self.save_now(final=True)
        if self.durable and self._lock_fd is not None:
            self.close_logs()

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_INTERVAL_S)
            if self.durable:
                self._flush_due()
            if self._persisted < self._mutations or self._fingerprint() != self._saved_fingerprint:
                try:
                    await self._write_async()
                except OSError as e:  # e.g. a full disk: retried at the next tick
                    log.error("could not save topic state", error=str(e))
                except Exception:
                    log.exception("could not save topic state")

    # ------------------------------------------------------------------ retention and cleaning

    async def _cleaner_loop(self) -> None:
        """Time-based retention every ``log.retention.check.interval.ms`` and the log cleaner
        every ``log.cleaner.backoff.ms`` (both on the broker's clock, so the control plane's
        clock advance counts), one partition at a time between yields."""
        next_retention = next_clean = 0.0
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            if now >= next_retention:
                next_retention = now + self.retention_check_interval_ms / 1000
                await self._sweep(clean=False)
            if now >= next_clean:
                next_clean = now + self.cleaner_backoff_ms / 1000
                await self._sweep(clean=True)
            await asyncio.sleep(max(0.001, min(next_retention, next_clean) - loop.time()))

    async def _sweep(self, *, clean: bool) -> None:
        for topic in list(self._topics.values()):
            if topic.is_internal or topic.name not in self._topics:
                continue
            p = self.policy(topic)
            if not (p.compact if clean else p.delete and p.retention_ms >= 0):
                continue
            for plog in topic.partitions:
                if plog.deleted:
                    continue
                try:
                    if clean:
                        await self.clean_partition_async(plog, p)
                    else:
                        self.expire_partition(plog, p)
                except Exception:  # one bad partition must not stop the cleaner for the others
                    log.exception("log cleaning failed", topic=topic.name, partition=plog.partition)
                await asyncio.sleep(0)

    def expire_partition(self, plog: PartitionLog, p: topic_configs.LogPolicy) -> int:
        """``retention.ms`` for one partition now; returns how many batches went."""
        gone = plog.expire(self.clock.now_ms(), p.retention_ms)
        if gone:
            log.info(
                "retention deleted batches",
                topic=plog.topic,
                partition=plog.partition,
                batches=gone,
                log_start_offset=plog.log_start_offset,
            )
        return gone

    def clean_partition(self, plog: PartitionLog, p: topic_configs.LogPolicy, *, force: bool = False) -> bool:
        """Clean one compacted partition now if it needs it (or ``force``); True if a pass ran."""
        now = self.clock.now_ms()
        if not force and not plog.needs_cleaning(now, p):
            return False
        self._log_cleaned(plog, plog.clean(now, p, self.max_uncompressed))
        return True

    async def clean_partition_async(self, plog: PartitionLog, p: topic_configs.LogPolicy) -> bool:
        """:meth:`clean_partition` with the pass itself in a worker thread, so the event loop
        keeps serving while a large partition is compacted (its work grows with the partition's
        bytes, which ``log.retention.bytes`` bounds)."""
        now = self.clock.now_ms()
        if not plog.needs_cleaning(now, p):
            return False
        job = plog.clean_job(now, p, self.max_uncompressed)
        loop = asyncio.get_running_loop()
        try:
            result = await loop.run_in_executor(None, job.run)
            # on disk the cleaned segment is written off the loop too; only renames are left
            staged = await loop.run_in_executor(None, plog.stage_clean, job, result)
        except OSError:
            if plog.deleted or job.version != plog.layout_version:
                return False  # a segment it read went meanwhile (deletion, retention): the next pass starts again
            raise
        if plog.deleted or not plog.apply_clean(job, result, staged):
            if staged is not None:
                staged[0].unlink(missing_ok=True)
            return False
        self._log_cleaned(plog, result)
        return True

    def _log_cleaned(self, plog: PartitionLog, r: compaction.Cleaned) -> None:
        log.info(
            "log cleaned",
            topic=plog.topic,
            partition=plog.partition,
            records_removed=r.records_removed,
            tombstones_removed=r.tombstones_removed,
            bytes_before=r.bytes_before,
            bytes_after=r.bytes_after,
            first_dirty_offset=plog.first_dirty,
        )

    # ------------------------------------------------------------------ persistence

    @property
    def mutations(self) -> int:
        """A counter of metadata changes: the server compares it around a request to know
        whether the answer must wait for :meth:`persist`."""
        return self._mutations

    def _changed(self) -> None:
        """A metadata change was made in memory; it must be on disk before it is acknowledged.

        In the broker (an event loop runs) the write is left to :meth:`persist`, which the
        server awaits before answering, so many changes share one write.  Without a loop
        (tools, unit tests) it is written at once."""
        self._mutations += 1
        if self.data_dir is None:
            self._persisted = self._mutations
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self.save_now()

    async def persist(self) -> None:
        """Return once every metadata change made before the call is on disk.

        Group commit: while a write is under way, callers wait for it and then check whether
        it covered their change; one new write then covers everyone still waiting.  The file
        is written and fsynced in a worker thread, off the event loop.  Raises what the write
        raised (the caller answers with an error)."""
        if self.data_dir is None:
            return
        target = self._mutations
        while self._persisted < target:
            if self._writing is not None:
                await asyncio.shield(self._writing)
                continue
            await self._write_async()

    async def _write_async(self) -> None:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._writing = done
        try:
            covered = self._mutations
            snapshot, gen, fp, reserved = self._snapshot()
            await asyncio.to_thread(self._write, snapshot, gen, reserved)
            self._persisted = max(self._persisted, covered)
            self._saved_fingerprint = fp
        finally:
            if self._writing is done:
                self._writing = None
            done.set_result(None)

    def _attach(self, partitions: list[PartitionLog]) -> None:
        if self.data_dir is None:
            return
        if self.durable:
            for p in partitions:
                topic = self._topics.get(p.topic)
                if p.files is None and topic is not None and not topic.is_internal:
                    p.files = SegmentFiles(self.data_dir / partition_dir_name(p.topic, p.partition), topic.topic_id)
            return
        for p in partitions:
            p.on_reserve = self._reserve_now

    def _reserve_now(self, partition: PartitionLog, end: int) -> None:
        """An append would hand out offsets up to ``end``, past the saved reservation: save a
        new one before it does (on the event loop, like the producer-id block)."""
        self._steps[partition] = min(2 * self._steps.get(partition, RESERVE_STEP), MAX_RESERVE_STEP)
        log.info("end offset reservation", topic=partition.topic, partition=partition.partition, end=end)
        self.save_now(need=(partition, end))

    def _fingerprint(self) -> tuple[int, ...]:
        return tuple(p.next_offset for p in self.partitions())

    def _reservation(self, p: PartitionLog, final: bool, need: tuple[PartitionLog, int] | None) -> int:
        if final or p.files is not None:
            return p.next_offset
        end = max(p.next_offset, need[1]) if need is not None and need[0] is p else p.next_offset
        return max(p.reserved_end or 0, end + self._steps.get(p, RESERVE_STEP))

    def _snapshot(
        self, final: bool = False, need: tuple[PartitionLog, int] | None = None
    ) -> tuple[dict[str, Any], int, tuple[int, ...], list[tuple[PartitionLog, int]]]:
        """The state to save, its generation, the offsets it covers, and each partition's
        reservation in it (``final``: exactly its end, for a clean shutdown)."""
        self._generation += 1
        reserved = [(p, self._reservation(p, final, need)) for t in self._topics.values() for p in t.partitions]
        it = iter(r for _p, r in reserved)
        state = {
            "version": 1,
            "producer_id_limit": self._producer_id_limit,
            "topics": [
                {
                    "name": t.name,
                    "topic_id": str(t.topic_id),
                    "is_internal": t.is_internal,
                    "configs": t.configs,
                    "next_offsets": [p.next_offset for p in t.partitions],
                    "reserved_offsets": [next(it) for _p in t.partitions],
                }
                for t in self._topics.values()
            ],
        }
        return state, self._generation, self._fingerprint(), reserved

    def save_now(self, final: bool = False, need: tuple[PartitionLog, int] | None = None) -> None:
        """Write the whole state at once, on the calling thread (shutdown, an end-offset
        reservation, tools, unit tests)."""
        if self.data_dir is None:
            return
        covered = self._mutations
        snapshot, gen, fp, reserved = self._snapshot(final, need)
        self._write(snapshot, gen, reserved)
        self._persisted = max(self._persisted, covered)
        self._saved_fingerprint = fp

    def _write(self, state: dict[str, Any], generation: int, reserved: list[tuple[PartitionLog, int]]) -> None:
        assert self.data_dir is not None
        with self._write_lock:
            if generation <= self._written_generation:
                return  # a newer snapshot is already on disk (with reservations at least as high)
            path = self.data_dir / STATE_FILE
            tmp = path.with_name(f"{STATE_FILE}.{generation}.tmp")
            with open(tmp, "w") as f:
                json.dump(state, f, separators=(",", ":"))
                f.flush()
                os.fsync(f.fileno())
            tmp.replace(path)
            self._written_generation = generation
            # What is on disk now bounds the offsets partitions may hand out.
            for p, r in reserved:
                p.reserved_end = r

    def _load(self) -> None:
        assert self.data_dir is not None
        self.data_dir.mkdir(parents=True, exist_ok=True)
        for stale in self.data_dir.glob(f"{STATE_FILE}.*.tmp"):
            with contextlib.suppress(OSError):
                stale.unlink()
        path = self.data_dir / STATE_FILE
        if not path.exists():
            return
        state = json.loads(path.read_text())
        entries = state.get("topics", [])
        total = sum(len(entry["next_offsets"]) for entry in entries)
        if self.max_partitions is not None and total > self.max_partitions:
            # Rebuilding them would take memory and start-up time beyond the configured bound.
            raise TopicStateError(
                f"{path} holds {total} partitions, more than rallypoint.max.broker.partitions="
                f"{self.max_partitions}; raise that limit or remove the file"
            )
        limit = int(state.get("producer_id_limit", 0))
        # Ids handed out before the restart all lie below the reserved limit.
        self._next_producer_id = self._producer_id_limit = limit
        for entry in entries:
            offsets = [int(o) for o in entry["next_offsets"]]
            # After a crash, offsets up to the reservation may have been handed out: start there.
            ends = [max(int(r), o) for r, o in zip(entry.get("reserved_offsets", offsets), offsets, strict=True)]
            partitions = []
            for i, (o, e) in enumerate(zip(offsets, ends, strict=True)):
                p = PartitionLog(entry["name"], i, o, e)
                p.reserved_end = e
                partitions.append(p)
            topic = Topic(
                entry["name"],
                uuid.UUID(entry["topic_id"]),
                len(offsets),
                bool(entry.get("is_internal", False)),
                dict(entry.get("configs", {})),
                partitions,
            )
            self._add(topic)
            self._attach(topic.partitions)
        self._saved_fingerprint = self._fingerprint()
        log.info("topic state loaded", topics=len(self._topics), path=str(path))

    # ------------------------------------------------------------------ durable topic data

    def _lock_data_dir(self) -> None:
        """Hold ``<data.dir>/.lock`` (as Kafka locks a log dir): two brokers writing one
        partition's segments would corrupt them."""
        assert self.data_dir is not None
        self.data_dir.mkdir(parents=True, exist_ok=True)
        path = self.data_dir / durable.LOCK_FILE
        fd = lock_exclusive(path)
        if fd is None:
            raise TopicStateError(
                f"{path} is locked: another rallypoint process is using the data directory {self.data_dir}"
            )
        self._lock_fd = fd

    def load_logs(self) -> durable.LoadReport:
        """Load every partition's segments (recovering them after a crash): the rules are in
        :mod:`.durable`.  Runs before the broker listens."""
        assert self.data_dir is not None
        import time

        t0 = time.monotonic()
        for gone in remove_leftovers(self.data_dir):
            log.info("interrupted deletion finished", path=str(gone))
        report = durable.LoadReport(clean_shutdown=durable.load_clean_marker(self.data_dir))
        starts = durable.read_checkpoint(self.data_dir / durable.LOG_START_CHECKPOINT)
        points = durable.read_checkpoint(self.data_dir / durable.RECOVERY_POINT_CHECKPOINT)
        now = self.clock.now_ms()
        for topic in self._topics.values():
            if topic.is_internal:
                continue
            for i, old in enumerate(topic.partitions):
                topic.partitions[i] = durable.open_partition(
                    self.data_dir / partition_dir_name(topic.name, i),
                    topic.name,
                    i,
                    topic.topic_id,
                    saved_next=old.next_offset,
                    log_start=starts.get((topic.name, i)),
                    recovery_point=points.get((topic.name, i)),
                    clean=report.clean_shutdown,
                    now_ms=now,
                    report=report,
                )
        for entry in self.data_dir.iterdir():
            parsed = parse_partition_dir_name(entry.name)
            if parsed is None or not entry.is_dir() or parsed[0] in INTERNAL_TOPICS:
                continue
            t = self._topics.get(parsed[0])
            if t is None or parsed[1] >= len(t.partitions):
                log.warning("stray partition directory left alone", path=str(entry))
        self._log_starts_saved = self._log_starts()
        report.millis = durable.elapsed_ms(t0)
        self.load_report = report
        log.info(
            "topic data loaded",
            partitions=report.partitions,
            segments=report.segments,
            batches=report.batches,
            bytes=report.bytes,
            truncated=len(report.truncated),
            clean_shutdown=report.clean_shutdown,
            ms=report.millis,
        )
        return report

    def _durable_partitions(self) -> Iterator[PartitionLog]:
        for p in self.partitions():
            if p.files is not None:
                yield p

    def _log_starts(self) -> dict[tuple[str, int], int]:
        return {(p.topic, p.partition): p.log_start_offset for p in self._durable_partitions()}

    def save_log_starts(self) -> None:
        """Write ``log-start-offset-checkpoint`` if a log start moved since the last write."""
        if not self.durable or self.data_dir is None:
            return
        with self._log_starts_lock:
            starts = self._log_starts()
            if starts != self._log_starts_saved:
                durable.write_checkpoint(self.data_dir / durable.LOG_START_CHECKPOINT, starts)
                self._log_starts_saved = starts

    async def save_log_starts_async(self) -> None:
        """DeleteRecords: the new log start offsets are on disk before the answer."""
        if self.durable:
            await asyncio.to_thread(self.save_log_starts)

    def _flush_due(self) -> None:
        """The periodic duties of durable logs: ``flush.ms``, and the log-start checkpoint."""
        now = self.clock.now_ms()
        for topic in self._topics.values():
            if topic.is_internal:
                continue
            p = self.policy(topic)
            for plog in topic.partitions:
                try:
                    plog.flush(now, p)
                except OSError as e:
                    log.error("could not flush partition", topic=topic.name, partition=plog.partition, error=str(e))
        try:
            self.save_log_starts()
        except OSError as e:
            log.error("could not save log start offsets", error=str(e))

    def close_logs(self) -> None:
        """Clean shutdown: every active segment fsynced and closed, the checkpoints written, then
        ``.kafka_cleanshutdown`` (the next start trusts the segments without checking CRCs)."""
        assert self.data_dir is not None
        try:
            points = {}
            for p in self._durable_partitions():
                assert p.files is not None
                p.files.close(sync=True)
                points[(p.topic, p.partition)] = p.next_offset
            durable.write_checkpoint(self.data_dir / durable.RECOVERY_POINT_CHECKPOINT, points)
            durable.write_checkpoint(self.data_dir / durable.LOG_START_CHECKPOINT, self._log_starts())
            durable.mark_clean(self.data_dir)
        except OSError as e:
            log.error("unclean shutdown of topic data", error=str(e))
        finally:
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None
