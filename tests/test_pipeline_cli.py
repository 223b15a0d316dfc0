"""``rallypoint report`` as users run it: a subprocess with its own JVM (the broker never needs pyspark)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from rallypoint.pipeline import job

from tests.support import ROOT
from tests.support import offsets_synth as synth
from tests.test_pipeline_spark import T0, write_crafted

pytestmark = pytest.mark.unit


def rallypoint(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rallypoint", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


def test_the_broker_does_not_import_pyspark() -> None:
    code = (
        "import sys, rallypoint.cli, rallypoint.assemble, rallypoint.server\n"
        "bad = [m for m in sys.modules if m == 'pyspark' or m.startswith(('pyspark.', 'rallypoint.pipeline'))]\n"
        "sys.exit(1 if bad else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=30).returncode == 0


@pytest.mark.slow
def test_report_help_and_bad_arguments(tmp_path: Path) -> None:
    r = rallypoint("report", "--help")
    assert r.returncode == 0 and "--input" in r.stdout and "--master" in r.stdout
    r = rallypoint("report", "--input", str(tmp_path / "nope"), "--out", str(tmp_path / "out"))
    assert r.returncode == 2 and "not a directory" in r.stderr
    r = rallypoint("report", "--input", str(tmp_path), "--out", str(tmp_path / "o"), "--conf", "novalue")
    assert r.returncode == 2 and "KEY=VALUE" in r.stderr
    r = rallypoint("report", "--out", str(tmp_path))
    assert r.returncode == 2 and "--input" in r.stderr
    # spark-submit runs the module as a script: it must find its packages itself
    r = subprocess.run(
        [sys.executable, str(ROOT / "pipeline" / "job.py"), "--help"], capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 0 and "--input" in r.stdout


@pytest.mark.spark
def test_report_subcommand_end_to_end(tmp_path: Path) -> None:
    write_crafted(tmp_path / "crafted")
    synth.generate(tmp_path / "synthetic", synth.SynthConfig(seed=3, events=150))
    out = tmp_path / "out"
    r = rallypoint(
        "report",
        "--input",
        f"east={tmp_path / 'crafted'}",
        str(tmp_path / "synthetic"),
        "--out",
        str(out),
        "--master",
        "local[1]",
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "damaged_segments=1 " in r.stdout and "invariant_violations=3" in r.stdout and "report.html" in r.stdout
    # the JVM is quiet: nothing but its one start-up notice
    noise = [ln for ln in r.stderr.splitlines() if ln.strip() and "Using incubator modules" not in ln]
    assert noise == []
    for t in job.TABLES:
        assert (out / t).is_dir()
    latest = pq.read_table(out / "offsets_latest").to_pylist()
    east = sorted((x["group"], x["offset"]) for x in latest if x["broker"] == "east" and x["log_partition"] == 0)
    assert east == [("g-reasons", 99), ("g-simple", 333)]
    assert {x["broker"] for x in latest} == {"east", "synthetic"}
    commits = pq.read_table(out / "commits").to_pylist()
    assert min(c["commit_timestamp"] for c in commits if c["broker"] == "east" and c["log_partition"] == 0) == T0 + 600
    assert (out / "report.html").stat().st_size > 10_000
