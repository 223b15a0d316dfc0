"""The wheel built from a copy of the sources (the checkout is left untouched: no build/ or
egg-info in it), and pip calls with this interpreter's pip."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from .paths import ROOT

FOLDERS = ("coordinator", "protocol", "pipeline")  # the product's folders, mapped into rallypoint


def pip(*args: str, timeout: float = 300) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


def build_wheel(tmp: Path) -> Path:
    """Copy pyproject.toml, README.md and the product's folders under ``tmp`` and build the
    wheel there (``pip wheel --no-deps``, build requirements from the index); its path."""
    src = tmp / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for folder in FOLDERS:
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    pip("wheel", "--quiet", "--no-deps", "--wheel-dir", str(tmp / "dist"), str(src))
    (wheel,) = (tmp / "dist").glob("rallypoint-*.whl")
    return wheel


def empty_venv(path: Path) -> Path:
    """A virtual environment with nothing installed (no pip either); its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True, timeout=120)
    return path / "bin" / "python"
