"""Kafka record batches, magic v2 (the on-disk and on-wire format since Kafka 0.11): the one codec.

Why one module of about 850 lines: it is the one record-batch codec every user imports (data
plane, offsets log, dump-log, pipeline), reading and writing side by side so that both follow
the same layout; compression and CRC live in their own modules, the compiled walks in
``_recwalk.pyx``.

Pure functions over bytes (or a file path): no asyncio, no state.  Used by the data plane
(Produce validation, Fetch, ListOffsets), the offsets log (``coordinator/storage``),
``rallypoint dump-log`` and the Spark pipeline.

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

Record layout (zig-zag varints, see ``protocol/wire.py``; Kafka's ``DefaultRecord``)::

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

``baseOffset`` and ``partitionLeaderEpoch`` lie before the CRC'd bytes: a broker assigns offsets
by patching them (:func:`with_base_offset`) and never rewrites the rest of a produced batch.

Every reader is bounded by the bytes that are there: a length, count or header that claims
more than remains is an error before anything is allocated, and a compressed payload is
decompressed only up to a caller-given number of bytes (:func:`records_payload`,
``protocol/compression.py``), so a "decompression bomb" costs at most that much memory.
Writing is uncompressed only (all rallypoint writes); reading handles every Kafka codec.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, Literal, NamedTuple, overload

from . import compression
from .crc import crc32c
from .wire import I16 as _I16
from .wire import I32 as _I32
from .wire import read_varint, write_varint

# The produce check's walk compiled from protocol/_recwalk.pyx, when the install could build it
# (docs/data-plane.md, "Checking produced records"); None: the pure-Python walk does all of it.
_compiled: types.ModuleType | None
try:
    from . import _recwalk

    _compiled = _recwalk
except ImportError:  # no C compiler at install, or run from a source tree never built
    _compiled = None

MAGIC: Final = 2
HEADER_SIZE: Final = 61  # bytes before the first record
LOG_OVERHEAD: Final = 12  # baseOffset + batchLength: bytes not counted in batchLength
CRC_START: Final = 21  # the CRC covers attributes .. end
MIN_BATCH_LENGTH: Final = HEADER_SIZE - LOG_OVERHEAD  # 49
# The smallest batchLength any message format allows (LegacyRecord.RECORD_OVERHEAD_V0): a
# batch claiming less cannot be read at all (``ByteBufferLogInputStream.nextBatchSize``).
MIN_ANY_BATCH_LENGTH: Final = 14
# The smallest record: a one-byte length, attributes, and one-byte timestamp delta, offset
# delta, key length, value length and header count.
MIN_RECORD_SIZE: Final = 7

COMPRESSION_NONE: Final = 0
COMPRESSION_GZIP: Final = compression.GZIP
COMPRESSION_SNAPPY: Final = compression.SNAPPY
COMPRESSION_LZ4: Final = compression.LZ4
COMPRESSION_ZSTD: Final = compression.ZSTD
COMPRESSION_NAMES: Final = compression.NAMES

ATTR_COMPRESSION_MASK: Final = 0x07
ATTR_LOG_APPEND_TIME: Final = 0x08
ATTR_TRANSACTIONAL: Final = 0x10
ATTR_CONTROL: Final = 0x20
ATTR_DELETE_HORIZON: Final = 0x40

NO_PRODUCER_ID: Final = -1
NO_PRODUCER_EPOCH: Final = -1
NO_SEQUENCE: Final = -1
INT32_MAX: Final = 2**31 - 1

# The most bytes a compressed batch may decompress to when the caller sets no bound (tools and
# the offsets log, which read what rallypoint wrote); the broker bounds client batches by
# ``rallypoint.max.uncompressed.batch.bytes``.
DEFAULT_MAX_UNCOMPRESSED: Final = 64 * 1024 * 1024

# baseOffset, batchLength, partitionLeaderEpoch, magic, crc
_PREFIX = struct.Struct(">qiibI")
# attributes, lastOffsetDelta, baseTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence, count
_AFTER_CRC = struct.Struct(">hiqqqhii")
_HEADER = struct.Struct(">qiibIhiqqqhii")
assert _HEADER.size == HEADER_SIZE
_LEN = struct.Struct(">qi")
_PATCH = struct.Struct(">qii")


class RecordsError(ValueError):
    """Bytes that are not a valid v2 record batch.  ``position`` is the batch's byte position."""

    def __init__(self, message: str, position: int) -> None:
        super().__init__(message)
        self.position = position


