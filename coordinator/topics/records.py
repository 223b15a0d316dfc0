"""Record batches (magic v2) as opaque bytes: header fields, validation, offset assignment.

Layout of a v2 batch header (Kafka's ``DefaultRecordBatch``)::

    0  baseOffset            int64
    8  batchLength           int32   (bytes after this field: size = 12 + batchLength)
    12 partitionLeaderEpoch  int32
    16 magic                 int8
    17 crc                   uint32  (CRC-32C of the bytes from ``attributes`` to the end)
    21 attributes            int16
    23 lastOffsetDelta       int32
    27 baseTimestamp         int64
    35 maxTimestamp          int64
    43 producerId            int64
    51 producerEpoch         int16
    53 baseSequence          int32
    57 recordCount           int32
    61 records...

The broker never decompresses nor rewrites a batch: it patches ``baseOffset`` and
``partitionLeaderEpoch``, which lie before the CRC'd region, so the CRC stays valid.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import crc32c
from rallypoint.protocol.errors import ErrorCode

HEADER_SIZE = 61
LOG_OVERHEAD = 12  # baseOffset + batchLength
CRC_START = 21
MAGIC_V2 = 2

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20

COMPRESSION_ZSTD = 4

NO_PRODUCER_ID = -1
NO_SEQUENCE = -1
INT32_MAX = 2**31 - 1

_HEADER = struct.Struct(">qiibIhiqqqhii")
_PATCH = struct.Struct(">qii")


class BatchError(Exception):
    """A batch Kafka would refuse; ``code`` is the partition's error code."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class BatchHeader:
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size(self) -> int:
        return LOG_OVERHEAD + self.batch_length

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id > NO_PRODUCER_ID

    @property
    def last_sequence(self) -> int:
        """``DefaultRecordBatch.lastSequence``: base sequence + delta, wrapping at INT32_MAX."""
        return increment_sequence(self.base_sequence, self.last_offset_delta)


def increment_sequence(sequence: int, increment: int) -> int:
    if sequence == NO_SEQUENCE:
        return NO_SEQUENCE
    if sequence > INT32_MAX - increment:
        return increment - (INT32_MAX - sequence) - 1
    return sequence + increment


def decrement_sequence(sequence: int, decrement: int) -> int:
    if sequence < decrement:
        return INT32_MAX - (decrement - sequence) + 1
    return sequence - decrement


def parse_header(data: bytes | memoryview, pos: int = 0) -> BatchHeader:
    return BatchHeader(*_HEADER.unpack_from(data, pos))


def split_batches(data: bytes) -> list[tuple[int, int]]:
    """(position, size) of each complete batch, like Kafka's ``ByteBufferLogInputStream``.

    A trailing partial batch is ignored (Kafka trims it); a batch length too small to be a
    record is corrupt (``nextBatchSize`` throws ``CorruptRecordException``).
    """
    out: list[tuple[int, int]] = []
    pos = 0
    n = len(data)
    while n - pos >= LOG_OVERHEAD:
        (length,) = struct.unpack_from(">i", data, pos + 8)
        if length < 14:  # LegacyRecord.RECORD_OVERHEAD_V0
            raise BatchError(
                ErrorCode.CORRUPT_MESSAGE, f"Record size {length} is less than the minimum record overhead"
            )
        size = LOG_OVERHEAD + length
        if n - pos < size:
            break
        out.append((pos, size))
        pos += size
    return out


