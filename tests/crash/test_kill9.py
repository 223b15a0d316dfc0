"""The kill -9 suite, quick: a handful of SIGKILLs during a commit storm of real clients.

    RALLYPOINT_CRASH_KILLS=60 pytest -s tests/crash/test_kill9.py   # or: make crash

The seed is printed first (set RALLYPOINT_CRASH_SEED to replay a run's random choices);
RALLYPOINT_CRASH_JSON=FILE writes the run's figures.  See docs/reliability.md, "Crash safety".
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.crash.runner import CrashRun, seed_from_env
from tests.crash.storm import StormConfig

pytestmark = pytest.mark.clients

QUICK_KILLS = 5


def test_kill9_commit_storm(tmp_path: Path) -> None:
    kills = int(os.environ.get("RALLYPOINT_CRASH_KILLS", QUICK_KILLS))
    seed = seed_from_env()
    print(f"\ncrash suite seed: {seed} (RALLYPOINT_CRASH_SEED={seed} replays it)")
    summary = CrashRun(kills, seed, tmp_path / "data").run()
    figures = summary.figures()
    print(json.dumps(figures, indent=1))
    if out := os.environ.get("RALLYPOINT_CRASH_JSON"):
        Path(out).write_text(json.dumps(figures, indent=1) + "\n")
    assert summary.problems == [], f"seed {seed}"
    assert summary.kills == kills
    assert summary.failed_restarts == 0
    assert summary.lost == 0
    assert summary.offsets_repeated == 0 and summary.end_offset_regressions == 0
    assert summary.tap_decode_errors == 0
    assert summary.startup_kills >= 1 or kills < 2
    assert summary.restarts == kills + 1  # one per storm kill, and the final clean one
    # the storm really ran: commits and produced batches acknowledged on top of the prefill
    assert summary.commits_acked - summary.prefill_commits >= 50 * kills
    assert summary.produce_batches_acked >= 10 * kills
    assert summary.broker_tracebacks == 0


def test_the_checks_catch_a_broker_that_forgets(tmp_path: Path) -> None:
    """A restart that loses the offsets log and the topic data and moves end offsets back must
    be reported: the suite's checks can fail."""
    data = tmp_path / "data"

    def forget(data_dir: Path) -> None:
        for seg in data_dir.glob("__consumer_offsets-*/*.log"):
            seg.unlink()
        for seg in data_dir.glob("*-*/*.log"):  # topic data (docs/data-plane.md, "Durable topic data")
            seg.unlink()
        state_file = data_dir / "topics.json"
        state = json.loads(state_file.read_text())
        for t in state["topics"]:
            t["next_offsets"] = [0] * len(t["next_offsets"])
            t["reserved_offsets"] = [0] * len(t["next_offsets"])
        state_file.write_text(json.dumps(state))

    storm = StormConfig(kafka_python=1, aiokafka=1, confluent=0, simple=0)
    run = CrashRun(1, 7, data, storm=storm, startup_kill_rate=0.0, prefill=(2, 3), before_restart=forget)
    summary = run.run()
    assert summary.lost > 0
    assert summary.end_offset_regressions > 0
    assert summary.offsets_repeated > 0
    assert any("acknowledged commit lost" in p for p in summary.problems)
