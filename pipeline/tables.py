"""The analytics tables, as Spark DataFrames over the decoded records (pipeline/decode.py).

Semantics follow the broker's own load (docs/offsets-log-format.md, "Recovery at start-up"): records are replayed in
log order per ``__consumer_offsets`` partition, the last record per key wins, a tombstone deletes
the key, and a transactional offset commit counts only once a COMMIT marker of its producer
follows it (an ABORT drops it; no marker yet = still pending, not loaded).  ``offsets_latest``
reads each partition only up to its first damaged batch, where a log recovery stops.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from pyspark.sql import Column, Window
from pyspark.sql import functions as F
from rallypoint.pipeline.decode import KIND_COLUMNS, check_order
from rallypoint.protocol.records import CONTROL_COMMIT

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

SEGMENT_COLUMNS = list(KIND_COLUMNS["segment"])
# Columns identifying one record in the whole input.
REC = ["broker", "log_partition", "log_offset"]
GROUP = ["broker", "group"]
OFFSET_KEY = ["broker", "log_partition", "group", "topic", "partition"]

# Why a generation record was written (generations.reason), from comparing it with the previous
# record of the same group (members identified by group.instance.id when static, else member id).
REASONS = (
    "first",  # the first stored generation of this group (or after its deletion)
    "join",  # new members, nobody left
    "leave",  # members left, nobody new (and some remain)
    "join_and_leave",  # both (e.g. a dynamic member restarted with a new member id)
    "same_members",  # same members, new generation (rejoin, subscription or metadata change)
    "empty",  # every member gone: the group became Empty
    "static_replacement",  # same generation: a static member rejoined with a new member id
    "same_generation",  # same generation, different members: not something Kafka writes
)


def segments(decoded: DataFrame) -> DataFrame:
    """One row per segment file.  The rows are few (one per file): they are checked in the driver
    with :func:`pipeline.decode.check_order` (offsets must not go backwards across segments)."""
    seg_rows = [r.asDict() for r in decoded.where(F.col("kind") == "segment").select(*SEGMENT_COLUMNS).collect()]
    checked = check_order(seg_rows)
    spark = decoded.sparkSession
    df = spark.createDataFrame(checked, schema=decoded.select(*SEGMENT_COLUMNS).schema)
    return df.select(
        "broker",
        "log_partition",
        F.col("segment_base").alias("base_offset"),
        "path",
        "status",
        "error",
        "size_bytes",
        "valid_bytes",
        (F.col("size_bytes") - F.col("valid_bytes")).alias("unread_bytes"),
        "batches",
        "records",
        "bad_records",
        "other_records",
        "first_offset",
        "last_offset",
    )


def _with_txn_result(offsets: DataFrame, decoded: DataFrame) -> DataFrame:
    """Add the transaction outcome of each offset record.

    ``txn_result``: committed / aborted / pending (no marker yet), null when not transactional;
    ``marker_offset``: where its COMMIT/ABORT marker is; ``promoted``: a COMMIT marker loads this
    record (it is the producer's last staged record for the key before the marker, and not a
    tombstone: a staged tombstone only un-stages, GroupMetadataManager.scala doLoadGroupsAndOffsets).
    """
    plain = (
        offsets.where(~F.col("transactional"))
        .withColumn("txn_result", F.lit(None).cast("string"))
        .withColumn("marker_offset", F.lit(None).cast("long"))
        .withColumn("promoted", F.lit(False))
    )
    txn = offsets.where(F.col("transactional"))
    markers = decoded.where(F.col("kind") == "marker").select(
        "kind", "broker", "log_partition", "producer_id", "log_offset", "control_type"
    )
    # the first marker of the same producer after each record decides its fate
    w = (
        Window.partitionBy("broker", "log_partition", "producer_id")
        .orderBy("log_offset")
        .rowsBetween(1, Window.unboundedFollowing)
    )
    is_marker = F.col("kind") == "marker"
    nxt = F.first(F.when(is_marker, F.struct("log_offset", "control_type")), ignorenulls=True).over(w)
    resolved = (
        txn.unionByName(markers, allowMissingColumns=True)
        .withColumn("_next", nxt)
        .where(~is_marker)
        .withColumn(
            "txn_result",
            F.when(F.col("_next.control_type") == CONTROL_COMMIT, "committed")
            .when(F.col("_next").isNotNull(), "aborted")
            .otherwise("pending"),
        )
        .withColumn("marker_offset", F.col("_next.log_offset"))
        .drop("_next")
    )
    last_staged = Window.partitionBy("producer_id", "marker_offset", *OFFSET_KEY).orderBy(F.col("log_offset").desc())
    resolved = resolved.withColumn(
        "promoted",
        (F.col("txn_result") == "committed") & (F.row_number().over(last_staged) == 1) & ~F.col("tombstone"),
    )
    return plain.unionByName(resolved)


def offset_records(decoded: DataFrame, transactions: bool = True) -> DataFrame:
    """Every offset-commit record (values and tombstones) with its transaction outcome.

    ``transactions=False`` (no transactional offset record in the input) skips that work."""
    offsets = decoded.where(F.col("kind") == "offset")
    if transactions:
        return _with_txn_result(offsets, decoded)
    return (
        offsets.withColumn("txn_result", F.lit(None).cast("string"))
        .withColumn("marker_offset", F.lit(None).cast("long"))
        .withColumn("promoted", F.lit(False))
    )


def has_transactions(decoded: DataFrame) -> bool:
    return bool(decoded.where((F.col("kind") == "offset") & F.col("transactional")).limit(1).count())


def commits(offset_recs: DataFrame) -> DataFrame:
    return offset_recs.where(~F.col("tombstone")).select(
        *REC,
        "timestamp",
        "group",
        "topic",
        "partition",
        "offset",
        "leader_epoch",
        "metadata",
        "commit_timestamp",
        "expire_timestamp",
        "transactional",
        "txn_result",
        "value_version",
    )


def trusted(decoded: DataFrame, segs: DataFrame) -> DataFrame:
    """The records a log recovery keeps: per partition, everything before its first damaged batch.
    ``segs`` is the :func:`segments` table: in the first damaged segment of a partition the records
    decoded before the damage are kept (none when it has no valid bytes, e.g. offsets overlapping
    the previous segment); later segments are not."""
    w = Window.partitionBy("broker", "log_partition").orderBy("base_offset")
    damage = (
        segs.where(F.col("status") != "ok")
        .withColumn("_rn", F.row_number().over(w))
        .where(F.col("_rn") == 1)
        .select(
            "broker",
            "log_partition",
            F.col("base_offset").alias("_cut"),
            (F.col("valid_bytes") > 0).alias("_cut_keeps_prefix"),
        )
    )
    keep = (
        F.col("_cut").isNull()
        | (F.col("segment_base") < F.col("_cut"))
        | ((F.col("segment_base") == F.col("_cut")) & F.col("_cut_keeps_prefix"))
    )
    return (
        decoded.join(F.broadcast(damage), on=["broker", "log_partition"], how="left")
        .where(keep)
        .drop("_cut", "_cut_keeps_prefix")
    )


def offsets_latest(offset_recs: DataFrame, transactions: bool = True) -> DataFrame:
    """What the broker loads (docs/offsets-log-format.md, "Recovery at start-up"), from offset
    records of :func:`trusted` input.

    Replaying in log order, the state of a key ends as follows: take its last non-transactional
    record U (a put at U's batch offset, or a delete); every transactional promotion after U (at
    its COMMIT marker) replaces the loaded value only if its batch offset is newer
    (``CommitRecordMetadataAndOffset.olderThan``).  So the winner is, among U if it is a put and
    the promotions whose marker comes after U, the one with the highest batch offset; none = no
    offset.
    """
    by_key = Window.partitionBy(*OFFSET_KEY)
    last_plain = F.max(F.when(~F.col("transactional"), F.col("log_offset"))).over(by_key)
    r = offset_recs.withColumn("_last_plain", last_plain)
    candidate = (~F.col("transactional") & (F.col("log_offset") == F.col("_last_plain")) & ~F.col("tombstone")) | (
        F.col("promoted") & (F.col("marker_offset") > F.coalesce(F.col("_last_plain"), F.lit(-1)))
    )
    w = by_key.orderBy(F.col("batch_offset").desc(), F.col("log_offset").desc())
    return (
        r.where(candidate)
        .withColumn("_rn", F.row_number().over(w))
        .where(F.col("_rn") == 1)
        .select(
            "broker",
            "group",
            "topic",
            "partition",
            "offset",
            "leader_epoch",
            "metadata",
            "commit_timestamp",
            "expire_timestamp",
            "log_partition",
            "log_offset",
            "timestamp",
        )
    )


def tombstones(decoded: DataFrame) -> DataFrame:
    return decoded.where(F.col("kind").isin("offset", "group") & F.col("tombstone")).select(
        *REC, "timestamp", F.col("kind").alias("key_type"), "group", "topic", "partition"
    )


def _identities(members: Column) -> Column:
    return F.array_sort(F.transform(members, lambda m: F.coalesce(m["group_instance_id"], m["member_id"])))


def generations(decoded: DataFrame) -> DataFrame:
    """One row per GroupMetadata value record, compared with the group's previous record."""
    g = decoded.where(F.col("kind") == "group")
    by_group = Window.partitionBy("broker", "log_partition", "group").orderBy("log_offset")
    # incarnation = tombstones of this group before the record (a deleted group starts over)
    g = g.withColumn(
        "incarnation",
        (F.sum(F.col("tombstone").cast("int")).over(by_group) - F.col("tombstone").cast("int")).cast("int"),
    )
    v = g.where(~F.col("tombstone"))
    w = Window.partitionBy("broker", "log_partition", "group", "incarnation").orderBy("log_offset")
    state_ts = F.when(F.col("current_state_timestamp") >= 0, F.col("current_state_timestamp")).otherwise(
        F.col("timestamp")
    )
    v = (
        v.withColumn("state_timestamp", state_ts)
        .withColumn("identities", _identities(F.col("members")))
        .withColumn("member_ids", F.array_sort(F.transform(F.col("members"), lambda m: m["member_id"])))
        .withColumn("prev_generation", F.lag("generation").over(w))
        .withColumn("prev_identities", F.lag("identities").over(w))
        .withColumn("prev_member_ids", F.lag("member_ids").over(w))
        .withColumn("prev_state_timestamp", F.lag("state_timestamp").over(w))
    )
    joined = F.array_except(F.col("identities"), F.col("prev_identities"))
    left = F.array_except(F.col("prev_identities"), F.col("identities"))
    reason = (
        F.when(F.col("prev_generation").isNull(), "first")
        .when(
            F.col("generation") == F.col("prev_generation"),
            F.when(
                (F.col("identities") == F.col("prev_identities")) & (F.col("member_ids") != F.col("prev_member_ids")),
                "static_replacement",
            ).otherwise("same_generation"),
        )
        .when(F.size("members") == 0, "empty")
        .when((F.size(joined) > 0) & (F.size(left) > 0), "join_and_leave")
        .when(F.size(joined) > 0, "join")
        .when(F.size(left) > 0, "leave")
        .otherwise("same_members")
    )
    return v.select(
        *REC,
        "timestamp",
        "group",
        "incarnation",
        "generation",
        "protocol_type",
        "protocol",
        "leader",
        "current_state_timestamp",
        "state_timestamp",
        F.when(F.size("members") > 0, "Stable").otherwise("Empty").alias("state"),
        F.size("members").alias("member_count"),
        F.size(F.filter("members", lambda m: m["group_instance_id"].isNotNull())).alias("static_members"),
        F.aggregate("members", F.lit(0), lambda acc, m: acc + F.coalesce(m["assigned_partitions"], F.lit(0))).alias(
            "assigned_partitions"
        ),
        "members",
        F.coalesce(joined, F.col("identities")).alias("members_joined"),
        F.coalesce(left, F.array().cast("array<string>")).alias("members_left"),
        reason.alias("reason"),
        "prev_generation",
        (F.col("state_timestamp") - F.col("prev_state_timestamp")).alias("ms_since_previous"),
    )