class TornBatchError(RecordsError):
    """The buffer ends inside a batch (e.g. a write cut short by a crash): a torn tail."""


class CorruptBatchError(RecordsError):
    """The batch is complete but wrong: CRC mismatch, impossible lengths, bad record framing."""


class UndecompressableError(CorruptBatchError):
    """A compressed payload the codec refuses (not a stream of that codec, or damaged)."""


class UnsupportedBatchError(RecordsError):
    """A batch this module cannot decode: magic < 2, or a compression id Kafka does not define."""


class PayloadTooLargeError(RecordsError):
    """A compressed batch that decompresses to more bytes than the reader allows."""


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
    def has_producer_id(self) -> bool:
        return self.producer_id > NO_PRODUCER_ID

    @property
    def delete_horizon_ms(self) -> int | None:
        """KIP-534: when the delete-horizon bit is set, baseTimestamp holds it."""
        return self.base_timestamp if self.attributes & ATTR_DELETE_HORIZON else None

    @property
    def last_sequence(self) -> int:
        """``DefaultRecordBatch.lastSequence``: base sequence + delta, wrapping at INT32_MAX."""
        return increment_sequence(self.base_sequence, self.last_offset_delta)


class RecordBatch(NamedTuple):
    header: BatchHeader
    records: tuple[Record, ...]


def increment_sequence(sequence: int, increment: int) -> int:
    """``DefaultRecordBatch.incrementSequence``: sequences wrap from INT32_MAX to 0."""
    if sequence == NO_SEQUENCE:
        return NO_SEQUENCE
    if sequence > INT32_MAX - increment:
        return increment - (INT32_MAX - sequence) - 1
    return sequence + increment


def decrement_sequence(sequence: int, decrement: int) -> int:
    """``DefaultRecordBatch.decrementSequence``."""
    if sequence < decrement:
        return INT32_MAX - (decrement - sequence) + 1
    return sequence - decrement


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


def _encode_body(records: Sequence[Record], base_offset: int, base_timestamp: int) -> tuple[bytearray, int]:
    """(record bytes, largest timestamp): one pass (the offsets log's commit path runs this)."""
    prev = base_offset - 1
    max_ts = base_timestamp
    body = bytearray()
    for rec in records:
        if rec.offset <= prev:
            raise ValueError(f"record offsets must ascend ({rec.offset} after {prev})")
        prev = rec.offset
        if rec.timestamp > max_ts:
            max_ts = rec.timestamp
        _encode_record(body, rec, base_offset, base_timestamp)
    return body, max_ts


def encode_records(records: Sequence[Record], base_offset: int, base_timestamp: int) -> bytearray:
    """The uncompressed record bytes of a batch with ``base_offset`` and ``base_timestamp``:
    each record's offset and timestamp stored as deltas from them.  Offsets must ascend (gaps
    are allowed, as after compaction)."""
    return _encode_body(records, base_offset, base_timestamp)[0]


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
    body, max_ts = _encode_body(records, base, base_ts)
    attributes = (ATTR_TRANSACTIONAL if transactional else 0) | (ATTR_CONTROL if control else 0)
    after_crc = (
        _AFTER_CRC.pack(
            attributes,
            records[-1].offset - base,
            base_ts,
            max_ts,
            producer_id,
            producer_epoch,
            base_sequence,
            len(records),
        )
        + body
    )
    return _with_prefix(after_crc, base, partition_leader_epoch, MAGIC, None)


def assemble_batch(header: BatchHeader, payload: bytes | bytearray, *, crc: int | None = None) -> bytes:
    """A batch of ``header``'s fields (its position, batchLength and crc ignored) followed by
    ``payload``, the records as they are to be stored (compressed or not): batchLength is
    computed, and the CRC too unless ``crc`` is given (tests craft bad batches with it)."""
    after_crc = (
        _AFTER_CRC.pack(
            header.attributes,
            header.last_offset_delta,
            header.base_timestamp,
            header.max_timestamp,
            header.producer_id,
            header.producer_epoch,
            header.base_sequence,
            header.record_count,
        )
        + payload
    )
    return _with_prefix(after_crc, header.base_offset, header.partition_leader_epoch, header.magic, crc)


