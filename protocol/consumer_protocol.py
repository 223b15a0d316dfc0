"""The classic consumer embedded protocol (protocol type ``"consumer"``).

These are the opaque bytes a consumer puts in JoinGroup's protocol metadata (the *subscription*)
and a leader hands out in SyncGroup (the *assignment*); the group coordinator stores them as
``subscription`` / ``assignment`` of each member in a GroupMetadataValue
(docs/offsets-log-format.md, "Values (version-prefixed)").

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

from msgspec import Struct, field

from .wire import I16 as _I16
from .wire import I32 as _I32
from .wire import Reader, Writer

_I16_I32 = struct.Struct(">hi")

LATEST_VERSION = 3


class ConsumerProtocolError(ValueError):
    """The bytes are not a valid consumer-protocol subscription or assignment."""


class TopicPartitions(Struct, frozen=True):
    """A topic and some of its partitions (owned or assigned ones)."""

    topic: str
    partitions: tuple[int, ...]


class Subscription(Struct, frozen=True):
    """A ``ConsumerProtocolSubscription``: what a consumer puts in JoinGroup's protocol metadata."""

    version: int
    topics: tuple[str, ...]
    user_data: bytes | None = None
    owned_partitions: tuple[TopicPartitions, ...] = field(default_factory=tuple)
    generation_id: int = -1
    rack_id: str | None = None


class Assignment(Struct, frozen=True):
    """A ``ConsumerProtocolAssignment``: the partitions a leader gives a member in SyncGroup."""

    version: int
    partitions: tuple[TopicPartitions, ...]
    user_data: bytes | None = None

    def topic_partitions(self) -> list[tuple[str, int]]:
        return [(tp.topic, p) for tp in self.partitions for p in tp.partitions]


def _reader(data: bytes) -> Reader:
    return Reader(bytes(data), error=ConsumerProtocolError)


def _version(r: Reader) -> int:
    v = r.int16()
    if v < 0:
        raise ConsumerProtocolError(f"unsupported consumer protocol version {v}")
    return v


def _read_topic_partitions(r: Reader) -> tuple[TopicPartitions, ...]:
    out = []
    for _ in range(r.array_length()):
        topic = r.string()
        out.append(TopicPartitions(topic, r.int32_array(r.array_length())))
    return tuple(out)


def decode_subscription(data: bytes) -> Subscription:
    r = _reader(data)
    version = _version(r)
    v = min(version, LATEST_VERSION)
    topics = tuple(r.string() for _ in range(r.array_length()))
    user_data = r.nullable_bytes()
    owned: tuple[TopicPartitions, ...] = ()
    generation_id = -1
    rack_id: str | None = None
    if v >= 1:
        owned = _read_topic_partitions(r)
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
    r = _reader(data)
    r.int16()  # the version: every version starts with the v0 fields
    topics = tuple(r.string() for _ in range(r.array_length()))
    n = r.int32()
    if n >= 0:
        r.take(n)
    return topics


def _assignment_direct(data: bytes) -> Assignment:
    """:func:`decode_assignment`'s reference (the Reader below) for a well-formed assignment,
    read with fewer calls (the pipeline reads one per member of every group record).  Raises
    IndexError, ValueError or struct.error for anything it does not read whole; the caller
    then reads the bytes with the reference, which words the error."""
    data = bytes(data)
    version, count = _I16_I32.unpack_from(data, 0)
    if version < 0 or count < 0 or count > len(data):
        raise ConsumerProtocolError("irregular")
    pos = 6
    out = []
    for _ in range(count):
        n = _I16.unpack_from(data, pos)[0]
        if n < 0 or pos + 2 + n > len(data):
            raise ConsumerProtocolError("irregular")
        topic = data[pos + 2 : pos + 2 + n].decode("utf-8")
        pos += 2 + n
        k = _I32.unpack_from(data, pos)[0]
        if k < 0 or k > len(data):
            raise ConsumerProtocolError("irregular")
        out.append(TopicPartitions(topic, struct.unpack_from(f">{k}i", data, pos + 4)))
        pos += 4 + 4 * k
    size = _I32.unpack_from(data, pos)[0]
    if size > len(data) - pos - 4:
        raise ConsumerProtocolError("irregular")
    user_data = None if size < 0 else data[pos + 4 : pos + 4 + size]
    return Assignment(version, tuple(out), user_data)


def decode_assignment(data: bytes) -> Assignment:
    try:
        return _assignment_direct(data)
    except (IndexError, ValueError, struct.error):
        return _assignment_reference(data)  # which words the error


def _assignment_reference(data: bytes) -> Assignment:
    r = _reader(data)
    version = _version(r)
    partitions = _read_topic_partitions(r)
    user_data = r.nullable_bytes()
    return Assignment(version, partitions, user_data)


def _write_topic_partitions(w: Writer, tps: tuple[TopicPartitions, ...]) -> None:
    w.array_length(len(tps))
    for tp in tps:
        w.string(tp.topic)
        w.int32_array(tp.partitions)


def encode_subscription(s: Subscription) -> bytes:
    if not 0 <= s.version <= LATEST_VERSION:
        raise ValueError(f"cannot encode subscription version {s.version}")
    w = Writer(error=ConsumerProtocolError)
    w.int16(s.version)
    w.array_length(len(s.topics))
    for t in s.topics:
        w.string(t)
    w.nullable_bytes(s.user_data)
    if s.version >= 1:
        _write_topic_partitions(w, s.owned_partitions)
    if s.version >= 2:
        w.int32(s.generation_id)
    if s.version >= 3:
        w.nullable_string(s.rack_id)
    return w.done()


def encode_assignment(a: Assignment) -> bytes:
    if not 0 <= a.version <= LATEST_VERSION:
        raise ValueError(f"cannot encode assignment version {a.version}")
    w = Writer(error=ConsumerProtocolError)
    w.int16(a.version)
    _write_topic_partitions(w, a.partitions)
    w.nullable_bytes(a.user_data)
    return w.done()
