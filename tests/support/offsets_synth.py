"""Synthetic ``__consumer_offsets`` logs for tests and the benchmark (encoded with ``protocol/``,
laid out with the broker's own segment naming from ``coordinator/storage``).

A seeded simulation of consumer groups: commits, members joining and leaving (a new generation
each time, with range assignments), static members rejoining under a new member id (same
generation), groups emptied and deleted (offset and group tombstones), optional transactional
commits with COMMIT/ABORT markers.  Segments roll at ``segment_bytes`` like the broker's log.

It is a generator of valid input, not a model of the broker: the broker's own log is exercised by
the end-to-end test with real clients.
"""

from __future__ import annotations

import array
import random
import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rallypoint.protocol import offsets_schema as schema
from rallypoint.protocol import records as rec
from rallypoint.protocol.consumer_protocol import (
    Assignment,
    Subscription,
    TopicPartitions,
    encode_assignment,
    encode_subscription,
)
from rallypoint.storage.recovery import replay_partition
from rallypoint.storage.segments import list_partition_dirs, partition_dir, segment_name

Entry = tuple[bytes, bytes | None]


def control_key(commit: bool) -> bytes:
    """A transaction marker's key: int16 version 0, int16 type (0 ABORT, 1 COMMIT)."""
    return struct.pack(">hh", 0, 1 if commit else 0)


CONTROL_VALUE = struct.pack(">hi", 0, 0)  # version 0, coordinator epoch 0


class LogWriter:
    """Appends batches to ``<data_dir>/__consumer_offsets-<n>/<base>.log``, rolling segments."""

    def __init__(self, data_dir: Path, num_partitions: int, segment_bytes: int = 1 << 20) -> None:
        self.data_dir = Path(data_dir)
        self.segment_bytes = segment_bytes
        self.next_offset = [0] * num_partitions
        self.seg_size = [0] * num_partitions
        self.seg_path: list[Path | None] = [None] * num_partitions
        self.records = 0
        self.batches = 0
        for p in range(num_partitions):
            partition_dir(self.data_dir, p).mkdir(parents=True, exist_ok=True)

    def _write(self, p: int, data: bytes, base: int) -> None:
        path = self.seg_path[p]
        if path is None or self.seg_size[p] >= self.segment_bytes:
            path = partition_dir(self.data_dir, p) / segment_name(base)
            self.seg_path[p] = path
            self.seg_size[p] = 0
        with open(path, "ab") as f:
            f.write(data)
        self.seg_size[p] += len(data)
        self.batches += 1

    def append(
        self,
        p: int,
        entries: list[Entry],
        ts: int,
        *,
        producer_id: int = rec.NO_PRODUCER_ID,
        transactional: bool = False,
        control: bool = False,
    ) -> int:
        base = self.next_offset[p]
        records = [rec.Record(base + i, ts, k, v) for i, (k, v) in enumerate(entries)]
        data = rec.encode_batch(
            records,
            base_offset=base,
            producer_id=producer_id,
            producer_epoch=0 if producer_id >= 0 else rec.NO_PRODUCER_EPOCH,
            transactional=transactional,
            control=control,
        )
        self._write(p, data, base)
        self.next_offset[p] = base + len(entries)
        self.records += len(entries)
        return base

    def segments(self) -> list[Path]:
        return sorted(self.data_dir.glob("__consumer_offsets-*/*.log"))


@dataclass
class _Member:
    member_id: str
    instance_id: str | None


@dataclass
class _Group:
    name: str
    topics: list[str]
    members: list[_Member] = field(default_factory=list)
    generation: int = 0
    committed: set[tuple[str, int]] = field(default_factory=set)
    next_member: int = 0


@dataclass
class SynthConfig:
    groups: int = 12
    topics: int = 3
    partitions_per_topic: int = 4
    log_partitions: int = 3
    events: int = 400
    segment_bytes: int = 64 * 1024
    seed: int = 1
    static_fraction: float = 0.3  # share of new members that are static
    txn_fraction: float = 0.0  # share of commits written in a transaction
    start_ms: int = 1_700_000_000_000
    group_prefix: str = "group"