def _with_prefix(after_crc: bytes, base_offset: int, leader_epoch: int, magic: int, crc: int | None) -> bytes:
    """baseOffset, batchLength, partitionLeaderEpoch, magic and CRC in front of the CRC'd bytes."""
    batch_length = len(after_crc) + (CRC_START - LOG_OVERHEAD)
    return (
        _PREFIX.pack(base_offset, batch_length, leader_epoch, magic, crc32c(after_crc) if crc is None else crc)
        + after_crc
    )


def build_batch(
    base_offset: int,
    entries: Sequence[tuple[bytes | None, bytes | None]],
    timestamp: int,
    *,
    partition_leader_epoch: int = 0,
) -> bytes:
    """The batch the offsets log writes: consecutive offsets from ``base_offset``, one timestamp,
    producerId/epoch/sequence -1, no compression, CreateTime.  A None value is a tombstone.

    Built by ``build_plain_batch`` (``protocol/_recwalk.pyx``) when it was built and takes the
    entries (pairs of bytes or None), else by :func:`encode_batch`: the same bytes."""
    if _compiled is not None and _use_compiled:
        try:
            built: bytes | None = _compiled.build_plain_batch(
                base_offset,
                entries if type(entries) is list else list(entries),
                timestamp,
                partition_leader_epoch,
                crc32c,
            )
        except (OverflowError, TypeError):
            built = None  # a number outside its field, ...: the reference raises what it raises
        if built is not None:
            return built
    recs = [Record(base_offset + i, timestamp, k, v) for i, (k, v) in enumerate(entries)]
    return encode_batch(recs, base_offset=base_offset, partition_leader_epoch=partition_leader_epoch)


def with_base_offset(data: bytes, pos: int, size: int, base_offset: int, leader_epoch: int) -> bytes:
    """The batch at ``data[pos:pos+size]`` with ``baseOffset`` and ``partitionLeaderEpoch`` set:
    both lie before the CRC'd bytes, so the CRC stays valid."""
    (length,) = _I32.unpack_from(data, pos + 8)
    return _PATCH.pack(base_offset, length, leader_epoch) + data[pos + LOG_OVERHEAD + 4 : pos + size]


def with_max_timestamp(batch: bytes, max_timestamp: int, *, log_append_time: bool = False) -> bytes:
    """The batch with ``maxTimestamp`` set and its CRC recomputed (Kafka's ``setMaxTimestamp``);
    with ``log_append_time`` also the LogAppendTime attribute: readers then take
    ``maxTimestamp`` as the timestamp of every record of the batch."""
    h = parse_header(batch)
    attributes = h.attributes | ATTR_LOG_APPEND_TIME if log_append_time else h.attributes
    return assemble_batch(h._replace(max_timestamp=max_timestamp, attributes=attributes), batch[HEADER_SIZE:])


# ---------------------------------------------------------------------------------------------
# batch headers


def parse_header(buf: bytes | memoryview | mmap.mmap, pos: int = 0) -> BatchHeader:
    """The header fields at ``pos``, unchecked (the caller knows a whole header is there)."""
    return BatchHeader(pos, *_HEADER.unpack_from(buf, pos))


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
        if avail >= 17 and buf[pos + 16] in (0, 1) and batch_length >= MIN_ANY_BATCH_LENGTH:
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
    if verify_crc and not crc_matches(buf, pos, size, fields[4]):
        raise CorruptBatchError(f"CRC mismatch in batch at {pos} (base offset {base_offset}): stored {fields[4]}", pos)
    header = BatchHeader(pos, *fields)
    if header.record_count < 0 or header.last_offset_delta < 0:
        raise CorruptBatchError(f"negative record count or offset delta in batch at {pos}", pos)
    return header


def crc_matches(buf: bytes | memoryview | mmap.mmap, pos: int, size: int, stored: int) -> bool:
    """Whether the CRC-32C of the batch's bytes from ``attributes`` on equals ``stored``."""
    view = memoryview(buf)[pos + CRC_START : pos + size]
    try:
        return bool(crc32c(view) == stored)
    finally:
        view.release()


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


