"""Topics, their partitions' logs, and the little that persists across restarts.

Data is in memory only.  What persists, in ``<data.dir>/topics.json`` (written to a new file
then renamed over the old one): each topic's name, id, internal flag, configs, and each
partition's next offset; plus the producer-id block reserved so far.  It is written at once
on create/delete/partition changes, about every second while offsets move, and on shutdown.
After a restart each partition is empty with log start offset = high watermark = its saved
next offset, so committed consumer offsets stay valid.  See docs/data-plane.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import threading
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rallypoint.protocol.errors import ErrorCode

from ..config import default
from ..logger import get as get_logger
from . import configs as topic_configs
from .errors import TopicError
from .fetch_sessions import FetchSessionCache
from .partition import PartitionLog

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
PRODUCER_ID_BLOCK = 1000


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
    name: str
    topic_id: uuid.UUID
    num_partitions: int
    is_internal: bool = False
    configs: dict[str, str] = field(default_factory=dict)
    partitions: list[PartitionLog] = field(default_factory=list, repr=False)

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
    ) -> None:
        self.default_partitions = default_partitions
        self.auto_create = auto_create
        self.retention_bytes = retention_bytes
        self.max_message_bytes = max_message_bytes
        self.data_dir = data_dir
        self._topics: dict[str, Topic] = {}
        self._by_id: dict[uuid.UUID, Topic] = {}
        self._unified: dict[str, set[str]] = {}
        self._next_producer_id = 0
        self._producer_id_limit = 0  # first id not yet reserved on disk
        self._write_lock = threading.Lock()
        self._generation = 0
        self._written_generation = 0
        self._saved_fingerprint: tuple[int, ...] = ()
        self._flusher: asyncio.Task[None] | None = None
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

    def retention_bytes_for(self, topic: Topic) -> int:
        v = topic.configs.get("retention.bytes")
        return int(v) if v is not None else self.retention_bytes

    def max_message_bytes_for(self, topic: Topic) -> int:
        v = topic.configs.get("max.message.bytes")
        return int(v) if v is not None else self.max_message_bytes

    def broker_values(self) -> dict[str, Any]:
        return {"log.retention.bytes": self.retention_bytes, "message.max.bytes": self.max_message_bytes}

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
    ) -> Topic:
        """Create a topic (TopicError on Kafka's refusals).

        Creating an internal topic that already exists returns the existing one, so the
        group coordinator's start-up ``create("__consumer_offsets", n, is_internal=True)`` works
        after a restart restored it from disk."""
        existing = self._topics.get(name)
        if existing is not None and is_internal and existing.is_internal:
            return existing
        n = self.check_create(name, num_partitions, configs)
        clean = {k: v for k, v in (configs or {}).items() if v is not None}
        topic = Topic(name, topic_id or uuid.uuid4(), n, is_internal or name in INTERNAL_TOPICS, clean)
        self._add(topic)
        log.info("topic created", topic=name, partitions=n, topic_id=str(topic.topic_id), internal=topic.is_internal)
        self.save_now()
        return topic

    def _add(self, topic: Topic) -> None:
        self._topics[topic.name] = topic
        self._by_id[topic.topic_id] = topic
        self._unified.setdefault(_unify(topic.name), set()).add(topic.name)

    def auto_create_topic(self, name: str) -> Topic:
        """Auto-creation (Metadata): ``num.partitions`` partitions, default configs."""
        existing = self._topics.get(name)
        if existing is not None:
            return existing
        return self.create(name)

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
        for p in topic.partitions:
            p.deleted = True
            p.notify()
        log.info("topic deleted", topic=topic.name, topic_id=str(topic.topic_id))
        self.save_now()
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

    def add_partitions(self, name: str, count: int) -> Topic:
        topic = self.check_add_partitions(name, count)
        while len(topic.partitions) < count:
            topic.partitions.append(PartitionLog(topic.name, len(topic.partitions)))
        topic.num_partitions = count
        log.info("partitions added", topic=name, partitions=count)
        self.save_now()
        return topic

    # ------------------------------------------------------------------ producer ids

    def next_producer_id(self) -> int:
        """A fresh producer id; ids are reserved on disk in blocks, like Kafka's controller."""
        if self._next_producer_id >= self._producer_id_limit:
            self._producer_id_limit = self._next_producer_id + PRODUCER_ID_BLOCK
            self.save_now()
        pid = self._next_producer_id
        self._next_producer_id += 1
        return pid

    # ------------------------------------------------------------------ life cycle

    async def start(self) -> None:
        if self.data_dir is not None:
            self._flusher = asyncio.create_task(self._flush_loop(), name="topics-flusher")

    def begin_shutdown(self) -> None:
        """Release parked fetches so they answer at once."""
        self.closing = True
        for p in self.partitions():
            p.notify()

    async def stop(self) -> None:
        self.begin_shutdown()
        if self._flusher is not None:
            self._flusher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flusher
            self._flusher = None
        if self.data_dir is not None:
            self.save_now()

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_INTERVAL_S)
            if self._fingerprint() != self._saved_fingerprint:
                try:
                    snapshot, gen, fp = self._snapshot()
                    await asyncio.to_thread(self._write, snapshot, gen)
                    self._saved_fingerprint = fp
                except Exception:
                    log.exception("could not save topic state")

    # ------------------------------------------------------------------ persistence

    def _fingerprint(self) -> tuple[int, ...]:
        return tuple(p.next_offset for p in self.partitions())

    def _snapshot(self) -> tuple[dict[str, Any], int, tuple[int, ...]]:
        self._generation += 1
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
                }
                for t in self._topics.values()
            ],
        }
        return state, self._generation, self._fingerprint()

    def save_now(self) -> None:
        if self.data_dir is None:
            return
        snapshot, gen, fp = self._snapshot()
        self._write(snapshot, gen)
        self._saved_fingerprint = fp

    def _write(self, state: dict[str, Any], generation: int) -> None:
        assert self.data_dir is not None
        with self._write_lock:
            if generation <= self._written_generation:
                return  # a newer snapshot is already on disk
            path = self.data_dir / STATE_FILE
            tmp = path.with_name(f"{STATE_FILE}.{generation}.tmp")
            with open(tmp, "w") as f:
                json.dump(state, f, separators=(",", ":"))
                f.flush()
                os.fsync(f.fileno())
            tmp.replace(path)
            self._written_generation = generation

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
        limit = int(state.get("producer_id_limit", 0))
        # Ids handed out before the restart all lie below the reserved limit.
        self._next_producer_id = self._producer_id_limit = limit
        for entry in state.get("topics", []):
            offsets = [int(o) for o in entry["next_offsets"]]
            topic = Topic(
                entry["name"],
                uuid.UUID(entry["topic_id"]),
                len(offsets),
                bool(entry.get("is_internal", False)),
                dict(entry.get("configs", {})),
                [PartitionLog(entry["name"], i, o) for i, o in enumerate(offsets)],
            )
            self._add(topic)
        self._saved_fingerprint = self._fingerprint()
        log.info("topic state loaded", topics=len(self._topics), path=str(path))
