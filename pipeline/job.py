"""``rallypoint report``: offsets-log analytics over one or many brokers' data dirs, in PySpark.

    rallypoint report --input DIR [DIR ...] --out OUT [--master URL] [--conf KEY=VALUE ...]
    spark-submit --master spark://h:7077 pipeline/job.py --input DIR ... --out OUT

Each input is one broker's data dir (``NAME=DIR`` names it; otherwise the directory's name does);
that name is the ``broker`` column of every table.  OUT receives one Parquet directory per table
(segments, commits, offsets_latest, tombstones, generations, group_summary, invariants,
consumer_group_records, and for
topic data kept on disk topic_batches and topic_partitions: pipeline/topic_data.py) and
``report.html``.

How it runs: the driver lists the segment files itself (Spark's listing hides ``__consumer_offsets-N``
directories, see pipeline/README.md, "How it runs") and packs them into bins of similar size; a DataFrame of those
paths goes through ``mapInArrow``, where each task opens and decodes its own files with
``protocol/``'s decoders and writes what it decoded as a Parquet file of a staging directory
under OUT (pyarrow's writer, not Spark's: pipeline/README.md, "How it runs"); the tables are
computed from there (later tables from earlier ones read back), then the staging is removed.

pyspark is imported only when the job runs, so the broker never needs it.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if __package__ in (None, ""):  # run as a script by spark-submit: make the packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from rallypoint.pipeline import decode, topic_data  # after the sys.path fix above

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

STAGING = "staging-decoded"
TABLES = (
    "segments",
    "commits",
    "offsets_latest",
    "tombstones",
    "generations",
    "group_summary",
    "invariants",
    "consumer_group_records",
    "topic_batches",
    "topic_partitions",
)
SMALL_TABLES = frozenset({"segments", "group_summary", "invariants", "topic_partitions"})  # one Parquet file each

# Small logs (pipeline/README.md, "Small logs"): decoded in the driver, and run with settings for
# many tiny jobs rather than a few big ones -- one shuffle partition, no adaptive re-planning
# (it adds a job per stage), no whole-stage code generation (compiling each plan costs more
# than running it); a JVM that starts up and warms up fast (C1 only, the serial collector).
SMALL_INPUT_BYTES = 32 << 20
SMALL_INPUT_SQL: dict[str, str] = {
    "spark.sql.shuffle.partitions": "1",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.autoBroadcastJoinThreshold": "-1",
}
SMALL_INPUT_JVM = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


@dataclass(frozen=True)
class Input:
    broker: str
    data_dir: Path


def parse_inputs(specs: Sequence[str]) -> list[Input]:
    """``DIR`` or ``NAME=DIR``; repeated names get ``-2``, ``-3`` … appended."""
    out: list[Input] = []
    seen: dict[str, int] = {}
    for spec in specs:
        name, sep, rest = spec.partition("=")
        if sep and name and "/" not in name:
            path = Path(rest)
        else:
            path = Path(spec)
            name = path.resolve().name or "broker"
        n = seen.get(name, 0) + 1
        seen[name] = n
        out.append(Input(name if n == 1 else f"{name}-{n}", path))
    return out


def spark_schema() -> Any:
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(decode.ARROW_SCHEMA)


def stage_decoded(spark: SparkSession, files: list[decode.SegmentFile], staging: Path) -> None:
    """Decode ``files`` in the tasks, each bin of files into a Parquet file of ``staging``
    (decode.staging_writer).  An input without files leaves one empty file, so that the
    directory reads as an empty table."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark.sql.pandas.types import from_arrow_schema

    staging.mkdir(parents=True, exist_ok=True)
    parallelism = spark.sparkContext.defaultParallelism
    bins = decode.bin_files(files, bins=4 * parallelism)
    if not bins:
        pq.write_table(pa.Table.from_batches([], schema=decode.ARROW_SCHEMA), staging / "part-empty.parquet")
        return
    # one bin per task; the files travel in the function's closure (decode.staging_writer)
    writer = decode.staging_writer(str(staging), [[dataclasses.asdict(f) for f in b] for b in bins])
    written = spark.range(0, len(bins), 1, len(bins)).mapInArrow(writer, from_arrow_schema(decode.STAGED_ARROW))
    written.collect()  # runs the tasks: a row count per bin comes back