def split_batches(data: bytes) -> list[tuple[int, int]]:
    """(position, size) of each complete batch of a produced record set, as Kafka's
    ``ByteBufferLogInputStream`` finds them: a trailing partial batch is ignored (Kafka trims
    it); a batch length below :data:`MIN_ANY_BATCH_LENGTH` raises :class:`CorruptBatchError`
    (``nextBatchSize`` throws ``CorruptRecordException``)."""
    out: list[tuple[int, int]] = []
    pos = 0
    n = len(data)
    while n - pos >= LOG_OVERHEAD:
        (length,) = _I32.unpack_from(data, pos + 8)
        if length < MIN_ANY_BATCH_LENGTH:
            raise CorruptBatchError(f"Record size {length} is less than the minimum record overhead", pos)
        size = LOG_OVERHEAD + length
        if n - pos < size:
            break
        out.append((pos, size))
        pos += size
    return out


# ---------------------------------------------------------------------------------------------
# payloads (bounded decompression)


def records_payload(
    buf: bytes | memoryview | mmap.mmap, h: BatchHeader, max_bytes: int = DEFAULT_MAX_UNCOMPRESSED
) -> bytes:
    """The record bytes of batch ``h``, decompressed (``protocol/compression.py``); at most
    ``max_bytes`` of them.

    Raises :class:`PayloadTooLargeError` when the batch decompresses to more (nothing larger than
    ``max_bytes`` is ever allocated), :class:`UndecompressableError` when the codec refuses the
    payload, :class:`CorruptBatchError` when the stream ends early,
    :class:`UnsupportedBatchError` for a compression id Kafka does not define.
    """
    raw = bytes(buf[h.position + HEADER_SIZE : h.end])
    comp = h.compression
    if comp == COMPRESSION_NONE:
        return raw
    if comp not in COMPRESSION_NAMES:
        raise UnsupportedBatchError(f"batch at {h.position} has unknown compression id {comp}", h.position)
    where = f"the {h.compression_name} payload of batch at {h.position}"
    try:
        return compression.decompress(comp, raw, max_bytes)
    except compression.TooLarge:
        raise PayloadTooLargeError(f"{where} decompresses to more than {max_bytes} bytes", h.position) from None
    except compression.Truncated as e:
        raise CorruptBatchError(f"{where} ends early: {e}", h.position) from None
    except compression.Undecompressable as e:
        raise UndecompressableError(f"{where} does not decompress: {e}", h.position) from None


# ---------------------------------------------------------------------------------------------
# records


def decode_records(
    buf: bytes | memoryview | mmap.mmap, h: BatchHeader, max_uncompressed: int = DEFAULT_MAX_UNCOMPRESSED
) -> tuple[Record, ...]:
    """The records of the batch ``h`` (a header read from the same ``buf``), keys, values and
    headers copied.  Framing rules and errors: :func:`_walk_records`."""
    data = records_payload(buf, h, max_uncompressed)
    out: list[Record] = []
    for offset, ts, kpos, klen, vpos, vlen, hpos, end in _walk_records(data, h, True):
        key = None if klen < 0 else data[kpos : kpos + klen]
        value = None if vlen < 0 else data[vpos : vpos + vlen]
        headers = () if hpos + 1 == end else _read_headers(data, hpos, h.position)
        out.append(Record(offset, ts, key, value, headers))
    return tuple(out)


def iter_record_times(
    buf: bytes | memoryview | mmap.mmap, h: BatchHeader, max_uncompressed: int = DEFAULT_MAX_UNCOMPRESSED
) -> Iterator[tuple[int, int]]:
    """(offset, timestamp) of each record of batch ``h``, every field of every record walked
    (:func:`_walk_records`) without copying keys or values.  Errors of the payload itself
    (:func:`records_payload`) are raised by this call, framing errors while iterating."""
    return _walk_records(records_payload(buf, h, max_uncompressed), h, False)


_Spans = tuple[int, int, int, int, int, int, int, int]


