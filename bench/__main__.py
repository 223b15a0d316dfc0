"""Run every benchmark and write docs/BENCHMARKS.md (no figure is typed by hand).

    python -m bench [--quick] [--only NAME ...] [--out docs/BENCHMARKS.md]

Each section is a module in bench/ with ``run(quick: bool) -> list[dict]``; a row is either a
rallypoint-only figure ``{"name", "unit", "stats": {median,min,max,n,stdev}}`` or a side-by-side
comparison ``{"name", "unit", "brokers": {broker: stats}, "ratio", "higher_is_better"}``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from bench.common import fmt
from tests.support import ROOT

# Each section's latest rows, so the document can be re-rendered after re-running one section.
RESULTS = ROOT / "bench" / "results"

# (section title, module) in the order they appear in the document.
SECTIONS: list[tuple[str, str]] = [
    ("Side by side with librdkafka's mock cluster", "bench.compare"),
    ("Hot paths side by side (requests/s by concurrency)", "bench.hot_paths"),
    ("Start-up", "bench.startup"),
    ("Rebalance time", "bench.rebalance"),
    ("Consumer groups (KIP-848)", "bench.consumer_groups"),
    ("Share groups (KIP-932)", "bench.share_groups"),
    ("Several brokers: coordinator moves", "bench.cluster"),
    ("Transactions", "bench.transactions"),
    ("Memory per member", "bench.memory"),
    ("Offsets log", "bench.offsets_log"),
    ("Data plane", "bench.produce_consume"),
    ("TLS and SASL", "bench.security"),
    ("Fetch wake-up", "bench.fetch_wakeup"),
    ("Pipeline", "bench.pipeline"),
    ("Load", "bench.load"),
    ("Control plane", "bench.control_plane"),
]


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for mod in ("kio", "confluent_kafka", "structlog", "pyspark"):
        try:
            m = importlib.import_module(mod)
            v = getattr(m, "__version__", None) or getattr(m, "version", lambda: "?")
            out[mod] = v() if callable(v) else str(v)
        except Exception:
            continue
    try:
        import confluent_kafka

        out["librdkafka"] = confluent_kafka.libversion()[0]
    except Exception:
        pass
    return out


def _machine() -> str:
    cpu = "unknown cpu"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 1024 / 1024:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        pass
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} cores ({cpu}){mem}"


def _stats_cell(st: dict[str, float], unit: str) -> str:
    return f"{fmt(st['median'], unit)} ({fmt(st['min'])}–{fmt(st['max'])}, n={int(st['n'])})"


PROFILE_NOTES = """## Profiling the hot path

