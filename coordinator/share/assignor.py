"""The share groups' ``simple`` assignor (KIP-932; Kafka's ``SimpleAssignor``), pure.

docs/share-groups.md, "Assignment".  Several members may be given the same partition: share
groups divide records, not partitions.  For each member (in member-id order):

1. the member is hashed to one of its subscribed partitions (Java ``String.hashCode`` of the
   member id, modulo the partition count, absolute value — as Kafka computes it);
2. partitions no member was hashed to and nobody holds yet go round-robin to the members
   subscribed to their topic;
3. each member keeps what it held before, for topics it still subscribes to, plus what steps
   1–2 gave it.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence

from rallypoint.protocol.offsets_schema import java_string_hash

TopicPartition = tuple[uuid.UUID, int]
Assignment = dict[uuid.UUID, frozenset[int]]


def _java_int_mod(a: int, n: int) -> int:
    """Java's ``%`` on ints: the sign of the dividend."""
    r = abs(a) % n
    return -r if a < 0 else r


def assign(
    subscriptions: Mapping[str, Sequence[uuid.UUID]],
    partition_counts: Mapping[uuid.UUID, int],
    current: Mapping[str, Mapping[uuid.UUID, frozenset[int]]],
) -> dict[str, Assignment]:
    """``subscriptions``: member id → subscribed topic ids (existing topics, in subscription
    order); ``current``: each member's assignment so far.  Returns every member's assignment."""
    members = sorted(subscriptions)
    targets: dict[str, list[TopicPartition]] = {
        m: [(t, p) for t in subscriptions[m] for p in range(partition_counts.get(t, 0))] for m in members
    }
    new: dict[TopicPartition, list[str]] = {}
    for m in members:  # step 1
        tps = targets[m]
        if tps:
            tp = tps[abs(_java_int_mod(java_string_hash(m), len(tps)))]
            new.setdefault(tp, []).append(m)
    held: set[TopicPartition] = {(t, p) for a in current.values() for t, ps in a.items() for p in ps}
    subscribers: dict[uuid.UUID, list[str]] = {}
    ordered: list[TopicPartition] = []
    seen: set[TopicPartition] = set()
    for m in members:
        for t in dict.fromkeys(subscriptions[m]):
            subscribers.setdefault(t, []).append(m)
        for tp in targets[m]:
            if tp not in seen:
                seen.add(tp)
                ordered.append(tp)
    cursor: dict[uuid.UUID, int] = {}
    for tp in ordered:  # step 2
        if tp in new or tp in held:
            continue
        subs = subscribers[tp[0]]
        i = cursor.get(tp[0], 0)
        new.setdefault(tp, []).append(subs[i % len(subs)])
        cursor[tp[0]] = i + 1
    out: dict[str, dict[uuid.UUID, set[int]]] = {m: {} for m in members}
    for m in members:  # step 3
        subscribed = set(subscriptions[m])
        for t, ps in current.get(m, {}).items():
            if t in subscribed:
                valid = {p for p in ps if p < partition_counts.get(t, 0)}
                if valid:
                    out[m].setdefault(t, set()).update(valid)
    for (t, p), ms in new.items():
        for m in ms:
            out[m].setdefault(t, set()).add(p)
    return {m: {t: frozenset(ps) for t, ps in a.items()} for m, a in out.items()}
