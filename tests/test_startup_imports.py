"""What the broker's start-up imports may cost (docs/BENCHMARKS.md, start-up section).

On Python 3.11 a dataclass costs about 1 ms to define (the standard library compiles its
methods one ``exec`` at a time); with some 160 of them rallypoint spent most of its start-up
defining classes.  Its own record, event and state classes are msgspec Structs, defined in C.
This test imports what ``python -m rallypoint`` imports before it listens, in a fresh
interpreter, counting the dataclasses each module defines, and fails when a rallypoint module
defines one that is not listed here with its reason.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support import ROOT

pytestmark = pytest.mark.unit

# Module -> dataclasses it may define at start-up, and why they stay dataclasses.
ALLOWED: dict[str, set[str]] = {
    # field(repr=False): a topic's repr leaves out its partition logs and cached policy
    "rallypoint.topics.store": {"Topic"},
    # field(repr=False): a rule's repr leaves out its random source and parked requests
    "rallypoint.control.faults": {"FaultRule"},
}

PROBE = r"""
import dataclasses, json, sys
sys.modules["hypothesis"] = None  # as the CLI does (rallypoint.cli.hide_hypothesis)
made = []
real = dataclasses._process_class
def counting(cls, *args, **kwargs):
    made.append((cls.__module__, cls.__qualname__))
    return real(cls, *args, **kwargs)
dataclasses._process_class = counting
import rallypoint.cli, rallypoint.assemble, rallypoint.server, rallypoint.handlers
rallypoint.handlers.load_handlers()
print(json.dumps(made))
"""


def test_start_up_defines_no_unlisted_dataclass() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True
    ).stdout
    made: list[tuple[str, str]] = [tuple(x) for x in json.loads(out)]
    assert any(m.startswith("kio.") for m, _ in made), "the probe saw no dataclass at all: it measures nothing"
    ours = [(m, name) for m, name in made if m == "rallypoint" or m.startswith("rallypoint.")]
    unlisted = sorted((m, name) for m, name in ours if name not in ALLOWED.get(m, set()))
    assert not unlisted, f"dataclasses defined at start-up (make them msgspec Structs, or list them here): {unlisted}"
