"""The classic consumer embedded protocol (protocol type ``"consumer"``).

These are the opaque bytes a consumer puts in JoinGroup's protocol metadata (the *subscription*)
and a leader hands out in SyncGroup (the *assignment*); the group coordinator stores them as
``subscription`` / ``assignment`` of each member in a GroupMetadataValue (spec §B.2).

Schemas (``clients/src/main/resources/common/message/ConsumerProtocol{Subscription,Assignment}.json``),
version-prefixed (int16), classic non-flexible encoding::

    ConsumerProtocolSubscription v0-3
      topics           ARRAY of STRING            v0+
      userData         NULLABLE BYTES             v0+
      ownedPartitions  ARRAY of {topic STRING,    v1+
                                 partitions ARRAY of INT32}
      generationId     INT32 (default -1)         v2+
      rackId           NULLABLE STRING            v3+

    ConsumerProtocolAssignment v0-3
      assignedPartitions ARRAY of {topic STRING, partitions ARRAY of INT32}   v0+
      userData           NULLABLE BYTES                                       v0+

Like Kafka's ``ConsumerProtocol.deserialize*`` a version above the newest known one is read with
the newest schema (forward compatibility: newer versions only append fields); a negative version
is an error.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

LATEST_VERSION = 3

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


class ConsumerProtocolError(ValueError):
    """The bytes are not a valid consumer-protocol subscription or assignment."""


@dataclass(frozen=True, slots=True)
class TopicPartitions:
    topic: str
    partitions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Subscription:
    version: int
    topics: tuple[str, ...]
    user_data: bytes | None = None
    owned_partitions: tuple[TopicPartitions, ...] = field(default_factory=tuple)
    generation_id: int = -1
    rack_id: str | None = None


@dataclass(frozen=True, slots=True)
class Assignment:
    version: int
    partitions: tuple[TopicPartitions, ...]
    user_data: bytes | None = None

    def topic_partitions(self) -> list[tuple[str, int]]:
        return [(tp.topic, p) for tp in self.partitions for p in tp.partitions]


class _Reader:
    __slots__ = ("buf", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.buf):
            raise ConsumerProtocolError(f"truncated: need {n} bytes at {self.pos}, have {len(self.buf) - self.pos}")
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def int16(self) -> int:
        v: int = _I16.unpack(self._take(2))[0]
        return v

    def int32(self) -> int:
        v: int = _I32.unpack(self._take(4))[0]
        return v

    def string(self) -> str:
        n = self.int16()
        if n < 0:
            raise ConsumerProtocolError("null where a STRING is required")
        try:
            return self._take(n).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConsumerProtocolError(f"bad UTF-8 in string: {e}") from None

    def nullable_string(self) -> str | None:
        n = self.int16()
        if n == -1:
            return None
        if n < 0:
            raise ConsumerProtocolError(f"bad string length {n}")
        try:
            return self._take(n).decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConsumerProtocolError(f"bad UTF-8 in string: {e}") from None

    def nullable_bytes(self) -> bytes | None:
        n = self.int32()
        if n == -1:
            return None
        if n < 0:
            raise ConsumerProtocolError(f"bad bytes length {n}")
        return self._take(n)

    def count(self) -> int:
        n = self.int32()
        if n < 0:
            raise ConsumerProtocolError(f"bad array length {n}")
        # each element is at least 2 bytes: refuse absurd counts before allocating
        if n > len(self.buf) - self.pos:
            raise ConsumerProtocolError(f"array length {n} exceeds the remaining {len(self.buf) - self.pos} bytes")
        return n

    def topic_partitions(self) -> tuple[TopicPartitions, ...]:
        out = []
        for _ in range(self.count()):
            topic = self.string()
            n = self.count()
            raw = self._take(4 * n)
            out.append(TopicPartitions(topic, struct.unpack(f">{n}i", raw)))
        return tuple(out)

    def version(self) -> int:
        v = self.int16()
        if v < 0:
            raise ConsumerProtocolError(f"unsupported consumer protocol version {v}")
        return v


def decode_subscription(data: bytes) -> Subscription:
    r = _Reader(bytes(data))
    version = r.version()
    v = min(version, LATEST_VERSION)
    topics = tuple(r.string() for _ in range(r.count()))
    user_data = r.nullable_bytes()
    owned: tuple[TopicPartitions, ...] = ()
    generation_id = -1
    rack_id: str | None = None
    if v >= 1:
        owned = r.topic_partitions()
    if v >= 2:
        generation_id = r.int32()
    if v >= 3:
        rack_id = r.nullable_string()
    return Subscription(version, topics, user_data, owned, generation_id, rack_id)


def decode_subscription_topics(data: bytes) -> tuple[str, ...]:
    """The topics of a subscription, read with the version-0 schema whatever its version (the
    int16 version, topics, user data; later fields are ignored): how Kafka's group coordinator
    learns a classic group's topics (``ClassicGroup.computeSubscribedTopics``).  Any negative
    user-data length reads as null, as in Kafka's generated readers.  Raises
    :class:`ConsumerProtocolError` when that prefix does not parse."""
    r = _Reader(bytes(data))
    r.int16()  # the version: every version starts with the v0 fields
    topics = tuple(r.string() for _ in range(r.count()))
    n = r.int32()
    if n >= 0:
        r._take(n)
    return topics


def decode_assignment(data: bytes) -> Assignment:
    r = _Reader(bytes(data))
    version = r.version()
    partitions = r.topic_partitions()
    user_data = r.nullable_bytes()
    return Assignment(version, partitions, user_data)


def _string(s: str) -> bytes:
    b = s.encode("utf-8")
    return _I16.pack(len(b)) + b


def _nullable_string(s: str | None) -> bytes:
    return _I16.pack(-1) if s is None else _string(s)


def _nullable_bytes(b: bytes | None) -> bytes:
    return _I32.pack(-1) if b is None else _I32.pack(len(b)) + b


def _topic_partitions(tps: tuple[TopicPartitions, ...]) -> bytes:
    out = [_I32.pack(len(tps))]
    for tp in tps:
        out.append(_string(tp.topic))
        out.append(_I32.pack(len(tp.partitions)))
        out.append(struct.pack(f">{len(tp.partitions)}i", *tp.partitions))
    return b"".join(out)


def encode_subscription(s: Subscription) -> bytes:
    if not 0 <= s.version <= LATEST_VERSION:
        raise ValueError(f"cannot encode subscription version {s.version}")
    out = [_I16.pack(s.version), _I32.pack(len(s.topics))]
    out += [_string(t) for t in s.topics]
    out.append(_nullable_bytes(s.user_data))
    if s.version >= 1:
        out.append(_topic_partitions(s.owned_partitions))
    if s.version >= 2:
        out.append(_I32.pack(s.generation_id))
    if s.version >= 3:
        out.append(_nullable_string(s.rack_id))
    return b"".join(out)


def encode_assignment(a: Assignment) -> bytes:
    if not 0 <= a.version <= LATEST_VERSION:
        raise ValueError(f"cannot encode assignment version {a.version}")
    return _I16.pack(a.version) + _topic_partitions(a.partitions) + _nullable_bytes(a.user_data)
