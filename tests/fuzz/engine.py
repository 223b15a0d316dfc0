"""The frame fuzzer: mutated real-client frames against a broker process, watched throughout.

    .venv/bin/python -m tests.fuzz.engine --frames 1000000 [--seed N] [--connections 8] ...

(``make fuzz`` runs it with ``FUZZ_FRAMES``, default 1,000,000; the quick run in
``tests/fuzz/test_frame_fuzz.py`` calls :func:`run` with a few tens of thousands.)

Set-up: one broker subprocess; a **Stable group** of two confluent-kafka consumers (separate
processes) on their own topic; a **probe** thread holding one healthy connection that sends
ApiVersions and Metadata round trips every 100 ms; ``--connections`` fuzz connections sending
cases from :class:`tests.fuzz.mutate.Mutator` one after the other (a connection waits for an
answer to each case; one the broker closes or that stays unanswered for ``stall_s`` — a parked
JoinGroup, an announced body that never comes — is dropped and reopened).

Watched every 100 ms, each breach being a *finding*:

* ``crash``: the broker process is gone;
* ``memory``: its RSS (``/proc/<pid>/status``) went over ``rss_max_mb`` (the broker is then
  killed: the guard that keeps a run from taking the machine down);
* ``hang``: a probe round trip took longer than ``probe_max_s``;
* ``bystander-closed``: the broker closed the probe's connection (only the offending
  connection may be closed);
* ``stable-disturbed``: the Stable group changed state or a member was revoked/assigned;
* ``traceback``: the broker logged a traceback or an error-level line (a malformed request
  must be answered with Kafka's error or close its connection with one warning line).

After the run each distinct finding is **triaged**: the cases sent shortly before it are
replayed against a fresh broker, halving the set until the one case that reproduces it is
found; that case is written to ``save_dir`` as a regression file (``<kind>-<api>-<hash>.frames``,
replayed by ``tests/fuzz/test_fuzz_regressions.py``).

Known defects (``tests/fuzz/known.py``) that are fixed on other branches but not here can be
skipped at generation time (``skip_known``), so a run still guards everything else.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rallypoint.probe import recv_exactly
from rallypoint.protocol import codec
from rallypoint.protocol.apis import SERVED_APIS

from tests.support.paths import ROOT

from .broker import FuzzBroker, Problem
from .frames import REGRESSIONS_DIR, Frame, load_corpus, split_frames, write_case
from .known import KNOWN_DEFECTS, KnownDefect, match_frame, match_problem
from .mutate import Case, Mutator

FUZZ_BROKER_CONFIG = {"log.retention.bytes": str(4 * 1024 * 1024)}
STABLE_GROUP = "fuzz-stable"
STABLE_TOPIC = "fuzz-stable"


@dataclass
class Settings:
    frames: int = 30_000
    seconds: float = 150.0
    connections: int = 16
    seed: int = 1
    rss_max_mb: int = 256
    probe_max_s: float = 2.0
    stable_group: bool = True
    stable_members: int = 2
    skip_known: bool = True
    include_known: frozenset[int] = frozenset()  # known defects sent anyway (to find their inputs)
    stall_s: float = 0.15
    triage: bool = True
    triage_budget_s: float = 900.0
    verify_known: int = 0  # replay the first N and the N largest skipped cases of each known defect
    save_dir: Path | None = None
    keep_going: bool = True  # restart the broker after a crash/memory finding and go on
    # Produced data is kept in memory up to log.retention.bytes per partition (256 MB by
    # default) and Fetch answers up to 55 MB: a long run would measure its own data, not the
    # broker's handling of bad input.  The load suite (bench/) covers data volume.
    broker_config: dict[str, str] = field(default_factory=lambda: dict(FUZZ_BROKER_CONFIG))
    progress_s: float = 0.0  # print a progress line every so many seconds (0: never)
    data_dir: Path | None = None


@dataclass
class Sent:
    no: int
    at: float
    wire: bytes
    ops: list[str]
    api: tuple[int, int]
    source: str


@dataclass
class Finding:
    kind: str
    at: float
    detail: str
    signature: str = ""
    known: KnownDefect | None = None
    candidates: list[Sent] = field(default_factory=list)
    culprit: list[Sent] | None = None
    saved: Path | None = None
    api: tuple[int, int] | None = None  # the API the broker's log named, if it did

    def summary(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "detail": self.detail[:2000],
            "signature": self.signature,
            "known": None if self.known is None else self.known.reason,
            "culprit": None
            if self.culprit is None
            else [{"case": s.no, "api": list(s.api), "ops": s.ops, "bytes": len(s.wire)} for s in self.culprit],
            "saved": None if self.saved is None else str(self.saved),
        }


@dataclass
class Report:
    seed: int = 0
    frames: int = 0
    bytes: int = 0
    seconds: float = 0.0
    skipped_known: Counter[str] = field(default_factory=Counter)
    closed_by_broker: int = 0
    stalled: int = 0
    rss_start_mb: float = 0.0
    cold_start_probe_max_ms: float = 0.0
    rss_max_mb: float = 0.0
    probe_round_trips: int = 0
    probe_p50_ms: float = 0.0
    probe_p99_ms: float = 0.0
    probe_max_ms: float = 0.0
    restarts: int = 0
    tracebacks: int = 0
    warnings: Counter[str] = field(default_factory=Counter)
    findings: list[Finding] = field(default_factory=list)
    known_confirmed: dict[str, list[int]] = field(default_factory=dict)  # defect -> [failing, replayed]
    known_saved: list[str] = field(default_factory=list)

    @property
    def frames_per_s(self) -> float:
        return self.frames / self.seconds if self.seconds else 0.0

    def unknown(self) -> list[Finding]:
        return [f for f in self.findings if f.known is None]

    def as_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "frames": self.frames,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 1),
            "frames_per_s": round(self.frames_per_s),
            "skipped_known": dict(self.skipped_known),
            "closed_by_broker": self.closed_by_broker,
            "stalled": self.stalled,
            "rss_start_mb": round(self.rss_start_mb, 1),
            "cold_start_probe_max_ms": round(self.cold_start_probe_max_ms),
            "rss_max_mb": round(self.rss_max_mb, 1),
            "probe": {
                "round_trips": self.probe_round_trips,
                "p50_ms": round(self.probe_p50_ms, 1),
                "p99_ms": round(self.probe_p99_ms, 1),
                "max_ms": round(self.probe_max_ms, 1),
            },
            "restarts": self.restarts,
            "tracebacks": self.tracebacks,
            "warnings": dict(self.warnings.most_common(12)),
            "findings": [f.summary() for f in self.findings],
            "known_confirmed": self.known_confirmed,
            "known_saved": self.known_saved,
        }


# ---------------------------------------------------------------------------- wire helpers


def request(api_key: int, version: int, corr: int, body: dict[str, Any], client_id: str = "fuzz-probe") -> bytes:
    return bytes(codec.encode_request(api_key, version, corr, body, client_id))


def recv_frame(sock: socket.socket) -> bytes:
    (size,) = struct.unpack(">i", recv_exactly(sock, 4))
    return recv_exactly(sock, size)


def call(address: tuple[str, int], api_key: int, version: int, body: dict[str, Any], timeout: float = 10.0) -> Any:
    with socket.create_connection(address, timeout=timeout) as s:
        s.sendall(request(api_key, version, 1, body))
        return codec.decode_response_frame(api_key, version, recv_frame(s))[1]


def _api_of(fields: dict[str, Any]) -> tuple[int, int] | None:
    """(key, version) named by a log event's ``api``/``api_version`` fields."""
    name, version = fields.get("api"), fields.get("api_version")
    for a in SERVED_APIS.values():
        if a.name == name and isinstance(version, int):
            return a.key, version
    return None