Tool: py-spy (sampling, `py-spy record -f raw`) attached to the broker process while the
heartbeat and offset-commit loads of the side-by-side section ran. What it showed, and what
changed (before/after figures are the side-by-side rows of this document's history):

1. **One socket write per answer** was the largest single cost of a heartbeat (`StreamWriter.write`
   held about a third of the samples): clients pipeline requests, and every answer went out in its
   own `send`. Now answers to requests that are already in the connection's read buffer are
   coalesced into one write before the broker waits for more input (`coordinator/server.py`;
   order and bytes unchanged, tested in `tests/test_pipelining.py`).
2. **The group → `__consumer_offsets` partition hash** (Java's `String.hashCode` over UTF-16, in
   Python) was recomputed on every group request: now cached (`protocol/offsets_schema.py`).
3. **Commits did not share fsyncs**: the group runtime held a per-partition lock around each
   append, so the log's group commit never saw two batches at once. The log already keeps call
   order, so the lock went (`coordinator/groups/runtime.py`). With `rallypoint.offsets.flush`
   `interval`/`never` each batch still hopped to an I/O thread and back; it is now written from the
   event loop, and only fsyncs go to threads (`coordinator/storage/offsets_log.py`).
4. The broker runs on **uvloop** when it is installed (a dependency on Linux).
5. **Metadata answers are cached encoded** while the topic store is unchanged
   (`coordinator/handlers/metadata.py`): Metadata 1×1 / 4×8 / 16×16 went from 9.0k / 15.1k /
   11.5k to 11.5k / 33.1k / 39.0k requests/s (0.36 / 0.12 / 0.08× the mock → 0.48 / 0.19 / 0.21×).

6. **Start-up is measured byte-compiled** (`bench/startup.py`), as an install leaves the code
   (pip writes `.pyc` files; the image's wheels too): from a checkout run with
   `PYTHONDONTWRITEBYTECODE=1` every start compiled every module first. Same machine, same
   hour: 612 ms without, 399 ms with the `.pyc` files (first answer, 7 runs each).

What remains: the rest of a request's cost is spread thin over decoding (the safe reader that
bounds array lengths), the sans-IO machine, building the response dataclass and kio's pure-Python
writer; no single function holds more than a few per cent.
"""


def render(results: list[tuple[str, str, list[dict[str, Any]] | str]], started: float, quick: bool) -> str:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    lines = [
        "# Benchmarks",
        "",
        "Generated by `python -m bench`"
        + (" --quick" if quick else "")
        + " — do not edit by hand; re-run it. Figures are medians of repeated runs with "
        "(min–max, n = runs).",
        "",
        f"- date: {datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- commit: {commit.stdout.strip() or 'unknown'}",
        f"- machine: {_machine()}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in _versions().items()),
        f"- this run took {time.time() - started:.0f} s (sections not re-run keep their last saved figures)",
        "",
    ]
    for title, module, rows in results:
        lines += [f"## {title}", "", f"Module: `{module}`.", ""]
        if isinstance(rows, str):
            lines += ["Not measured in this run:", "", "```", rows.strip()[-2000:], "```", ""]
            continue
        cmp_rows = [r for r in rows if "brokers" in r]
        own_rows = [r for r in rows if "brokers" not in r]
        if cmp_rows:
            names = sorted({b for r in cmp_rows for b in r["brokers"]}, key=lambda b: b != "rallypoint")
            lines.append("| measurement | " + " | ".join(names) + " | rallypoint vs peer |")
            lines.append("|---|" + "---|" * len(names) + "---|")
            for r in cmp_rows:
                cells = [_stats_cell(r["brokers"][b], r["unit"]) if b in r["brokers"] else "–" for b in names]
                verdict = f"{r['ratio']:.2f}× " + (
                    "(higher is better)" if r["higher_is_better"] else "(lower is better)"
                )
                lines.append(f"| {r['name']} | " + " | ".join(cells) + f" | {verdict} |")
            lines.append("")
        if own_rows:
            lines += ["| measurement | value |", "|---|---|"]
            for r in own_rows:
                lines.append(f"| {r['name']} | {_stats_cell(r['stats'], r['unit'])} |")
            lines.append("")
        notes = [r["note"] for r in rows if r.get("note")]
        lines += [f"- {n}" for n in notes]
        if notes:
            lines.append("")
    lines.append(PROFILE_NOTES)
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench")
    p.add_argument("--quick", action="store_true", help="fewer, shorter runs")
    p.add_argument("--only", nargs="*", help="module names, e.g. compare startup")
    p.add_argument("--out", default=str(ROOT / "docs" / "BENCHMARKS.md"))
    args = p.parse_args()
    started = time.time()
    RESULTS.mkdir(parents=True, exist_ok=True)
    results: list[tuple[str, str, list[dict[str, Any]] | str]] = []
    for title, module in SECTIONS:
        if args.only and module.split(".")[-1] not in args.only:
            continue
        print(f"== {title} ({module})", flush=True)
        try:
            mod = importlib.import_module(module)
            rows = mod.run(args.quick)
            (RESULTS / f"{module}.json").write_text(json.dumps(rows, indent=1, default=str))
        except Exception:
            tb = traceback.format_exc()
            print(tb, file=sys.stderr)
            (RESULTS / f"{module}.json").write_text(json.dumps(tb))
    # The document shows every section's latest saved run, so `--only X` refreshes one section.
    for title, module in SECTIONS:
        saved = RESULTS / f"{module}.json"
        results.append((title, module, json.loads(saved.read_text()) if saved.exists() else "not run yet"))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(results, started, args.quick))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
