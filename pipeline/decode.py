"""Decoding ``__consumer_offsets`` segment files into Arrow record batches (runs in Spark workers).

Pure Python + pyarrow; no Spark import here, so the same code is unit-tested without a JVM and
benchmarked single-process.  Files are found and read with the broker's own storage code
(``coordinator/storage/segments.py``: segment naming, ``SegmentReader`` and its torn-tail rule),
so the pipeline sees exactly what a broker's start-up recovery sees; bytes are decoded by
``protocol/``: ``protocol.records`` (v2 record batches, CRC-32C), ``protocol.offsets_schema`` (keys
and values, docs/offsets-log-format.md) and ``protocol.consumer_protocol`` (the members'
subscriptions and assignments).

One row per record, in one wide schema (:data:`ARROW_SCHEMA`) whose ``kind`` column says which
columns are filled:

- ``offset``  an OffsetCommitKey record (value or tombstone);
- ``group``   a GroupMetadataKey record (value or tombstone);
- ``marker``  a transaction control record (COMMIT/ABORT), with its producer id;
- ``other``   a key version this reader skips (KIP-848 / share groups, as Kafka's Scala loader does);
- ``bad``     a record whose key or value does not decode (counted, skipped);
- ``segment`` one row per file: what was read, and where and why reading stopped.

A segment is read up to its first torn (cut short) or corrupt (CRC, framing) batch, which is
where a log recovery truncates or stops; nothing raises out of :func:`decode_segment`.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from rallypoint.protocol import consumer_group_records as cgr
from rallypoint.protocol import offsets_schema as schema
from rallypoint.protocol import records as rec
from rallypoint.protocol.consumer_protocol import ConsumerProtocolError, decode_assignment, decode_subscription
from rallypoint.protocol.crc import crc32c
from rallypoint.storage.segments import BatchScan, CorruptLogError, SegmentReader, list_partition_dirs, list_segments

BATCH_ROWS = 32_768  # rows per Arrow batch handed back to Spark

ASSIGNED = pa.list_(pa.struct([("topic", pa.string()), ("partitions", pa.list_(pa.int32()))]))
MEMBER = pa.struct(
    [
        ("member_id", pa.string()),
        ("group_instance_id", pa.string()),
        ("client_id", pa.string()),
        ("client_host", pa.string()),
        ("rebalance_timeout", pa.int32()),
        ("session_timeout", pa.int32()),
        ("subscription_bytes", pa.int32()),
        ("assignment_bytes", pa.int32()),
        ("subscription_version", pa.int16()),
        ("subscribed_topics", pa.list_(pa.string())),
        ("assignment_version", pa.int16()),
        ("assigned", ASSIGNED),
        ("assigned_partitions", pa.int32()),
        ("protocol_error", pa.string()),  # the consumer-protocol bytes did not decode
    ]
)

ARROW_SCHEMA = pa.schema(
    [
        ("kind", pa.string()),
        ("broker", pa.string()),
        ("log_partition", pa.int32()),
        ("segment_base", pa.int64()),
        # record position
        ("log_offset", pa.int64()),
        ("batch_offset", pa.int64()),
        ("timestamp", pa.int64()),
        ("producer_id", pa.int64()),
        ("transactional", pa.bool_()),
        ("control_type", pa.int16()),
        ("key_version", pa.int16()),
        ("value_version", pa.int16()),
        ("tombstone", pa.bool_()),
        # OffsetCommitKey / GroupMetadataKey
        ("group", pa.string()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        # OffsetCommitValue
        ("offset", pa.int64()),
        ("leader_epoch", pa.int32()),
        ("metadata", pa.string()),
        ("commit_timestamp", pa.int64()),
        ("expire_timestamp", pa.int64()),
        # GroupMetadataValue
        ("protocol_type", pa.string()),
        ("generation", pa.int32()),
        ("protocol", pa.string()),
        ("leader", pa.string()),
        ("current_state_timestamp", pa.int64()),
        ("members", pa.list_(MEMBER)),
        # consumer-group (KIP-848) records: which record, its member (if any); the epoch it
        # carries goes in ``generation``
        ("record_type", pa.string()),
        ("member_id", pa.string()),
        # kind = bad / segment
        ("error", pa.string()),
        # kind = segment
        ("path", pa.string()),
        ("size_bytes", pa.int64()),
        ("valid_bytes", pa.int64()),
        ("batches", pa.int64()),
        ("records", pa.int64()),
        ("bad_records", pa.int64()),
        ("other_records", pa.int64()),
        ("first_offset", pa.int64()),
        ("last_offset", pa.int64()),
        # ok; torn (the broker truncates it away); corrupt, unsupported, unreadable (the broker refuses to start)
        ("status", pa.string()),
    ]
)
COLUMNS: tuple[str, ...] = tuple(ARROW_SCHEMA.names)

STATUS_OK = "ok"


@dataclass(frozen=True, slots=True)
class SegmentFile:
    broker: str
    log_partition: int
    base_offset: int
    path: str
    size: int
    is_last: bool = True  # the partition's active segment: the only one a crash can tear


def find_segments(broker: str, data_dir: str | os.PathLike[str]) -> list[SegmentFile]:
    """Every ``__consumer_offsets-<N>/<20-digit base offset>.log`` under one broker's data dir,
    as the broker lists them (``coordinator/storage/segments.py``).

    Listed here, in plain Python, and handed to Spark as explicit paths: Spark's own file
    listing treats names starting with ``_`` as hidden and silently skips these directories.
    """
    out: list[SegmentFile] = []
    for n, pdir in list_partition_dirs(Path(data_dir)).items():
        segs = list_segments(pdir)
        for i, (base, path) in enumerate(segs):
            out.append(SegmentFile(broker, n, base, str(path), path.stat().st_size, i == len(segs) - 1))
    return out


# What a consumer-protocol payload decodes to, cached by its bytes while a segment is read (the
# members of a group mostly share one subscription, and assignments repeat across rebalances):
# subscription -> (version, topics) or an error; assignment -> (version, assigned, partitions).
_CACHED_PAYLOADS = 4096
_CACHED_PAYLOAD_BYTES = 4096


def _subscription_fields(data: bytes) -> tuple[int, list[str]] | str:
    try:
        sub = decode_subscription(data)
    except ConsumerProtocolError as e:
        return f"subscription: {e}"
    return sub.version, list(sub.topics)


def _assignment_fields(data: bytes) -> tuple[int, list[dict[str, Any]], int] | str:
    try:
        a = decode_assignment(data)
    except ConsumerProtocolError as e:
        return f"assignment: {e}"
    assigned = [{"topic": tp.topic, "partitions": list(tp.partitions)} for tp in a.partitions]
    return a.version, assigned, sum(len(tp.partitions) for tp in a.partitions)


def _cached(decode: Callable[[bytes], Any], data: bytes, cache: dict[bytes, Any]) -> Any:
    """``decode(data)``, from ``cache`` when these bytes were decoded before (bounded above)."""
    got = cache.get(data)
    if got is None:
        got = decode(data)
        if len(cache) < _CACHED_PAYLOADS and len(data) <= _CACHED_PAYLOAD_BYTES:
            cache[data] = got
    return got


def _member_row(
    m: schema.MemberMetadata, consumer: bool, subscriptions: dict[bytes, Any], assignments: dict[bytes, Any]
) -> dict[str, Any]:
    """One member of a group record; the lists in it may be shared with other rows (read only)."""
    row: dict[str, Any] = {
        "member_id": m.member_id,
        "group_instance_id": m.group_instance_id,
        "client_id": m.client_id,
        "client_host": m.client_host,
        "rebalance_timeout": m.rebalance_timeout,
        "session_timeout": m.session_timeout,
        "subscription_bytes": len(m.subscription),
        "assignment_bytes": len(m.assignment),
        "subscription_version": None,
        "subscribed_topics": None,
        "assignment_version": None,
        "assigned": None,
        "assigned_partitions": None,
        "protocol_error": None,
    }
    if not consumer:
        return row
    errors = []
    sub = _cached(_subscription_fields, m.subscription, subscriptions)
    if isinstance(sub, str):
        errors.append(sub)
    else:
        row["subscription_version"], row["subscribed_topics"] = sub
    if m.assignment:
        asg = _cached(_assignment_fields, m.assignment, assignments)
        if isinstance(asg, str):
            errors.append(asg)
        else:
            row["assignment_version"], row["assigned"], row["assigned_partitions"] = asg
    else:
        errors.append("assignment: empty")
    row["protocol_error"] = "; ".join(errors) or None
    return row


# Which columns each kind of row fills, in the order its row tuples hold them; the other columns
# are null.  Rows are buffered as tuples per kind and turned into columns with zip(*rows) (C speed).
_COMMON = (
    "kind",
    "broker",
    "log_partition",
    "segment_base",
    "log_offset",
    "batch_offset",
    "timestamp",
    "producer_id",
    "transactional",
    "tombstone",
)
KIND_COLUMNS: dict[str, tuple[str, ...]] = {
    "offset": (
        *_COMMON,
        "key_version",
        "value_version",
        "group",
        "topic",
        "partition",
        "offset",
        "leader_epoch",
        "metadata",
        "commit_timestamp",
        "expire_timestamp",
    ),
    "group": (
        *_COMMON,
        "key_version",
        "value_version",
        "group",
        "protocol_type",
        "generation",
        "protocol",
        "leader",
        "current_state_timestamp",
        "members",
    ),
    "marker": (*_COMMON, "control_type"),
    "consumer": (*_COMMON, "key_version", "record_type", "group", "member_id", "generation"),
    "other": (*_COMMON, "key_version"),
    "bad": (*_COMMON, "error"),
    "segment": (
        "kind",
        "broker",
        "log_partition",
        "segment_base",
        "path",
        "size_bytes",
        "valid_bytes",
        "batches",
        "records",
        "bad_records",
        "other_records",
        "first_offset",
        "last_offset",
        "status",
        "error",
    ),
}
_TYPES = {f.name: f.type for f in ARROW_SCHEMA}


def _to_batch(kind: str, rows: list[tuple[Any, ...]]) -> pa.RecordBatch:
    cols = dict(zip(KIND_COLUMNS[kind], zip(*rows, strict=True), strict=True))
    n = len(rows)
    arrays = [
        pa.array(cols[name], type=_TYPES[name]) if name in cols else pa.nulls(n, type=_TYPES[name]) for name in COLUMNS
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def _consumer_fields(key: bytes, value: bytes | None) -> tuple[str, str, str | None, int | None]:
    """(record type name, group, member id, epoch) of a consumer-group record (KIP-848): the
    group epoch, the target assignment epoch or the member epoch, whichever the record holds.
    Raises OffsetsSchemaError for bytes that do not decode (a ``bad`` row)."""
    try:
        k, val = cgr.decode_record(key, value)
    except (cgr.ConsumerRecordError, ValueError, IndexError) as e:
        raise schema.OffsetsSchemaError(f"consumer-group record: {e}") from None
    epoch: int | None = None
    if isinstance(val, cgr.GroupMetadataValue):
        epoch = val.epoch
    elif isinstance(val, cgr.TargetAssignmentMetadataValue):
        epoch = val.assignment_epoch
    elif isinstance(val, cgr.CurrentMemberAssignmentValue):
        epoch = val.member_epoch
    return cgr.RECORD_NAMES[k.record_type], k.group_id, getattr(k, "member_id", None), epoch


class _Counts:
    """Per segment: bad and skipped records, and the consumer-protocol caches."""

    __slots__ = ("assignments", "bad", "other", "subscriptions")

    def __init__(self) -> None:
        self.bad = self.other = 0
        self.subscriptions: dict[bytes, Any] = {}
        self.assignments: dict[bytes, Any] = {}


def _record_row(
    buffers: dict[str, list[tuple[Any, ...]]], common: tuple[Any, ...], k: bytes | None, v: bytes | None, n: _Counts
) -> None:
    """The row of one record (not a control record) in its kind's buffer; ``common`` holds
    broker, log partition, segment base, offset, batch offset, timestamp, producer id,
    transactional and tombstone."""
    if k is None:
        buffers["bad"].append(("bad", *common, "record without a key"))
        n.bad += 1
        return
    try:
        key = schema.decode_key(k)
        if isinstance(key, schema.OffsetCommitKey):
            if v is None:
                buffers["offset"].append(
                    ("offset", *common, (k[0] << 8 | k[1]), None, key.group, key.topic, key.partition) + (None,) * 5
                )
            else:
                ov = schema.decode_offset_commit_value(v)
                buffers["offset"].append(
                    (
                        "offset",
                        *common,
                        (k[0] << 8 | k[1]),
                        (v[0] << 8 | v[1]),
                        key.group,
                        key.topic,
                        key.partition,
                        ov.offset,
                        ov.leader_epoch,
                        ov.metadata,
                        ov.commit_timestamp,
                        ov.expire_timestamp,
                    )
                )
        elif isinstance(key, schema.GroupMetadataKey):
            if v is None:
                buffers["group"].append(("group", *common, (k[0] << 8 | k[1]), None, key.group) + (None,) * 6)
            else:
                g = schema.decode_group_metadata_value(v)
                consumer = g.protocol_type == "consumer"
                buffers["group"].append(
                    (
                        "group",
                        *common,
                        (k[0] << 8 | k[1]),
                        (v[0] << 8 | v[1]),
                        key.group,
                        g.protocol_type,
                        g.generation,
                        g.protocol,
                        g.leader,
                        g.current_state_timestamp,
                        [_member_row(m, consumer, n.subscriptions, n.assignments) for m in g.members],
                    )
                )
        elif cgr.is_consumer_record_type(key.version):
            buffers["consumer"].append(("consumer", *common, key.version, *_consumer_fields(k, v)))
        else:  # UnknownKey: share-group records, skipped as Kafka's Scala loader does
            buffers["other"].append(("other", *common, key.version))
            n.other += 1
    except schema.OffsetsSchemaError as e:
        buffers["bad"].append(("bad", *common, str(e)))
        n.bad += 1


class _CompiledRows:
    """The compiled scan's sink (``FastSink``, coordinator/storage/segments.py): plain batches
    are read by ``OffsetRows`` (protocol/_recwalk.pyx), which makes the offset rows itself, as
    Arrow column buffers, and hands every other record back in :attr:`rest` for
    :func:`_record_row` (docs/offsets-log-format.md, "Reading the log in the pipeline")."""

    def __init__(self, make: Callable[[], Any], max_rows: int) -> None:
        self.rows = make()
        self.rest: list[tuple[int, int, int, int, bytes, bytes | None]] = []
        self.fast_records = 0
        self.max_rows = max_rows

    def scanner(self) -> BatchScan:
        scan, rest, max_rows = self.rows.scan, self.rest, self.max_rows

        def bound(segment: mmap.mmap, pos: int, expected: int) -> tuple[int, int, int, int]:
            result: tuple[int, int, int, int] = scan(segment, pos, expected, crc32c, rest, max_rows)
            return result

        return bound

    def batch(self, broker: str, lp: int, sbase: int) -> pa.RecordBatch:
        """The offset rows made so far, as one Arrow batch of :data:`ARROW_SCHEMA`."""
        n, b = self.rows.take()

        def fixed(name: str, validity: pa.Buffer | None = None) -> pa.Array:
            return pa.Array.from_buffers(_TYPES[name], n, [validity, pa.py_buffer(b[name])])

        def text(name: str, validity: pa.Buffer | None = None) -> pa.Array:
            buffers = [validity, pa.py_buffer(b[name + "_offsets"]), pa.py_buffer(b[name + "_data"])]
            return pa.Array.from_buffers(pa.string(), n, buffers)

        def bitmap(name: str) -> pa.Array:
            return pc.cast(pa.Array.from_buffers(pa.uint8(), n, [None, pa.py_buffer(b[name])]), pa.bool_())

        tombstone = bitmap("tombstone")
        valued = pc.invert(tombstone).buffers()[1]  # the value's columns are null in a tombstone
        cols = {
            "kind": pa.repeat("offset", n),
            "broker": pa.repeat(broker, n),
            "log_partition": pa.repeat(pa.scalar(lp, pa.int32()), n),
            "segment_base": pa.repeat(pa.scalar(sbase, pa.int64()), n),
            "log_offset": fixed("log_offset"),
            "batch_offset": fixed("batch_offset"),
            "timestamp": fixed("timestamp"),
            "producer_id": fixed("producer_id"),
            "transactional": pa.repeat(False, n),
            "tombstone": tombstone,
            "key_version": fixed("key_version"),
            "value_version": fixed("value_version", valued),
            "group": text("group"),
            "topic": text("topic"),
            "partition": fixed("partition"),
            "offset": fixed("offset", valued),
            "leader_epoch": fixed("leader_epoch", valued),
            "metadata": text("metadata", valued),
            "commit_timestamp": fixed("commit_timestamp", valued),
            "expire_timestamp": fixed("expire_timestamp", bitmap("expire_valid").buffers()[1]),
        }
        assert tuple(cols) == KIND_COLUMNS["offset"]
        arrays = [cols[name] if name in cols else pa.nulls(n, type=_TYPES[name]) for name in COLUMNS]
        return pa.RecordBatch.from_arrays(arrays, schema=ARROW_SCHEMA)


def decode_segment(seg: SegmentFile, batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    """Arrow batches of one segment's records, then its ``segment`` row.  Never raises for bad
    data: reading stops at the first torn or corrupt batch and the segment row says so.

    Rows come out grouped by kind, in no set order: the tables order them by offset."""
    buffers: dict[str, list[tuple[Any, ...]]] = {k: [] for k in KIND_COLUMNS}
    offsets, groups = buffers["offset"], buffers["group"]
    counts = _Counts()
    n_records = 0
    first_offset: int | None = None
    status, error = STATUS_OK, None
    broker, lp, sbase = seg.broker, seg.log_partition, seg.base_offset
    make = rec.compiled_offset_rows()
    fast = _CompiledRows(make, batch_rows) if make is not None else None
    reader = SegmentReader(Path(seg.path), sbase, is_last=seg.is_last, fast=fast)

    def take_rest() -> None:
        assert fast is not None
        for boff, pid, offset, ts, k, v in fast.rest:
            _record_row(buffers, (broker, lp, sbase, offset, boff, ts, pid, False, v is None), k, v, counts)
        fast.rest.clear()

    try:
        for batch in reader:
            h = batch.header
            boff, pid, txn = h.base_offset, h.producer_id, h.is_transactional
            if h.is_control:
                for r in batch.records:
                    common = (broker, lp, sbase, r.offset, boff, r.timestamp, pid, txn, r.value is None)
                    buffers["marker"].append(("marker", *common, rec.control_type(r)))
            else:
                for r in batch.records:
                    v = r.value
                    common = (broker, lp, sbase, r.offset, boff, r.timestamp, pid, txn, v is None)
                    _record_row(buffers, common, r.key, v, counts)
            n_records += len(batch.records)
            if first_offset is None:
                first_offset = h.base_offset
            if fast is not None:
                take_rest()
                if fast.rows.rows >= batch_rows:
                    yield fast.batch(broker, lp, sbase)
            if len(offsets) >= batch_rows:
                yield _to_batch("offset", offsets)
                offsets.clear()
            if len(groups) * 8 >= batch_rows:  # group rows are wide
                yield _to_batch("group", groups)
                groups.clear()
        if reader.torn is not None:
            status, error = "torn", reader.torn[1]
    except CorruptLogError as e:
        status, error = ("unsupported" if e.unsupported else "corrupt"), e.reason
    except OSError as e:
        status, error = "unreadable", f"{type(e).__name__}: {e}"
    done = reader.segment
    if fast is not None:
        take_rest()
        n_records += fast.fast_records
        if fast.rows.first_offset >= 0 and (first_offset is None or fast.rows.first_offset < first_offset):
            first_offset = fast.rows.first_offset
        if fast.rows.rows:
            yield fast.batch(broker, lp, sbase)
    buffers["segment"].append(
        (
            "segment",
            broker,
            lp,
            sbase,
            seg.path,
            seg.size,
            done.size,
            done.batches,
            n_records,
            counts.bad,
            counts.other,
            first_offset,
            done.next_offset - 1 if done.batches else None,
            status,
            error,
        )
    )
    for kind, rows in buffers.items():
        if rows:
            yield _to_batch(kind, rows)


def decode_segments(segs: Iterable[SegmentFile], batch_rows: int = BATCH_ROWS) -> Iterator[pa.RecordBatch]:
    for seg in segs:
        yield from decode_segment(seg, batch_rows)


def check_order(segments: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Segment rows (``kind == "segment"``) with what only the whole partition shows: offsets
    must not go backwards from one segment to the next (as in ``recover_partition``,
    coordinator/storage/segments.py: an overlapping segment or a batch below the expected offset
    stops the broker).  Such a segment is marked ``corrupt`` with no valid bytes (its records were decoded but
    none is trusted); rows are returned in (broker, partition, base) order."""
    out = sorted((dict(r) for r in segments), key=lambda r: (r["broker"], r["log_partition"], r["segment_base"]))
    prev: tuple[str, int] | None = None
    next_offset = 0
    for r in out:
        if (r["broker"], r["log_partition"]) != prev:
            prev, next_offset = (r["broker"], r["log_partition"]), 0
        if r["status"] in (STATUS_OK, "torn"):
            base, first = r["segment_base"], r["first_offset"]
            if base < next_offset:
                r["status"], r["valid_bytes"] = "corrupt", 0
                r["error"] = f"segment base offset {base} overlaps the previous segment (ends at {next_offset})"
            elif first is not None and first < max(base, next_offset):
                r["status"], r["valid_bytes"] = "corrupt", 0
                r["error"] = f"batch base offset {first} is below the expected {max(base, next_offset)}"
        next_offset = r["last_offset"] + 1 if r["last_offset"] is not None else max(next_offset, r["segment_base"])
    return out


