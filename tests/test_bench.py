"""Benchmarks must keep running (each bench script once, with the smallest workload), and
they lean on the test support package only."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.unit


@pytest.mark.wire
def test_startup_bench_runs() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.startup", "--runs", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    figures = json.loads(proc.stdout)
    assert figures["runs"] == 2
    first, listening = figures["first_answer_ms"], figures["listening_line_ms"]
    assert 0 < listening["min"] <= first["min"] <= first["median"] <= first["p90"] <= first["max"]
    assert figures["sigterm_to_exit_ms"]["max"] > 0


def _imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _is_test_module(name: str) -> bool:
    in_tests = name == "tests" or name.startswith("tests.")
    return in_tests and not (name == "tests.support" or name.startswith("tests.support."))


def test_bench_imports_only_the_test_support_package_from_tests() -> None:
    bad = {
        str(p.relative_to(ROOT)): sorted(m for m in _imported_modules(p) if _is_test_module(m))
        for p in sorted((ROOT / "bench").rglob("*.py"))
    }
    assert not {p: ms for p, ms in bad.items() if ms}, "bench/ may import tests.support only"


def test_no_import_path_hacks_in_tests_or_bench() -> None:
    """The editable install provides ``rallypoint``; the repository root is the working directory."""
    hacks = []
    for folder in ("tests", "bench"):
        for p in sorted((ROOT / folder).rglob("*.py")):
            if "node_modules" in p.parts:
                continue
            text = p.read_text(encoding="utf-8")
            if "sys.path.insert" in text or '"PYTHONPATH"' in text or "PYTHONPATH=" in text:
                hacks.append(str(p.relative_to(ROOT)))
    hacks.remove("tests/test_bench.py")  # this test names them
    assert not hacks, hacks


@pytest.mark.wire
@pytest.mark.slow  # runs every row against a broker: make test only
def test_hot_paths_generator_counts_answers_of_every_row() -> None:
    """bench.hot_paths' generator against rallypoint: every row's sample answer carries the
    expected error code and the load is answered (a short run of each row)."""
    import asyncio

    from bench.common import rallypoint
    from bench.hot_paths import ROWS, measure

    with rallypoint({"rallypoint.offsets.flush": "never"}) as ep:
        rates = {row.name: asyncio.run(measure(ep, row, 2, 2, 0.3)) for row in ROWS}
    assert all(rate > 50 for rate in rates.values()), rates


@pytest.mark.clients
def test_transactions_bench_measures_committed_transactions() -> None:
    """bench.transactions' loop against rallypoint: it commits real transactions."""
    from bench.common import rallypoint
    from bench.transactions import transactions_per_s

    with rallypoint({"rallypoint.offsets.flush": "never"}) as ep:
        assert transactions_per_s(ep, 10, 0.3) > 1


def test_coordinator_time_bench_brings_the_group_through_two_generations() -> None:
    """bench.coordinator_time drives the sans-IO coordinator itself: every sync of both
    generations must succeed (it raises otherwise) and both figures are real times."""
    from bench.coordinator_time import coordinator_time

    first, again = coordinator_time(20)
    assert first > 0 and again > 0


def test_instruction_totals_are_read_from_callgrind_output() -> None:
    from bench.instructions import parse_total

    text = "version: 1\ncmd: python\nevents: Ir\nfn=main\n12 34\nsummary: 123456\ntotals: 123456\n"
    assert parse_total(text) == 123456
    assert parse_total("summary: 10\n" + "summary: 250\n") == 250  # one file per thread: the largest
    with pytest.raises(ValueError):
        parse_total("events: Ir\n")


@pytest.mark.slow
def test_instruction_counts_repeat() -> None:
    """bench.instructions is the A/B measure for request-path changes: the same code must give
    the same count (to a per cent) in two runs, and a count a request's work could take."""

    argv = [sys.executable, "-m", "bench.instructions", "ApiVersions", "--level", "2x2", "--requests", "300"]

    def count() -> float:
        proc = subprocess.run(
            [*argv, "--json"],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=ROOT,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        result = json.loads(proc.stdout)
        assert result["requests"] == 300 and result["level"] == "2x2"
        return float(result["instructions_per_request"])

    first, second = count(), count()
    assert 5_000 < first < 5_000_000
    assert abs(first - second) / first < 0.01, (first, second)
