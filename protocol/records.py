"""Kafka record batches, magic v2 (the on-disk and on-wire format since Kafka 0.11).

Pure functions over bytes (or a file path): no asyncio, no state.  Used by the offsets log
(``coordinator/storage``), by ``rallypoint dump-log`` and by the Spark pipeline.

Batch layout (big-endian; byte offsets from the start of the batch; Kafka's
``DefaultRecordBatch``)::

    0  baseOffset            int64
    8  batchLength           int32   bytes after this field (= batch size - 12)
   12  partitionLeaderEpoch  int32
   16  magic                 int8    2
   17  crc                   uint32  CRC-32C (Castagnoli) of bytes 21 .. end of batch
   21  attributes            int16   bits 0-2 compression (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd),
                                     bit 3 timestamp type (0 CreateTime, 1 LogAppendTime),
                                     bit 4 transactional, bit 5 control, bit 6 delete horizon set
   23  lastOffsetDelta       int32
   27  baseTimestamp         int64
   35  maxTimestamp          int64
   43  producerId            int64   -1 = none
   51  producerEpoch         int16   -1 = none
   53  baseSequence          int32   -1 = none
   57  recordCount           int32
   61  records               (compressed as a whole when the compression bits are set)

Record layout (varints are zig-zag encoded signed varints, Kafka's ``ByteUtils.writeVarint``)::

    length          varint   bytes of the record after this field
    attributes      int8     unused, 0
    timestampDelta  varlong  timestamp - baseTimestamp
    offsetDelta     varint   offset - baseOffset
    keyLength       varint   -1 = null key
    key             bytes
    valueLength     varint   -1 = null value (a tombstone in a compacted topic)
    value           bytes
    headerCount     varint
    headers         (keyLength varint, key UTF-8, valueLength varint (-1 null), value) * headerCount

What is supported: writing uncompressed batches (all rallypoint writes); reading uncompressed and
gzip-compressed batches (gzip is in the standard library).  snappy, lz4 and zstd batches are
recognised and refused with :class:`UnsupportedBatchError` (their payload cannot be decoded
without third-party codecs); magic v0/v1 message sets are refused the same way.
"""

from __future__ import annotations

import mmap
import os
import struct
import zlib
from collections.abc import Iterator, Sequence
from typing import Final, NamedTuple

from crc32c import crc32c

MAGIC: Final = 2
HEADER_SIZE: Final = 61  # bytes before the first record
LOG_OVERHEAD: Final = 12  # baseOffset + batchLength: bytes not counted in batchLength
CRC_START: Final = 21  # the CRC covers attributes .. end
MIN_BATCH_LENGTH: Final = HEADER_SIZE - LOG_OVERHEAD  # 49

COMPRESSION_NONE: Final = 0
COMPRESSION_GZIP: Final = 1
COMPRESSION_NAMES: Final = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}

ATTR_COMPRESSION_MASK: Final = 0x07
ATTR_LOG_APPEND_TIME: Final = 0x08
ATTR_TRANSACTIONAL: Final = 0x10
ATTR_CONTROL: Final = 0x20
ATTR_DELETE_HORIZON: Final = 0x40

NO_PRODUCER_ID: Final = -1
NO_PRODUCER_EPOCH: Final = -1
NO_SEQUENCE: Final = -1

# baseOffset, batchLength, partitionLeaderEpoch, magic, crc
_PREFIX = struct.Struct(">qiibI")
# attributes, lastOffsetDelta, baseTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence, count
_AFTER_CRC = struct.Struct(">hiqqqhii")
_HEADER = struct.Struct(">qiibIhiqqqhii")
assert _HEADER.size == HEADER_SIZE
_LEN = struct.Struct(">qi")
_I16 = struct.Struct(">h")


class RecordsError(ValueError):
    """Bytes that are not a valid v2 record batch.  ``position`` is the batch's byte position."""

    def __init__(self, message: str, position: int) -> None:
        super().__init__(message)
        self.position = position


class TornBatchError(RecordsError):
    """The buffer ends inside a batch (e.g. a write cut short by a crash): a torn tail."""


class CorruptBatchError(RecordsError):
    """The batch is complete but wrong: CRC mismatch, impossible lengths, bad record framing."""


class UnsupportedBatchError(RecordsError):
    """A valid batch this module cannot decode (magic < 2, or snappy/lz4/zstd compression)."""