@dataclass
class SynthResult:
    records: int
    batches: int
    commits: int
    generation_records: int
    deleted_groups: int
    segments: list[Path]


class Simulation:
    def __init__(self, data_dir: Path, cfg: SynthConfig) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.log = LogWriter(data_dir, cfg.log_partitions, cfg.segment_bytes)
        self.now = cfg.start_ms
        self.topics = [f"topic-{t}" for t in range(cfg.topics)]
        self.groups = [
            _Group(f"{cfg.group_prefix}-{g}", self.rng.sample(self.topics, self.rng.randint(1, len(self.topics))))
            for g in range(cfg.groups)
        ]
        self.commits = 0
        self.generation_records = 0
        self.deleted = 0
        self.next_pid = 1000

    def part(self, g: _Group) -> int:
        return schema.partition_for(g.name, self.cfg.log_partitions)

    def tick(self) -> int:
        self.now += self.rng.randint(1, 2000)
        return self.now

    # --- group metadata ---------------------------------------------------------------------
    def _assign(self, g: _Group) -> dict[str, bytes]:
        tps = [(t, p) for t in sorted(g.topics) for p in range(self.cfg.partitions_per_topic)]
        ids = sorted(m.member_id for m in g.members)
        out: dict[str, list[tuple[str, int]]] = {m: [] for m in ids}
        for i, tp in enumerate(tps):
            out[ids[i % len(ids)]].append(tp)
        enc = {}
        for m, assigned in out.items():
            by_topic: dict[str, list[int]] = {}
            for t, p in assigned:
                by_topic.setdefault(t, []).append(p)
            a = Assignment(
                self.rng.choice((0, 1, 3)), tuple(TopicPartitions(t, tuple(ps)) for t, ps in by_topic.items())
            )
            enc[m] = encode_assignment(a)
        return enc

    def store_group(self, g: _Group) -> None:
        ts = self.tick()
        sub = encode_subscription(Subscription(1, tuple(sorted(g.topics)), None))
        assignments = self._assign(g) if g.members else {}
        members = tuple(
            schema.MemberMetadata(
                m.member_id,
                m.instance_id,
                f"client-{m.member_id}",
                "/127.0.0.1",
                300000,
                45000,
                sub,
                assignments[m.member_id],
            )
            for m in g.members
        )
        leader = min((m.member_id for m in g.members), default=None)
        value = schema.GroupMetadataValue("consumer", g.generation, "range" if g.members else None, leader, ts, members)
        k, v = schema.encode_record(schema.GroupMetadataKey(g.name), value)
        self.log.append(self.part(g), [(k, v)], ts)
        self.generation_records += 1

    def new_member(self, g: _Group) -> _Member:
        g.next_member += 1
        static = self.rng.random() < self.cfg.static_fraction
        mid = f"{g.name}-m{g.next_member}-{self.rng.randrange(1 << 30):x}"
        return _Member(mid, f"{g.name}-instance-{g.next_member}" if static else None)

    def join(self, g: _Group) -> None:
        g.members.append(self.new_member(g))
        g.generation += 1
        self.store_group(g)

    def leave(self, g: _Group) -> None:
        g.members.pop(self.rng.randrange(len(g.members)))
        g.generation += 1
        self.store_group(g)

    def static_replace(self, g: _Group) -> bool:
        statics = [m for m in g.members if m.instance_id is not None]
        if not statics:
            return False
        m = self.rng.choice(statics)
        m.member_id = f"{g.name}-r{self.rng.randrange(1 << 30):x}"
        self.store_group(g)  # same generation (Kafka: updateStaticMemberAndRebalance in Stable)
        return True

    def delete(self, g: _Group) -> None:
        """DeleteGroups on an empty group: offset tombstones, then the group tombstone."""
        ts = self.tick()
        entries: list[Entry] = [
            (schema.encode_record(schema.OffsetCommitKey(g.name, t, p), None)[0], None) for t, p in sorted(g.committed)
        ]
        entries.append((schema.encode_record(schema.GroupMetadataKey(g.name), None)[0], None))
        self.log.append(self.part(g), entries, ts)
        g.committed.clear()
        g.generation = 0
        g.members.clear()
        self.deleted += 1

    # --- commits ----------------------------------------------------------------------------
    def commit(self, g: _Group) -> None:
        ts = self.tick()
        tps = [(t, p) for t in g.topics for p in range(self.cfg.partitions_per_topic)]
        chosen = sorted(self.rng.sample(tps, self.rng.randint(1, len(tps))))
        entries = []
        for t, p in chosen:
            expire = ts + 86_400_000 if self.rng.random() < 0.05 else None
            value = schema.OffsetCommitValue(
                self.rng.randrange(1 << 40), self.rng.choice(("", "meta")), ts, self.rng.choice((-1, 3)), expire
            )
            entries.append(schema.encode_record(schema.OffsetCommitKey(g.name, t, p), value))
        if self.rng.random() < self.cfg.txn_fraction:
            pid = self.next_pid
            self.next_pid += 1
            self.log.append(self.part(g), entries, ts, producer_id=pid, transactional=True)
            if self.rng.random() < 0.85:  # else: left open (no marker)
                commit = self.rng.random() < 0.7
                self.log.append(
                    self.part(g),
                    [(control_key(commit), CONTROL_VALUE)],
                    self.tick(),
                    producer_id=pid,
                    transactional=True,
                    control=True,
                )
        else:
            self.log.append(self.part(g), entries, ts)
        g.committed.update(chosen)
        self.commits += len(entries)

    def step(self) -> None:
        g = self.rng.choice(self.groups)
        r = self.rng.random()
        if not g.members:
            if g.committed and r < 0.15:
                self.delete(g)
            elif g.generation == 0 or r < 0.3:
                self.join(g)
            else:
                self.commit(g)  # a simple (or emptied) group can still commit
            return
        if r < 0.70:
            self.commit(g)
        elif r < 0.82 and len(g.members) < 6:
            self.join(g)
        elif r < 0.94:
            self.leave(g)
        elif not self.static_replace(g):
            self.commit(g)

    def run(self) -> SynthResult:
        for _ in range(self.cfg.events):
            self.step()
        return SynthResult(
            self.log.records, self.log.batches, self.commits, self.generation_records, self.deleted, self.log.segments()
        )


