"""Client scripts run as `python tests/support/<script>.py`, which puts tests/support first on
sys.path: a helper module there named like an installed distribution (``packaging``, ``wire``...)
would shadow it inside every client the script imports.  CI once failed that way."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.support.paths import ROOT

pytestmark = pytest.mark.unit

SUPPORT = ROOT / "tests" / "support"


def test_no_support_module_shadows_an_importable_module() -> None:
    names = sorted(p.stem for p in SUPPORT.glob("*.py") if p.stem != "__init__")
    assert names, "tests/support has modules"
    shadowing = [n for n in names if n in sys.stdlib_module_names or importlib.util.find_spec(n) is not None]
    assert shadowing == [], f"rename these tests/support modules: {shadowing}"
