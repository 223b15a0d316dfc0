"""Server-side assignors of consumer groups: ``uniform`` and ``range`` (docs/consumer-groups.md,
"Assignors").

Pure functions: a :class:`GroupSpec` (members with their subscribed topic ids and current
target) and the partition count of every subscribed topic in, the new target out.  The
algorithms are Kafka's (``UniformHomogeneousAssignmentBuilder.java``,
``UniformHeterogeneousAssignmentBuilder.java``, ``RangeAssignor.java``); where Kafka walks a
``HashMap`` rallypoint walks members in sorted member-id order, so *which* member gets which
partition may differ from Kafka's, but the guarantees are the same: every subscribed partition
is assigned exactly once, the uniform result is balanced (±1 for a homogeneous group) and
sticky, the range result is Kafka's (deterministic, static members ordered by instance id).
"""

from __future__ import annotations

import bisect
import uuid
from collections.abc import Mapping
from typing import Final, Protocol, TypeAlias

from msgspec import Struct, field

Assignment: TypeAlias = dict[uuid.UUID, frozenset[int]]
"""topic id -> partitions."""


class MemberSpec(Struct, frozen=True):
    """One member as an assignor sees it: its ids, rack, subscribed topic ids and current target."""

    member_id: str
    instance_id: str | None
    rack_id: str | None
    subscribed: frozenset[uuid.UUID]  # existing topics only
    current: Mapping[uuid.UUID, frozenset[int]] = field(default_factory=dict)  # current target


class GroupSpec(Struct, frozen=True):
    """An assignor's input: the members, whether they all subscribe alike, and each topic's partition count."""

    members: Mapping[str, MemberSpec]
    homogeneous: bool
    partitions: Mapping[uuid.UUID, int]  # partition count of every subscribed topic


class AssignorError(Exception):
    """The assignor could not produce an assignment (Kafka's PartitionAssignorException)."""


class Assignor(Protocol):
    name: str

    def assign(self, spec: GroupSpec) -> dict[str, Assignment]: ...


def _freeze(a: Mapping[uuid.UUID, set[int]]) -> Assignment:
    return {t: frozenset(ps) for t, ps in a.items() if ps}


# ------------------------------------------------------------------------------ uniform