def _has_api(wire: bytes, api: tuple[int, int]) -> bool:
    """Does any frame of a case (or a frame a lying size prefix hides) start with this API and version?"""
    needle = struct.pack(">hh", *api)
    return needle in wire


def api_name(key: int) -> str:
    a = SERVED_APIS.get(key)
    return a.name if a is not None else f"api{key}"


# ---------------------------------------------------------------------------------- probe


class Probe(threading.Thread):
    """A healthy client: one connection, an ApiVersions or Metadata round trip every ``interval``."""

    def __init__(self, address: tuple[str, int], interval: float = 0.1) -> None:
        super().__init__(name="fuzz-probe", daemon=True)
        self.address = address
        self.interval = interval
        self.latencies: list[float] = []
        self.outstanding_since: float | None = None
        self.closed_by_broker = 0
        self.errors: list[str] = []
        self._halt = threading.Event()
        self.paused = threading.Event()

    def stop(self) -> None:
        self._halt.set()

    def run(self) -> None:
        corr = 0
        sock: socket.socket | None = None
        while not self._halt.is_set():
            if self.paused.is_set():
                if sock is not None:
                    sock.close()
                    sock = None
                time.sleep(0.05)
                continue
            try:
                if sock is None:
                    sock = socket.create_connection(self.address, timeout=5)
                    sock.settimeout(60)
                corr += 1
                body: dict[str, Any]
                if corr % 2:
                    key, ver, body = 18, 3, {"client_software_name": "fuzz-probe", "client_software_version": "1"}
                else:
                    key, ver = 3, 12
                    body = {"topics": [{"name": STABLE_TOPIC}], "allow_auto_topic_creation": False}
                t0 = time.monotonic()
                self.outstanding_since = t0
                sock.sendall(request(key, ver, corr, body))
                got, _msg = codec.decode_response_frame(key, ver, recv_frame(sock))
                self.outstanding_since = None
                self.latencies.append(time.monotonic() - t0)
                if got != corr:
                    self.errors.append(f"correlation id {got} != {corr}")
            except (ConnectionError, OSError) as e:
                self.outstanding_since = None
                if not self.paused.is_set() and not self._halt.is_set():
                    self.closed_by_broker += 1
                    self.errors.append(f"{type(e).__name__}: {e}")
                if sock is not None:
                    sock.close()
                sock = None
                time.sleep(0.2)
                continue
            time.sleep(self.interval)
        if sock is not None:
            sock.close()


