"""Topics and their partitions (metadata part; the data plane grows here)."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field

from protocol.errors import ErrorCode

_LEGAL = re.compile(r"^[a-zA-Z0-9._-]+$")
MAX_NAME_LENGTH = 249
OFFSETS_TOPIC = "__consumer_offsets"


class TopicError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


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


@dataclass
class Topic:
    name: str
    topic_id: uuid.UUID
    num_partitions: int
    is_internal: bool = False
    configs: dict[str, str] = field(default_factory=dict)


class TopicStore:
    def __init__(self, default_partitions: int = 1, auto_create: bool = True) -> None:
        self.default_partitions = default_partitions
        self.auto_create = auto_create
        self._topics: dict[str, Topic] = {}
        self._by_id: dict[uuid.UUID, Topic] = {}

    def get(self, name: str) -> Topic | None:
        return self._topics.get(name)

    def by_id(self, topic_id: uuid.UUID) -> Topic | None:
        return self._by_id.get(topic_id)

    def all(self) -> list[Topic]:
        return list(self._topics.values())

    def create(
        self,
        name: str,
        num_partitions: int | None = None,
        *,
        is_internal: bool = False,
        topic_id: uuid.UUID | None = None,
        configs: dict[str, str] | None = None,
    ) -> Topic:
        validate_topic_name(name)
        if name in self._topics:
            raise TopicError(ErrorCode.TOPIC_ALREADY_EXISTS, f"Topic '{name}' already exists.")
        n = self.default_partitions if num_partitions is None or num_partitions == -1 else num_partitions
        if n <= 0:
            raise TopicError(ErrorCode.INVALID_PARTITIONS, "Number of partitions must be larger than 0.")
        topic = Topic(name, topic_id or uuid.uuid4(), n, is_internal, dict(configs or {}))
        self._topics[name] = topic
        self._by_id[topic.topic_id] = topic
        return topic

    def delete(self, name: str) -> Topic:
        topic = self._topics.pop(name, None)
        if topic is None:
            raise TopicError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"Topic '{name}' does not exist")
        self._by_id.pop(topic.topic_id, None)
        return topic