# --- the mapInArrow side ------------------------------------------------------------------------

FILES_ARROW = pa.struct(
    [
        ("broker", pa.string()),
        ("log_partition", pa.int32()),
        ("base_offset", pa.int64()),
        ("path", pa.string()),
        ("size", pa.int64()),
        ("is_last", pa.bool_()),
    ]
)


STAGED_ARROW = pa.schema([("bin", pa.int32()), ("rows", pa.int64())])  # staging_writer's output


def staging_writer(
    staging: str, bins: list[list[dict[str, Any]]]
) -> Callable[[Iterable[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """mapInArrow function writing Parquet itself.  Its input is ``spark.range(len(bins))``:
    a row ``id`` is a bin number, and ``bins[id]`` (carried in this closure) its files, as
    dicts of :class:`SegmentFile`'s fields.  The task decodes them into
    ``<staging>/part-<bin>.parquet`` (:data:`ARROW_SCHEMA`) and yields one row of
    :data:`STAGED_ARROW`.  Spark then reads the directory with its own Parquet reader.  Handing
    the rows to Spark instead made the JVM turn every Arrow batch into rows and write them
    again, some 6 times the decode's own cost; the bins as a DataFrame of Python rows made a
    second kind of Python worker start (pipeline/README.md, "How it runs").  The file is
    written under a hidden name and renamed into place, so a task that Spark runs again leaves
    one whole file, never two."""
    import pyarrow.parquet as pq

    def write(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for b in batches:
            for number in b.column("id").to_pylist():
                final = os.path.join(staging, f"part-{number:05d}.parquet")
                temp = os.path.join(staging, f".part-{number:05d}.{os.getpid()}.{id(b)}.tmp")
                rows = 0
                with pq.ParquetWriter(temp, ARROW_SCHEMA) as out:
                    for f in bins[number]:
                        for decoded in decode_segment(SegmentFile(**f)):
                            out.write_batch(decoded)
                            rows += decoded.num_rows
                os.replace(temp, final)
                yield pa.RecordBatch.from_pylist([{"bin": number, "rows": rows}], schema=STAGED_ARROW)

    return write


def bin_files(files: list[SegmentFile], bins: int) -> list[list[SegmentFile]]:
    """Largest-first greedy packing of files into at most ``bins`` bins of similar total size."""
    n = max(1, min(bins, len(files)))
    out: list[list[SegmentFile]] = [[] for _ in range(n)]
    load = [0] * n
    for f in sorted(files, key=lambda f: (-f.size, f.path)):
        i = min(range(n), key=load.__getitem__)
        out[i].append(f)
        load[i] += f.size + 1
    return [b for b in out if b]