def walk_record_spans(
    buf: bytes | memoryview | mmap.mmap, h: BatchHeader, max_uncompressed: int = DEFAULT_MAX_UNCOMPRESSED
) -> Iterator[_Spans]:
    """For each record of batch ``h``: (offset, timestamp, key position, key length, value
    position, value length, header-count position, end) in the decompressed records
    (:func:`_walk_records`); a length of -1 is null."""
    return _walk_records(records_payload(buf, h, max_uncompressed), h, True)


def latest_record_times(
    buf: bytes | memoryview | mmap.mmap, h: BatchHeader, max_uncompressed: int, every: int
) -> Iterator[tuple[int, int, int]]:
    """Every field of every record of batch ``h`` walked as :func:`iter_record_times` walks
    them, yielding after each ``every`` records and after the last: (records walked so far,
    the latest timestamp among them, the offset delta of the first record holding it).  One
    yield per ``every`` records, not per record: the produce path's check of every record
    (docs/data-plane.md)."""
    if every <= 0:
        raise ValueError("every must be positive")
    data = records_payload(buf, h, max_uncompressed)
    if _compiled is not None and _use_compiled:
        return _latest_compiled(data, h, every)
    walk: Iterator[tuple[int, int, int]] = _walk_records(data, h, False, every)
    return walk


# Tests switch the compiled walks off to compare them with the reference (:func:`compiled_walk`).
_use_compiled = True


@contextlib.contextmanager
def compiled_walk(enabled: bool) -> Iterator[None]:
    """Within the block, the compiled walks (when built) are used only if ``enabled``: the
    produce check's (:func:`latest_record_times`), the offsets-log replay's
    (:func:`compiled_offsets_scan`) and the pipeline's (:func:`compiled_offset_rows`), and the
    offsets log's batch builder (:func:`build_batch`); the tests run both ways on the same
    bytes."""
    global _use_compiled
    before, _use_compiled = _use_compiled, enabled
    try:
        yield
    finally:
        _use_compiled = before


def compiled_offsets_scan() -> Callable[..., tuple[int, int, int, int]] | None:
    """The compiled scan of ``__consumer_offsets`` batches for replay (``scan_offsets_batches``
    in ``protocol/_recwalk.pyx``; docs/offsets-log-format.md, "Recovery at start-up"), or None
    when it was not built or is switched off."""
    if _compiled is None or not _use_compiled:
        return None
    scan: Callable[..., tuple[int, int, int, int]] = _compiled.scan_offsets_batches
    return scan


def compiled_offsets_fold() -> Callable[..., str | None] | None:
    """The compiled fold of what the replay scan took (``fold_offsets`` in
    ``protocol/_recwalk.pyx``), or None when it was not built or is switched off."""
    if _compiled is None or not _use_compiled:
        return None
    fold: Callable[..., str | None] = _compiled.fold_offsets
    return fold


def compiled_offsets_decoders() -> (
    tuple[Callable[[bytes], tuple[str, str, int, bool] | None], Callable[[bytes], tuple[int, str, int, int] | None]]
    | None
):
    """The compiled readers of an offset commit key (versions 0 and 1) and value (version 3)
    the replay decodes (``offset_commit_key_parts`` and ``offset_commit_value_v3_parts`` in
    ``protocol/_recwalk.pyx``; each answers None where ``protocol/offsets_schema.py`` must
    read), or None when they were not built or are switched off."""
    if _compiled is None or not _use_compiled:
        return None
    return _compiled.offset_commit_key_parts, _compiled.offset_commit_value_v3_parts


def compiled_offset_rows() -> Callable[[], Any] | None:
    """The compiled builder of the pipeline's offset rows (``OffsetRows`` in
    ``protocol/_recwalk.pyx``; pipeline/decode.py makes the rows it leaves), or None when it was
    not built or is switched off."""
    if _compiled is None or not _use_compiled:
        return None
    rows: Callable[[], Any] = _compiled.OffsetRows
    return rows


