"""The pytest plugin (registered with the ``pytest11`` entry point: installed, it is active).

Fixtures (docs/control.md, "pytest plugin"):

* ``rallypoint`` — a broker for one test, stopped and its data directory removed afterwards
  (also when the test fails).  Configured per test with the marker::

      @pytest.mark.rallypoint(config={"num.partitions": "3"}, mode="subprocess")
      def test_it(rallypoint): ...

* ``rallypoint_session`` — one broker for the whole session, configured with the ini options
  ``rallypoint_config`` (lines of ``key=value``) and ``rallypoint_mode``.

Both give a :class:`rallypoint.testing.Rallypoint`: ``.bootstrap`` for clients, one method per
control-plane endpoint (``inject``, ``wait_group``, ``expire_member``, ``advance_clock``,
``requests`` ...), ``restart()`` for persistence tests.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from .testing import MODES, Mode, Rallypoint

MARKER = "rallypoint"
MARKER_ARGS = frozenset({"config", "brokers", "mode"})


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("rallypoint_config", "rallypoint_session's broker settings, one key=value per line", type="linelist")
    parser.addini("rallypoint_mode", "rallypoint_session's mode: inprocess or subprocess", default="inprocess")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(config=None, brokers=1, mode='inprocess'): the broker the 'rallypoint' fixture starts "
        "(config: settings by Kafka name; mode: inprocess or subprocess)",
    )


def _mode(value: Any, where: str) -> Mode:
    if value not in MODES:
        raise pytest.UsageError(f"{where}: mode must be one of {', '.join(MODES)}, not {value!r}")
    mode: Mode = value
    return mode


def _marker_kwargs(request: pytest.FixtureRequest) -> dict[str, Any]:
    marker = request.node.get_closest_marker(MARKER)
    if marker is None:
        return {}
    if marker.args:
        names = ", ".join(sorted(MARKER_ARGS))
        raise pytest.UsageError(f"@pytest.mark.{MARKER} takes keyword arguments only ({names})")
    unknown = set(marker.kwargs) - MARKER_ARGS
    if unknown:
        raise pytest.UsageError(f"@pytest.mark.{MARKER}: unknown argument(s) {', '.join(sorted(unknown))}")
    config = marker.kwargs.get("config") or {}
    if not isinstance(config, Mapping):
        raise pytest.UsageError(f"@pytest.mark.{MARKER}(config=...) must be a dict of settings")
    return {
        "config": dict(config),
        "brokers": marker.kwargs.get("brokers", 1),
        "mode": _mode(marker.kwargs.get("mode", "inprocess"), f"@pytest.mark.{MARKER}"),
    }


@pytest.fixture
def rallypoint(request: pytest.FixtureRequest) -> Iterator[Rallypoint]:
    """A rallypoint broker for this test (see ``@pytest.mark.rallypoint``)."""
    with Rallypoint(**_marker_kwargs(request)) as rp:
        yield rp


@pytest.fixture(scope="session")
def rallypoint_session(pytestconfig: pytest.Config) -> Iterator[Rallypoint]:
    """One rallypoint broker shared by every test of the session (ini: ``rallypoint_config``,
    ``rallypoint_mode``)."""
    settings: dict[str, str] = {}
    for line in pytestconfig.getini("rallypoint_config"):
        key, sep, value = str(line).partition("=")
        if not sep or not key.strip():
            raise pytest.UsageError(f"rallypoint_config: expected key=value, got {line!r}")
        settings[key.strip()] = value.strip()
    mode = _mode(pytestconfig.getini("rallypoint_mode") or "inprocess", "rallypoint_mode")
    with Rallypoint(settings, mode=mode) as rp:
        yield rp