def validate_produce_records(version: int, data: bytes) -> tuple[int, int]:
    """``ProduceRequest.validateRecords`` (v3+): exactly one magic-v2 batch per partition.

    Returns (position, size) of that batch.  Kafka answers INVALID_RECORD otherwise
    (clients/.../requests/ProduceRequest.java, called from KafkaApis.handleProduceRequest).
    """
    spans = split_batches(data)
    if not spans:
        raise BatchError(
            ErrorCode.INVALID_RECORD,
            f"Produce requests with version {version} must have at least one record batch per partition",
        )
    pos, size = spans[0]
    if size < HEADER_SIZE or data[pos + 16] != MAGIC_V2:
        raise BatchError(
            ErrorCode.INVALID_RECORD,
            f"Produce requests with version {version} are only allowed to contain record batches with magic version 2",
        )
    if version < 7 and (data[pos + 22] & COMPRESSION_MASK) == COMPRESSION_ZSTD:
        raise BatchError(
            ErrorCode.UNSUPPORTED_COMPRESSION_TYPE,
            f"Produce requests with version {version} are not allowed to use ZStandard compression",
        )
    if len(spans) > 1:
        raise BatchError(
            ErrorCode.INVALID_RECORD,
            f"Produce requests with version {version} are only allowed to contain exactly one record batch "
            "per partition",
        )
    return pos, size


def validate_client_batch(data: bytes, pos: int, size: int, max_message_bytes: int) -> BatchHeader:
    """The checks of ``UnifiedLog.analyzeAndValidateRecords`` and ``LogValidator.validateBatch``
    for a client append, in Kafka's order."""
    h = parse_header(data, pos)
    if h.base_offset != 0:
        raise BatchError(
            ErrorCode.INVALID_RECORD, f"The baseOffset of the record batch should be 0, but it is {h.base_offset}"
        )
    if size > max_message_bytes:
        raise BatchError(
            ErrorCode.MESSAGE_TOO_LARGE,
            f"The record batch size is {size} bytes which exceeds the maximum configured value of {max_message_bytes}.",
        )
    if crc32c.crc32c(memoryview(data)[pos + CRC_START : pos + size]) != h.crc:
        raise BatchError(ErrorCode.CORRUPT_MESSAGE, f"Record is corrupt (stored crc = {h.crc})")
    if h.last_offset_delta < 0:
        raise BatchError(ErrorCode.INVALID_RECORD, "Batch has an invalid offset range")
    if h.record_count <= 0:
        raise BatchError(ErrorCode.INVALID_RECORD, f"Invalid reported count for record batch: {h.record_count}")
    if h.last_offset_delta + 1 != h.record_count:
        raise BatchError(
            ErrorCode.INVALID_RECORD,
            f"Inconsistent batch offset range [0, {h.last_offset_delta}] and count of records {h.record_count}",
        )
    if h.is_control:
        raise BatchError(ErrorCode.INVALID_RECORD, "Clients are not allowed to write control records")
    if h.has_producer_id and h.base_sequence < 0:
        raise BatchError(ErrorCode.INVALID_RECORD, f"Invalid sequence number {h.base_sequence} in record batch")
    return h


def assign_offset(data: bytes, pos: int, size: int, base_offset: int, leader_epoch: int) -> bytes:
    """The batch with ``baseOffset`` and ``partitionLeaderEpoch`` set (both outside the CRC)."""
    (length,) = struct.unpack_from(">i", data, pos + 8)
    return _PATCH.pack(base_offset, length, leader_epoch) + data[pos + LOG_OVERHEAD + 4 : pos + size]


# --------------------------------------------------------------------------- record iteration


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """A zig-zag varint (Kafka's ``ByteUtils.readVarint/readVarlong``)."""
    shift = 0
    raw = 0
    while True:
        b = data[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")
    return (raw >> 1) ^ -(raw & 1), pos


def record_timestamps(batch: bytes) -> list[tuple[int, int]] | None:
    """(offset, timestamp) of each record of an uncompressed batch; None if compressed.

    Only ``timestampDelta`` and ``offsetDelta`` are decoded; the rest of each record is
    skipped by its length.
    """
    h = parse_header(batch)
    if h.compression != 0:
        return None
    out: list[tuple[int, int]] = []
    pos = HEADER_SIZE
    end = h.size
    for _ in range(h.record_count):
        if pos >= end:
            break
        length, body = _varint(batch, pos)
        p = body + 1  # attributes int8
        ts_delta, p = _varint(batch, p)
        off_delta, p = _varint(batch, p)
        out.append((h.base_offset + off_delta, h.base_timestamp + ts_delta))
        pos = body + length
    return out
