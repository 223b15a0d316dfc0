"""Pipeline: Spark (mapInArrow over segment paths) vs one Python process decoding the same files.

    python -m bench.pipeline [--quick] [--mib 200] [--master local[*]] [--keep DIR]

Input: a synthetic ``__consumer_offsets`` log (tests/support/offsets_synth.py: commits, rebalances with
range assignments, static members, deletions, some transactions) of ``--mib`` MiB over 8
partitions in 32 MiB segments, written to a temporary directory (one partition is simulated,
the other seven are copies of it).  Figures:

* **single process, full decode**: pipeline/decode.py over every file, in this process: what
  one Spark task does (records → Arrow batches, group metadata and consumer-protocol bytes
  included);
* **single process, replay**: the broker's own recovery and loader (coordinator/storage: CRC
  checks, Kafka's load semantics) over the same files, the reference for ``offsets_latest``;
* **Spark decode stage**: segment paths → mapInArrow decode → staging Parquet;
* **Spark whole job**: decode + every table + report (what ``rallypoint report`` takes, minus the
  SparkSession start-up, which is printed separately);
* **``rallypoint report`` on a small log**: the command's wall time on a log of a few records, in a
  new process each run (pipeline/README.md, "Small logs").
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rallypoint.pipeline import decode, job

from bench.common import summarize
from tests.support import offsets_synth as synth

PARTITIONS = 8
SEGMENT_BYTES = 32 << 20


def make_log(root: Path, mib: int) -> Path:
    """A data dir of about ``mib`` MiB: partition 0 simulated, partitions 1..7 copies of it."""
    data = root / "broker"
    per_partition = max(1, mib * (1 << 20) // PARTITIONS)
    cfg = synth.SynthConfig(
        groups=400,
        topics=8,
        partitions_per_topic=16,
        log_partitions=1,
        events=1,
        segment_bytes=SEGMENT_BYTES,
        seed=7,
        txn_fraction=0.02,
    )
    sim = synth.Simulation(data, cfg)
    while sum(p.stat().st_size for p in sim.log.segments()) < per_partition:
        for _ in range(200):
            sim.step()
    src = data / "__consumer_offsets-0"
    for p in range(1, PARTITIONS):
        shutil.copytree(src, data / f"__consumer_offsets-{p}")
    return data


def single_process(files: list[decode.SegmentFile]) -> tuple[float, int]:
    t = time.perf_counter()
    rows = sum(b.num_rows for b in decode.decode_segments(files))
    return time.perf_counter() - t, rows - len(files)  # minus the one "segment" row per file


def single_replay(data: Path) -> tuple[float, int]:
    """The broker's own recovery and loader (coordinator/storage) over the same files."""
    t = time.perf_counter()
    r = synth.load_offsets([("bench", data)])
    return time.perf_counter() - t, r.records


def measure(mib: int, master: str, keep: Path | None = None) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="rp-bench-pipeline-")) if keep is None else keep
    try:
        t = time.perf_counter()
        data = make_log(root, mib)
        files = decode.find_segments("bench", data)
        size = sum(f.size for f in files)
        gen_s = time.perf_counter() - t
        print(f"input: {len(files)} segment files, {size / (1 << 20):.0f} MiB, generated in {gen_s:.0f} s", flush=True)

        sp_s, records = single_process(files)
        rp_s, rp_records = single_replay(data)
        assert rp_records == records, (rp_records, records)

        from rallypoint.pipeline.session import get_session

        t = time.perf_counter()
        spark = get_session(master, app_name="rallypoint-bench")
        spark.range(1).count()  # JVM and first job warm-up, not charged to the pipeline
        start_s = time.perf_counter() - t
        try:
            c = job.run(spark, job.parse_inputs([f"bench={data}"]), root / "out")
            parallelism = spark.sparkContext.defaultParallelism
        finally:
            spark.stop()
        assert c["records"] == records, (c["records"], records)
        return {
            "mib": size / (1 << 20),
            "records": records,
            "files": len(files),
            "cores": os.cpu_count(),
            "parallelism": parallelism,
            "single_decode_s": sp_s,
            "single_replay_s": rp_s,
            "spark_start_s": start_s,
            "spark_decode_s": c["decode_seconds"],
            "spark_tables_s": c["tables_seconds"],
            "spark_report_s": c["report_seconds"],
            "spark_total_s": c["seconds"],
        }
    finally:
        if keep is None:
            shutil.rmtree(root, ignore_errors=True)


