from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support import ROOT, BrokerProcess

JS_DIR = ROOT / "tests" / "js"


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