# ---------------------------------------------------------------------------- stable group


class StableGroup:
    """Real consumers in one group on their own topic; any rebalance after settling is a finding."""

    def __init__(self, broker: FuzzBroker, members: int) -> None:
        self.broker = broker
        self.n = members
        self.procs: list[subprocess.Popen[str]] = []
        self.events: list[list[dict[str, Any]]] = []
        self.baseline_transitions = 0
        self.baseline_events: list[int] = []

    def start(self) -> None:
        call(
            self.broker.address,
            19,
            7,
            {"topics": [{"name": STABLE_TOPIC, "num_partitions": 4, "replication_factor": 1}], "timeout": 10_000},
        )
        env = dict(os.environ)
        for _ in range(self.n):
            cmd = [sys.executable, "-m", "tests.fuzz.stable_member", "--bootstrap", self.broker.bootstrap]
            cmd += ["--group", STABLE_GROUP, "--topic", STABLE_TOPIC]
            p = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                cwd=ROOT,
                env=env,
            )
            events: list[dict[str, Any]] = []
            threading.Thread(target=self._read, args=(p, events), daemon=True).start()
            self.procs.append(p)
            self.events.append(events)

    @staticmethod
    def _read(p: subprocess.Popen[str], events: list[dict[str, Any]]) -> None:
        assert p.stdout is not None
        for line in p.stdout:
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))

    def _assigned(self) -> bool:
        out = []
        for evs in self.events:
            last = [e for e in evs if e.get("event") in ("assign", "revoke")]
            out.append(bool(last) and last[-1]["event"] == "assign")
        return all(out)

    def wait_stable(self, timeout: float = 90.0, settle: float = 2.0) -> None:
        """Until every member holds an assignment, the group is Stable, and nothing moved for ``settle`` s."""
        deadline = time.monotonic() + timeout
        last_change, seen = time.monotonic(), None
        while time.monotonic() < deadline:
            trans = self.broker.log.transitions
            state = (len(trans), tuple(len(e) for e in self.events))
            if state != seen:
                seen, last_change = state, time.monotonic()
            stable = bool(trans) and trans[-1].get("to") == "Stable"
            if stable and self._assigned() and time.monotonic() - last_change >= settle:
                self.baseline_transitions = len(trans)
                self.baseline_events = [len(e) for e in self.events]
                return
            time.sleep(0.1)
        raise RuntimeError(
            f"the Stable group did not settle in {timeout} s: transitions "
            f"{[t.get('to') for t in self.broker.log.transitions]}, members {self.events}"
        )

    def disturbed(self) -> str | None:
        trans = self.broker.log.transitions[self.baseline_transitions :]
        if trans:
            t = trans[0]
            return f"group {STABLE_GROUP} went {t.get('from')} -> {t.get('to')}: {t.get('reason')}"
        for i, evs in enumerate(self.events):
            new = [e for e in evs[self.baseline_events[i] :] if e.get("event") in ("assign", "revoke", "closed")]
            if new:
                return f"member {i}: {new[0]}"
            if self.procs[i].poll() is not None:
                return f"member {i} exited with {self.procs[i].returncode}"
        return None

    def stop(self) -> None:
        for p in self.procs:
            with contextlib.suppress(OSError):
                if p.stdin is not None:
                    p.stdin.close()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


# ------------------------------------------------------------------------------- the run


