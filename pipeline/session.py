"""Creating the SparkSession the pipeline runs in (local by default, any master by flag).

Facts this follows : workers must run *this* interpreter (PYSPARK_PYTHON);
``spark.ui.enabled=false`` avoids binding port 4040; ``SPARK_LOCAL_IP=127.0.0.1`` plus a log4j2
file in ``SPARK_CONF_DIR`` keep the JVM quiet and off the network in local mode.

Python workers must import ``rallypoint`` (the decoders live in ``rallypoint.protocol`` and
``rallypoint.pipeline``).  In local mode they run this interpreter, where rallypoint is installed;
on a cluster, or under spark-submit (which started the JVM already), the package is shipped as a
zip with ``addPyFile`` (the executors still need pyarrow and crc32c installed).
"""

from __future__ import annotations

import atexit
import io
import os
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PACKAGE_DIR = Path(__file__).resolve().parent
CONF_DIR = PACKAGE_DIR / "conf"
DEFAULT_MASTER = "local[*]"

BASE_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.sql.session.timeZone": "UTC",
    # small tables: far fewer than Spark's 200 shuffle partitions (AQE coalesces further)
    "spark.sql.shuffle.partitions": "16",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.python.worker.reuse": "true",
    "spark.ui.showConsoleProgress": "false",
}


def is_local(master: str) -> bool:
    return master == "local" or master.startswith("local[") or master.startswith("local-cluster[")


def under_spark_submit() -> bool:
    """True when spark-submit started this interpreter (it already owns the JVM and the master)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def prepare_environment(master: str) -> None:
    """Environment the JVM and the Python workers inherit; must run before the JVM starts."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_CONF_DIR", str(CONF_DIR))
    if is_local(master):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def _code_zip() -> bytes:
    """The installed ``rallypoint`` package as a zip, laid out by import name (the source tree's
    folders are mapped into the namespace, so their locations are asked of the import system)."""
    import rallypoint
    import rallypoint.pipeline
    import rallypoint.protocol

    roots = [
        (Path(rallypoint.__path__[0]), "rallypoint"),
        (Path(rallypoint.protocol.__path__[0]), "rallypoint/protocol"),
        (Path(rallypoint.pipeline.__path__[0]), "rallypoint/pipeline"),
    ]
    nested = {root for root, _ in roots[1:]}
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for root, prefix in roots:
            for f in sorted(root.rglob("*")):
                if not f.is_file() or "__pycache__" in f.parts:
                    continue
                if prefix == "rallypoint" and any(n == f or n in f.parents for n in nested):
                    continue  # an installed wheel nests them; written under their own prefix
                z.write(f, f"{prefix}/{f.relative_to(root).as_posix()}")
    return buf.getvalue()


def ship_code(spark: SparkSession) -> None:
    """Make ``rallypoint`` importable on executors that do not have it installed."""
    tmp = Path(tempfile.mkdtemp(prefix="rallypoint-pipeline-"))
    atexit.register(shutil.rmtree, tmp, True)
    path = tmp / "rallypoint_pipeline_code.zip"
    path.write_bytes(_code_zip())
    spark.sparkContext.addPyFile(str(path))


def get_session(
    master: str | None = None,
    app_name: str = "rallypoint-offsets-report",
    conf: dict[str, str] | None = None,
) -> SparkSession:
    """A SparkSession: ``master`` if given; else spark-submit's; else ``local[*]``."""
    from pyspark.sql import SparkSession

    submitted = under_spark_submit()  # then the JVM (and the workers' environment) already exist
    if master is None and not submitted:
        master = DEFAULT_MASTER
    prepare_environment(master or "")
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    for k, v in {**BASE_CONF, **(conf or {})}.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    actual = spark.sparkContext.master or ""
    if submitted or not is_local(actual):
        ship_code(spark)
    return spark