def generate(data_dir: Path, cfg: SynthConfig | None = None) -> SynthResult:
    """Write a synthetic offsets log into ``data_dir`` (a broker data dir)."""
    return Simulation(Path(data_dir), cfg or SynthConfig()).run()


# --- damage ---------------------------------------------------------------------------------------


def tear_tail(path: Path, nbytes: int) -> None:
    """Cut the last ``nbytes`` off a segment (a crash in the middle of an append)."""
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(max(0, size - nbytes))


def flip_byte(path: Path, position: int) -> None:
    """Invert one byte (a CRC mismatch for the batch holding it)."""
    with open(path, "r+b") as f:
        f.seek(position)
        b = f.read(1)
        f.seek(position)
        f.write(bytes([b[0] ^ 0xFF]))


# --- hand-made records (tests) ------------------------------------------------------------------


def offset_entry(
    group: str, topic: str, partition: int, offset: int | None, ts: int = 0, *, expire: int | None = None
) -> Entry:
    """An OffsetCommit record; ``offset=None`` makes its tombstone."""
    key = schema.OffsetCommitKey(group, topic, partition)
    value = None if offset is None else schema.OffsetCommitValue(offset, "", ts, -1, expire)
    k, v = schema.encode_record(key, value)
    return k, v


def consumer_member(
    member_id: str,
    assigned: dict[str, list[int]] | None,
    instance_id: str | None = None,
    topics: tuple[str, ...] = ("t",),
) -> schema.MemberMetadata:
    """A consumer-protocol member; ``assigned=None`` gives it empty assignment bytes."""
    sub = encode_subscription(Subscription(1, topics, None))
    asg = (
        b""
        if assigned is None
        else encode_assignment(Assignment(0, tuple(TopicPartitions(t, tuple(p)) for t, p in assigned.items())))
    )
    return schema.MemberMetadata(member_id, instance_id, f"client-{member_id}", "/127.0.0.1", 60000, 10000, sub, asg)