class FrameFuzzer:
    def __init__(self, settings: Settings, corpus_dir: Path | None = None) -> None:
        self.s = settings
        corpus = load_corpus() if corpus_dir is None else load_corpus(corpus_dir)
        self.mutator = Mutator(corpus, settings.seed)
        self.report = Report(seed=settings.seed)
        self.recent: deque[Sent] = deque(maxlen=20_000)
        self.stopping = False
        self._tmp = tempfile.TemporaryDirectory(prefix="rp-fuzz-")
        base = settings.data_dir or Path(self._tmp.name)
        self.base = base
        self.broker = FuzzBroker(base / "broker", settings.broker_config, watch_groups={STABLE_GROUP})
        self.probe: Probe | None = None
        self.stable: StableGroup | None = None
        self._problems_seen = 0
        self._probe_closed_seen = 0
        self._latencies_seen = 0
        self._hang_reported_for: float | None = None
        self._warm_up_window = (0.0, 0.0)
        self.known_samples: dict[int, tuple[list[Sent], list[Sent]]] = {}
        self._broker_down = False
        self._t0 = 0.0

    # -------------------------------------------------------------- cases

    def next_case(self) -> tuple[Sent, list[bytes]] | None:
        while not self._over():
            case: Case = self.mutator.case()
            hit = self._skipped(case.wire)
            if hit is not None:
                self.report.skipped_known[hit.label] += 1
                if self.s.verify_known:
                    self._keep_sample(hit.number, case)
                continue
            self.report.frames += 1
            self.report.bytes += len(case.wire)
            sent = Sent(self.mutator.cases, time.monotonic(), case.wire, case.ops, case.api, case.source)
            self.recent.append(sent)
            return sent, case.chunks
        return None

    def _over(self) -> bool:
        if self.report.frames >= self.s.frames or time.monotonic() - self._t0 > self.s.seconds:
            self.stopping = True
        return self.stopping

    async def worker(self, wid: int) -> None:
        while not self._over():
            if self._broker_down:
                await asyncio.sleep(0.1)
                continue
            try:
                r, w = await asyncio.wait_for(asyncio.open_connection(*self.broker.address), 5)
            except (OSError, TimeoutError):
                await asyncio.sleep(0.1)
                continue
            progress = asyncio.Event()
            eof = asyncio.Event()

            async def read(
                r: asyncio.StreamReader = r, progress: asyncio.Event = progress, eof: asyncio.Event = eof
            ) -> None:
                try:
                    while True:
                        (size,) = struct.unpack(">i", await r.readexactly(4))
                        await r.readexactly(size)
                        progress.set()
                except (asyncio.IncompleteReadError, ConnectionError, struct.error, ValueError):
                    pass
                finally:
                    eof.set()
                    progress.set()

            reader = asyncio.create_task(read())
            try:
                while not self.stopping and not self._broker_down:
                    nxt = self.next_case()
                    if nxt is None:
                        return
                    _sent, chunks = nxt
                    progress.clear()
                    try:
                        for i, chunk in enumerate(chunks):
                            if i:
                                await asyncio.sleep(0.002)
                            w.write(chunk)
                            await asyncio.wait_for(w.drain(), self.s.stall_s * 4)
                        await asyncio.wait_for(progress.wait(), self.s.stall_s)
                    except (TimeoutError, ConnectionError, OSError):
                        self.report.stalled += 1
                        break
                    if eof.is_set():
                        self.report.closed_by_broker += 1
                        break
            finally:
                reader.cancel()
                w.close()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(w.wait_closed(), 1)

    # ----------------------------------------------------------- watching

    def _finding(
        self,
        kind: str,
        detail: str,
        signature: str = "",
        known: KnownDefect | None = None,
        window: tuple[float, float] | None = None,
        api: tuple[int, int] | None = None,
    ) -> Finding:
        """Record a finding; its candidates are the cases sent in ``window`` (monotonic times;
        default: the last 8 s), only those holding a frame of ``api`` when given."""
        now = time.monotonic()
        f = Finding(kind, now, detail, signature or kind, known, api=api)
        lo, hi = window or (now - 8.0, now)
        f.candidates = [s for s in self.recent if lo <= s.at <= hi and (api is None or _has_api(s.wire, api))]
        self.report.findings.append(f)
        if self.s.progress_s:
            print(f"finding: {kind}: {signature or detail[:200]}", flush=True)
        return f

    def check(self) -> bool:
        """One look at the broker; False when it is down (crash or killed by the memory guard)."""
        b = self.broker
        if not b.alive():
            self._finding("crash", f"broker exited with {b.returncode()}:\n" + "\n".join(list(b.log.tail)[-30:]))
            return False
        rss = b.rss_kb() / 1024
        self.report.rss_max_mb = max(self.report.rss_max_mb, rss)
        if rss > self.s.rss_max_mb:
            if self.probe is not None:
                self.probe.paused.set()  # its connection is lost with the broker: not a bystander finding
            b.kill()
            self._finding("memory", f"RSS {rss:.0f} MB > {self.s.rss_max_mb} MB; broker killed")
            return False
        if self.probe is not None:
            since = self.probe.outstanding_since
            if since is not None and time.monotonic() - since > self.s.probe_max_s:
                if self._hang_reported_for != since:
                    self._hang_reported_for = since
                    self._finding(
                        "hang",
                        f"a probe round trip has taken over {self.s.probe_max_s} s",
                        window=(since - 3.0, since + 0.2),
                    )
            if self.probe.closed_by_broker > self._probe_closed_seen:
                self._probe_closed_seen = self.probe.closed_by_broker
                self._finding("bystander-closed", f"probe connection lost: {self.probe.errors[-1:]}")
        problems = b.log.problems
        while self._problems_seen < len(problems):
            p = problems[self._problems_seen]
            self._problems_seen += 1
            known = match_problem(p.text)
            if known is not None and self.s.skip_known:
                self.report.skipped_known[f"{known.label} (logged)"] += 1
                continue
            if not any(f.signature == p.signature for f in self.report.findings):
                api = _api_of(p.fields)
                lo, hi = self._warm_up_window
                window = (lo, hi) if lo <= p.at <= hi + 1.0 else (p.at - 3.0, p.at)
                self._finding("traceback", p.text, p.signature, known, window=window, api=api)
        if self.stable is not None:
            why = self.stable.disturbed()
            if why is not None:
                self._finding("stable-disturbed", why)
                self.stable.baseline_transitions = len(b.log.transitions)
                self.stable.baseline_events = [len(e) for e in self.stable.events]
        return True

    async def monitor(self) -> None:
        last_progress = time.monotonic()
        while not self.stopping:
            await asyncio.sleep(0.1)
            if self._broker_down:
                continue
            ok = self.check()
            if not ok:
                self._broker_down = True
                self.report.tracebacks += self.broker.log.problem_count
                self.report.warnings.update(self.broker.log.warnings)
                if not self.s.keep_going:
                    self.stopping = True
                    return
                # In this thread: a broker dies with the thread that started it (_die_with_parent).
                self._restart()
                self._broker_down = False
            if self.s.progress_s and time.monotonic() - last_progress >= self.s.progress_s:
                last_progress = time.monotonic()
                el = last_progress - self._t0
                print(
                    f"{self.report.frames} frames, {el:.0f} s, {self.report.frames / el:.0f}/s, "
                    f"RSS {self.broker.rss_kb() / 1024:.0f} MB (max {self.report.rss_max_mb:.0f}), "
                    f"closed {self.report.closed_by_broker}, stalled {self.report.stalled}, "
                    f"findings {len(self.report.findings)}, skipped {sum(self.report.skipped_known.values())}",
                    flush=True,
                )

    def warm_up(self) -> float:
        """:func:`warm_up` with this run's filter; its frames are triage candidates like any case."""
        wires = [w for w in warm_up_frames(self.mutator.corpus) if not self._skipped(w)]
        start = time.monotonic()
        self.recent.extend(Sent(0, start, w, ["warm-up"], _api_of_wire(w), "warm-up") for w in wires)
        worst = warm_up(self.broker, wires)
        self._warm_up_window = (start, time.monotonic() + 0.5)
        return worst

    def _keep_sample(self, number: int, case: Case) -> None:
        """Keep the first ``verify_known`` skipped cases of a defect and the ``verify_known``
        largest (the largest are the most severe of the size-driven classes)."""
        first, largest = self.known_samples.setdefault(number, ([], []))
        sent = Sent(self.mutator.cases, time.monotonic(), case.wire, case.ops, case.api, case.source)
        if len(first) < self.s.verify_known:
            first.append(sent)
        elif len(largest) < self.s.verify_known:
            largest.append(sent)
        else:
            smallest = min(range(len(largest)), key=lambda i: len(largest[i].wire))
            if len(sent.wire) > len(largest[smallest].wire):
                largest[smallest] = sent

    def _skipped(self, wire: bytes) -> KnownDefect | None:
        """The known defect a case triggers, if this run skips that defect."""
        if not self.s.skip_known:
            return None
        hit = match_frame(wire)
        return hit if hit is not None and hit.number not in self.s.include_known else None

    def _restart(self) -> None:
        """After a crash or the memory guard: a new broker (warmed up), a new Stable group."""
        if self.probe is not None:
            self.probe.paused.set()
        if self.stable is not None:
            self.stable.stop()
            self.stable = None
        self.broker.kill()
        self.broker.start()
        self._problems_seen = 0
        self.warm_up()
        self.report.restarts += 1
        self._start_stable()
        if self.probe is not None:
            self._probe_closed_seen = self.probe.closed_by_broker
            self.probe.paused.clear()

    def _start_stable(self) -> None:
        if self.s.stable_group:
            self.stable = StableGroup(self.broker, self.s.stable_members)
            self.stable.start()
            self.stable.wait_stable()

    async def _run_async(self) -> None:
        self._t0 = time.monotonic()
        tasks = [asyncio.create_task(self.worker(i)) for i in range(self.s.connections)]
        mon = asyncio.create_task(self.monitor())
        await asyncio.gather(*tasks)
        self.stopping = True
        await mon

    def run(self) -> Report:
        try:
            self.broker.start()
            self.report.rss_start_mb = self.broker.rss_kb() / 1024
            self.report.cold_start_probe_max_ms = self.warm_up()
            self._start_stable()
            self.probe = Probe(self.broker.address)
            self.probe.start()
            asyncio.run(self._run_async())
            self.report.seconds = time.monotonic() - self._t0
            time.sleep(0.5)  # late log lines and transitions
            if self.broker.alive():
                self.check()
            self.probe.stop()
            self.probe.join(5)
            lat = sorted(self.probe.latencies)
            if lat:
                self.report.probe_round_trips = len(lat)
                self.report.probe_p50_ms = 1000 * lat[len(lat) // 2]
                self.report.probe_p99_ms = 1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))]
                self.report.probe_max_ms = 1000 * lat[-1]
            if self.stable is not None:
                self.stable.stop()
                self.stable = None
            self.report.tracebacks += self.broker.log.problem_count
            self.report.warnings.update(self.broker.log.warnings)
            self.broker.kill()
            if self.s.triage:
                self.triage_all()
            if self.s.verify_known:
                self.verify_known_samples()
            return self.report
        finally:
            if self.probe is not None:
                self.probe.stop()
            if self.stable is not None:
                self.stable.stop()
            self.broker.kill()
            self._tmp.cleanup()

    # ------------------------------------------------------------------ triage

    def verify_known_samples(self) -> None:
        """Replay the first cases the known-defect filters skipped, each against a fresh broker:
        the report says which classes still fail here (``known_confirmed``), and with a
        ``save_dir`` the failing cases are written as regression cases.  A Produce case (defect 4:
        a batch ListOffsets later walks) is followed by the corpus' ListOffsets frames."""
        list_offsets = [f.wire() for f in self.mutator.corpus if f.api_key == 2]
        saved: set[bytes] = set()
        n = 0
        for number, (first, largest) in sorted(self.known_samples.items()):
            for sent in first + largest:
                n += 1
                wires = [sent.wire] + (list_offsets if sent.api[0] == 0 else [])
                with FuzzBroker(self.base / f"verify{n}", self.s.broker_config).start() as b:
                    r = replay(b, wires, self.s.rss_max_mb, self.s.probe_max_s)
                failures = r.failures()
                key = next(d.label for d in KNOWN_DEFECTS if d.number == number)
                self.report.known_confirmed.setdefault(key, [0, 0])
                self.report.known_confirmed[key][1] += 1
                if not failures:
                    continue
                self.report.known_confirmed[key][0] += 1
                kinds = r.kinds()
                kind = next((k for k in ("crash", "memory", "hang", "bystander-closed") if k in kinds), "traceback")
                signature = r.problems[0].signature if r.problems else kind
                f = Finding(
                    kind, sent.at, "; ".join(failures), signature, next(d for d in KNOWN_DEFECTS if d.number == number)
                )
                f.api = _api_of(r.problems[0].fields) if r.problems else None
                culprit = (
                    [sent]
                    if len(wires) == 1
                    else [sent, *(Sent(0, sent.at, w, ["corpus"], _api_of_wire(w), "corpus") for w in list_offsets)]
                )
                wire = b"".join(c.wire for c in culprit)
                if self.s.save_dir is not None and wire not in saved:
                    saved.add(wire)
                    f.saved = save_regression(self.s.save_dir, f, culprit)
                    f.culprit = culprit
                    self.report.known_saved.append(str(f.saved))

    def triage_all(self) -> None:
        """Triage, within ``triage_budget_s``, the first finding of each traceback signature and
        the first three of each other kind (a hang or a memory finding can have many causes)."""
        done: Counter[str] = Counter()
        saved: set[bytes] = set()
        deadline = time.monotonic() + self.s.triage_budget_s
        for f in self.report.findings:
            key = f"{f.kind}|{f.signature}"
            if done[key] >= (1 if f.kind == "traceback" else 3) or not f.candidates or time.monotonic() > deadline:
                continue
            done[key] += 1
            culprit = Triage(self.s, self.base / f"triage{sum(done.values())}", f).find()
            f.culprit = culprit
            wire = b"".join(c.wire for c in culprit or [])
            if culprit and self.s.save_dir is not None and wire not in saved:
                saved.add(wire)
                f.saved = save_regression(self.s.save_dir, f, culprit)


