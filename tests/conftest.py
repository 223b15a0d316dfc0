from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from tests.support import JS_DIR, BrokerProcess

# Property tests are judged on what they find, not on how fast one example runs: on a shared
# 2-core machine (and with `make check`'s parallel workers) Hypothesis' default 200 ms deadline
# fails tests for the machine's load.  Tests that set their own deadline keep it.
settings.register_profile("rallypoint", deadline=None)
settings.load_profile("rallypoint")


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[Callable[..., BrokerProcess]]:
    """Start brokers: ``broker_factory(config={...}, env={...})``; all are killed afterwards."""
    started: list[BrokerProcess] = []
    counter = [0]

    def make(
        config: dict[str, str] | None = None,
        env: dict[str, str] | None = None,
        data_dir: Path | None = None,
        extra_args: list[str] | None = None,
    ) -> BrokerProcess:
        counter[0] += 1
        cfg = {"group.initial.rebalance.delay.ms": "0"}
        cfg.update(config or {})
        b = BrokerProcess(
            data_dir=data_dir or tmp_path / f"broker{counter[0]}",
            config=cfg,
            env=env or {},
            extra_args=extra_args or [],
        )
        started.append(b)
        return b.start()

    yield make
    for b in started:
        b.kill()


@pytest.fixture
def broker(broker_factory: Callable[..., BrokerProcess]) -> BrokerProcess:
    return broker_factory()


@pytest.fixture(scope="module")
def shared_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One default broker for a whole test module: for tests that leave nothing behind that
    another test could see (stateless requests, or names of their own)."""
    b = BrokerProcess(data_dir=tmp_path_factory.mktemp("shared"), config={"group.initial.rebalance.delay.ms": "0"})
    b.start()
    yield b
    b.kill()


def _need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.fail(f"{tool} is not installed; run ./scripts/test (it installs every client)")
    return path


@pytest.fixture(scope="session")
def kcat() -> str:
    return _need("kcat")


@pytest.fixture(scope="session")
def node_js() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run a script from tests/js with node (kafkajs installed there by ./scripts/test)."""
    node = _need("node")
    if not (JS_DIR / "node_modules" / "kafkajs").exists():
        pytest.fail("kafkajs is not installed in tests/js; run ./scripts/test")

    def run(script: str, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [node, str(JS_DIR / script), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=JS_DIR,
        )

    return run


# ------------------------------------------------------------------------------ test groups

# Every test belongs to one of these groups (pyproject.toml lists the markers; `make check` runs
# unit and wire tests that are not also clients/spark/docker/slow).
GROUPS = ("unit", "wire", "clients", "spark", "docker")
_ungrouped: list[str] = []


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ungrouped = {item.nodeid.split("::")[0] for item in items if not any(item.get_closest_marker(g) for g in GROUPS)}
    _ungrouped[:] = sorted(ungrouped)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _ungrouped:
        terminalreporter.write_line(
            "tests without a group marker (they run in `make test` only, never in `make check`); "
            f"give each file a pytestmark of {', '.join(GROUPS)}: {', '.join(_ungrouped)}",
            yellow=True,
        )