def _latest_compiled(data: bytes, h: BatchHeader, every: int) -> Iterator[tuple[int, int, int]]:
    """:func:`latest_record_times` with each slice of ``every`` records walked by the compiled
    walk (``protocol/_recwalk.pyx``), which answers only for records the reference accepts.
    When it does not answer, the reference walks the batch from its start, and yields only what
    this has not yielded yet: it words the error, or accepts what the compiled walk left to it."""
    assert _compiled is not None
    walk_times = _compiled.walk_times
    n = len(data)
    count = h.record_count
    done = pos = yielded = 0
    best_ts = best_delta = -1
    log_append = bool(h.attributes & ATTR_LOG_APPEND_TIME)
    if 0 <= count <= n // MIN_RECORD_SIZE:
        while done < count:
            step = min(every, count - done)
            walked = walk_times(data, pos, step, h.base_timestamp, log_append, h.max_timestamp, best_ts, best_delta)
            if walked is None:
                break
            pos, best_ts, best_delta = walked
            done += step
            if done == count and pos != n:
                break  # bytes after the last record: the reference words it
            yielded = done
            yield done, best_ts, best_delta
        else:
            if pos == n:
                return
    for item in _walk_records(data, h, False, every):
        if item[0] > yielded:
            yield item


@overload
def _walk_records(data: bytes, h: BatchHeader, spans: Literal[True]) -> Iterator[_Spans]: ...
@overload
def _walk_records(data: bytes, h: BatchHeader, spans: Literal[False]) -> Iterator[tuple[int, int]]: ...
@overload
def _walk_records(data: bytes, h: BatchHeader, spans: Literal[False], every: int) -> Iterator[tuple[int, int, int]]: ...
def _walk_records(data: bytes, h: BatchHeader, spans: bool, every: int = 0) -> Iterator[Any]:
    """The one walk over the (decompressed) records of batch ``h``, as Kafka's
    ``DefaultRecord.readFrom`` reads them: for each record its offset, its timestamp, the
    position and length of its key and of its value (length -1: null), the position of its
    header count and its end.  Header keys and values are walked (and checked) here, but only
    :func:`_read_headers` copies them.  With ``every``, it yields running maxima instead
    (:func:`latest_record_times`).

    Raises :class:`CorruptBatchError` (after the good records before it) when a record's length
    is negative or runs past the records, a varint is longer than its type allows, a header
    count is negative or larger than the bytes left, a header key is null, a record's fields do
    not end where its length says, fewer records than the header's count are there, or bytes
    remain after them.  The work is bounded by the bytes of the records, whatever the count
    claims.  Varints are inlined for their one- and two-byte cases (most lengths and deltas): start-up
    replay runs this for every record of the offsets log.
    """
    n = len(data)
    count = h.record_count
    where = h.position
    if count < 0 or count > n // MIN_RECORD_SIZE:
        raise CorruptBatchError(f"{count} records cannot fit in the {n} bytes of batch at {where}", where)
    base_offset = h.base_offset
    base_ts = h.base_timestamp
    # LogAppendTime batches: every record's timestamp is the batch's maxTimestamp (Kafka's
    # DefaultRecordBatch iterator ignores the stored deltas then).
    log_append_ts = h.max_timestamp if h.attributes & ATTR_LOG_APPEND_TIME else None
    pos = 0
    done = 0
    best_ts = best_delta = -1
    try:
        while done < count:
            b = data[pos]
            if b < 0x80:
                length = (b >> 1) ^ -(b & 1)
                pos += 1
            elif (b2 := data[pos + 1]) < 0x80:  # two bytes: records of 64 to 8 KiB
                raw = (b & 0x7F) | b2 << 7
                length = (raw >> 1) ^ -(raw & 1)
                pos += 2
            else:
                length, pos = read_varint(data, pos)
            end = pos + length
            if length < 6 or end > n:  # 6: MIN_RECORD_SIZE without its length byte
                raise CorruptBatchError(f"bad record length {length} in batch at {where}", where)
            p = pos + 1  # attributes
            b = data[p]
            if b < 0x80:
                ts_delta = (b >> 1) ^ -(b & 1)
                p += 1
            else:
                ts_delta, p = read_varint(data, p)
            b = data[p]
            if b < 0x80:
                off_delta = (b >> 1) ^ -(b & 1)
                p += 1
            elif (b2 := data[p + 1]) < 0x80:  # two bytes: the 64th to the 8,192nd record
                raw = (b & 0x7F) | b2 << 7
                off_delta = (raw >> 1) ^ -(raw & 1)
                p += 2
            else:
                off_delta, p = _read_varint32(data, p, where)
            b = data[p]
            if b < 0x80:
                klen = (b >> 1) ^ -(b & 1)
                p += 1
            else:
                klen, p = _read_varint32(data, p, where)
            kpos = p
            if klen > 0:
                p += klen
            b = data[p]
            if b < 0x80:
                vlen = (b >> 1) ^ -(b & 1)
                p += 1
            elif (b2 := data[p + 1]) < 0x80:  # two bytes: values of 64 B to 8 KiB
                raw = (b & 0x7F) | b2 << 7
                vlen = (raw >> 1) ^ -(raw & 1)
                p += 2
            else:
                vlen, p = _read_varint32(data, p, where)
            vpos = p
            if vlen > 0:
                p += vlen
            hpos = p
            if data[p] == 0:
                p += 1
            else:
                nheaders, p = _read_varint32(data, p, where)
                if nheaders < 0 or nheaders > end - p:
                    raise CorruptBatchError(f"bad header count {nheaders} in batch at {where}", where)
                for _h in range(nheaders):
                    hklen, p = _read_varint32(data, p, where)
                    if hklen < 0:
                        raise CorruptBatchError(f"null header key in batch at {where}", where)
                    p += hklen
                    hvlen, p = _read_varint32(data, p, where)
                    if hvlen > 0:
                        p += hvlen
                    if p > end:
                        break  # the framing check below refuses it
            if p != end:
                raise CorruptBatchError(f"record framing mismatch in batch at {where}", where)
            pos = end
            done += 1
            ts = log_append_ts if log_append_ts is not None else base_ts + ts_delta
            if spans:
                yield base_offset + off_delta, ts, kpos, klen, vpos, vlen, hpos, end
            elif every:
                if ts > best_ts:
                    best_ts, best_delta = ts, off_delta
                if done % every == 0:
                    yield done, best_ts, best_delta
            else:
                yield base_offset + off_delta, ts
    except IndexError:
        raise CorruptBatchError(
            f"batch at {where} holds {done} whole records, its header says {count}", where
        ) from None
    except ValueError as e:
        if isinstance(e, RecordsError):
            raise
        raise CorruptBatchError(f"malformed record in batch at {where}: {e}", where) from None
    if pos != n:
        raise CorruptBatchError(f"{n - pos} bytes remain after the {count} records of batch at {where}", where)
    if every and done % every:
        yield done, best_ts, best_delta


