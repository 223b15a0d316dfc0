"""Regression cases found by the frame fuzzer (docs/reliability.md, "Fuzzing").

Each entry of ``tests/fuzz/regressions/`` is the input behind one finding, as triaged by
``tests/fuzz/engine.py``: a ``.frames`` (or gzipped ``.frames.gz``) file is sent as it is on one
connection (frames whose size prefix lies included); a ``.frames`` directory holds one file per
connection, sent in order.  Against a fresh broker, while a probe connection makes round trips: the broker must
live, stay under the RSS bound, answer the probe within the bound, keep the probe's connection
open, log no traceback — and still answer a new connection afterwards.
``regressions/index.json`` says what each case was (kind, log signature, mutations).

``KNOWN_FAILING`` lists the cases that reproduce defects fixed on other branches (they fail
here until those are merged): flip an entry (delete it) when its branch is merged.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rallypoint.protocol import codec
from rallypoint.protocol.records import Record, encode_batch

from tests.fuzz.broker import FuzzBroker
from tests.fuzz.engine import call, recv_frame, replay
from tests.fuzz.frames import REGRESSIONS_DIR, case_wires, regression_cases

pytestmark = [pytest.mark.wire, pytest.mark.slow]

RSS_MAX_MB = 256
PROBE_MAX_S = 2.0

# A regression case -> why it fails here.  Delete an entry once its branch is merged (the case
# must then pass: strict xfail).
KNOWN_FAILING: dict[str, str] = {}


def _cases() -> list[Path]:
    return regression_cases(REGRESSIONS_DIR) if REGRESSIONS_DIR.is_dir() else []


def _params() -> list[Any]:
    out: list[Any] = []
    for case in _cases():
        marks = []
        if case.name in KNOWN_FAILING:
            marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_FAILING[case.name]))
        out.append(pytest.param(case, id=case.name.split(".frames")[0], marks=marks))
    return out


def test_known_failing_cases_exist() -> None:
    missing = sorted(set(KNOWN_FAILING) - {p.name for p in _cases()})
    assert not missing, f"KNOWN_FAILING names cases that do not exist: {missing}"


class Brokers:
    """One broker for the cases in turn; a new one after a case that failed (it may be dead,
    over the memory bound or still busy), so that no case inherits another's damage."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.broker: FuzzBroker | None = None
        self.started = 0

    def get(self) -> FuzzBroker:
        if self.broker is None or not self.broker.alive():
            self.fresh()
        assert self.broker is not None
        return self.broker

    def fresh(self) -> None:
        if self.broker is not None:
            self.broker.kill()
        self.started += 1
        self.broker = FuzzBroker(self.base / f"broker{self.started}").start()

    def close(self) -> None:
        if self.broker is not None:
            self.broker.kill()


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Brokers]:
    b = Brokers(tmp_path_factory.mktemp("regressions"))
    yield b
    b.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", _params())
def test_regression_case(case: Path, brokers: Brokers) -> None:
    broker = brokers.get()
    r = replay(broker, case_wires(case), RSS_MAX_MB, PROBE_MAX_S, answer_wait_s=2.0, settle_s=0.5)
    failures = r.failures()
    if not failures and broker.alive():
        try:
            versions = call(broker.address, 18, 3, {"client_software_name": "check", "client_software_version": "1"})
            if versions.error_code != 0:
                failures.append(f"ApiVersions afterwards answered {versions.error_code}")
        except OSError as e:
            failures.append(f"no answer to a new connection afterwards: {e}")
    if failures:
        brokers.fresh()
    assert not failures, f"{case.name}: " + "; ".join(failures)


@pytest.mark.timeout(120)
def test_fetch_listing_a_partition_many_times_is_answered_once(tmp_path: Path) -> None:
    """Found by the quick run (seed 32: RSS spikes to 269 MB). Kafka keys a fetch by partition
    (``FetchRequest.fetchData``), so a partition listed 40 times is answered once; here each
    copy carries the partition's data, up to the 55 MB fetch cap: a 1.4 KB request, a ~55 MB
    answer, the broker's RSS from ~40 MB to ~250 MB."""
    with FuzzBroker(tmp_path / "broker").start() as broker:
        call(broker.address, 19, 7, {"topics": [{"name": "t", "num_partitions": 1, "replication_factor": 1}]})
        batch = encode_batch([Record(0, 1_700_000_000_000, b"k", b"v" * 900_000)])
        for _ in range(4):
            produce = {
                "acks": -1,
                "timeout": 5000,
                "topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": batch}]}],
            }
            call(broker.address, 0, 9, produce)
        partition = {"partition": 0, "fetch_offset": 0, "partition_max_bytes": 2**31 - 1}
        fetch = {
            "max_wait": 0,
            "min_bytes": 1,
            "max_bytes": 2**31 - 1,
            "session_epoch": -1,
            "topics": [{"topic": "t", "partitions": [partition] * 40}],
        }
        with socket.create_connection(broker.address, timeout=30) as s:
            s.sendall(codec.encode_request(1, 12, 1, fetch, "fuzz-regression"))
            size = len(recv_frame(s))
        assert size < 2 * 4 * len(batch), f"a {size}-byte answer for 4 batches of {len(batch)} bytes"