def group_summary(gens: DataFrame, commit_df: DataFrame, tomb: DataFrame, latest: DataFrame) -> DataFrame:
    counts = [F.sum((F.col("reason") == r).cast("int")).alias(f"reason_{r}") for r in REASONS]
    rebalancing = ~F.col("reason").isin("first", "static_replacement", "same_generation")
    last = F.max_by(
        F.struct("generation", "state", "protocol_type", "protocol", "leader", "member_count", "static_members"),
        "log_offset",
    )
    gen_agg = gens.groupBy(*GROUP).agg(
        F.count("*").alias("generation_records"),
        F.countDistinct("incarnation", "generation").alias("generations"),
        F.min("generation").alias("first_generation"),
        F.max("generation").alias("max_generation"),
        F.sum(rebalancing.cast("int")).alias("rebalances"),
        F.avg(F.when(rebalancing, F.col("ms_since_previous"))).alias("mean_ms_between_generations"),
        F.min("state_timestamp").alias("first_generation_ts"),
        F.max("state_timestamp").alias("last_generation_ts"),
        last.alias("_last"),
        *counts,
    )
    members = gens.select(*GROUP, F.explode("members").alias("m"))
    mem_agg = members.groupBy(*GROUP).agg(
        F.countDistinct("m.group_instance_id").alias("static_members_seen"),
        F.countDistinct(F.when(F.col("m.group_instance_id").isNull(), F.col("m.member_id"))).alias(
            "dynamic_members_seen"
        ),
    )
    com_agg = commit_df.groupBy(*GROUP).agg(
        F.count("*").alias("commits"),
        F.countDistinct("topic", "partition").alias("committed_partitions_seen"),
        F.min("commit_timestamp").alias("first_commit_ts"),
        F.max("commit_timestamp").alias("last_commit_ts"),
    )
    tomb_agg = tomb.groupBy(*GROUP).agg(
        F.sum((F.col("key_type") == "offset").cast("int")).alias("offset_tombstones"),
        F.sum((F.col("key_type") == "group").cast("int")).alias("group_tombstones"),
    )
    latest_agg = latest.groupBy(*GROUP).agg(F.count("*").alias("committed_partitions"))
    # deleted = the group's last GroupMetadata record is a tombstone
    last_group_rec = (
        gens.select(*GROUP, "log_offset", F.lit(False).alias("tombstone"))
        .unionByName(
            tomb.where(F.col("key_type") == "group").select(*GROUP, "log_offset", F.lit(True).alias("tombstone"))
        )
        .groupBy(*GROUP)
        .agg(F.max_by("tombstone", "log_offset").alias("deleted"))
    )
    keys = gens.select(*GROUP).unionByName(commit_df.select(*GROUP)).unionByName(tomb.select(*GROUP)).distinct()
    s = keys
    for part in (gen_agg, mem_agg, com_agg, tomb_agg, latest_agg, last_group_rec):
        s = s.join(part, on=GROUP, how="left")
    span_min = (F.col("last_commit_ts") - F.col("first_commit_ts")) / 60000.0
    deleted = F.coalesce(F.col("deleted"), F.lit(False))
    return s.select(
        *GROUP,
        F.when(deleted, "Dead")
        .when(F.col("_last.state").isNotNull(), F.col("_last.state"))
        .otherwise("Empty")
        .alias("state"),
        deleted.alias("deleted"),
        F.col("_last.protocol_type").alias("protocol_type"),
        F.col("_last.protocol").alias("protocol"),
        F.col("_last.generation").alias("generation"),
        F.col("_last.leader").alias("leader"),
        F.coalesce(F.col("_last.member_count"), F.lit(0)).alias("members"),
        F.coalesce(F.col("_last.static_members"), F.lit(0)).alias("static_members"),
        (F.coalesce(F.col("_last.member_count"), F.lit(0)) - F.coalesce(F.col("_last.static_members"), F.lit(0))).alias(
            "dynamic_members"
        ),
        F.coalesce(F.col("static_members_seen"), F.lit(0)).alias("static_members_seen"),
        F.coalesce(F.col("dynamic_members_seen"), F.lit(0)).alias("dynamic_members_seen"),
        F.coalesce(F.col("generation_records"), F.lit(0)).alias("generation_records"),
        F.coalesce(F.col("generations"), F.lit(0)).alias("generations"),
        "first_generation",
        "max_generation",
        F.coalesce(F.col("rebalances"), F.lit(0)).alias("rebalances"),
        "mean_ms_between_generations",
        "first_generation_ts",
        "last_generation_ts",
        *[F.coalesce(F.col(f"reason_{r}"), F.lit(0)).alias(f"reason_{r}") for r in REASONS],
        F.coalesce(F.col("commits"), F.lit(0)).alias("commits"),
        F.when(span_min > 0, F.col("commits") / span_min).alias("commits_per_minute"),
        "first_commit_ts",
        "last_commit_ts",
        F.coalesce(F.col("committed_partitions_seen"), F.lit(0)).alias("committed_partitions_seen"),
        F.coalesce(F.col("committed_partitions"), F.lit(0)).alias("committed_partitions"),
        F.coalesce(F.col("offset_tombstones"), F.lit(0)).alias("offset_tombstones"),
        F.coalesce(F.col("group_tombstones"), F.lit(0)).alias("group_tombstones"),
    )


