"""Topic data in the pipeline: the partitions a broker keeps on disk (``rallypoint.log.storage=disk``,
docs/data-plane.md, "Durable topic data") are Kafka logs too, so ``rallypoint report`` reads them.

Only batch headers are read (record count, offsets, bytes, timestamps, codec, flags; the CRC is
checked), never the records: the tables describe volume and flow, not content.

* ``topic_batches`` — one row per batch: broker, topic, partition, segment_base, base_offset,
  last_offset, records, bytes, first_timestamp, max_timestamp, compression, transactional,
  control, crc_ok;
* ``topic_partitions`` — one row per partition: batches, records, bytes, first and last offset,
  first and last timestamp, records per second over that span.

The report adds "Topic data": a table per partition and records over time per partition.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from rallypoint.protocol.records import RecordsError, read_header
from rallypoint.storage.segments import list_segments
from rallypoint.topics.segment_files import PARTITION_METADATA, parse_partition_dir_name
from rallypoint.topics.store import INTERNAL_TOPICS

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


ARROW_SCHEMA = pa.schema(
    [
        ("broker", pa.string()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("segment_base", pa.int64()),
        ("base_offset", pa.int64()),
        ("last_offset", pa.int64()),
        ("records", pa.int32()),
        ("bytes", pa.int64()),
        ("first_timestamp", pa.int64()),
        ("max_timestamp", pa.int64()),
        ("compression", pa.string()),
        ("transactional", pa.bool_()),
        ("control", pa.bool_()),
        ("crc_ok", pa.bool_()),
    ]
)

FILES_ARROW = pa.struct(
    [
        ("broker", pa.string()),
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("base_offset", pa.int64()),
        ("path", pa.string()),
        ("size", pa.int64()),
    ]
)


@dataclass(frozen=True)
class TopicSegment:
    broker: str
    topic: str
    partition: int
    base_offset: int
    path: str
    size: int


def find_topic_segments(broker: str, data_dir: str | os.PathLike[str]) -> list[TopicSegment]:
    """Every ``<topic>-<partition>/<base>.log`` of topic data under one broker's data dir."""
    out: list[TopicSegment] = []
    root = Path(data_dir)
    if not root.is_dir():
        return out
    for pdir in sorted(root.iterdir()):
        parsed = parse_partition_dir_name(pdir.name)
        # only partition directories of topic data have partition.metadata
        if parsed is None or parsed[0] in INTERNAL_TOPICS or not (pdir / PARTITION_METADATA).is_file():
            continue
        topic, index = parsed
        for base, path in list_segments(pdir):
            out.append(TopicSegment(broker, topic, index, base, str(path), path.stat().st_size))
    return out


def decode_topic_segment(seg: TopicSegment) -> Iterator[pa.RecordBatch]:
    """One row per batch header of ``seg``, up to the first batch that cannot be read."""
    rows: dict[str, list[Any]] = {name: [] for name in ARROW_SCHEMA.names}
    if seg.size:
        with open(seg.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            pos, size = 0, len(mm)
            while pos < size:
                crc_ok = True
                try:
                    h = read_header(mm, pos)
                except RecordsError:
                    try:  # a CRC mismatch: still describe the batch, flagged
                        h = read_header(mm, pos, verify_crc=False)
                        crc_ok = False
                    except RecordsError:
                        break
                for name, value in (
                    ("broker", seg.broker),
                    ("topic", seg.topic),
                    ("partition", seg.partition),
                    ("segment_base", seg.base_offset),
                    ("base_offset", h.base_offset),
                    ("last_offset", h.last_offset),
                    ("records", h.record_count),
                    ("bytes", h.size),
                    ("first_timestamp", h.base_timestamp),
                    ("max_timestamp", h.max_timestamp),
                    ("compression", h.compression_name),
                    ("transactional", h.is_transactional),
                    ("control", h.is_control),
                    ("crc_ok", crc_ok),
                ):
                    rows[name].append(value)
                pos = h.end
    if rows["broker"]:
        yield pa.RecordBatch.from_pydict(rows, schema=ARROW_SCHEMA)


def decode_topic_files(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """mapInArrow function: each input row holds one bin of topic segment files."""
    for b in batches:
        for files in b.column("files").to_pylist():
            for f in files or ():
                yield from decode_topic_segment(TopicSegment(**f))


def batches_frame(spark: SparkSession, files: list[TopicSegment]) -> DataFrame:
    """``topic_batches`` (lazily decoded, one task per bin of files of similar size)."""
    from pyspark.sql.pandas.types import from_arrow_schema
    from rallypoint.pipeline.decode import SegmentFile, bin_files

    schema = from_arrow_schema(ARROW_SCHEMA)
    in_schema = from_arrow_schema(pa.schema([("files", pa.list_(FILES_ARROW))]))
    # bin_files packs by size only: borrow its SegmentFile shape for the packing
    by_path = {f.path: f for f in files}
    proxies = [SegmentFile(f.broker, f.partition, f.base_offset, f.path, f.size) for f in files]
    bins = bin_files(proxies, bins=4 * spark.sparkContext.defaultParallelism)
    rows = [([vars(by_path[p.path]) for p in b],) for b in bins]
    rdd = spark.sparkContext.parallelize(rows, max(1, len(rows)))
    return spark.createDataFrame(rdd, in_schema).mapInArrow(decode_topic_files, schema)


def partitions_table(batches: DataFrame) -> DataFrame:
    """``topic_partitions``: one row per (broker, topic, partition); control batches (transaction
    markers) count as batches and bytes, not as records."""
    from pyspark.sql import functions as F

    data = F.when(~F.col("control"), F.col("records")).otherwise(F.lit(0))
    span_s = (F.col("last_timestamp") - F.col("first_timestamp")) / 1000.0
    return (
        batches.groupBy("broker", "topic", "partition")
        .agg(
            F.count("*").alias("batches"),
            F.sum(data).cast("long").alias("records"),
            F.sum("bytes").alias("bytes"),
            F.min("base_offset").alias("first_offset"),
            F.max("last_offset").alias("last_offset"),
            F.min("first_timestamp").alias("first_timestamp"),
            F.max("max_timestamp").alias("last_timestamp"),
            F.sum((~F.col("crc_ok")).cast("int")).alias("crc_errors"),
        )
        .withColumn("records_per_second", F.when(span_s > 0, F.col("records") / span_s))
        .orderBy("broker", "topic", "partition")
    )


def activity(batches: DataFrame, bucket_ms: int) -> Any:
    """Records per (broker, topic, partition, time bucket of the batches' max timestamp), pandas."""
    from pyspark.sql import functions as F

    return (
        batches.where(~F.col("control"))
        .groupBy(
            "broker",
            "topic",
            "partition",
            (F.floor(F.col("max_timestamp") / bucket_ms) * bucket_ms).cast("long").alias("bucket"),
        )
        .agg(F.sum("records").cast("long").alias("records"))
        .orderBy("broker", "topic", "partition", "bucket")
        .toPandas()
    )
