"""The storage layer (``coordinator/storage``) stands below the domain: it imports the protocol
package and the broker's plumbing (config, clock, logger), never the groups, topics or handlers
that use it; and the shipped pipeline imports no test or benchmark module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.unit


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve inside the rallypoint package
                base = "rallypoint." + ".".join(path.relative_to(ROOT / "coordinator").parts[: -node.level])
                out.add(f"{base.rstrip('.')}.{node.module or ''}".rstrip("."))
            else:
                out.add(node.module or "")
    return out


def test_storage_does_not_import_the_domain() -> None:
    forbidden = ("rallypoint.groups", "rallypoint.topics", "rallypoint.handlers", "rallypoint.broker")
    files = sorted((ROOT / "coordinator" / "storage").glob("*.py"))
    assert files
    for path in files:
        bad = {m for m in _imports(path) if m.startswith(forbidden)}
        assert not bad, f"{path.name} imports {sorted(bad)}"


def test_the_pipeline_ships_no_test_or_bench_code() -> None:
    for path in sorted((ROOT / "pipeline").glob("*.py")):
        tree = ast.parse(path.read_text())
        mods = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        mods |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level}
        assert not {m for m in mods if m.split(".")[0] in ("tests", "bench")}, path.name