class Triage:
    """Replays a finding's candidate cases against a broker to find the ones that reproduce it.

    A traceback is looked for on one broker kept across tests (it is restarted only if it
    died); the other kinds get a fresh broker per test, since what they leave behind (a huge
    topic, a wedged group) would make every later test positive.
    """

    def __init__(self, settings: Settings, data_dir: Path, finding: Finding) -> None:
        self.s = settings
        self.data_dir = data_dir
        self.finding = finding
        self.broker: FuzzBroker | None = None
        self.tests = 0

    def _broker(self) -> FuzzBroker:
        reuse = self.finding.kind == "traceback"
        if self.broker is not None and reuse and self.broker.alive():
            return self.broker
        if self.broker is not None:
            self.broker.kill()
        self.broker = FuzzBroker(self.data_dir / f"b{self.tests}", self.s.broker_config).start()
        return self.broker

    def reproduces(self, cases: list[Sent]) -> bool:
        self.tests += 1
        b = self._broker()
        r = replay(b, [c.wire for c in cases], self.s.rss_max_mb, self.s.probe_max_s)
        return self.finding.kind in r.kinds(self.finding.signature)

    def find(self, limit_tests: int = 30) -> list[Sent] | None:
        cases = self.finding.candidates
        try:
            # Suspects first: a case of a known defect class, or a big one, often is the culprit.
            suspects = [c for c in cases if match_frame(c.wire) is not None or len(c.wire) > 100_000]
            for c in suspects[::-1][:6]:
                if self.reproduces([c]):
                    return self._smallest([c], limit_tests)
            if not cases or not self.reproduces(cases):
                return None
            # Bisect: keep the half that still reproduces (the most recent half first).
            while len(cases) > 1 and self.tests < limit_tests:
                half = len(cases) // 2
                later, earlier = cases[half:], cases[:half]
                if self.reproduces(later):
                    cases = later
                elif self.reproduces(earlier):
                    cases = earlier
                else:
                    break  # it takes cases from both halves: keep the set
            # Then drop cases from the front while it still reproduces (a two-frame culprit).
            while len(cases) > 1 and self.tests < limit_tests and self.reproduces(cases[1:]):
                cases = cases[1:]
            return self._smallest(cases, limit_tests)
        finally:
            if self.broker is not None:
                self.broker.kill()

    def _smallest(self, cases: list[Sent], limit_tests: int) -> list[Sent]:
        """One case of several frames (joined, or a lying size): is one frame of it enough?"""
        if len(cases) != 1:
            return cases
        c = cases[0]
        frames = list(split_frames(c.wire))
        if len(frames) > 1 and sum(4 + len(f) for f in frames) == len(c.wire):
            for body in frames:
                one = Sent(c.no, c.at, struct.pack(">i", len(body)) + body, c.ops, c.api, c.source)
                if self.tests < limit_tests + 5 and self.reproduces([one]):
                    return [one]
        return cases


