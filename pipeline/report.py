"""The self-contained HTML report: one file, charts embedded as base64 PNG (matplotlib, Agg).

:func:`collect` runs the (small) aggregations in Spark and returns pandas frames;
:func:`render` turns those into HTML without Spark.
"""

from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, cast

import pandas as pd

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

TOP_GROUPS = 15
TOP_PARTITIONS = 12  # topic partitions drawn in the topic-data chart
MAX_ROWS = 200
# candidate time buckets for the commit-activity chart, smallest first (ms)
BUCKETS_MS = (1_000, 10_000, 60_000, 600_000, 3_600_000, 86_400_000)
MAX_BUCKETS = 240


@dataclass
class ReportData:
    inputs: list[tuple[str, str]]  # (broker name, data dir)
    totals: dict[str, Any]
    bucket_ms: int
    commit_activity: pd.DataFrame  # broker, bucket (ms), commits
    generations: pd.DataFrame  # broker, group, state_timestamp, generation (top groups only)
    top_groups: pd.DataFrame  # group_summary rows of the most rebalancing groups
    invariants: pd.DataFrame  # per check: groups, failed groups, violations
    invariant_failures: pd.DataFrame
    segment_status: pd.DataFrame  # broker, status, segments, bytes
    bad_segments: pd.DataFrame
    topic_partitions: pd.DataFrame = field(default_factory=pd.DataFrame)  # topic data kept on disk
    topic_activity: pd.DataFrame = field(default_factory=pd.DataFrame)  # broker, topic, partition, bucket, records
    topic_bucket_ms: int = 60_000
    consumer_epochs: pd.DataFrame = field(default_factory=pd.DataFrame)  # broker, group, timestamp, epoch
    generated_at: str = field(default_factory=lambda: datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC"))


def _pick_bucket(span_ms: int) -> int:
    for b in BUCKETS_MS:
        if span_ms / b <= MAX_BUCKETS:
            return b
    return BUCKETS_MS[-1]


def collect(tables: dict[str, DataFrame], inputs: list[tuple[str, str]]) -> ReportData:
    """Aggregate in Spark what is big (commits, generations); take the small tables whole."""
    from pyspark.sql import functions as F

    seg = cast(pd.DataFrame, tables["segments"].toPandas())
    summary = cast(pd.DataFrame, tables["group_summary"].toPandas())
    inv = cast(pd.DataFrame, tables["invariants"].toPandas())
    com, gens = tables["commits"], tables["generations"]
    c = com.agg(
        F.count("*").alias("commits"), F.min("commit_timestamp").alias("lo"), F.max("commit_timestamp").alias("hi")
    ).first()
    assert c is not None
    damaged = seg[seg["status"] != "ok"]
    totals: dict[str, Any] = {
        "segments": len(seg),
        "bytes": int(seg["size_bytes"].sum()),
        "records": int(seg["records"].sum()),
        "damaged_segments": len(damaged),
        "bad_records": int(seg["bad_records"].sum()),
        "commits": c["commits"],
        "groups": len(summary),
        "generation_records": int(summary["generation_records"].sum()) if len(summary) else 0,
        "deleted_groups": int(summary["deleted"].sum()) if len(summary) else 0,
    }
    bucket = _pick_bucket(int((c["hi"] or 0) - (c["lo"] or 0)))
    activity = (
        com.groupBy("broker", (F.floor(F.col("commit_timestamp") / bucket) * bucket).cast("long").alias("bucket"))
        .agg(F.count("*").alias("commits"))
        .orderBy("broker", "bucket")
        .toPandas()
    )
    top = summary.sort_values(
        ["rebalances", "generations", "broker", "group"], ascending=[False, False, True, True]
    ).head(TOP_GROUPS)
    keys = [f"{b}\x00{g}" for b, g in zip(top["broker"], top["group"], strict=True)]
    gens_pd = (
        gens.where(F.concat_ws("\x00", "broker", "group").isin(keys))
        .select("broker", "group", "state_timestamp", "generation", "reason")
        .orderBy("broker", "group", "state_timestamp")
        .toPandas()
    )
    if len(inv):
        inv_pd = (
            inv.assign(failed=~inv["passed"])
            .groupby("check", as_index=False)
            .agg(
                groups=("group", "size"),
                failed_groups=("failed", "sum"),
                checked=("checked", "sum"),
                violations=("violations", "sum"),
            )
        )
        inv_fail = (
            inv[~inv["passed"]][["broker", "group", "check", "violations", "first_violation"]]
            .sort_values(["check", "broker", "group"])
            .head(MAX_ROWS)
        )
    else:
        inv_pd = pd.DataFrame(columns=["check", "groups", "failed_groups", "checked", "violations"])
        inv_fail = pd.DataFrame(columns=["broker", "group", "check", "violations", "first_violation"])
    seg_status = (
        seg.groupby(["broker", "status"], as_index=False)
        .agg(segments=("path", "size"), bytes=("size_bytes", "sum"), unread=("unread_bytes", "sum"))
        .sort_values(["broker", "status"])
    )
    bad_seg = (
        damaged[["broker", "log_partition", "base_offset", "status", "valid_bytes", "unread_bytes", "error"]]
        .sort_values(["broker", "log_partition", "base_offset"])
        .head(MAX_ROWS)
    )
    tp = cast(pd.DataFrame, tables["topic_partitions"].toPandas())
    topic_bucket = 60_000
    topic_act = pd.DataFrame(columns=["broker", "topic", "partition", "bucket", "records"])
    if len(tp):
        from rallypoint.pipeline import topic_data

        top_parts = tp.sort_values("records", ascending=False).head(TOP_PARTITIONS)
        span = int(tp["last_timestamp"].max() - tp["first_timestamp"].min())
        topic_bucket = _pick_bucket(span)
        part_keys = sorted(
            f"{b}\x00{t}\x00{p}"
            for b, t, p in zip(top_parts["broker"], top_parts["topic"], top_parts["partition"], strict=True)
        )
        batches = tables["topic_batches"].where(
            F.concat_ws("\x00", "broker", "topic", F.col("partition").cast("string")).isin(part_keys)
        )
        topic_act = topic_data.activity(batches, topic_bucket)
        totals["topic_partitions"] = len(tp)
        totals["topic_records"] = int(tp["records"].sum())
        totals["topic_bytes"] = int(tp["bytes"].sum())
    cg = tables["consumer_group_records"]
    epochs = cg.where((F.col("record_type") == "consumer_group_metadata") & ~F.col("tombstone"))
    totals["consumer_group_records"] = cg.count()
    busiest = [
        f"{r['broker']}\x00{r['group']}"
        for r in epochs.groupBy("broker", "group").count().orderBy(F.desc("count"), "broker", "group").head(TOP_GROUPS)
    ]
    consumer_epochs = (
        epochs.where(F.concat_ws("\x00", "broker", "group").isin(busiest))
        .select("broker", "group", "timestamp", "epoch")
        .orderBy("broker", "group", "timestamp")
        .toPandas()
    )
    return ReportData(
        inputs,
        totals,
        bucket,
        activity,
        gens_pd,
        top,
        inv_pd,
        inv_fail,
        seg_status,
        bad_seg,
        tp,
        topic_act,
        topic_bucket,
        consumer_epochs,
    )


# --- rendering ----------------------------------------------------------------------------------


def _png(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=96, bbox_inches="tight")
    plt.close(fig)
    return f'<img alt="chart" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode("ascii")}">'


def _ts(ms: Any) -> Any:
    return pd.to_datetime(ms, unit="ms", utc=True)


def _table(df: pd.DataFrame, empty: str = "none") -> str:
    if df.empty:
        return f"<p class=muted>{html.escape(empty)}</p>"
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in df.columns)
    rows = []
    for rec in df.itertuples(index=False):
        cells = []
        for v in rec:
            if isinstance(v, float):
                txt = "" if pd.isna(v) else f"{v:,.2f}"
            elif v is None or (not isinstance(v, (list, tuple)) and pd.isna(v)):
                txt = ""
            else:
                txt = str(v)
            cells.append(f"<td>{html.escape(txt)}</td>")
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _commit_chart(d: ReportData) -> str:
    import matplotlib.pyplot as plt

    if d.commit_activity.empty:
        return "<p class=muted>no offset commits in the log</p>"
    fig, ax = plt.subplots(figsize=(9, 3.2))
    for broker, part in d.commit_activity.groupby("broker"):
        ax.plot(_ts(part["bucket"]), part["commits"], marker=".", label=str(broker))
    ax.set_ylabel(f"commits per {d.bucket_ms // 1000}s")
    ax.set_xlabel("commit time (UTC)")
    ax.legend(loc="upper left", fontsize="small")
    ax.grid(alpha=0.3)
    fig.autofmt_xdate()
    return _png(fig)


