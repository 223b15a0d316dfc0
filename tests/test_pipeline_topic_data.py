"""The pipeline over topic data kept on disk: topic_batches and topic_partitions tables and the
report's "Topic data" section, against partitions written by the broker's own durable store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rallypoint.pipeline import job, topic_data
from rallypoint.topics import TopicStore
from rallypoint.topics.configs import LogPolicy

from tests.test_pipeline_spark import spark  # noqa: F401 - the shared session fixture
from tests.test_topic_compaction import keyed, put

pytestmark = pytest.mark.spark

T0 = 1_700_000_000_000
POLICY = LogPolicy(segment_bytes=600)  # several segments per partition


def write_topics(data_dir: Path) -> dict[tuple[str, int], tuple[int, int]]:
    """Two topics through the durable store; returns (records, batches) per partition."""
    store = TopicStore(data_dir=data_dir, log_storage="disk")
    expected: dict[tuple[str, int], tuple[int, int]] = {}
    for name, parts in (("orders", 2), ("audit.log", 1)):
        t = store.create(name, parts)
        for p in range(parts):
            records = batches = 0
            for i in range(6 + 3 * p):
                n = 1 + i % 3
                put(t.partitions[p], keyed([(b"k", b"v" * 20)] * n, ts=T0 + i * 30_000), T0, POLICY)
                records, batches = records + n, batches + 1
            expected[(name, p)] = (records, batches)
    # a transaction marker is a batch but not a record
    plog = store.get("audit.log").partitions[0]  # type: ignore[union-attr]
    plog.write_marker(77, 0, True, T0)
    r, b = expected[("audit.log", 0)]
    expected[("audit.log", 0)] = (r, b + 1)
    for p in store.partitions():
        if p.files is not None:
            p.files.close()
    return expected


def test_decode_reads_every_batch_header(tmp_path: Path) -> None:
    expected = write_topics(tmp_path)
    segs = topic_data.find_topic_segments("b", tmp_path)
    assert {(s.topic, s.partition) for s in segs} == set(expected)
    assert len(segs) > len(expected)  # rolled
    got: dict[tuple[str, int], list[int]] = {}
    for s in segs:
        for batch in topic_data.decode_topic_segment(s):
            for row in batch.to_pylist():
                assert row["crc_ok"]
                got.setdefault((row["topic"], row["partition"]), []).append(row["records"] if not row["control"] else 0)
    assert {k: (sum(v), len(v)) for k, v in got.items()} == expected


def test_report_tables_and_section(spark: Any, tmp_path: Path) -> None:  # noqa: F811
    data = tmp_path / "b1"
    expected = write_topics(data)
    counters = job.run(spark, job.parse_inputs([f"b1={data}"]), tmp_path / "out")
    assert counters["topic_partitions"] == 3
    rows = {
        (r["topic"], r["partition"]): r.asDict()
        for r in spark.read.parquet(str(tmp_path / "out" / "topic_partitions")).collect()
    }
    assert {k: (r["records"], r["batches"]) for k, r in rows.items()} == expected
    orders0 = rows[("orders", 0)]
    assert (orders0["first_offset"], orders0["last_offset"]) == (0, expected[("orders", 0)][0] - 1)
    last = T0 + 5 * 30_000 + 2  # the last batch: three records, timestamps +0, +1, +2
    assert orders0["first_timestamp"] == T0 and orders0["last_timestamp"] == last
    assert orders0["records_per_second"] == pytest.approx(expected[("orders", 0)][0] / ((last - T0) / 1000))
    assert spark.read.parquet(str(tmp_path / "out" / "topic_batches")).count() == sum(b for _r, b in expected.values())
    html = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    section = html.split("<h2>Topic data</h2>")[1]
    assert "audit.log" in section and 'src="data:image/png;base64,' in section  # the records-over-time chart


def test_consumer_group_records_are_decoded_into_their_table_and_the_report(
    spark: Any,  # noqa: F811
    tmp_path: Path,
) -> None:
    """KIP-848 records are decoded (not counted as unknown keys): consumer_group_records holds each
    with its epoch, and the generations chart gains the group epochs."""
    from rallypoint.protocol import consumer_group_records as cgr

    from tests.support import offsets_synth as synth

    data = tmp_path / "b2"
    w = synth.LogWriter(data, 1)
    for i, epoch in enumerate((1, 2, 3)):
        w.append(0, [cgr.encode_record(cgr.GroupMetadataKey("cg"), cgr.GroupMetadataValue(epoch))], T0 + i * 1000)
        w.append(
            0,
            [cgr.encode_record(cgr.TargetAssignmentMetadataKey("cg"), cgr.TargetAssignmentMetadataValue(epoch, T0))],
            T0 + i * 1000 + 1,
        )
    w.append(0, [cgr.encode_record(cgr.GroupMetadataKey("cg"), None)], T0 + 5000)  # deleted
    counters = job.run(spark, job.parse_inputs([f"b2={data}"]), tmp_path / "out")
    assert counters["consumer_group_records"] == 7
    rows = spark.read.parquet(str(tmp_path / "out" / "consumer_group_records")).orderBy("log_offset").collect()
    assert [(r["record_type"], r["epoch"], r["tombstone"]) for r in rows] == [
        ("consumer_group_metadata", 1, False),
        ("consumer_group_target_assignment_metadata", 1, False),
        ("consumer_group_metadata", 2, False),
        ("consumer_group_target_assignment_metadata", 2, False),
        ("consumer_group_metadata", 3, False),
        ("consumer_group_target_assignment_metadata", 3, False),
        ("consumer_group_metadata", None, True),
    ]
    segments = spark.read.parquet(str(tmp_path / "out" / "segments")).collect()
    assert sum(s["other_records"] for s in segments) == 0
    html = (tmp_path / "out" / "report.html").read_text(encoding="utf-8")
    assert "consumer-group (KIP-848) records</td><td>7<" in html
    assert "no group metadata records" not in html  # the epochs are drawn
