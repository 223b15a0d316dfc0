"""The Spark pipeline end to end on crafted and synthetic logs (one shared local[2] SparkSession).

One pipeline run (module fixture) over three "brokers": b1 (synthetic, with transactions), b2
(synthetic, then a torn tail and a corrupted closed segment), crafted (hand-made records whose
tables are known exactly: rebalance reasons, a deleted and a recreated group, invariant
violations).  Oracle: the broker's own recovery and loader (coordinator/storage), each partition
read up to its first damage.
"""

from __future__ import annotations

import shutil
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from rallypoint.pipeline import decode, job
from rallypoint.protocol import offsets_schema as schema
from rallypoint.protocol import records as rec
from rallypoint.storage.recovery import replay_partition

from tests.support import offsets_synth as synth

pytestmark = pytest.mark.spark


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The one SparkSession of the test run (other pipeline test modules import this fixture)."""
    if shutil.which("java") is None:
        pytest.fail("java is not installed; run ./scripts/test (scripts/setup --test installs Java 17)")
    from rallypoint.pipeline.session import get_session

    s = get_session("local[2]", app_name="rallypoint-tests")
    yield s
    s.stop()


@dataclass
class Scenario:
    dirs: dict[str, Path]
    out: Path
    counters: dict[str, Any]
    b1: synth.SynthResult
    spark: Any

    def table(self, name: str) -> list[dict[str, Any]]:
        return [r.asDict(recursive=True) for r in self.spark.read.parquet(str(self.out / name)).collect()]


T0 = 1_700_000_000_000


def write_crafted(data_dir: Path) -> None:
    w = synth.LogWriter(data_dir, 1)
    cm, ge, off = synth.consumer_member, synth.group_entry, synth.offset_entry

    def put(entry: synth.Entry, ts: int) -> None:
        w.append(0, [entry], T0 + ts)

    a, c = cm("A", {"t": [0, 1]}), cm("C", {"t": [0, 1]})
    put(ge("g-reasons", 1, [a], T0 + 1000), 1000)  # first
    put(ge("g-reasons", 2, [cm("A", {"t": [0]}), cm("S1", {"t": [1]}, "s1")], T0 + 2000), 2000)  # join
    put(ge("g-reasons", 2, [cm("A", {"t": [0]}), cm("S1b", {"t": [1]}, "s1")], T0 + 3000), 3000)  # static repl.
    put(ge("g-reasons", 3, [cm("S1b", {"t": [0, 1]}, "s1")], T0 + 5000), 5000)  # leave
    put(ge("g-reasons", 4, [], T0 + 6000), 6000)  # empty
    w.append(0, [off("g-reasons", "t", 0, 10, T0 + 7000), off("g-reasons", "t", 1, 11, T0 + 7000)], T0 + 7000)
    w.append(0, [off("g-reasons", "t", 0, None), off("g-reasons", "t", 1, None), ge("g-reasons", None)], T0 + 8000)
    put(ge("g-reasons", 1, [c], T0 + 9000), 9000)  # first again (recreated)
    put(off("g-reasons", "t", 0, 99, T0 + 10000), 10000)

    put(ge("g-dead", 1, [cm("D", {"t": [0]})], T0 + 1000), 1100)
    put(off("g-dead", "t", 0, 5, T0 + 1200), 1200)
    put(ge("g-dead", 2, [], T0 + 1300), 1300)
    w.append(0, [off("g-dead", "t", 0, None), ge("g-dead", None)], T0 + 1400)

    put(ge("g-backwards", 5, [cm("E", {"t": [0]})], T0 + 100), 100)
    put(ge("g-backwards", 3, [cm("E", {"t": [0]})], T0 + 200), 200)
    put(ge("g-noassign", 1, [cm("F", {"t": [0]}), cm("G", None)], T0 + 300), 300)
    put(ge("g-double", 1, [cm("H", {"t": [0, 1]}), cm("I", {"t": [1]})], T0 + 400), 400)
    worker = schema.MemberMetadata("W", None, "c", "h", 1, 1, b"opaque", b"opaque")
    put(ge("g-connect", 1, [worker], T0 + 500, protocol_type="connect", protocol="default"), 500)
    put(off("g-simple", "u", 3, 333, T0 + 600), 600)
    put((struct.pack(">h", 11) + b"share-group record", b"\x00\x00"), 700)  # a key the pipeline skips
    put((schema.encode_key(schema.OffsetCommitKey("g-bad", "t", 0)), b"\x00\x03"), 800)  # undecodable value

    # partition 1: a second segment whose offsets overlap the first one's (the broker refuses to
    # start; the pipeline marks it corrupt and loads the partition up to it)
    p1 = data_dir / "__consumer_offsets-1"
    p1.mkdir()
    first = [rec.Record(i, T0, *off("g-overlap", "t", i, i + 1)) for i in range(3)]
    (p1 / f"{0:020d}.log").write_bytes(rec.encode_batch(first))
    (p1 / f"{1:020d}.log").write_bytes(rec.encode_batch([rec.Record(1, T0, *off("g-overlap", "t", 0, 999))]))


@pytest.fixture(scope="module")
def scenario(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Scenario:
    root = tmp_path_factory.mktemp("pipeline")
    dirs = {name: root / name for name in ("b1", "b2", "crafted", "empty")}
    b1 = synth.generate(dirs["b1"], synth.SynthConfig(seed=11, events=500, txn_fraction=0.3, segment_bytes=8 * 1024))
    synth.generate(dirs["b2"], synth.SynthConfig(seed=12, events=400, segment_bytes=8 * 1024, group_prefix="grp"))
    p0 = sorted((dirs["b2"] / "__consumer_offsets-0").glob("*.log"))
    p1 = sorted((dirs["b2"] / "__consumer_offsets-1").glob("*.log"))
    assert len(p0) > 1 and len(p1) > 1
    synth.tear_tail(p0[-1], 5)  # torn tail: the broker truncates it and loads the rest
    synth.flip_byte(p1[0], p1[0].stat().st_size // 2)  # corrupt closed segment: the rest of p1 is past it
    write_crafted(dirs["crafted"])
    dirs["empty"].mkdir()
    out = root / "out"
    inputs = job.parse_inputs([str(d) for d in dirs.values()])
    counters = job.run(spark, inputs, out)
    return Scenario(dirs, out, counters, b1, spark)


def broker_load(data_dir: Path, partitions: list[int] | None = None) -> tuple[dict[Any, int], dict[str, Any]]:
    offsets: dict[Any, int] = {}
    groups: dict[str, Any] = {}
    for pdir in sorted(data_dir.glob("__consumer_offsets-*")):
        n = int(pdir.name.rsplit("-", 1)[1])
        if partitions is not None and n not in partitions:
            continue
        st = replay_partition(pdir, n, repair=False).state
        offsets.update({(n, k.group, k.topic, k.partition): v.offset for k, v in st.offsets.items()})
        groups.update(st.groups)
    return offsets, groups


def latest_of(sc: Scenario, broker: str) -> dict[Any, int]:
    return {
        (r["log_partition"], r["group"], r["topic"], r["partition"]): r["offset"]
        for r in sc.table("offsets_latest")
        if r["broker"] == broker
    }


# --- the hidden-directory trap -----------------------------------------------------------------


def test_spark_file_listing_skips_consumer_offsets_dirs(spark: Any, scenario: Scenario) -> None:
    """Spark treats names starting with ``_`` as hidden: a recursive read of a broker data dir finds
    no segment at all, silently.  This is why the driver lists the files itself."""
    ours = decode.find_segments("b1", scenario.dirs["b1"])
    assert len(ours) > 3
    recursive = (
        spark.read.format("binaryFile")
        .option("recursiveFileLookup", "true")
        .option("pathGlobFilter", "*.log")
        .load(str(scenario.dirs["b1"]))
    )
    assert recursive.count() == 0
    segs = scenario.table("segments")
    assert sorted(s["path"] for s in segs if s["broker"] == "b1") == sorted(f.path for f in ours)


# --- offsets_latest ----------------------------------------------------------------------------


def test_offsets_latest_equals_the_broker_loader_read_up_to_the_damage(scenario: Scenario) -> None:
    expected = {k: v.offset for k, v in synth.load_offsets(list(scenario.dirs.items())).offsets.items()}
    got = {
        (r["broker"], r["log_partition"], r["group"], r["topic"], r["partition"]): r["offset"]
        for r in scenario.table("offsets_latest")
    }
    assert got == expected
    assert {k[0] for k in got} == {"b1", "b2", "crafted"}


def test_offsets_latest_equals_what_the_broker_loads(scenario: Scenario) -> None:
    b1, _ = broker_load(scenario.dirs["b1"])  # transactions included
    assert latest_of(scenario, "b1") == b1 and len(b1) > 20
    crafted, _ = broker_load(scenario.dirs["crafted"], [0])  # (partition 1 stops the broker)
    assert {k: v for k, v in latest_of(scenario, "crafted").items() if k[0] == 0} == crafted
    assert crafted == {(0, "g-reasons", "t", 0): 99, (0, "g-simple", "u", 3): 333}
    overlap = {k: v for k, v in latest_of(scenario, "crafted").items() if k[0] == 1}
    assert overlap == {(1, "g-overlap", "t", 0): 1, (1, "g-overlap", "t", 1): 2, (1, "g-overlap", "t", 2): 3}
    # b2 partition 0 has a torn tail (the broker truncates it); partition 1 a corrupt segment
    # (the broker refuses to start; the pipeline keeps what precedes the damage)
    torn_ok, _ = broker_load(scenario.dirs["b2"], [0, 2])
    got = latest_of(scenario, "b2")
    assert {k: v for k, v in got.items() if k[0] in (0, 2)} == torn_ok


def test_offsets_latest_columns(scenario: Scenario) -> None:
    (row,) = [r for r in scenario.table("offsets_latest") if r["group"] == "g-simple"]
    assert row == {
        "broker": "crafted",
        "group": "g-simple",
        "topic": "u",
        "partition": 3,
        "offset": 333,
        "leader_epoch": -1,
        "metadata": "",
        "commit_timestamp": T0 + 600,
        "expire_timestamp": None,
        "log_partition": 0,
        "log_offset": row["log_offset"],
        "timestamp": T0 + 600,
    }


# --- segments and counters ---------------------------------------------------------------------


def test_damaged_segments_are_counted_not_fatal(scenario: Scenario) -> None:
    segs = scenario.table("segments")
    damaged = sorted((s["broker"], s["log_partition"], s["status"]) for s in segs if s["status"] != "ok")
    assert damaged == [("b2", 0, "torn"), ("b2", 1, "corrupt"), ("crafted", 1, "corrupt")]
    corrupt = next(s for s in segs if s["status"] == "corrupt" and s["broker"] == "b2")
    assert "CRC mismatch" in corrupt["error"] and corrupt["unread_bytes"] > 0
    overlap = next(s for s in segs if s["status"] == "corrupt" and s["broker"] == "crafted")
    assert overlap["base_offset"] == 1 and "overlaps the previous segment" in overlap["error"]
    assert scenario.counters["damaged_segments"] == 3
    crafted = [s for s in segs if s["broker"] == "crafted" and s["log_partition"] == 0]
    assert [(s["bad_records"], s["other_records"]) for s in crafted] == [(1, 1)]
    assert scenario.counters["bad_records"] == 1
    assert scenario.counters["segments"] == len(segs)
    assert sum(s["records"] for s in segs if s["broker"] == "b1") == scenario.b1.records


# --- commits and generations -------------------------------------------------------------------


def test_commits_hold_every_commit_record(scenario: Scenario) -> None:
    commits = scenario.table("commits")
    b1 = [c for c in commits if c["broker"] == "b1"]
    assert len(b1) == scenario.b1.commits
    assert {c["txn_result"] for c in b1} == {None, "committed", "aborted", "pending"}
    assert {c["value_version"] for c in b1} == {1, 3}  # v1 carries an expire timestamp
    assert all((c["value_version"] == 1) == (c["expire_timestamp"] is not None) for c in b1)
    crafted = sorted(
        (c["group"], c["topic"], c["partition"], c["offset"])
        for c in commits
        if c["broker"] == "crafted" and c["log_partition"] == 0
    )
    assert crafted == [
        ("g-dead", "t", 0, 5),
        ("g-reasons", "t", 0, 10),
        ("g-reasons", "t", 0, 99),
        ("g-reasons", "t", 1, 11),
        ("g-simple", "u", 3, 333),
    ]
    tombs = [t for t in scenario.table("tombstones") if t["broker"] == "crafted"]
    assert sorted((t["key_type"], t["group"]) for t in tombs) == [
        ("group", "g-dead"),
        ("group", "g-reasons"),
        ("offset", "g-dead"),
        ("offset", "g-reasons"),
        ("offset", "g-reasons"),
    ]


def test_generations_and_why_they_happened(scenario: Scenario) -> None:
    gens = scenario.table("generations")
    assert len([g for g in gens if g["broker"] == "b1"]) == scenario.b1.generation_records
    reasons = [
        (g["incarnation"], g["generation"], g["reason"], g["state"], g["members_joined"], g["members_left"])
        for g in sorted((g for g in gens if g["group"] == "g-reasons"), key=lambda g: g["log_offset"])
    ]
    assert reasons == [
        (0, 1, "first", "Stable", ["A"], []),
        (0, 2, "join", "Stable", ["s1"], []),
        (0, 2, "static_replacement", "Stable", [], []),
        (0, 3, "leave", "Stable", [], ["A"]),
        (0, 4, "empty", "Empty", [], ["s1"]),
        (1, 1, "first", "Stable", ["C"], []),
    ]
    static = next(g for g in gens if g["group"] == "g-reasons" and g["reason"] == "static_replacement")
    assert [(m["member_id"], m["group_instance_id"]) for m in static["members"]] == [("A", None), ("S1b", "s1")]
    assert (static["member_count"], static["static_members"], static["assigned_partitions"]) == (2, 1, 2)
    assert static["leader"] == "A" and static["protocol"] == "range" and static["ms_since_previous"] == 1000


def test_group_summary(scenario: Scenario) -> None:
    summary = {(s["broker"], s["group"]): s for s in scenario.table("group_summary")}
    r = summary[("crafted", "g-reasons")]
    expect = {
        "state": "Stable",
        "deleted": False,
        "generation": 1,
        "members": 1,
        "static_members": 0,
        "dynamic_members": 1,
        "static_members_seen": 1,
        "dynamic_members_seen": 2,
        "generation_records": 6,
        "generations": 5,
        "rebalances": 3,
        "reason_first": 2,
        "reason_join": 1,
        "reason_leave": 1,
        "reason_empty": 1,
        "reason_static_replacement": 1,
        "reason_same_generation": 0,
        "commits": 3,
        "committed_partitions": 1,
        "committed_partitions_seen": 2,
        "offset_tombstones": 2,
        "group_tombstones": 1,
    }
    assert {k: r[k] for k in expect} == expect
    assert r["mean_ms_between_generations"] == pytest.approx((1000 + 2000 + 1000) / 3)
    assert r["commits_per_minute"] == pytest.approx(3 / (3000 / 60000))
    dead = summary[("crafted", "g-dead")]
    assert (dead["state"], dead["deleted"], dead["committed_partitions"]) == ("Dead", True, 0)
    simple = summary[("crafted", "g-simple")]
    assert (simple["state"], simple["generations"], simple["commits"], simple["commits_per_minute"]) == (
        "Empty",
        0,
        1,
        None,
    )
    # b1: the groups the broker would load (last GroupMetadata record is a value) are exactly the
    # groups not marked deleted, with the same generation and Stable/Empty state
    _, loaded = broker_load(scenario.dirs["b1"])
    with_meta = {g: s for (b, g), s in summary.items() if b == "b1" and s["generation_records"] > 0}
    assert {g for g, s in with_meta.items() if not s["deleted"]} == set(loaded)
    for g, v in loaded.items():
        assert with_meta[g]["generation"] == v.generation
        assert with_meta[g]["state"] == ("Stable" if v.members else "Empty")
        assert with_meta[g]["members"] == len(v.members)


def test_invariants(scenario: Scenario) -> None:
    inv = {(i["broker"], i["group"], i["check"]): i for i in scenario.table("invariants")}
    failing = sorted((k[1], k[2], i["checked"], i["violations"]) for k, i in inv.items() if not i["passed"])
    assert failing == [
        ("g-backwards", "generation_increases", 1, 1),
        ("g-double", "no_double_assignment", 1, 1),
        ("g-noassign", "members_have_assignment", 2, 1),
    ]
    assert inv[("crafted", "g-backwards", "generation_increases")]["first_violation"].startswith("generation 3 after 5")
    assert "t-1 assigned to H, I" in inv[("crafted", "g-double", "no_double_assignment")]["first_violation"]
    assert "member G" in inv[("crafted", "g-noassign", "members_have_assignment")]["first_violation"]
    # a static replacement keeps its generation legitimately; the recreated group starts over
    ok = inv[("crafted", "g-reasons", "generation_increases")]
    assert (ok["checked"], ok["violations"], ok["passed"]) == (4, 0, True)
    assert ("crafted", "g-connect", "no_double_assignment") not in inv  # not the consumer protocol
    assert inv[("crafted", "g-connect", "members_have_assignment")]["passed"]
    synthetic = [i for k, i in inv.items() if k[0] in ("b1", "b2")]
    assert synthetic and all(i["passed"] for i in synthetic)
    assert {i["check"] for i in synthetic} == {
        "generation_increases",
        "members_have_assignment",
        "no_double_assignment",
    }
    assert scenario.counters["invariant_violations"] == 3


def test_report_is_one_self_contained_html_file(scenario: Scenario) -> None:
    html = (scenario.out / "report.html").read_text(encoding="utf-8")
    assert html.startswith("<!doctype html>") and html.rstrip().endswith("</html>")
    assert html.count('src="data:image/png;base64,') >= 4  # commits, generations, rebalances, segments
    assert "http://" not in html and "https://" not in html and "<script" not in html
    for text in ("Commit activity", "Top rebalancing groups", "Invariants", "g-backwards", "CRC mismatch", "torn"):
        assert text in html
    assert (scenario.out / job.STAGING).exists() is False
    for t in job.TABLES:
        assert (scenario.out / t / "_SUCCESS").exists()


def test_decoding_in_the_tasks_makes_the_same_tables(spark: Any, scenario: Scenario, tmp_path: Path) -> None:
    """The scenario is small, so it was decoded in the driver; above ``small_input_bytes`` the
    tasks decode it (mapInArrow) and stage it as Parquet: every table and counter the same."""
    assert scenario.counters["decode"] == "driver"
    out = tmp_path / "tasks"
    inputs = job.parse_inputs([str(d) for d in scenario.dirs.values()])
    counters = job.run(spark, inputs, out, report=False, small_input_bytes=-1)
    assert counters["decode"] == "tasks"
    timing = {"decode", "decode_seconds", "tables_seconds", "report_seconds", "seconds"}
    assert {k: v for k, v in counters.items() if k not in timing} == {
        k: v for k, v in scenario.counters.items() if k not in timing
    }
    for name in job.TABLES:
        tasks = sorted(repr(r.asDict(recursive=True)) for r in spark.read.parquet(str(out / name)).collect())
        assert tasks == sorted(repr(r) for r in scenario.table(name)), name
    assert spark.conf.get("spark.sql.adaptive.enabled") == "true"  # the small-input settings were put back


def test_a_run_without_any_segment(spark: Any, tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    counters = job.run(spark, job.parse_inputs([f"solo={tmp_path / 'in'}"]), tmp_path / "out")
    assert counters["segments"] == counters["commits"] == counters["groups"] == 0
    assert spark.read.parquet(str(tmp_path / "out" / "offsets_latest")).count() == 0
    assert "no offset commits" in (tmp_path / "out" / "report.html").read_text()


def test_parse_inputs_names_brokers() -> None:
    got = job.parse_inputs(["/x/data", "east=/y/data", "/z/data", "/w/a=b"])
    assert [(i.broker, str(i.data_dir)) for i in got] == [
        ("data", "/x/data"),
        ("east", "/y/data"),
        ("data-2", "/z/data"),
        ("a=b", "/w/a=b"),
    ]