def _read_headers(data: bytes, pos: int, where: int) -> tuple[tuple[str, bytes | None], ...]:
    """The headers of a record whose header count starts at ``pos``, already walked (and
    checked) by :func:`_walk_records`; header keys must be UTF-8."""
    nheaders, pos = read_varint(data, pos)
    out: list[tuple[str, bytes | None]] = []
    for _h in range(nheaders):
        hklen, pos = read_varint(data, pos)
        try:
            hkey = data[pos : pos + hklen].decode("utf-8")
        except UnicodeDecodeError as e:
            raise CorruptBatchError(f"header key is not UTF-8 in batch at {where}: {e}", where) from None
        pos += hklen
        hvlen, pos = read_varint(data, pos)
        hval: bytes | None = None
        if hvlen >= 0:
            hval = data[pos : pos + hvlen]
            pos += hvlen
        out.append((hkey, hval))
    return tuple(out)


def _read_varint32(data: bytes, pos: int, where: int) -> tuple[int, int]:
    value, end = read_varint(data, pos)
    if end - pos > 5:
        raise CorruptBatchError(f"varint longer than 5 bytes in batch at {where}", where)
    return value, end


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


def end_txn_marker(
    offset: int, timestamp: int, producer_id: int, producer_epoch: int, commit: bool, coordinator_epoch: int = 0
) -> bytes:
    """The control batch ending a transaction (``MemoryRecords.withEndTransactionMarker``): one
    record, key = (version 0, type COMMIT 1 / ABORT 0), value = (version 0, coordinator epoch),
    transactional and control flags, base sequence -1, uncompressed, CreateTime."""
    key = _I16.pack(0) + _I16.pack(CONTROL_COMMIT if commit else CONTROL_ABORT)
    value = _I16.pack(0) + struct.pack(">i", coordinator_epoch)
    return encode_batch(
        [Record(offset, timestamp, key, value)],
        base_offset=offset,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        transactional=True,
        control=True,
    )
