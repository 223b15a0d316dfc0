"""The kill -9 loop: SIGKILL the broker at random moments of a commit storm, restart it on the
same data directory, and check what survived.  See docs/reliability.md, "Crash safety".

    python -m tests.crash.runner --kills 60 [--seed N] [--json FILE]

Each round: let the storm (tests/crash/storm.py) run for a random time, SIGKILL the broker,
close the gate (tests/crash/tap.py), sometimes start the broker and SIGKILL it again during
start-up (while it replays the offsets log, or earlier), restart it, and with no client able to
reach it yet read back

* every group's committed offsets (OffsetFetch): each must be the last one the broker
  acknowledged, or one tried after it (a commit cut by the kill may have reached the disk);
* each produced partition's end offset (ListOffsets latest): never below an acknowledged
  offset, so no offset is handed out twice;

then open the gate and go on.  At the end the storm stops, the broker is stopped cleanly and
restarted once more, and everything is checked again, including that no two acknowledged
Produce answers share an offset.  Random choices come from one seed, printed first.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tests.crash.storm import COMMIT_TOPIC, PARTITIONS, PRODUCE_TOPIC, Storm, StormConfig
from tests.crash.tap import Ledger, WireTap, end_regressions, lost_commits, repeated_offsets
from tests.support import ROOT, WireClient, free_port

START_TIMEOUT_S = 60.0
PROGRESS_TIMEOUT_S = 60.0

BROKER_CONFIG = {
    "group.initial.rebalance.delay.ms": "0",
    "offsets.topic.num.partitions": "8",
    "rallypoint.offsets.flush": "always",
    # small segments: rolls and compaction happen during the storm, so kills land in them too
    "offsets.topic.segment.bytes": str(256 * 1024),
}


class BrokerProc:
    """One broker process at a time on a fixed port and data directory; its JSON log is read
    by a thread (events kept by name, the last lines kept for failure reports)."""

    def __init__(self, data_dir: Path, port: int, config: dict[str, str]) -> None:
        self.data_dir = data_dir
        self.port = port
        self.config = config
        self.proc: subprocess.Popen[bytes] | None = None
        self.spawned_at = 0.0
        self.events: dict[str, list[dict[str, Any]]] = {}
        self.tail: deque[str] = deque(maxlen=200)
        self.error_lines = 0
        self.traceback_lines = 0
        self._cond = threading.Condition()

    def spawn(self) -> None:
        cmd = [sys.executable, "-m", "rallypoint", "--host", "127.0.0.1", "--port", str(self.port)]
        cmd += ["--data-dir", str(self.data_dir), "--log-format", "json"]
        for k, v in self.config.items():
            cmd += ["--config", f"{k}={v}"]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with self._cond:
            self.events = {}
        self.spawned_at = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        threading.Thread(target=self._pump, args=(self.proc,), daemon=True).start()

    def _pump(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip("\n")
            self.tail.append(line)
            try:
                ev = json.loads(line)
            except ValueError:
                if "Traceback" in line:
                    self.traceback_lines += 1
                continue
            if ev.get("level") in ("error", "critical"):
                self.error_lines += 1
            if "exception" in ev:
                self.traceback_lines += 1
            with self._cond:
                if proc is self.proc:
                    self.events.setdefault(str(ev.get("event")), []).append(ev)
                    self._cond.notify_all()

    def wait_event(self, name: str, timeout: float) -> dict[str, Any] | None:
        """The first ``name`` event of this run; None if the process exits or time runs out."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if self.events.get(name):
                    return self.events[name][0]
                left = deadline - time.monotonic()
                if left <= 0 or self.proc is None or self.proc.poll() is not None:
                    return None
                self._cond.wait(min(left, 0.05))

    def seen(self, name: str) -> bool:
        with self._cond:
            return bool(self.events.get(name))

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
            self.proc = None

    def stop(self) -> int:
        """SIGTERM: a clean shutdown; returns the exit status."""
        if self.proc is None:
            return 0
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait(5)
        self.proc = None
        return rc