def invariants(gens: DataFrame) -> DataFrame:
    """Per (broker, group, check): how many things were checked, how many broke the rule, and the
    first violation in log order.

    - ``generation_increases``: each GroupMetadata record of a group has a higher generation than
      the previous one (the only same-generation write Kafka does is a static member replacement,
      ``GroupMetadataManager.storeGroup`` from ``updateStaticMemberAndRebalance`` in Stable; a
      deleted group starts over).
    - ``members_have_assignment``: every member of a stored non-empty generation has an assignment
      (Kafka's writer refuses otherwise, GroupMetadataManager.prepareStoreGroup); for the consumer
      protocol it must also decode.
    - ``no_double_assignment``: no topic-partition is assigned to two members (or twice) in one
      consumer-protocol generation.
    """
    seq = gens.where(F.col("prev_generation").isNotNull()).select(
        *GROUP,
        F.lit("generation_increases").alias("check"),
        F.lit(1).alias("checked"),
        (
            (F.col("generation") < F.col("prev_generation"))
            | ((F.col("generation") == F.col("prev_generation")) & (F.col("reason") != "static_replacement"))
        ).alias("bad"),
        "log_partition",
        "log_offset",
        F.format_string(
            "generation %d after %d at log offset %d (partition %d)",
            "generation",
            "prev_generation",
            "log_offset",
            "log_partition",
        ).alias("detail"),
    )
    members = gens.select(
        *GROUP, "log_partition", "log_offset", "generation", "protocol_type", F.explode("members").alias("m")
    )
    missing = (F.col("m.assignment_bytes") == 0) | (
        (F.col("protocol_type") == "consumer") & F.col("m.assigned").isNull()
    )
    assign = members.select(
        *GROUP,
        F.lit("members_have_assignment").alias("check"),
        F.lit(1).alias("checked"),
        missing.alias("bad"),
        "log_partition",
        "log_offset",
        F.format_string(
            "member %s of generation %d: %s",
            F.col("m.member_id"),
            F.col("generation"),
            F.coalesce(F.col("m.protocol_error"), F.lit("no assignment")),
        ).alias("detail"),
    )
    consumer = gens.where((F.col("protocol_type") == "consumer") & (F.col("member_count") > 0))
    tps = (
        consumer.select(*GROUP, "log_partition", "log_offset", "generation", F.explode("members").alias("m"))
        .select(*GROUP, "log_partition", "log_offset", "generation", "m.member_id", F.explode("m.assigned").alias("a"))
        .select(
            *GROUP,
            "log_partition",
            "log_offset",
            "generation",
            "member_id",
            "a.topic",
            F.explode("a.partitions").alias("p"),
        )
    )
    doubled = (
        tps.groupBy(*GROUP, "log_partition", "log_offset", "generation", "topic", "p")
        .agg(F.count("*").alias("n"), F.array_sort(F.collect_list("member_id")).alias("owners"))
        .where(F.col("n") > 1)
        .groupBy(*GROUP, "log_partition", "log_offset", "generation")
        .agg(
            F.min(
                F.format_string(
                    "generation %d: %s-%d assigned to %s",
                    F.col("generation"),
                    F.col("topic"),
                    F.col("p"),
                    F.array_join("owners", ", "),
                )
            ).alias("detail_dbl")
        )
    )
    dbl = (
        consumer.select(*GROUP, "log_partition", "log_offset", "generation")
        .join(doubled, on=[*GROUP, "log_partition", "log_offset", "generation"], how="left")
        .select(
            *GROUP,
            F.lit("no_double_assignment").alias("check"),
            F.lit(1).alias("checked"),
            F.col("detail_dbl").isNotNull().alias("bad"),
            "log_partition",
            "log_offset",
            F.col("detail_dbl").alias("detail"),
        )
    )
    allc = seq.unionByName(assign).unionByName(dbl)
    first_bad = F.min(F.when(F.col("bad"), F.struct("log_partition", "log_offset", "detail")))
    return (
        allc.groupBy(*GROUP, "check")
        .agg(
            F.sum("checked").cast("long").alias("checked"),
            F.sum(F.col("bad").cast("int")).cast("long").alias("violations"),
            first_bad["detail"].alias("first_violation"),
        )
        .withColumn("passed", F.col("violations") == 0)
    )