def _generations_chart(d: ReportData) -> str:
    import matplotlib.pyplot as plt

    if d.generations.empty and d.consumer_epochs.empty:
        return "<p class=muted>no group metadata records in the log</p>"
    fig, ax = plt.subplots(figsize=(9, 3.6))
    for (broker, group), part in d.generations.groupby(["broker", "group"]):
        ax.step(_ts(part["state_timestamp"]), part["generation"], where="post", marker=".", label=f"{group} @{broker}")
    for (broker, group), part in d.consumer_epochs.groupby(["broker", "group"]):
        ax.step(_ts(part["timestamp"]), part["epoch"], where="post", marker="x", label=f"{group} @{broker} (epoch)")
    ax.set_ylabel("generation / consumer-group epoch")
    ax.set_xlabel("time the generation began (UTC)")
    ax.legend(loc="upper left", fontsize="x-small", ncol=2)
    ax.grid(alpha=0.3)
    fig.autofmt_xdate()
    return _png(fig)


REASON_COLUMNS = ("join", "leave", "join_and_leave", "same_members", "empty")


def _rebalance_chart(d: ReportData) -> str:
    import matplotlib.pyplot as plt

    top = d.top_groups[d.top_groups["rebalances"] > 0] if not d.top_groups.empty else d.top_groups
    if top.empty:
        return "<p class=muted>no rebalances after a group's first generation</p>"
    top = top.iloc[::-1]
    labels = [f"{g} @{b}" for g, b in zip(top["group"], top["broker"], strict=True)]
    fig, ax = plt.subplots(figsize=(9, 0.4 * len(top) + 1.2))
    left = [0] * len(top)
    for r in REASON_COLUMNS:
        vals = list(top[f"reason_{r}"].fillna(0).astype(int))
        ax.barh(labels, vals, left=left, label=r)
        left = [a + b for a, b in zip(left, vals, strict=True)]
    ax.set_xlabel("rebalances (stored generations after the first), by what changed")
    ax.legend(loc="lower right", fontsize="small")
    return _png(fig)