class Record(NamedTuple):
    """One record with its absolute offset and timestamp (a NamedTuple: cheap to build)."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None  # None = tombstone
    headers: tuple[tuple[str, bytes | None], ...] = ()


class BatchHeader(NamedTuple):
    """The 61-byte header of a batch, plus where it is (``position``) in its buffer or file."""

    position: int
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
        """Bytes of the whole batch, header included."""
        return self.batch_length + LOG_OVERHEAD

    @property
    def end(self) -> int:
        return self.position + self.size

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def compression(self) -> int:
        return self.attributes & ATTR_COMPRESSION_MASK

    @property
    def compression_name(self) -> str:
        return COMPRESSION_NAMES.get(self.compression, f"unknown({self.compression})")

    @property
    def timestamp_type(self) -> str:
        return "LogAppendTime" if self.attributes & ATTR_LOG_APPEND_TIME else "CreateTime"

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)

    @property
    def delete_horizon_ms(self) -> int | None:
        """KIP-534: when the delete-horizon bit is set, baseTimestamp holds it."""
        return self.base_timestamp if self.attributes & ATTR_DELETE_HORIZON else None

    @property
    def last_sequence(self) -> int:
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return (self.base_sequence + self.last_offset_delta) & 0x7FFFFFFF


class RecordBatch(NamedTuple):
    header: BatchHeader
    records: tuple[Record, ...]


# ---------------------------------------------------------------------------------------------
# varints


def zigzag(n: int) -> int:
    """Signed → unsigned (Kafka's ``(n << 1) ^ (n >> 63)`` for 64-bit values)."""
    return (n << 1) ^ (n >> 63)


def unzigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def write_varint(n: int, out: bytearray) -> None:
    """Append a zig-zag signed varint (Kafka's varint / varlong)."""
    v = ((n << 1) ^ (n >> 63)) & 0xFFFFFFFFFFFFFFFF
    while v > 0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """Read a zig-zag signed varint at ``pos``; returns (value, new position).

    Raises IndexError when the buffer ends inside the varint, ValueError when it is longer
    than 10 bytes (a varlong's maximum).
    """
    b = buf[pos]
    pos += 1
    if b < 0x80:
        return (b >> 1) ^ -(b & 1), pos
    result = b & 0x7F
    shift = 7
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


# ---------------------------------------------------------------------------------------------
# encoding


def _encode_record(out: bytearray, rec: Record, base_offset: int, base_timestamp: int) -> None:
    body = bytearray(b"\x00")  # attributes
    write_varint(rec.timestamp - base_timestamp, body)
    write_varint(rec.offset - base_offset, body)
    if rec.key is None:
        body.append(1)  # zigzag(-1)
    else:
        write_varint(len(rec.key), body)
        body += rec.key
    if rec.value is None:
        body.append(1)
    else:
        write_varint(len(rec.value), body)
        body += rec.value
    write_varint(len(rec.headers), body)
    for hkey, hval in rec.headers:
        raw = hkey.encode("utf-8")
        write_varint(len(raw), body)
        body += raw
        if hval is None:
            body.append(1)
        else:
            write_varint(len(hval), body)
            body += hval
    write_varint(len(body), out)
    out += body


def encode_batch(
    records: Sequence[Record],
    *,
    base_offset: int | None = None,
    partition_leader_epoch: int = 0,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    transactional: bool = False,
    control: bool = False,
) -> bytes:
    """Encode ``records`` (absolute offsets, ascending) as one uncompressed CreateTime batch.

    ``base_offset`` defaults to the first record's offset.  Offsets may have gaps (as after
    compaction); the batch's lastOffsetDelta is the last record's.
    """
    if not records:
        raise ValueError("a record batch needs at least one record")
    base = records[0].offset if base_offset is None else base_offset
    base_ts = records[0].timestamp
    max_ts = base_ts
    prev = base - 1
    body = bytearray()
    for rec in records:
        if rec.offset <= prev:
            raise ValueError(f"record offsets must ascend ({rec.offset} after {prev})")
        prev = rec.offset
        if rec.timestamp > max_ts:
            max_ts = rec.timestamp
        _encode_record(body, rec, base, base_ts)
    last_delta = records[-1].offset - base
    attributes = (ATTR_TRANSACTIONAL if transactional else 0) | (ATTR_CONTROL if control else 0)
    after_crc = (
        _AFTER_CRC.pack(
            attributes,
            last_delta,
            base_ts,
            max_ts,
            producer_id,
            producer_epoch,
            base_sequence,
            len(records),
        )
        + body
    )
    crc = crc32c(after_crc)
    batch_length = len(after_crc) + (CRC_START - LOG_OVERHEAD)
    return _PREFIX.pack(base, batch_length, partition_leader_epoch, MAGIC, crc) + after_crc


def build_batch(
    base_offset: int,
    entries: Sequence[tuple[bytes | None, bytes | None]],
    timestamp: int,
    *,
    partition_leader_epoch: int = 0,
) -> bytes:
    """The batch the offsets log writes: consecutive offsets from ``base_offset``, one timestamp,
    producerId/epoch/sequence -1, no compression, CreateTime.  A None value is a tombstone."""
    recs = [Record(base_offset + i, timestamp, k, v) for i, (k, v) in enumerate(entries)]
    return encode_batch(recs, base_offset=base_offset, partition_leader_epoch=partition_leader_epoch)


# ---------------------------------------------------------------------------------------------
# decoding


def read_header(buf: bytes | memoryview | mmap.mmap, pos: int = 0, *, verify_crc: bool = True) -> BatchHeader:
    """Parse and check the batch starting at ``pos``.

    Raises :class:`TornBatchError` when ``buf`` ends before the batch does,
    :class:`CorruptBatchError` for impossible lengths or a CRC mismatch,
    :class:`UnsupportedBatchError` for magic < 2.
    """
    avail = len(buf) - pos
    if avail < LOG_OVERHEAD:
        raise TornBatchError(f"{avail} bytes at {pos}: shorter than a batch's length prefix", pos)
    base_offset, batch_length = _LEN.unpack_from(buf, pos)
    if batch_length < MIN_BATCH_LENGTH:
        if avail >= 17 and buf[pos + 16] in (0, 1) and batch_length >= 14:
            raise UnsupportedBatchError(f"magic v{buf[pos + 16]} message set at {pos} (only v2 batches)", pos)
        raise CorruptBatchError(f"batch length {batch_length} at {pos} is smaller than a v2 header", pos)
    size = batch_length + LOG_OVERHEAD
    if avail < size:
        raise TornBatchError(f"batch at {pos} needs {size} bytes, {avail} left", pos)
    fields = _HEADER.unpack_from(buf, pos)
    magic = fields[3]
    if magic != MAGIC:
        if magic in (0, 1):
            raise UnsupportedBatchError(f"magic v{magic} message set at {pos} (only v2 batches)", pos)
        raise CorruptBatchError(f"unknown magic {magic} at {pos}", pos)
    if verify_crc:
        view = memoryview(buf)[pos + CRC_START : pos + size]
        try:
            actual = crc32c(view)
        finally:
            view.release()
        if actual != fields[4]:
            raise CorruptBatchError(
                f"CRC mismatch in batch at {pos} (base offset {base_offset}): stored {fields[4]}, computed {actual}",
                pos,
            )
    header = BatchHeader(pos, *fields)
    if header.record_count < 0 or header.last_offset_delta < 0:
        raise CorruptBatchError(f"negative record count or offset delta in batch at {pos}", pos)
    return header


def scan_batches(
    buf: bytes | memoryview | mmap.mmap, pos: int = 0, *, verify_crc: bool = True
) -> Iterator[BatchHeader]:
    """Headers of consecutive batches from ``pos`` to the end of ``buf`` (CRC checked).

    The errors of :func:`read_header` propagate at the first bad batch, after every good
    batch before it has been yielded.
    """
    end = len(buf)
    while pos < end:
        h = read_header(buf, pos, verify_crc=verify_crc)
        yield h
        pos += h.size


def _records_payload(buf: bytes | memoryview | mmap.mmap, h: BatchHeader) -> bytes:
    raw = bytes(buf[h.position + HEADER_SIZE : h.end])
    comp = h.compression
    if comp == COMPRESSION_NONE:
        return raw
    if comp == COMPRESSION_GZIP:
        try:
            return zlib.decompress(raw, wbits=31)
        except zlib.error as e:
            raise CorruptBatchError(f"bad gzip payload in batch at {h.position}: {e}", h.position) from None
    raise UnsupportedBatchError(
        f"batch at {h.position} is {h.compression_name}-compressed; only none and gzip can be read",
        h.position,
    )


def decode_records(buf: bytes | memoryview | mmap.mmap, h: BatchHeader) -> tuple[Record, ...]:
    """The records of the batch ``h`` (a header read from the same ``buf``)."""
    data = _records_payload(buf, h)
    base_offset = h.base_offset
    base_ts = h.base_timestamp
    # LogAppendTime batches: every record's timestamp is the batch's maxTimestamp (Kafka's
    # DefaultRecordBatch iterator ignores the stored deltas then).
    log_append_ts = h.max_timestamp if h.attributes & ATTR_LOG_APPEND_TIME else None
    out: list[Record] = []
    pos = 0
    n = len(data)
    try:
        for _ in range(h.record_count):
            # varints are inlined for the one-byte case (most lengths and deltas here)
            b = data[pos]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                length, pos = read_varint(data, pos)
            end = pos + length
            if length < 6 or end > n:
                raise CorruptBatchError(f"bad record length {length} in batch at {h.position}", h.position)
            pos += 1  # attributes
            b = data[pos]
            if b < 0x80:
                ts_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                ts_delta, pos = read_varint(data, pos)
            b = data[pos]
            if b < 0x80:
                off_delta = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                off_delta, pos = read_varint(data, pos)
            b = data[pos]
            if b < 0x80:
                klen = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                klen, pos = read_varint(data, pos)
            key: bytes | None
            if klen < 0:
                key = None
            else:
                key = data[pos : pos + klen]
                pos += klen
            b = data[pos]
            if b < 0x80:
                vlen = (b >> 1) ^ -(b & 1)
                pos += 1
            else:
                vlen, pos = read_varint(data, pos)
            value: bytes | None
            if vlen < 0:
                value = None
            else:
                value = data[pos : pos + vlen]
                pos += vlen
            headers: tuple[tuple[str, bytes | None], ...] = ()
            if data[pos] == 0:
                pos += 1
            else:
                nheaders, pos = read_varint(data, pos)
                hs: list[tuple[str, bytes | None]] = []
                for _h in range(nheaders):
                    hklen, pos = read_varint(data, pos)
                    if hklen < 0:
                        raise CorruptBatchError(f"null header key in batch at {h.position}", h.position)
                    hkey = data[pos : pos + hklen].decode("utf-8")
                    pos += hklen
                    hvlen, pos = read_varint(data, pos)
                    hval: bytes | None = None
                    if hvlen >= 0:
                        hval = data[pos : pos + hvlen]
                        pos += hvlen
                    hs.append((hkey, hval))
                headers = tuple(hs)
            if pos != end:
                raise CorruptBatchError(f"record framing mismatch in batch at {h.position}", h.position)
            ts = log_append_ts if log_append_ts is not None else base_ts + ts_delta
            out.append(Record(base_offset + off_delta, ts, key, value, headers))
    except (IndexError, ValueError) as e:
        if isinstance(e, RecordsError):
            raise
        raise CorruptBatchError(f"malformed records in batch at {h.position}: {e}", h.position) from None
    if pos != n:
        raise CorruptBatchError(f"{n - pos} stray bytes after the records of batch at {h.position}", h.position)
    return tuple(out)


def iter_batches(
    buf: bytes | memoryview | mmap.mmap, pos: int = 0, *, verify_crc: bool = True
) -> Iterator[RecordBatch]:
    """Decoded batches from ``pos`` to the end of ``buf``; errors as :func:`read_header`."""
    for h in scan_batches(buf, pos, verify_crc=verify_crc):
        yield RecordBatch(h, decode_records(buf, h))


def iter_file_batches(path: str | os.PathLike[str], *, verify_crc: bool = True) -> Iterator[RecordBatch]:
    """Decoded batches of a segment file (memory-mapped: large files do not need large RAM).

    A torn tail raises :class:`TornBatchError` after all complete batches were yielded.
    """
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            yield from iter_batches(mm, 0, verify_crc=verify_crc)


# ---------------------------------------------------------------------------------------------
# control records (transaction markers)

CONTROL_ABORT: Final = 0
CONTROL_COMMIT: Final = 1


def control_type(rec: Record) -> int:
    """The type of a control record (key: int16 version, int16 type); -1 when unreadable."""
    if rec.key is None or len(rec.key) < 4:
        return -1
    return int(_I16.unpack_from(rec.key, 2)[0])