def group_entry(
    group: str,
    generation: int | None,
    members: list[schema.MemberMetadata] | None = None,
    ts: int = 0,
    *,
    protocol_type: str = "consumer",
    protocol: str = "range",
) -> Entry:
    """A GroupMetadata record; ``generation=None`` makes the group's tombstone."""
    key = schema.GroupMetadataKey(group)
    if generation is None:
        k, v = schema.encode_record(key, None)
        return k, v
    ms = tuple(members or ())
    value = schema.GroupMetadataValue(
        protocol_type if ms or protocol_type != "consumer" else "consumer",
        generation,
        protocol if ms else None,
        ms[0].member_id if ms else None,
        ts,
        ms,
    )
    k, v = schema.encode_record(key, value)
    return k, v


# --- where groups live ----------------------------------------------------------------------------


def java_hash_code(s: str) -> int:
    """String.hashCode computed independently of the product: s[0]*31^(n-1) + ... + s[n-1] over
    UTF-16 code units, as a signed 32-bit int."""
    units = array.array("H")
    units.frombytes(s.encode("utf-16-le" if sys.byteorder == "little" else "utf-16-be"))
    n = len(units)
    total = sum(u * pow(31, n - 1 - i, 1 << 32) for i, u in enumerate(units)) % (1 << 32)
    return total - (1 << 32) if total >= 1 << 31 else total


def old_partition_for(group: str, n: int) -> int:
    """Where rallypoint put a group before following Kafka's ``Utils.abs``: the Java hash masked
    with 0x7fffffff (wrong for every negative hash)."""
    h = java_hash_code(group)
    return (h & 0x7FFFFFFF if h != -(2**31) else 0) % n


def write_old_layout(data_dir: Path, n: int, records: dict[int, Sequence[tuple[Any, Any]]]) -> None:
    """A data dir as such a broker left it: every partition directory, and ``records``
    ((key, value or None) pairs of ``offsets_schema``) in the partitions given."""
    for p in range(n):
        pdir = partition_dir(data_dir, p)
        pdir.mkdir(parents=True, exist_ok=True)
        if p in records:
            entries = [schema.encode_record(k, v) for k, v in records[p]]
            (pdir / segment_name(0)).write_bytes(rec.build_batch(0, entries, 1000))


# --- the reference: what the broker's loader rebuilds -----------------------------------------------

# (broker, log partition, group, topic, partition)
OffsetKey = tuple[str, int, str, str, int]


@dataclass
class Loaded:
    offsets: dict[OffsetKey, schema.OffsetCommitValue]
    records: int  # records read (control records included)
    damaged_partitions: int  # partitions whose reading stopped at damage


def load_offsets(data_dirs: Sequence[tuple[str, Path]]) -> Loaded:
    """The committed offsets the broker's own recovery and loader (``coordinator/storage``) rebuild
    from each (broker name, data dir), every partition read up to its first damage without
    repairing anything: what the pipeline's ``offsets_latest`` must equal."""
    out = Loaded({}, 0, 0)
    for broker, data_dir in data_dirs:
        for n, pdir in list_partition_dirs(Path(data_dir)).items():
            rp = replay_partition(pdir, n, repair=False, stop_at_damage=True)
            out.records += rp.state.records
            out.damaged_partitions += rp.damage is not None
            out.offsets.update({(broker, n, k.group, k.topic, k.partition): v for k, v in rp.state.offsets.items()})
    return out