def small_frames(
    spark: SparkSession, files: list[decode.SegmentFile], topic_files: list[topic_data.TopicSegment]
) -> tuple[DataFrame, DataFrame]:
    """A small input decoded here, in the driver, by the same decoders the tasks run: the
    decoded records and topic_batches, as local relations (no Python workers, no staging)."""
    import pyarrow as pa

    def frame(batches: list[pa.RecordBatch], schema: pa.Schema) -> DataFrame:
        # one empty batch at least: Spark cannot take a table without any
        table = pa.Table.from_batches(batches or [pa.RecordBatch.from_pylist([], schema=schema)], schema=schema)
        return spark.createDataFrame(table)

    return (
        frame(list(decode.decode_segments(files)), decode.ARROW_SCHEMA),
        frame([b for f in topic_files for b in topic_data.decode_topic_segment(f)], topic_data.ARROW_SCHEMA),
    )


def segment_files(
    inputs: Sequence[Input], *, quiet: bool = False
) -> tuple[list[decode.SegmentFile], list[topic_data.TopicSegment], int]:
    """Every ``__consumer_offsets`` and topic segment file of the inputs, as the driver lists
    them, and their total size; an input without offsets-log segments is reported on stderr
    unless ``quiet``."""
    files: list[decode.SegmentFile] = []
    topic_files: list[topic_data.TopicSegment] = []
    for inp in inputs:
        found = decode.find_segments(inp.broker, inp.data_dir)
        if not found and not quiet:
            print(f"rallypoint report: no __consumer_offsets segments in {inp.data_dir}", file=sys.stderr)
        files += found
        topic_files += topic_data.find_topic_segments(inp.broker, inp.data_dir)
    total: int = sum(f.size for f in files) + sum(f.size for f in topic_files)
    return files, topic_files, total