def _segment_chart(d: ReportData) -> str:
    import matplotlib.pyplot as plt

    if d.segment_status.empty:
        return ""
    piv = d.segment_status.pivot_table(index="broker", columns="status", values="segments", fill_value=0)
    fig, ax = plt.subplots(figsize=(6, 0.4 * len(piv) + 1.2))
    left = [0] * len(piv)
    for status in piv.columns:
        vals = list(piv[status].astype(int))
        ax.barh([str(b) for b in piv.index], vals, left=left, label=str(status))
        left = [a + b for a, b in zip(left, vals, strict=True)]
    ax.set_xlabel("segments")
    ax.legend(fontsize="small")
    return _png(fig)


def _topic_chart(d: ReportData) -> str:
    import matplotlib.pyplot as plt

    if d.topic_activity.empty:
        return ""
    fig, ax = plt.subplots(figsize=(9, 3.2))
    for (broker, topic, partition), part in d.topic_activity.groupby(["broker", "topic", "partition"]):
        ax.plot(_ts(part["bucket"]), part["records"], marker=".", label=f"{topic}-{partition} @{broker}")
    ax.set_ylabel(f"records per {d.topic_bucket_ms // 1000}s")
    ax.set_xlabel("batch time (UTC, the batch's largest timestamp)")
    ax.legend(loc="upper left", fontsize="x-small", ncol=2)
    ax.grid(alpha=0.3)
    fig.autofmt_xdate()
    return _png(fig)


