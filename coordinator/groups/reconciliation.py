"""Per-member reconciliation of a consumer group towards its target assignment
(docs/consumer-groups.md, "Reconciliation"; Kafka's ``CurrentAssignmentBuilder.java``).

A member moves from its current assignment to its target in steps that never give one
partition two owners: partitions to revoke are first moved to *pending revocation* (the member
keeps its epoch and is told to drop them); only once the member's heartbeat no longer lists
them does it move to the target epoch; and a partition still owned or being revoked by another
member is held back (UNRELEASED_PARTITIONS) until that member lets it go.

Assignments map topic id -> {partition: assignment epoch} (KIP-1251: the epoch at which the
member was given the partition; an older-epoch offset commit is accepted for it).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Set
from enum import IntEnum
from typing import TypeAlias

from msgspec import Struct, field

EpochAssignment: TypeAlias = dict[uuid.UUID, dict[int, int]]


class MemberState(IntEnum):
    """Kafka's ``MemberState`` (stored in ConsumerGroupCurrentMemberAssignment.State)."""

    STABLE = 0
    UNREVOKED_PARTITIONS = 1
    UNRELEASED_PARTITIONS = 2
    UNKNOWN = 127


class MemberAssignment(Struct, frozen=True):
    """A member's reconciliation state: epochs, state, assigned and pending partitions."""

    epoch: int
    previous_epoch: int
    state: MemberState
    assigned: EpochAssignment = field(default_factory=dict)
    pending_revocation: EpochAssignment = field(default_factory=dict)

    def with_epoch(self, epoch: int) -> tuple[int, int]:
        """(epoch, previous epoch) after moving to ``epoch``."""
        if epoch == self.epoch:
            return self.epoch, self.previous_epoch
        return epoch, self.epoch

    def partitions(self) -> set[tuple[uuid.UUID, int]]:
        return {(t, p) for t, ps in self.assigned.items() for p in ps}


def _owns_any(owned: Mapping[uuid.UUID, Set[int]] | None, parts: EpochAssignment) -> bool:
    """Does the member still report owning any of ``parts``?  No report (null) counts as yes."""
    if owned is None:
        return True
    return any(p in owned.get(t, ()) for t, ps in parts.items() for p in ps)


def reconcile(
    current: MemberAssignment,
    target_epoch: int,
    target: Mapping[uuid.UUID, Set[int]],
    subscribed: Set[uuid.UUID],
    owned: Mapping[uuid.UUID, Set[int]] | None,
    partition_epoch: Callable[[uuid.UUID, int], int],
    subscription_changed: bool = False,
) -> MemberAssignment:
    """The member's next state (``CurrentAssignmentBuilder.build``).

    ``target`` is the member's target at ``target_epoch``; partitions of topics the member no
    longer subscribes to count as not targeted.  ``owned`` is what the member's heartbeat
    reported (None = not reported).  ``partition_epoch(t, p)`` is the epoch of the member that
    owns or is revoking the partition, -1 when free.
    """
    state = current.state
    if state == MemberState.STABLE:
        if current.epoch != target_epoch or subscription_changed:
            return _compute_next(current, target_epoch, target, subscribed, owned, partition_epoch)
        return current
    if state == MemberState.UNREVOKED_PARTITIONS:
        if _owns_any(owned, current.pending_revocation):
            if not subscription_changed:
                return current
            # drop newly unsubscribed topics too, still at the current epoch
            assigned = {t: dict(ps) for t, ps in current.assigned.items() if t in subscribed}
            pending = {t: dict(ps) for t, ps in current.pending_revocation.items()}
            for t, ps in current.assigned.items():
                if t not in subscribed:
                    pending.setdefault(t, {}).update(ps)
            return MemberAssignment(current.epoch, current.previous_epoch, state, assigned, pending)
        return _compute_next(current, target_epoch, target, subscribed, owned, partition_epoch)
    if state == MemberState.UNRELEASED_PARTITIONS:
        return _compute_next(current, target_epoch, target, subscribed, owned, partition_epoch)
    return current


def _compute_next(
    current: MemberAssignment,
    target_epoch: int,
    target: Mapping[uuid.UUID, Set[int]],
    subscribed: Set[uuid.UUID],
    owned: Mapping[uuid.UUID, Set[int]] | None,
    partition_epoch: Callable[[uuid.UUID, int], int],
) -> MemberAssignment:
    kept: EpochAssignment = {}
    revoke: EpochAssignment = {}
    to_assign: dict[uuid.UUID, set[int]] = {}
    unreleased = False
    for t in set(target) | set(current.assigned):
        tgt = target.get(t, set()) if t in subscribed else set()
        have = current.assigned.get(t, {})
        k = {p: e for p, e in have.items() if p in tgt}
        r = {p: e for p, e in have.items() if p not in tgt}
        if k:
            kept[t] = k
        if r:
            revoke[t] = r
        mine_pending = current.pending_revocation.get(t, {})
        new = set()
        for p in tgt:
            if p in k:
                continue
            if partition_epoch(t, p) != -1 and p not in mine_pending:
                unreleased = True
                continue
            new.add(p)
        if new:
            to_assign[t] = new
    if revoke and _owns_any(owned, revoke):
        return MemberAssignment(current.epoch, current.previous_epoch, MemberState.UNREVOKED_PARTITIONS, kept, revoke)
    epoch, previous = current.with_epoch(target_epoch)
    for t, ps in to_assign.items():
        kept.setdefault(t, {}).update(dict.fromkeys(ps, target_epoch))
    state = MemberState.UNRELEASED_PARTITIONS if unreleased else MemberState.STABLE
    return MemberAssignment(epoch, previous, state, kept, {})