def run(
    spark: SparkSession,
    inputs: Sequence[Input],
    out: Path,
    *,
    report: bool = True,
    small_input_bytes: int = SMALL_INPUT_BYTES,
) -> dict[str, Any]:
    """Decode, build every table into ``out``, optionally render ``out/report.html``; returns counters.

    An input of at most ``small_input_bytes`` is decoded in the driver and its tables computed
    with the settings of SMALL_INPUT_SQL (pipeline/README.md, "Small logs"; the session's own
    settings are put back after); a larger one is decoded by the tasks and staged as Parquet,
    once, for the tables."""
    t0 = time.monotonic()
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    files, topic_files, total = segment_files(inputs)
    parallelism = spark.sparkContext.defaultParallelism
    staging = out / STAGING
    small = total <= small_input_bytes
    settings = dict(SMALL_INPUT_SQL) if small else {}
    # few shuffle partitions for small logs: each one is a task per stage (AQE coalesces further)
    settings.setdefault("spark.sql.shuffle.partitions", str(max(parallelism, min(200, total // (32 << 20)))))
    before = {k: spark.conf.get(k, None) for k in settings}
    try:
        for k, v in settings.items():
            spark.conf.set(k, v)
        t1 = time.monotonic()
        if small:
            decoded, topic_batches = small_frames(spark, files, topic_files)
        else:
            shutil.rmtree(staging, ignore_errors=True)  # what a run stopped half-way left
            stage_decoded(spark, files, staging)
            decoded = spark.read.schema(spark_schema()).parquet(staging.as_uri())
            topic_batches = topic_data.batches_frame(spark, topic_files)
        t2 = time.monotonic()
        tables = build_and_write(spark, decoded, out, topic_batches)
        counters = counters_of(tables)
        t3 = time.monotonic()
        if report:
            from rallypoint.pipeline import report as report_mod

            data = report_mod.collect(tables, [(i.broker, str(i.data_dir)) for i in inputs])
            (out / "report.html").write_text(report_mod.render(data), encoding="utf-8")
    finally:
        for k, was in before.items():
            if was is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, was)
    shutil.rmtree(staging, ignore_errors=True)
    t4 = time.monotonic()
    counters["bytes"] = total
    counters["decode"] = "driver" if small else "tasks"
    counters.update(
        decode_seconds=round(t2 - t1, 2),
        tables_seconds=round(t3 - t2, 2),
        report_seconds=round(t4 - t3, 2),
        seconds=round(t4 - t0, 2),
    )
    return counters


def build_and_write(
    spark: SparkSession, decoded: DataFrame, out: Path, topic_batches: DataFrame
) -> dict[str, DataFrame]:
    from rallypoint.pipeline import tables as tables_mod

    def save(name: str, df: DataFrame) -> DataFrame:
        (df.coalesce(1) if name in SMALL_TABLES else df).write.mode("overwrite").parquet((out / name).as_uri())
        # read back with the schema it was written with: inferring it from the files is a job
        back: DataFrame = spark.read.schema(df.schema).parquet((out / name).as_uri())
        return back

    tables = tables_mod.build(decoded, save)
    tables["topic_batches"] = save("topic_batches", topic_batches)
    tables["topic_partitions"] = save("topic_partitions", topic_data.partitions_table(tables["topic_batches"]))
    return tables


def counters_of(tables: dict[str, DataFrame]) -> dict[str, Any]:
    from pyspark.sql import functions as F

    row = (
        tables["segments"]
        .agg(
            F.count("*").alias("segments"),
            F.coalesce(F.sum("records"), F.lit(0)).alias("records"),
            F.coalesce(F.sum((F.col("status") != "ok").cast("int")), F.lit(0)).alias("damaged_segments"),
            F.coalesce(F.sum("bad_records"), F.lit(0)).alias("bad_records"),
        )
        .first()
    )
    c: dict[str, Any] = row.asDict() if row is not None else {}
    c["commits"] = tables["commits"].count()
    c["offsets_latest"] = tables["offsets_latest"].count()
    c["groups"] = tables["group_summary"].count()
    c["topic_partitions"] = tables["topic_partitions"].count()
    c["consumer_group_records"] = tables["consumer_group_records"].count()
    c["invariant_violations"] = int(
        tables["invariants"].agg(F.coalesce(F.sum("violations"), F.lit(0))).first()[0]  # type: ignore[index]
    )
    return c


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rallypoint report",
        description="Analyse the __consumer_offsets logs of rallypoint brokers with PySpark: "
        "Parquet tables and a self-contained HTML report.",
    )
    p.add_argument(
        "--input",
        nargs="+",
        required=True,
        metavar="DIR",
        help="a broker's data dir (repeatable; NAME=DIR names the broker, default: the dir's name)",
    )
    p.add_argument("--out", required=True, type=Path, help="output directory (tables + report.html)")
    p.add_argument("--master", help="Spark master URL (default local[*], or spark-submit's)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark setting")
    p.add_argument("--no-report", action="store_true", help="write the tables only")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = _parser()
    try:
        args = p.parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as e:
        return int(e.code or 0)
    conf: dict[str, str] = {}
    for item in args.conf:
        k, sep, v = item.partition("=")
        if not sep or not k:
            print(f"rallypoint report: --conf expects KEY=VALUE, got {item!r}", file=sys.stderr)
            return 2
        conf[k] = v
    inputs = parse_inputs(args.input)
    missing = [str(i.data_dir) for i in inputs if not i.data_dir.is_dir()]
    if missing:
        print(f"rallypoint report: not a directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        import pyspark  # noqa: F401
    except ImportError:
        print("rallypoint report: pyspark is not installed (pip install 'rallypoint[pipeline]')", file=sys.stderr)
        return 1
    from pyspark.sql import SparkSession
    from rallypoint.pipeline.session import get_session

    args.out.mkdir(parents=True, exist_ok=True)
    ours = SparkSession.getActiveSession() is None  # stop only a session this call started
    if ours and segment_files(inputs, quiet=True)[2] <= SMALL_INPUT_BYTES:
        conf.setdefault("spark.driver.extraJavaOptions", SMALL_INPUT_JVM)
    spark = get_session(args.master, conf=conf)
    try:
        counters = run(spark, inputs, args.out, report=not args.no_report)
    finally:
        if ours:
            spark.stop()
    print(" ".join(f"{k}={v}" for k, v in counters.items()))
    print(f"tables: {', '.join(str(args.out / t) for t in TABLES)}")
    if not args.no_report:
        print(f"report: {args.out / 'report.html'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