def small_report(runs: int) -> tuple[list[float], int, int]:
    """Wall seconds of ``rallypoint report`` (a new process each time: interpreter, SparkSession,
    decode, tables, report.html) on a log of a few records; and its records and bytes."""
    root = Path(tempfile.mkdtemp(prefix="rp-bench-report-"))
    try:
        data = root / "broker"
        cfg = synth.SynthConfig(groups=2, topics=1, partitions_per_topic=2, log_partitions=1, events=4, seed=3)
        sim = synth.Simulation(data, cfg)
        for _ in range(4):
            sim.step()
        size = sum(p.stat().st_size for p in data.rglob("*.log"))
        records = sum(b.num_rows for b in decode.decode_segments(decode.find_segments("b", data))) - len(
            decode.find_segments("b", data)
        )
        walls = []
        for i in range(runs):
            t = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "rallypoint", "report", "--input", str(data), "--out", str(root / f"out{i}")],
                check=True,
                timeout=600,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            walls.append(time.perf_counter() - t)
        return walls, records, size
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(quick: bool = False, mib: int | None = None, master: str = "local[*]") -> list[dict[str, Any]]:
    mib = mib or (24 if quick else 200)
    walls, small_records, small_bytes = small_report(1 if quick else 3)
    print(f"rallypoint report, {small_records} records: {', '.join(f'{w:.1f}' for w in walls)} s", flush=True)
    m = measure(mib, master)
    n, size = m["records"], m["mib"]

    def row(name: str, seconds: float) -> dict[str, Any]:
        return {
            "name": f"{name} ({size:.0f} MiB, {n:,} records)",
            "unit": "records/s",
            "stats": summarize([n / seconds]),
        }

    rows = [
        row("single process, full decode to Arrow", m["single_decode_s"]),
        row("single process, replay (offsets only)", m["single_replay_s"]),
        row(f"Spark {master} ({m['parallelism']} tasks at once), decode stage", m["spark_decode_s"]),
        row(f"Spark {master}, whole job (decode + 7 tables + report)", m["spark_total_s"]),
    ]
    lines = [
        f"single process: full decode {n / m['single_decode_s']:,.0f} records/s "
        f"({size / m['single_decode_s']:.1f} MiB/s), replay {n / m['single_replay_s']:,.0f} records/s "
        f"({size / m['single_replay_s']:.1f} MiB/s)",
        f"Spark {master} on {m['cores']} cores: decode {n / m['spark_decode_s']:,.0f} records/s "
        f"({size / m['spark_decode_s']:.1f} MiB/s, {m['single_decode_s'] / m['spark_decode_s']:.2f}x one process), "
        f"tables {m['spark_tables_s']:.1f} s, report {m['spark_report_s']:.1f} s, "
        f"whole job {m['spark_total_s']:.1f} s ({n / m['spark_total_s']:,.0f} records/s); "
        f"SparkSession start-up {m['spark_start_s']:.1f} s (not included)",
    ]
    for line in lines:
        print(line, flush=True)
    rows[-1]["note"] = "; ".join(lines)
    rows.append(
        {
            "name": f"`rallypoint report` on a small log, wall time ({small_records} records, {small_bytes:,} bytes)",
            "unit": "s",
            "stats": summarize(walls),
            "note": "a new process each run: interpreter, SparkSession (local[*]), decode in the driver, "
            "the tables, report.html",
        }
    )
    return rows


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="python -m bench.pipeline")
    p.add_argument("--quick", action="store_true", help="24 MiB instead of 200")
    p.add_argument("--mib", type=int, help="input size in MiB (default 200, --quick 24)")
    p.add_argument("--master", default="local[*]")
    a = p.parse_args()
    run(a.quick, a.mib, a.master)