@dataclass
class Replay:
    """What happened while some cases were replayed (see :func:`replay`)."""

    crashed: bool = False
    memory_mb: float = 0.0  # highest RSS seen
    killed_for_memory: bool = False
    probe_max_ms: float = 0.0
    hung: bool = False
    bystander_closed: bool = False
    problems: list[Problem] = field(default_factory=list)
    answered: int = 0
    closed: int = 0

    def kinds(self, signature: str = "") -> set[str]:
        """The finding kinds this replay shows (``traceback`` only with ``signature``, if given)."""
        out = set()
        if self.crashed:
            out.add("crash")
        if self.killed_for_memory:
            out.add("memory")
        if self.hung:
            out.add("hang")
            out.add("stable-disturbed")  # a stall long enough to disturb a group shows as a hang here
        if self.bystander_closed:
            out.add("bystander-closed")
        if any(not signature or p.signature == signature for p in self.problems):
            out.add("traceback")
        return out

    def failures(self) -> list[str]:
        out = []
        if self.crashed:
            out.append("the broker process died")
        if self.killed_for_memory:
            out.append(f"RSS went over the bound ({self.memory_mb:.0f} MB; killed)")
        if self.hung:
            out.append(f"a healthy connection waited {self.probe_max_ms:.0f} ms for an answer")
        if self.bystander_closed:
            out.append("the healthy connection was closed")
        out += [f"logged: {p.signature}" for p in self.problems]
        return out