class UniformAssignor:
    """Balance first, then stickiness (``UniformAssignor.java``)."""

    name = "uniform"

    def assign(self, spec: GroupSpec) -> dict[str, Assignment]:
        if not spec.members:
            return {}
        if spec.homogeneous:
            return self._homogeneous(spec)
        return self._heterogeneous(spec)

    @staticmethod
    def _homogeneous(spec: GroupSpec) -> dict[str, Assignment]:
        ids = sorted(spec.members)
        topics = sorted(next(iter(spec.members.values())).subscribed & set(spec.partitions), key=str)
        # partitions are numbered 0..P-1 across the topics (topic i starts at starts[i])
        index = {t: i for i, t in enumerate(topics)}
        starts: list[int] = []
        total = 0
        for t in topics:
            starts.append(total)
            total += spec.partitions[t]
        quota, extra = divmod(total, len(ids))
        taken = bytearray(total)
        result: dict[str, list[int]] = {}
        # 1. every member keeps what it had, up to its quota (+1 while extra slots remain)
        for mid in ids:
            kept: list[int] = []
            cur = spec.members[mid].current
            for t in sorted(cur, key=str):
                ti = index.get(t)
                if ti is None:
                    continue  # no longer subscribed (or gone)
                n, base = spec.partitions[t], starts[ti]
                for p in sorted(cur[t]):
                    if p < n and not taken[base + p]:
                        kept.append(base + p)
                        taken[base + p] = 1
            limit = quota
            if len(kept) > quota and extra > 0:
                limit = quota + 1
                extra -= 1
            for g in kept[limit:]:
                taken[g] = 0  # released to the unassigned list
            result[mid] = kept[:limit]
        unassigned = [g for g in range(total) if not taken[g]]
        # 2. fill members up to the quota, then hand out the remaining extra slots
        pos = 0
        for mid in ids:
            need = quota - len(result[mid])
            if need > 0:
                result[mid].extend(unassigned[pos : pos + need])
                pos += need
        for mid in ids:
            if extra <= 0 or pos >= len(unassigned):
                break
            if len(result[mid]) == quota:
                result[mid].append(unassigned[pos])
                pos += 1
                extra -= 1
        if pos < len(unassigned):
            raise AssignorError("partitions left unassigned")
        out: dict[str, Assignment] = {}
        for mid, gs in result.items():
            a: dict[uuid.UUID, set[int]] = {}
            for g in gs:
                ti = bisect.bisect_right(starts, g) - 1
                a.setdefault(topics[ti], set()).add(g - starts[ti])
            out[mid] = _freeze(a)
        return out

    @staticmethod
    def _heterogeneous(spec: GroupSpec) -> dict[str, Assignment]:
        ids = sorted(spec.members)
        subscribers: dict[uuid.UUID, list[str]] = {}
        for mid in ids:
            for t in spec.members[mid].subscribed:
                if t in spec.partitions:
                    subscribers.setdefault(t, []).append(mid)
        # topics with the most partitions per subscriber first, then fewer subscribers, then id
        order = sorted(
            subscribers,
            key=lambda t: (-spec.partitions[t] / len(subscribers[t]), len(subscribers[t]), str(t)),
        )
        owned: dict[str, dict[uuid.UUID, set[int]]] = {mid: {} for mid in ids}
        load = dict.fromkeys(ids, 0)
        owner: dict[tuple[uuid.UUID, int], str] = {}
        # 1. keep current partitions of topics still subscribed (dropping unsubscribed ones)
        for mid in ids:
            m = spec.members[mid]
            for t, ps in m.current.items():
                if t not in m.subscribed or t not in spec.partitions:
                    continue
                for p in ps:
                    if p < spec.partitions[t] and (t, p) not in owner:
                        owner[(t, p)] = mid
                        owned[mid].setdefault(t, set()).add(p)
                        load[mid] += 1
        # 2. unassigned partitions to the least loaded subscriber
        for t in order:
            for p in range(spec.partitions[t]):
                if (t, p) in owner:
                    continue
                mid = min(subscribers[t], key=lambda x: (load[x], x))
                owner[(t, p)] = mid
                owned[mid].setdefault(t, set()).add(p)
                load[mid] += 1
        # 3. rebalance topics with two or more subscribers (bounded number of moves)
        budget = sum(spec.partitions[t] for t in order) * 2 + 16
        changed = True
        while changed and budget > 0:
            changed = False
            for t in order:
                subs = subscribers[t]
                if len(subs) < 2:
                    continue
                while budget > 0:
                    donors = [x for x in subs if owned[x].get(t)]
                    if not donors:
                        break
                    donor = max(donors, key=lambda x: (load[x], x))
                    taker = min(subs, key=lambda x: (load[x], x))
                    if load[donor] - load[taker] <= 1:
                        break
                    p = max(owned[donor][t])
                    owned[donor][t].discard(p)
                    owned[taker].setdefault(t, set()).add(p)
                    load[donor] -= 1
                    load[taker] += 1
                    budget -= 1
                    changed = True
        return {mid: _freeze(owned[mid]) for mid in ids}


def _group(parts: list[tuple[uuid.UUID, int]]) -> Assignment:
    out: dict[uuid.UUID, set[int]] = {}
    for t, p in parts:
        out.setdefault(t, set()).add(p)
    return _freeze(out)


# -------------------------------------------------------------------------------- range


def range_order(members: Mapping[str, MemberSpec]) -> list[str]:
    """Static members first, ordered by instance id; then dynamic members by member id."""
    static = sorted((m for m in members.values() if m.instance_id is not None), key=lambda m: m.instance_id or "")
    dynamic = sorted((m for m in members.values() if m.instance_id is None), key=lambda m: m.member_id)
    return [m.member_id for m in static + dynamic]


class RangeAssignor:
    """Contiguous ranges per topic, co-partitioned across topics (``RangeAssignor.java``)."""

    name = "range"

    def assign(self, spec: GroupSpec) -> dict[str, Assignment]:
        order = range_order(spec.members)
        out: dict[str, dict[uuid.UUID, set[int]]] = {mid: {} for mid in order}
        for t in sorted(spec.partitions, key=str):
            subs = [mid for mid in order if t in spec.members[mid].subscribed]
            if not subs:
                continue
            quota, extra = divmod(spec.partitions[t], len(subs))
            start = 0
            for i, mid in enumerate(subs):
                n = quota + (1 if i < extra else 0)
                if n:
                    out[mid][t] = set(range(start, start + n))
                start += n
        return {mid: _freeze(a) for mid, a in out.items()}


BUILTIN: Final[dict[str, Assignor]] = {"uniform": UniformAssignor(), "range": RangeAssignor()}