@dataclass
class Summary:
    seed: int
    kills: int = 0  # SIGKILLs during the storm
    startup_kills: int = 0  # SIGKILLs of a broker that had not finished starting
    startup_kills_in_replay: int = 0  # ... of which landed while the offsets log was replayed
    restarts: int = 0
    failed_restarts: int = 0
    commits_acked: int = 0  # partition offsets the broker answered with error 0 (prefill included)
    prefill_commits: int = 0  # of which committed before the storm, to give replay some work
    commits_failed: int = 0  # partition offsets answered with an error (not counted as acknowledged)
    client_commits: int = 0  # commit calls the clients saw succeed
    lost: int = 0  # acknowledged commits missing after a restart (summed over checks)
    produce_batches_acked: int = 0
    produce_records_acked: int = 0
    offsets_repeated: int = 0  # offsets handed out by two acknowledged Produce answers
    end_offset_regressions: int = 0  # partitions whose end went below an acknowledged offset
    torn_tails_truncated: int = 0  # offsets-log tails cut by a kill and repaired at start-up
    broker_error_lines: int = 0
    broker_tracebacks: int = 0
    tap_decode_errors: int = 0
    restart_s: list[float] = field(default_factory=list)
    replay_s: list[float] = field(default_factory=list)
    offsets_log_bytes: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    def figures(self) -> dict[str, Any]:
        d = asdict(self)
        r = self.restart_s
        d["restart_s"] = {
            "p50": round(statistics.median(r), 3) if r else None,
            "max": round(max(r), 3) if r else None,
            "n": len(r),
        }
        d["replay_s"] = {"max": round(max(self.replay_s), 3) if self.replay_s else None, "n": len(self.replay_s)}
        return d

    @property
    def ok(self) -> bool:
        return not self.problems


PREFILL_TOPIC = "storm-prefill"


def _create_topics(port: int, prefill_partitions: int) -> dict[uuid.UUID, str]:
    ids = {}
    with WireClient("127.0.0.1", port) as c:
        for name, n in ((COMMIT_TOPIC, PARTITIONS), (PRODUCE_TOPIC, PARTITIONS), (PREFILL_TOPIC, prefill_partitions)):
            topic = {"name": name, "num_partitions": n, "replication_factor": 1, "assignments": [], "configs": []}
            t = c.call(19, 7, {"topics": [topic], "timeout": 5000, "validate_only": False}).topics[0]
            if int(t.error_code) not in (0, 36):  # TOPIC_ALREADY_EXISTS on a reused data dir
                raise RuntimeError(f"cannot create {name}: error {int(t.error_code)}")
            ids[t.topic_id] = name
    return ids


def read_committed(port: int, groups: list[str]) -> dict[tuple[str, str, int], int]:
    out = {}
    with WireClient("127.0.0.1", port) as c:
        for g in groups:
            resp = c.call(9, 7, {"group_id": g, "topics": None, "require_stable": False})
            if int(resp.error_code) != 0:
                raise RuntimeError(f"OffsetFetch {g}: error {int(resp.error_code)}")
            for t in resp.topics:
                for p in t.partitions:
                    if int(p.error_code) == 0 and int(p.committed_offset) >= 0:
                        out[(g, str(t.name), int(p.partition_index))] = int(p.committed_offset)
    return out


def read_end_offsets(port: int) -> dict[tuple[str, int], int]:
    body = {
        "replica_id": -1,
        "isolation_level": 0,
        "topics": [
            {
                "name": PRODUCE_TOPIC,
                "partitions": [
                    {"partition_index": p, "current_leader_epoch": -1, "timestamp": -1} for p in range(PARTITIONS)
                ],
            }
        ],
    }
    with WireClient("127.0.0.1", port) as c:
        resp = c.call(2, 7, body)
    return {(str(t.name), int(p.partition_index)): int(p.offset) for t in resp.topics for p in t.partitions}