def replay(
    broker: FuzzBroker,
    wires: Iterable[bytes],
    rss_max_mb: int,
    probe_max_s: float,
    answer_wait_s: float = 0.3,
    settle_s: float = 0.5,
) -> Replay:
    """Send each wire blob on its own connection (waiting up to ``answer_wait_s`` for each of its
    answers, or its close), while a probe connection makes round trips and a guard watches RSS
    (killing the broker over ``rss_max_mb``) — then look at what happened."""
    out = Replay()
    problems_before = len(broker.log.problems)
    probe = Probe(broker.address, interval=0.05)
    probe.start()
    stop = threading.Event()

    def guard() -> None:
        while not stop.is_set():
            rss = broker.rss_kb() / 1024
            out.memory_mb = max(out.memory_mb, rss)
            if rss > rss_max_mb:
                probe.paused.set()
                broker.kill()
                out.killed_for_memory = True
                return
            since = probe.outstanding_since
            if since is not None and time.monotonic() - since > probe_max_s:
                out.hung = True
            time.sleep(0.02)

    g = threading.Thread(target=guard, daemon=True)
    g.start()
    try:
        for wire in wires:
            if not broker.alive():
                break
            expected = max(1, len(list(split_frames(wire))))
            try:
                with socket.create_connection(broker.address, timeout=5) as s:
                    s.sendall(wire)
                    s.settimeout(answer_wait_s)
                    for _ in range(expected):
                        recv_frame(s)
                        out.answered += 1
            except ConnectionError:
                out.closed += 1
            except OSError:
                pass
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline and not out.killed_for_memory:
            time.sleep(0.05)
        # the stall of a hang may still be going on: wait for the probe's answer (bounded)
        deadline = time.monotonic() + max(probe_max_s * 3, 5.0)
        while probe.outstanding_since is not None and time.monotonic() < deadline and broker.alive():
            time.sleep(0.05)
    finally:
        stop.set()
        g.join(2)
        probe.stop()
        probe.join(5)
    out.crashed = not broker.alive() and not out.killed_for_memory
    out.bystander_closed = probe.closed_by_broker > 0 and broker.alive()
    out.probe_max_ms = 1000 * max(probe.latencies, default=0.0)
    if out.probe_max_ms > probe_max_s * 1000:
        out.hung = True
    time.sleep(0.1)  # the log pump may be a line behind
    out.problems = list(broker.log.problems[problems_before:])
    return out


def warm_up_frames(corpus: list[Frame]) -> list[bytes]:
    """Every corpus frame at every version its API serves (the body read as that version)."""
    wires = []
    for f in corpus:
        a = SERVED_APIS.get(f.api_key)
        if a is None:
            continue
        for v in range(a.min_version, a.max_version + 1):
            body = f.body[:2] + struct.pack(">h", v) + f.body[4:]
            wires.append(struct.pack(">i", len(body)) + body)
    return wires


def _api_of_wire(wire: bytes) -> tuple[int, int]:
    if len(wire) < 8:
        return (-1, -1)
    key, version = struct.unpack_from(">hh", wire, 4)
    return int(key), int(version)


