"""The frame fuzzer's quick run, and tests of its own parts (docs/reliability.md, "Fuzzing").

The quick run (part of ``make test``) sends ``FUZZ_QUICK_FRAMES`` mutated frames (default
100,000) or as many as fit in ``FUZZ_QUICK_SECONDS`` (default 120 s: 15,000-30,000 on two busy
shared cores, all 100,000 in about a minute on two quiet ones) from a fixed seed (``FUZZ_SEED``, default
14) to a broker with a Stable confluent-kafka group and a probing connection, and fails on any
finding that is not a known defect (``tests/fuzz/known.py``); the cases behind a finding are
triaged and written to this test's temporary directory (the failure message names them) — copy
them to ``tests/fuzz/regressions/`` to keep them as regression cases.  ``make fuzz`` is the long
run (``tests/fuzz/engine.py``).
"""

from __future__ import annotations

import json
import os
import re
import socket
import struct
import time
from pathlib import Path
from typing import Any

import pytest
from crc32c import crc32c
from rallypoint.protocol import codec
from rallypoint.protocol.records import Record, encode_batch

from tests.fuzz.broker import FuzzBroker, LogWatch
from tests.fuzz.engine import STABLE_GROUP, Settings, StableGroup, recv_frame, run
from tests.fuzz.frames import load_corpus
from tests.fuzz.known import DEFECT_CLASSES, KnownDefect, match_frame
from tests.fuzz.layout import layout, write_uvarint
from tests.fuzz.mutate import Mutator

pytestmark = [pytest.mark.wire, pytest.mark.slow]

QUICK_FRAMES = int(os.environ.get("FUZZ_QUICK_FRAMES", 100_000))
QUICK_SECONDS = float(os.environ.get("FUZZ_QUICK_SECONDS", 120))
QUICK_SEED = int(os.environ.get("FUZZ_SEED", 14))
# Fewer frames than this means the run measured nothing worth the name (a very loaded machine).
MIN_FRAMES = 3_000


@pytest.mark.clients
@pytest.mark.timeout(900)
def test_quick_frame_fuzz(tmp_path: Path) -> None:
    settings = Settings(
        frames=QUICK_FRAMES,
        seconds=QUICK_SECONDS,
        seed=QUICK_SEED,
        save_dir=tmp_path / "found",
        data_dir=tmp_path,
        triage_budget_s=300,
    )
    report = run(settings)
    summary = json.dumps(report.as_dict(), indent=1)
    print(summary)
    assert report.frames >= MIN_FRAMES, f"only {report.frames} frames in {report.seconds:.0f} s:\n{summary}"
    assert report.probe_round_trips > 0
    unknown = report.unknown()
    assert not unknown, f"{len(unknown)} findings (regression cases written to {settings.save_dir}):\n" + "\n".join(
        json.dumps(f.summary(), indent=1) for f in unknown
    )


# ------------------------------------------------------------------- the fuzzer's parts


def test_corpus_is_small_and_covers_the_clients_and_apis() -> None:
    frames = load_corpus()
    assert {f.source for f in frames} >= {"kafka-python", "aiokafka", "confluent-kafka", "kcat"}
    apis = {f.api_key for f in frames}
    # produce, fetch, list offsets, metadata, commit, fetch offsets, find coordinator, the group
    # APIs, api versions, create/delete topics, init producer id, create partitions, delete groups
    assert apis >= {0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15, 16, 18, 19, 20, 22, 37, 42}
    total = sum(p.stat().st_size for p in (Path(__file__).parent / "corpus").glob("*.frames"))
    assert total < 2 * 1024 * 1024
    for f in frames:  # every recorded frame is a frame the schema walks completely (but one librdkafka quirk)
        lay = layout(f.body)
        assert lay.complete or (f.source == "confluent-kafka" and f.api_key == 3)


def test_mutator_is_deterministic_and_mutates() -> None:
    corpus = load_corpus()
    a, b = Mutator(corpus, 99), Mutator(corpus, 99)
    cases_a = [a.case() for _ in range(300)]
    cases_b = [b.case() for _ in range(300)]
    assert [c.wire for c in cases_a] == [c.wire for c in cases_b]
    originals = {f.wire() for f in a.corpus}
    changed = sum(1 for c in cases_a if c.wire not in originals)
    assert changed > 250
    ops = {re.match(r"[a-z_]*", op).group(0) for c in cases_a for op in c.ops}  # type: ignore[union-attr]
    assert {"flip", "array_len", "str_len", "int", "size_lie", "join", "split", "version"} <= ops


def test_mutator_survives_many_seeds() -> None:
    """The mutator itself never fails (any operator on any frame, stacked on earlier ones)."""
    corpus = load_corpus()
    for seed in range(40):
        m = Mutator(corpus, seed)
        for _ in range(1_000):
            assert len(m.case().wire) <= 2 * 1024 * 1024 + 4 * 5


def test_log_watch_counts_warnings_and_catches_tracebacks() -> None:
    w = LogWatch({"g"})
    w.feed(json.dumps({"event": "closing connection: bad frame size", "level": "warning"}))
    w.feed(json.dumps({"event": "group state transition", "level": "info", "group": "g", "to": "Stable"}))
    w.feed(
        json.dumps(
            {
                "event": "handler failed",
                "level": "error",
                "api": "Metadata",
                "exception": 'Traceback (most recent call last):\n  File "/x/coordinator/handlers/metadata.py", '
                "line 60, in handle\n    boom()\nTypeError: nope",
            }
        )
    )
    for line in [
        "Exception in callback GroupsRuntime._expire()",
        "Traceback (most recent call last):",
        '  File "/x/coordinator/groups/state.py", line 309, in select_protocol',
        "RuntimeError: no protocol",
    ]:
        w.feed(line)
    w.feed(json.dumps({"event": "listening", "level": "info"}))
    assert w.warnings["closing connection: bad frame size"] == 1
    assert len(w.transitions) == 1
    assert [p.signature for p in w.problems] == [
        "handlers/metadata.py:60 in handle | TypeError: nope",
        "groups/state.py:309 in select_protocol | RuntimeError: no protocol",
    ]
    assert w.problems[0].fields["api"] == "Metadata"