class CrashRun:
    def __init__(
        self,
        kills: int,
        seed: int,
        data_dir: Path,
        *,
        storm: StormConfig | None = None,
        startup_kill_rate: float = 0.3,
        storm_s: tuple[float, float] = (0.3, 2.5),
        prefill: tuple[int, int] = (100, 200),
        say: Callable[[str], None] = print,
        before_restart: Callable[[Path], None] | None = None,
    ) -> None:
        self.kills = kills
        self.rng = random.Random(seed)
        self.data_dir = data_dir
        self.storm_config = storm or StormConfig()
        self.startup_kill_rate = startup_kill_rate
        self.storm_s = storm_s
        self.prefill = prefill
        self.say = say
        self.before_restart = before_restart  # tests: damage the data dir to prove the checks bite
        self.summary = Summary(seed)
        self.ledger = Ledger()
        self.tap = WireTap(self.ledger)
        self.broker = BrokerProc(data_dir, free_port(), {**BROKER_CONFIG, "advertised.port": str(self.tap.port)})
        self.storm: Storm | None = None

    def problem(self, text: str) -> None:
        self.summary.problems.append(text)
        self.say(f"PROBLEM: {text}")

    # ------------------------------------------------------------------ the loop

    def run(self) -> Summary:
        t0 = time.monotonic()
        s = self.summary
        self.say(f"crash run: seed {s.seed}, {self.kills} kills, data dir {self.data_dir}")
        try:
            if not self._start():
                return s
            self.tap.topic_ids.update(_create_topics(self.broker.port, max(1, self.prefill[1])))
            self.tap.open(self.broker.port)
            self._prefill()
            self.storm = Storm(self.tap.bootstrap, self.storm_config)
            self.storm.start()
            for k in range(self.kills):
                if not self._round(k):
                    break
            self._finish()
        finally:
            if self.storm is not None:
                self.storm.stop_event.set()
            self.tap.shutdown()
            if self.storm is not None:
                self.storm.stop(10)
            self.broker.kill()
            s.seconds = round(time.monotonic() - t0, 1)
            s.commits_acked = self.ledger.commits_acked
            s.commits_failed = self.ledger.commits_failed
            s.produce_batches_acked = self.ledger.batches_acked
            s.produce_records_acked = self.ledger.records_acked
            s.tap_decode_errors = self.ledger.decode_errors
            s.broker_error_lines = self.broker.error_lines
            s.broker_tracebacks = self.broker.traceback_lines
            if self.storm is not None:
                s.client_commits = sum(self.storm.client_commits.values())
            s.offsets_log_bytes = sum(
                f.stat().st_size for f in self.data_dir.glob("__consumer_offsets-*/*.log") if f.is_file()
            )
        return s

    def _prefill(self) -> None:
        """Commit ``groups × partitions`` offsets through the tap (so they are checked like the
        storm's) before the storm: a log worth replaying, so start-up kills can land in replay."""
        groups, partitions = self.prefill
        self.summary.prefill_commits = groups * partitions
        with WireClient("127.0.0.1", self.tap.port) as c:
            for g in range(groups):
                body = {
                    "group_id": f"prefill-{g}",
                    "generation_id_or_member_epoch": -1,
                    "member_id": "",
                    "group_instance_id": None,
                    "retention_time_ms": -1,
                    "topics": [
                        {
                            "name": PREFILL_TOPIC,
                            "partitions": [
                                {"partition_index": p, "committed_offset": g + p, "committed_leader_epoch": -1,
                                 "committed_metadata": "prefill"}
                                for p in range(partitions)
                            ],
                        }
                    ],
                }  # fmt: skip
                resp = c.call(8, 8, body)
                errors = {int(p.error_code) for t in resp.topics for p in t.partitions}
                if errors != {0}:
                    raise RuntimeError(f"prefill commit failed: errors {errors}")

    def _start(self) -> bool:
        """Start the broker; a start that does not reach ``listening`` is a failed restart."""
        self.broker.spawn()
        if self.broker.wait_event("listening", START_TIMEOUT_S) is None:
            self.summary.failed_restarts += 1
            self.problem("broker did not start:\n" + "\n".join(list(self.broker.tail)[-30:]))
            return False
        self.summary.restart_s.append(round(time.monotonic() - self.broker.spawned_at, 3))
        rec = self.broker.wait_event("offsets_log.recovered", 1)
        if rec is not None:
            self.summary.replay_s.append(float(rec.get("seconds", 0.0)))
        self.summary.torn_tails_truncated += len(self.broker.events.get("offsets_log.torn_tail_truncated", []))
        return True

    def _wait_for_progress(self) -> None:
        """Until the clients get a commit acknowledged again after the gate opened."""
        start = self.ledger.commits_acked
        deadline = time.monotonic() + PROGRESS_TIMEOUT_S
        while self.ledger.commits_acked == start:
            if time.monotonic() > deadline:
                self.problem(f"no commit acknowledged within {PROGRESS_TIMEOUT_S} s of a restart")
                return
            time.sleep(0.02)

    def _round(self, k: int) -> bool:
        s = self.summary
        self._wait_for_progress()
        time.sleep(self.rng.uniform(*self.storm_s))
        self.broker.kill()
        s.kills += 1
        self.tap.close()
        snap = self.ledger.snapshot()
        # at least one start-up kill in every run of 3 kills or more
        if self.rng.random() < self.startup_kill_rate:
            self._kill_during_startup(in_replay=self.rng.random() < 0.6)
        elif k == 1 and s.startup_kills == 0:
            self._kill_during_startup(in_replay=True)
        if self.before_restart is not None:
            self.before_restart(self.data_dir)
        s.restarts += 1
        if not self._start():
            return False
        lost = lost_commits(snap, read_committed(self.broker.port, sorted({g for g, _t, _p in snap.commits})))
        latest = read_end_offsets(self.broker.port)
        regress = end_regressions(snap.produced, latest)
        repeats = repeated_offsets(snap.produced)
        s.lost += len(lost)
        s.end_offset_regressions += len(regress)
        for loss in lost[:5]:
            self.problem(f"kill {k + 1}: acknowledged commit lost: {loss}")
        for r in regress[:5]:
            self.problem(f"kill {k + 1}: end offset of {r[0]} is {r[2]} after the restart, below acknowledged {r[1]}")
        if repeats:
            s.offsets_repeated = len(repeats)
            self.problem(f"offsets handed out twice: {repeats[:5]}")
        self.say(
            f"kill {k + 1}/{self.kills}: restart {s.restart_s[-1]:.2f} s, "
            f"{self.ledger.commits_acked} commits acked, {len(lost)} lost, "
            f"{self.ledger.batches_acked} batches acked, {len(regress)} end-offset regressions"
        )
        self.tap.open(self.broker.port)
        return True

    def _kill_during_startup(self, in_replay: bool) -> None:
        """Start the broker and SIGKILL it before it listens: during the offsets log replay
        (after the group coordinator's start-up line, within the last replay's duration) or
        earlier (within the last start-up's duration)."""
        s = self.summary
        replay = max(self.summary.replay_s[-1] if s.replay_s else 0.05, 0.02)
        boot = s.restart_s[-1] if s.restart_s else 1.0
        self.broker.spawn()
        if in_replay:
            if self.broker.wait_event("group coordinator started", START_TIMEOUT_S) is None:
                self.problem(
                    "broker exited before replaying the offsets log:\n" + "\n".join(list(self.broker.tail)[-30:])
                )
                s.failed_restarts += 1
                return
            time.sleep(self.rng.uniform(0, replay))
        else:
            time.sleep(self.rng.uniform(0, boot))
        landed = self.broker.seen("group coordinator started") and not self.broker.seen("offsets_log.recovered")
        listening = self.broker.seen("listening")
        self.broker.kill()
        s.startup_kills += 1
        s.startup_kills_in_replay += int(landed)
        where = "during replay" if landed else ("after listening" if listening else "before replay")
        self.say(f"  start-up kill {where}")

    def _finish(self) -> None:
        """Stop the storm, stop the broker cleanly, restart, check everything once more."""
        s = self.summary
        assert self.storm is not None
        stuck = self.storm.stop(60)
        if stuck:
            self.problem(f"clients did not stop: {stuck}")
        self.tap.close()
        if self.broker.stop() != 0:
            self.problem("clean shutdown did not exit 0")
        snap = self.ledger.snapshot()
        s.restarts += 1
        if not self._start():
            return
        lost = lost_commits(snap, read_committed(self.broker.port, sorted({g for g, _t, _p in snap.commits})))
        regress = end_regressions(snap.produced, read_end_offsets(self.broker.port))
        repeats = repeated_offsets(snap.produced)
        s.lost += len(lost)
        s.end_offset_regressions += len(regress)
        s.offsets_repeated = len(repeats)
        for loss in lost[:5]:
            self.problem(f"after the final clean restart: acknowledged commit lost: {loss}")
        for r in regress[:5]:
            self.problem(f"after the final clean restart: end offset of {r[0]} is {r[2]}, below acknowledged {r[1]}")
        if repeats:
            self.problem(f"offsets handed out twice: {repeats[:5]}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.crash.runner", description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=int(os.environ.get("RALLYPOINT_CRASH_KILLS", "60")))
    p.add_argument("--seed", type=int, default=None, help="default: $RALLYPOINT_CRASH_SEED or random")
    p.add_argument("--data-dir", help="default: a new temporary directory, removed afterwards")
    p.add_argument("--json", help="write the figures to this file")
    args = p.parse_args(argv)
    seed = args.seed if args.seed is not None else seed_from_env()
    with tempfile.TemporaryDirectory(prefix="rp-crash-") as tmp:
        data_dir = Path(args.data_dir) if args.data_dir else Path(tmp)
        summary = CrashRun(args.kills, seed, data_dir).run()
    figures = summary.figures()
    print(json.dumps(figures, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1) + "\n")
    return 0 if summary.ok else 1


def seed_from_env() -> int:
    raw = os.environ.get("RALLYPOINT_CRASH_SEED")
    return int(raw) if raw else random.SystemRandom().randrange(2**32)


if __name__ == "__main__":
    raise SystemExit(main())