def warm_up(broker: FuzzBroker, wires: list[bytes], connections: int = 8) -> float:
    """Send ``wires`` (:func:`warm_up_frames`) before the run is watched.

    The broker loads a message schema the first time a version of an API is used, on its event
    loop; the first minutes of a run would otherwise show those loads as stalls of healthy
    connections (a cold-start cost, measured here: returns the worst probe round trip, ms).
    """
    probe = Probe(broker.address, interval=0.02)
    probe.start()

    def send(part: list[bytes]) -> None:
        for w in part:
            try:
                with socket.create_connection(broker.address, timeout=5) as sock:
                    sock.sendall(w)
                    sock.settimeout(0.3)
                    sock.recv(64)
            except OSError:
                pass

    threads = [threading.Thread(target=send, args=(wires[i::connections],)) for i in range(connections)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    time.sleep(0.2)
    probe.stop()
    probe.join(5)
    return 1000 * max(probe.latencies, default=0.0)


def save_regression(directory: Path, finding: Finding, cases: list[Sent]) -> Path:
    """Write a triaged culprit: ``<kind>-<api>-v<version>-<hash>.frames`` for one case (one
    connection), or a directory of that name holding ``<n>.frames`` per connection, in order."""
    wire = b"".join(c.wire for c in cases)
    api = finding.api or _api_of_wire(cases[-1].wire)
    key, version = api
    digest = hashlib.sha1(wire).hexdigest()[:10]
    path = directory / f"{finding.kind}-{api_name(key)}-v{version}-{digest}.frames"
    directory.mkdir(parents=True, exist_ok=True)
    if len(cases) == 1:
        path = write_case(path, wire)
    else:
        path.mkdir(exist_ok=True)
        for i, c in enumerate(cases):
            write_case(path / f"{i:03d}.frames", c.wire)
    known = finding.known or next((k for c in cases if (k := match_frame(c.wire)) is not None), None)
    index = directory / "index.json"
    entries = json.loads(index.read_text()) if index.exists() else {}
    entries[path.name] = {
        "kind": finding.kind,
        "signature": finding.signature,
        "detail": finding.detail.splitlines()[-1][:300] if finding.detail else "",
        "known": None if known is None else known.reason,
        "cases": [{"case": c.no, "ops": c.ops, "api": list(c.api), "source": c.source} for c in cases],
        "connections": len(cases),
    }
    index.write_text(json.dumps(entries, indent=1, sort_keys=True) + "\n")
    return path


def run(settings: Settings) -> Report:
    return FrameFuzzer(settings).run()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frames", type=int, default=int(os.environ.get("FUZZ_FRAMES", 1_000_000)))
    p.add_argument("--seconds", type=float, default=float(os.environ.get("FUZZ_SECONDS", 6 * 3600)))
    p.add_argument("--seed", type=int, default=int(os.environ.get("FUZZ_SEED", int(time.time()) % 100_000)))
    p.add_argument("--connections", type=int, default=int(os.environ.get("FUZZ_CONNECTIONS", 16)))
    p.add_argument("--rss-max-mb", type=int, default=int(os.environ.get("FUZZ_RSS_MAX_MB", 256)))
    p.add_argument("--probe-max-s", type=float, default=float(os.environ.get("FUZZ_PROBE_MAX_S", 2.0)))
    p.add_argument(
        "--include-known",
        default="",
        metavar="N,N|all",
        help="send cases of these known defects of known.py anyway (default: skip them all)",
    )
    p.add_argument(
        "--verify-known",
        type=int,
        default=0,
        metavar="N",
        help="replay the first N and the N largest skipped cases of each known defect against fresh brokers "
        "(and save the failing ones)",
    )
    p.add_argument("--no-stable-group", action="store_true")
    p.add_argument("--no-triage", action="store_true")
    p.add_argument("--save-dir", type=Path, default=None, help=f"write triaged cases here (e.g. {REGRESSIONS_DIR})")
    p.add_argument("--report", type=Path, default=None, help="write the JSON report here")
    p.add_argument("--stop-on-crash", action="store_true")
    a = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the clean-ups (brokers, consumers)
    s = Settings(
        frames=a.frames,
        seconds=a.seconds,
        seed=a.seed,
        connections=a.connections,
        rss_max_mb=a.rss_max_mb,
        probe_max_s=a.probe_max_s,
        skip_known=a.include_known != "all",
        include_known=frozenset(int(n) for n in a.include_known.split(",") if n.strip().isdigit()),
        stable_group=not a.no_stable_group,
        triage=not a.no_triage,
        verify_known=a.verify_known,
        save_dir=a.save_dir,
        keep_going=not a.stop_on_crash,
        progress_s=10.0,
    )
    print(f"fuzzing: seed {s.seed}, {s.frames} frames, {s.connections} connections", flush=True)
    report = run(s)
    out = json.dumps(report.as_dict(), indent=1)
    print(out)
    if a.report is not None:
        a.report.write_text(out + "\n")
    return 1 if report.unknown() else 0


__all__ = ["KNOWN_DEFECTS", "Finding", "Report", "Settings", "main", "replay", "run"]

if __name__ == "__main__":
    sys.exit(main())