def consumer_group_records(decoded: DataFrame) -> DataFrame:
    """Consumer-group (KIP-848) records: one row each, with the epoch it carries (group epoch,
    target assignment epoch or member epoch; null for the other record types)."""
    return decoded.where(F.col("kind") == "consumer").select(
        *REC,
        "timestamp",
        "record_type",
        "group",
        "member_id",
        F.col("generation").alias("epoch"),
        "tombstone",
    )


def _same(name: str, df: DataFrame) -> DataFrame:
    return df


def build(decoded: DataFrame, materialize: Callable[[str, DataFrame], DataFrame] = _same) -> dict[str, DataFrame]:
    """Every table, keyed by its name (the Parquet directory name in the output).

    ``materialize(name, df)`` is called on each table in dependency order and what it returns is
    used by the tables built from it (the job writes each table and reads it back, so that
    group_summary and invariants start from Parquet instead of recomputing their inputs).
    """
    txn = has_transactions(decoded)
    t: dict[str, DataFrame] = {}
    t["segments"] = materialize("segments", segments(decoded))
    t["commits"] = materialize("commits", commits(offset_records(decoded, txn)))
    kept = trusted(decoded, t["segments"])
    t["offsets_latest"] = materialize("offsets_latest", offsets_latest(offset_records(kept, txn), txn))
    t["tombstones"] = materialize("tombstones", tombstones(decoded))
    t["generations"] = materialize("generations", generations(decoded))
    t["group_summary"] = materialize(
        "group_summary", group_summary(t["generations"], t["commits"], t["tombstones"], t["offsets_latest"])
    )
    t["invariants"] = materialize("invariants", invariants(t["generations"]))
    t["consumer_group_records"] = materialize("consumer_group_records", consumer_group_records(decoded))
    return t