def _frame(api_key: int, version: int, body: dict[str, Any]) -> bytes:
    return bytes(codec.encode_request(api_key, version, 1, body, "known-example"))


def _patch(wire: bytes, kind: str, name: str, raw: bytes) -> bytes:
    """``wire`` with the first span of ``kind`` named ``name`` (tests.fuzz.layout) replaced by ``raw``."""
    body = wire[4:]
    s = next(s for s in layout(body).spans if s.kind == kind and s.name == name)
    size = s.size + (max(0, s.value) if kind in ("string", "bytes") else 0)
    body = body[: s.pos] + raw + body[s.pos + size :]
    return struct.pack(">i", len(body)) + body


def _topics(n: int) -> dict[str, Any]:
    return {"topics": [{"name": f"t{i}"} for i in range(n)], "allow_auto_topic_creation": True}


def _unwalked_batch() -> bytes:
    """A batch whose header says 1000 records (offset range consistent, CRC right) holding one."""
    batch = bytearray(encode_batch([Record(0, 1_700_000_000_000, b"k", b"v")]))
    batch[57:61] = struct.pack(">i", 1000)
    batch[23:27] = struct.pack(">i", 999)
    batch[17:21] = struct.pack(">I", crc32c(bytes(batch[21:])))
    return bytes(batch)


KNOWN_EXAMPLES: dict[int, bytes] = {
    1: _frame(19, 7, {"topics": [{"name": "huge", "num_partitions": 2**31 - 1, "replication_factor": 1}]}),
    3: _frame(3, 12, _topics(50)),
    4: _frame(
        0,
        9,
        {
            "acks": -1,
            "timeout": 1000,
            "topic_data": [{"name": "t", "partition_data": [{"index": 0, "records": _unwalked_batch()}]}],
        },
    ),
    5: _frame(3, 12, _topics(5001)),
    # 3000 copies of Fetch's tagged field 0 (cluster_id) in the top-level tagged section
    6: _frame(1, 12, {"topics": []})[:-1] + write_uvarint(3000) + b"\x00\x02\x01a" * 3000,
    7: _patch(_frame(20, 4, {"topic_names": [], "timeout": 1000}), "array", "topic_names", b"\x00"),
    8: _frame(
        11,
        5,
        {
            "group_id": "g",
            "session_timeout": 10_000,
            "rebalance_timeout": 10_000,
            "member_id": "",
            "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b""}, {"name": "range", "metadata": b"x"}],
        },
    ),
    9: _patch(_frame(3, 10, _topics(1)), "string", "name", b"\x00"),
    101: _frame(
        1,
        12,
        {
            "max_wait": 0,
            "min_bytes": 1,
            "max_bytes": 2**31 - 1,
            "session_epoch": -1,
            "topics": [{"topic": "t", "partitions": [{"partition": 0, "partition_max_bytes": 2**20}] * 3}],
        },
    ),
}


def _fix_size(wire: bytes) -> bytes:
    return struct.pack(">i", len(wire) - 4) + wire[4:]


@pytest.mark.parametrize("defect", DEFECT_CLASSES, ids=lambda d: f"defect{d.number}")
def test_known_defect_filters_recognise_their_class(defect: KnownDefect) -> None:
    """Each filter of known.py recognises a frame of its class, and no other filter does."""
    example = _fix_size(KNOWN_EXAMPLES[defect.number])
    assert match_frame(example, DEFECT_CLASSES) is defect


def test_known_defect_filters_let_the_corpus_through() -> None:
    for f in load_corpus():
        assert match_frame(f.wire(), DEFECT_CLASSES) is None, (
            f"corpus frame {f.source} {f.api_key}v{f.api_version} filtered"
        )


@pytest.mark.clients
@pytest.mark.timeout(180)
def test_stable_group_watch_sees_a_rebalance(tmp_path: Path) -> None:
    """The Stable-group watch reports a JoinGroup that makes the group rebalance."""
    with FuzzBroker(tmp_path / "b", watch_groups={STABLE_GROUP}).start() as broker:
        group = StableGroup(broker, 2)
        try:
            group.start()
            group.wait_stable()
            assert group.disturbed() is None
            time.sleep(1.5)
            assert group.disturbed() is None
            with socket.create_connection(broker.address, timeout=10) as s:
                join = {
                    "group_id": STABLE_GROUP,
                    "session_timeout": 10_000,
                    "rebalance_timeout": 10_000,
                    "member_id": "",
                    "protocol_type": "consumer",
                    "protocols": [{"name": "range", "metadata": b"\x00\x00\x00\x00\x00\x00\xff\xff\xff\xff"}],
                }
                s.sendall(codec.encode_request(11, 2, 1, join, "intruder"))
                s.settimeout(15)
                recv_frame(s)
            deadline = time.monotonic() + 15
            while group.disturbed() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            why = group.disturbed()
            assert why is not None and STABLE_GROUP in why
        finally:
            group.stop()
