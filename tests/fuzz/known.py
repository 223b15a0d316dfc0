"""Defect classes the fuzzer has found (issue 14's, and its own findings numbered from 101).

:data:`DEFECT_CLASSES` is the catalogue, fixed or not.  While a class is not fixed on this
branch, a run *skips* the cases that would trigger it (the report counts them in
``skipped_known``) so that it still guards everything else, and the regression cases that
reproduce it are ``xfail(strict=True)`` in ``test_fuzz_regressions.py``.  Once its fix is merged,
mark the class ``fixed=True``: it leaves :data:`KNOWN_DEFECTS`, the fuzzer sends those cases
again, and its regression cases must pass (flip them in the test file).  The filters of fixed
classes stay, tested, so that ``--include-known`` and later triage can still name them.

Each entry recognises its class from the request frames of a case (``frame``: a predicate over
the frame's :class:`~tests.fuzz.layout.Layout`; arrays or tagged sections with more than
``LIMIT`` entries are reported to it as an :class:`~tests.fuzz.layout.Oversized` walk), and
optionally from a traceback logged by the broker (``problem``).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from rallypoint.protocol.records import RecordsError, decode_records, read_header

from .frames import split_frames
from .layout import Layout, LayoutError, Oversized, layout

# Entries beyond which an array or tagged-field section counts as "huge" for defects 5 and 6.
LIMIT = 2000
# Partitions / topics beyond which a request counts as "asking for a lot" for defects 1 and 3.
MANY_PARTITIONS = 10_000
MANY_TOPICS = 20


@dataclass(frozen=True)
class KnownDefect:
    number: int
    branch: str
    title: str
    frame: Callable[[Layout], bool] | None = None
    oversized: Callable[[int, Oversized], bool] | None = None  # (api key, walk) -> is it this defect
    problem: Callable[[str], bool] | None = None
    fixed: bool = False

    @property
    def label(self) -> str:
        """``issue 14 defect N``, or ``fuzz finding N`` for a class the fuzzer found beyond issue 14
        (numbered from 101)."""
        return f"issue 14 defect {self.number}" if self.number < 100 else f"fuzz finding {self.number}"

    @property
    def reason(self) -> str:
        if self.fixed:
            where = "fixed"
        else:
            where = f"fixed on branch {self.branch}" if self.branch else "not fixed on any branch yet"
        return f"{self.label} ({self.title}), {where}"


def _ints(lay: Layout, name: str) -> list[int]:
    return [s.value for s in lay.spans if s.kind.startswith("int") and s.name == name]


def _arrays(lay: Layout, name: str) -> list[int]:
    return [s.value for s in lay.spans if s.kind == "array" and s.name == name]


def _huge_partitions(lay: Layout) -> bool:
    if lay.api_key == 19:  # CreateTopics.num_partitions
        return any(n > MANY_PARTITIONS for n in _ints(lay, "num_partitions"))
    if lay.api_key == 37:  # CreatePartitions.count
        return any(n > MANY_PARTITIONS for n in _ints(lay, "count"))
    return False


def _many_topics_created(lay: Layout) -> bool:
    """Requests that may create more than MANY_TOPICS topics: Metadata (auto-creation),
    Produce (auto-creation) and CreateTopics."""
    if lay.api_key == 3:
        return any(n > MANY_TOPICS for n in _arrays(lay, "topics"))
    if lay.api_key == 0:
        return any(n > MANY_TOPICS for n in _arrays(lay, "topic_data"))
    if lay.api_key == 19:
        return any(n > MANY_TOPICS for n in _arrays(lay, "topics"))
    return False


def _unwalked_batch(lay: Layout) -> bool:
    """A Produce batch the broker accepts without walking its records (CRC, count and offset
    range consistent) whose records do not decode: ListOffsets by timestamp later walks it."""
    if lay.api_key != 0:
        return False
    for s in lay.spans:
        if s.kind != "payload" or s.name != "records" or s.size < 61:
            continue
        data = bytes(lay.body[s.pos : s.pos + s.size])
        pos = 0
        while pos + 61 <= len(data):
            try:
                h = read_header(data, pos)
            except RecordsError:
                break
            if h.compression == 0 and h.record_count > 0 and h.last_offset_delta + 1 == h.record_count:
                try:
                    decode_records(data, h)
                except RecordsError:
                    return True
            pos = h.end
    return False


def _null_array(lay: Layout) -> bool:
    return any(s.kind == "array" and s.value < 0 and not s.nullable for s in lay.spans)


def _duplicate_protocols(lay: Layout) -> bool:
    if lay.api_key != 11:
        return False
    body = lay.body
    names = [bytes(body[s.pos : s.pos + s.size]) for s in lay.spans if s.kind == "payload" and s.name == "name"]
    nulls_or_empty = sum(1 for s in lay.spans if s.kind == "string" and s.name == "name" and s.value <= 0)
    return len(set(names)) < len(names) or nulls_or_empty > 1


def _null_topic_name_v10_v11(lay: Layout) -> bool:
    return (
        lay.api_key == 3
        and lay.api_version in (10, 11)
        and any(s.kind == "string" and s.name == "name" and s.value < 0 for s in lay.spans)
    )


def _fetch_repeats_a_partition(lay: Layout) -> bool:
    """A Fetch naming one partition several times: each copy is answered with the partition's
    data (Kafka keys a fetch by partition, so a repeat replaces the earlier entry)."""
    if lay.api_key != 1:
        return False
    seen: dict[int, int] = {}
    for s in lay.spans:
        if s.kind == "int32" and s.name == "partition":
            seen[s.value] = seen.get(s.value, 0) + 1
    return any(n > 2 for n in seen.values())


DEFECT_CLASSES: list[KnownDefect] = [
    KnownDefect(
        1, "limits", "CreateTopics/CreatePartitions with millions of partitions", frame=_huge_partitions, fixed=True
    ),
    KnownDefect(3, "limits", "one topics.json rewrite per created topic", frame=_many_topics_created, fixed=True),
    KnownDefect(
        4, "codec-storage", "Produce accepts a batch whose records are never walked", frame=_unwalked_batch, fixed=True
    ),
    KnownDefect(
        5,
        "limits",
        "decoding and answering grow with the element count",
        oversized=lambda _api, o: o.kind == "array",
        fixed=True,
    ),
    KnownDefect(
        6,
        "limits",
        "a repeated tagged field decodes in quadratic time",
        oversized=lambda _api, o: o.kind == "tagged",
        fixed=True,
    ),
    KnownDefect(7, "limits", "a null non-nullable array is decoded as None", frame=_null_array, fixed=True),
    KnownDefect(8, "groups-split", "JoinGroup listing the same protocol twice", frame=_duplicate_protocols, fixed=True),
    KnownDefect(9, "limits", "Metadata v10/v11 with a null topic name", frame=_null_topic_name_v10_v11, fixed=True),
    KnownDefect(
        101,
        "",
        "a Fetch listing one partition N times is answered with its data N times, up to 55 MB",
        frame=_fetch_repeats_a_partition,
        fixed=True,
    ),
]
# The classes a run skips: those not fixed here.
KNOWN_DEFECTS: list[KnownDefect] = [d for d in DEFECT_CLASSES if not d.fixed]


def classify(body: bytes, defects: list[KnownDefect] | None = None) -> KnownDefect | None:
    """The known defect one request frame body would trigger, if any."""
    defects = KNOWN_DEFECTS if defects is None else defects
    if len(body) >= 4:
        api_key = struct.unpack_from(">h", body, 0)[0]
    else:
        return None
    try:
        lay = layout(body, limit=LIMIT)
    except Oversized as o:
        for d in defects:
            if d.oversized is not None and d.oversized(api_key, o):
                return d
        return None
    except LayoutError:
        return None
    for d in defects:
        if d.frame is not None and d.frame(lay):
            return d
    return None


def match_frame(wire: bytes, defects: list[KnownDefect] | None = None) -> KnownDefect | None:
    """The known defect a case (its whole wire bytes: one or more frames) would trigger, if any."""
    if not (KNOWN_DEFECTS if defects is None else defects):
        return None
    for body in split_frames(wire):
        hit = classify(body, defects)
        if hit is not None:
            return hit
    return None


def match_problem(text: str, defects: list[KnownDefect] | None = None) -> KnownDefect | None:
    for d in KNOWN_DEFECTS if defects is None else defects:
        if d.problem is not None and d.problem(text):
            return d
    return None
