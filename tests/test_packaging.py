"""One import namespace: installed, rallypoint adds exactly one top-level name, ``rallypoint``.

The repository keeps its ``coordinator/``, ``protocol/`` and ``pipeline/`` folders and maps them
into ``rallypoint``, ``rallypoint.protocol`` and ``rallypoint.pipeline`` (pyproject.toml,
``[tool.setuptools]``).  These tests build the wheel from a copy of the sources, install it into
an empty virtual environment and look at what it added; the package-list check is fast and runs
in ``make check``, the wheel tests in ``make test``.
"""

from __future__ import annotations

import csv
import subprocess
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import ROOT
from tests.support.wheels import FOLDERS, build_wheel, empty_venv, pip

pytestmark = pytest.mark.unit

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
SETUPTOOLS = PYPROJECT["tool"]["setuptools"]
FORBIDDEN = {"coordinator", "protocol", "pipeline", "tests", "bench"}  # must never be installed top level


def _package_name(folder: Path) -> str:
    """The import name of a source folder under the package-dir mapping (coordinator/groups ->
    rallypoint.groups, protocol -> rallypoint.protocol)."""
    rel = folder.relative_to(ROOT).parts
    root_package = {src: pkg for pkg, src in SETUPTOOLS["package-dir"].items()}[rel[0]]
    return ".".join((root_package, *rel[1:]))


def test_every_source_package_is_in_the_package_list() -> None:
    found = {
        _package_name(init.parent)
        for folder in FOLDERS
        for init in (ROOT / folder).rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    listed = set(SETUPTOOLS["packages"])
    missing = sorted(found - listed)
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml: {missing}"
    assert not sorted(listed - found), "listed packages without an __init__.py"
    assert all(p == "rallypoint" or p.startswith("rallypoint.") for p in listed)


# ------------------------------------------------------------------------------ the wheel


@dataclass
class Installed:
    wheel: Path
    venv: Path
    added: list[str]  # what the --no-deps install put into site-packages

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def site_packages(self) -> Path:
        (sp,) = (self.venv / "lib").glob("python*/site-packages")
        return sp


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    """The wheel built from a copy of the sources (the checkout is left untouched), installed
    with ``--no-deps`` into an empty venv (no pip, no setuptools: nothing but what it adds)."""
    tmp = tmp_path_factory.mktemp("packaging")
    wheel = build_wheel(tmp)
    venv = tmp / "venv"
    empty_venv(venv)
    got = Installed(wheel, venv, [])
    assert sorted(p.name for p in got.site_packages.iterdir()) == [], "the fresh venv is not empty"
    pip("--python", str(got.python), "install", "--quiet", "--no-deps", str(wheel))
    got.added = sorted(p.name for p in got.site_packages.iterdir())
    yield got


def _top_level(paths: list[str]) -> set[str]:
    return {p.split("/")[0] for p in paths if not p.startswith("../")}


@pytest.mark.slow
def test_the_wheel_adds_exactly_one_top_level_name(installed: Installed) -> None:
    dist_info = f"{installed.wheel.name.split('-')[0]}-{installed.wheel.name.split('-')[1]}.dist-info"
    # what the install put into site-packages
    assert installed.added == ["rallypoint", dist_info], installed.added
    # what the wheel says it installs (RECORD) and declares as its import names (top_level.txt)
    with open(installed.site_packages / dist_info / "RECORD", newline="") as f:
        recorded = [row[0] for row in csv.reader(f)]
    assert _top_level(recorded) == {"rallypoint", dist_info}
    scripts = sorted(p for p in recorded if p.startswith("../"))
    assert [Path(p).name for p in scripts] == ["rallypoint"], scripts
    with zipfile.ZipFile(installed.wheel) as z:
        names = z.namelist()
        top_level = z.read(f"{dist_info}/top_level.txt").decode().split()
    assert _top_level(names) == {"rallypoint", dist_info}
    assert top_level == ["rallypoint"]
    assert not FORBIDDEN & _top_level(names)
    # every listed package is in it, with the pipeline's Spark logging configuration
    for package in SETUPTOOLS["packages"]:
        assert "/".join(package.split(".")) + "/__init__.py" in names, package
    assert "rallypoint/pipeline/conf/log4j2.properties" in names
    # nothing from the repository's other folders, nothing compiled
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]


@pytest.mark.slow
def test_only_rallypoint_imports_from_the_installed_wheel(installed: Installed, tmp_path: Path) -> None:
    """Outside the checkout (cwd elsewhere), the product's folder names do not import."""
    code = (
        "import importlib.util, sys\n"
        "assert importlib.util.find_spec('rallypoint') is not None\n"
        "assert importlib.util.find_spec('rallypoint.protocol') is not None\n"
        "assert importlib.util.find_spec('rallypoint.pipeline') is not None\n"
        f"bad = [n for n in {sorted(FORBIDDEN)!r} if importlib.util.find_spec(n) is not None]\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([str(installed.python), "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.slow
def test_the_console_script_and_module_run(installed: Installed, tmp_path: Path) -> None:
    """With its dependencies installed (pip's cache or the index), ``rallypoint --help`` and
    ``python -m rallypoint --help`` start the installed broker's command line."""
    pip("--python", str(installed.python), "install", "--quiet", str(installed.wheel))
    for cmd in (
        [str(installed.venv / "bin" / "rallypoint"), "--help"],
        [str(installed.python), "-m", "rallypoint", "--help"],
    ):
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith("usage: rallypoint") and "--config KEY=VALUE" in proc.stdout, proc.stdout
    # the installed package is the one that answered, not the checkout
    where = subprocess.run(
        [str(installed.python), "-c", "import rallypoint; print(rallypoint.__file__)"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert Path(where.stdout.strip()).is_relative_to(installed.site_packages), where