def _topic_section(d: ReportData) -> list[str]:
    if d.topic_partitions.empty:
        return ["<h2>Topic data</h2>", "<p class=muted>no topic data on disk (rallypoint.log.storage=memory?)</p>"]
    per_topic = (
        d.topic_partitions.groupby(["broker", "topic"], as_index=False)
        .agg(partitions=("partition", "size"), records=("records", "sum"), bytes=("bytes", "sum"))
        .sort_values(["broker", "topic"])
    )
    cols = [
        "broker",
        "topic",
        "partition",
        "batches",
        "records",
        "bytes",
        "first_offset",
        "last_offset",
        "records_per_second",
        "crc_errors",
    ]
    return [
        "<h2>Topic data</h2>",
        _table(per_topic),
        _topic_chart(d),
        _table(d.topic_partitions[cols].head(MAX_ROWS)),
    ]


CSS = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:1100px}
h1{font-size:1.5em} h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:0.85em;margin:0.5em 0}
td,th{border:1px solid #ddd;padding:2px 6px;text-align:left;vertical-align:top}
th{background:#f4f4f4} .muted{color:#777} .bad{color:#b00;font-weight:bold} .ok{color:#070}
.kv td:first-child{font-weight:bold}
"""


def render(d: ReportData) -> str:
    import matplotlib

    matplotlib.use("Agg")
    t = d.totals
    damaged = int(t.get("damaged_segments") or 0)
    failed = int(d.invariants["failed_groups"].sum()) if not d.invariants.empty else 0
    kv = [
        ("brokers", ", ".join(f"{n} ({p})" for n, p in d.inputs)),
        ("segments", f"{t.get('segments', 0):,} ({t.get('bytes', 0):,} bytes)"),
        ("records", f"{t.get('records', 0):,}"),
        ("offset commits", f"{t.get('commits', 0):,}"),
        ("groups", f"{t.get('groups', 0):,} ({t.get('deleted_groups', 0):,} deleted)"),
        ("group metadata records", f"{t.get('generation_records', 0):,}"),
        ("consumer-group (KIP-848) records", f"{t.get('consumer_group_records', 0):,}"),
        ("damaged segments", f"{damaged:,}"),
        ("undecodable records", f"{t.get('bad_records', 0):,}"),
        ("invariant failures (groups)", f"{failed:,}"),
        (
            "topic data",
            f"{t.get('topic_records', 0):,} records, {t.get('topic_bytes', 0):,} bytes "
            f"in {t.get('topic_partitions', 0):,} partitions",
        ),
    ]
    kv_html = "".join(f"<tr><td>{html.escape(k)}</td><td>{html.escape(str(v))}</td></tr>" for k, v in kv)
    inv_status = (
        "<p class=ok>every invariant holds</p>"
        if failed == 0 and not d.invariants.empty
        else (
            "<p class=muted>no generations to check</p>" if d.invariants.empty else f"<p class=bad>{failed} failing</p>"
        )
    )
    seg_status = (
        f"<p class=bad>{damaged} damaged segment(s)</p>" if damaged else "<p class=ok>every segment read to its end</p>"
    )
    top_cols = [
        c
        for c in (
            "broker",
            "group",
            "state",
            "protocol",
            "generation",
            "members",
            "static_members",
            "rebalances",
            "mean_ms_between_generations",
            "reason_static_replacement",
            "commits",
            "commits_per_minute",
            "committed_partitions",
        )
        if c in d.top_groups.columns
    ]
    parts = [
        "<!doctype html><html><head><meta charset=utf-8><title>rallypoint offsets report</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>rallypoint <code>__consumer_offsets</code> report</h1>",
        f"<p class=muted>generated {html.escape(d.generated_at)}</p>",
        f"<table class=kv>{kv_html}</table>",
        "<h2>Commit activity</h2>",
        _commit_chart(d),
        "<h2>Generations over time (most rebalancing groups; consumer groups: group epochs)</h2>",
        _generations_chart(d),
        "<h2>Top rebalancing groups</h2>",
        _rebalance_chart(d),
        _table(d.top_groups[top_cols] if top_cols else d.top_groups, "no groups"),
        "<h2>Invariants</h2>",
        inv_status,
        _table(d.invariants, "no generations to check"),
        _table(d.invariant_failures, "no violations"),
        "<h2>Segments</h2>",
        seg_status,
        _segment_chart(d),
        _table(d.segment_status, "no segments"),
        _table(d.bad_segments, "no damaged segments"),
        *_topic_section(d),
        "</body></html>",
    ]
    return "\n".join(parts)
