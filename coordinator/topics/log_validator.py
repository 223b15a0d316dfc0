"""Produced record sets checked as Kafka's broker checks them, before anything is stored.

In Kafka's order (docs/data-plane.md, "Produce validation"):

1. ``ProduceRequest.validateRecords`` (v3+): exactly one magic-v2 batch per partition, no zstd
   before v7 → INVALID_RECORD / UNSUPPORTED_COMPRESSION_TYPE (:func:`validate_produce_records`);
2. ``UnifiedLog.analyzeAndValidateRecords``: baseOffset 0, size within ``max.message.bytes``,
   CRC-32C → INVALID_RECORD / MESSAGE_TOO_LARGE / CORRUPT_MESSAGE;
3. ``LogValidator.validateBatch``: a consistent offset range and record count, no control
   batch, a sequence when there is a producer id → INVALID_RECORD (2 and 3:
   :func:`validate_client_batch`);
4. ``LogValidator`` walking every record (``DefaultRecord.readFrom``): each record's length,
   fields and headers inside the batch, exactly the header's count of records, nothing after
   them → INVALID_RECORD (:func:`check_records`).  Compressed batches are decompressed for
   this, up to ``rallypoint.max.uncompressed.batch.bytes``: a batch that decompresses to more
   is refused with MESSAGE_TOO_LARGE (Kafka has no such bound; it is what keeps a
   decompression bomb from taking the broker's memory, and a Java producer answers it by
   splitting the batch).  A payload its codec refuses is UNKNOWN_SERVER_ERROR, as Kafka's
   ``KafkaException("Failed to decompress record stream")`` maps to it.

Producer-state checks (duplicates, epochs, sequences) come after, in ``PartitionLog``.
"""

from __future__ import annotations

from collections.abc import Iterator

from msgspec import Struct
from rallypoint.protocol.errors import ErrorCode
from rallypoint.protocol.records import (
    COMPRESSION_NAMES,
    COMPRESSION_ZSTD,
    HEADER_SIZE,
    MAGIC,
    BatchHeader,
    CorruptBatchError,
    PayloadTooLargeError,
    RecordsError,
    UndecompressableError,
    crc_matches,
    latest_record_times,
    parse_header,
    split_batches,
    walk_record_spans,
)

# Records walked between two yields of :func:`check_records` (an async caller lets other
# connections run there).
SLICE_RECORDS = 4096


class BatchError(Exception):
    """A batch Kafka would refuse; ``code`` is the partition's error code."""

    def __init__(
        self,
        code: ErrorCode,
        message: str,
        *,
        error_message: str | None = None,
        record_errors: tuple[tuple[int, str], ...] = (),
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        # what the produce response carries (Kafka fills them for record validation errors)
        self.error_message = error_message
        self.record_errors = record_errors


class Checked(Struct, frozen=True):
    """What walking a batch's records found: its real largest timestamp and that record's offset
    delta (Kafka stores the batch with this maxTimestamp, whatever the producer wrote)."""

    max_timestamp: int
    offset_delta_of_max: int


def validate_produce_records(version: int, data: bytes) -> tuple[int, int]:
    """``ProduceRequest.validateRecords`` (v3+): exactly one magic-v2 batch per partition.

    Returns (position, size) of that batch.  A trailing partial batch is ignored, as Kafka's
    ``ByteBufferLogInputStream`` ignores it; a batch length too small to be a record is
    CORRUPT_MESSAGE.
    """
    try:
        spans = split_batches(data)
    except CorruptBatchError as e:
        raise BatchError(ErrorCode.CORRUPT_MESSAGE, str(e)) from None
    if not spans:
        raise BatchError(
            ErrorCode.INVALID_RECORD,
            f"Produce requests with version {version} must have at least one record batch per partition",
        )
    pos, size = spans[0]
    if size < HEADER_SIZE or data[pos + 16] != MAGIC:
        raise BatchError(
            ErrorCode.INVALID_RECORD,
            f"Produce requests with version {version} are only allowed to contain record batches with magic version 2",
        )
    if version < 7 and parse_header(data, pos).compression == COMPRESSION_ZSTD:
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
    """The header checks of ``UnifiedLog.analyzeAndValidateRecords`` and
    ``LogValidator.validateBatch`` for a client append, in Kafka's order."""
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
    if not crc_matches(data, pos, size, h.crc):
        raise BatchError(ErrorCode.CORRUPT_MESSAGE, f"Record is corrupt (stored crc = {h.crc})")
    if h.compression not in COMPRESSION_NAMES:
        # CompressionType.forId throws IllegalArgumentException: Kafka answers an unknown error.
        raise BatchError(ErrorCode.UNKNOWN_SERVER_ERROR, f"Unknown compression type id: {h.compression}")
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


def check_records(data: bytes, h: BatchHeader, max_uncompressed: int) -> Iterator[Checked | None]:
    """Walk every record of the (header-checked) batch ``h`` in ``data``.

    Yields None after every :data:`SLICE_RECORDS` records, then, last, the :class:`Checked`
    summary; raises :class:`BatchError` for the first problem.  Memory is bounded by
    ``max_uncompressed`` and the work by the bytes of the records, whatever the header claims.
    """
    latest = (0, -1, -1)  # records walked, latest timestamp, its offset delta
    try:
        for latest in latest_record_times(data, h, max_uncompressed, SLICE_RECORDS):
            if latest[0] % SLICE_RECORDS == 0:
                yield None
    except PayloadTooLargeError as e:
        raise BatchError(ErrorCode.MESSAGE_TOO_LARGE, str(e)) from None
    except UndecompressableError as e:
        raise BatchError(ErrorCode.UNKNOWN_SERVER_ERROR, str(e)) from None
    except RecordsError as e:
        # DefaultRecordBatch's iterators throw InvalidRecordException for every framing problem.
        raise BatchError(ErrorCode.INVALID_RECORD, str(e)) from None
    yield Checked(latest[1], latest[2])


def validate_client_records(data: bytes, h: BatchHeader, max_uncompressed: int) -> Checked:
    """:func:`check_records` run to its end."""
    result: Checked | None = None
    for step in check_records(data, h, max_uncompressed):
        result = step
    assert result is not None
    return result


def check_keys(data: bytes, h: BatchHeader, max_uncompressed: int, partition_name: str) -> None:
    """``LogValidator.validateKey`` for a compacted topic: every record needs a key, else the
    batch is refused with INVALID_RECORD and one record error per keyless record (the message
    shows the first three, as ``processRecordErrors`` words it).  The batch was walked already."""
    missing = [
        i for i, (_o, _t, _kp, klen, *_rest) in enumerate(walk_record_spans(data, h, max_uncompressed)) if klen < 0
    ]
    if not missing:
        return
    text = f"Compacted topic cannot accept message without key in topic partition {partition_name}."
    errors = tuple((i, text) for i in missing)
    shown = ", ".join(f"RecordError(batchIndex={i}, message='{m}')" for i, m in errors[:3])
    message = (
        f"One or more records have been rejected due to {len(errors)} record errors in total, and only "
        f"showing the first three errors at most: [{shown}]"
    )
    raise BatchError(ErrorCode.INVALID_RECORD, message, error_message=message, record_errors=errors)
