"""Every ``__consumer_offsets`` record the group coordinator writes is built here.

Kafka's counterpart is ``GroupCoordinatorRecordHelpers.java``.  The record kinds and when each
is written are listed in docs/groups.md, "Records written"; their byte layout is in
docs/offsets-log-format.md.  A ``None`` value is a tombstone.
"""

from __future__ import annotations

from collections.abc import Mapping

from rallypoint.protocol.offsets_schema import (
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadata,
    OffsetCommitKey,
    OffsetCommitValue,
)

from .model import ClassicGroup
from .persist import Record


def group_metadata(group: ClassicGroup, assignment: Mapping[str, bytes]) -> Record:
    """The group with every member and its assignment (``newGroupMetadataRecord``): written
    when the leader's assignment is stored, when a join phase ends with no member and when a
    static member is replaced without a rebalance."""
    members = tuple(
        MemberMetadata(
            m.member_id,
            m.group_instance_id,
            m.client_id,
            m.client_host,
            m.rebalance_timeout_ms,
            m.session_timeout_ms,
            m.metadata(group.protocol_name),
            assignment[m.member_id],
        )
        for m in group.members.values()
    )
    value = GroupMetadataValue(
        protocol_type=group.protocol_type or "",
        generation=group.generation,
        protocol=group.protocol_name,
        leader=group.leader_id,
        current_state_timestamp=-1 if group.state_timestamp is None else group.state_timestamp,
        members=members,
    )
    return (GroupMetadataKey(group.group_id), value)


def empty_group_metadata(group: ClassicGroup) -> Record:
    """The record that makes a group created by JoinGroup durable (``newEmptyGroupMetadataRecord``):
    no protocol type yet, generation 0, no member."""
    value = GroupMetadataValue(
        protocol_type="",
        generation=0,
        protocol=None,
        leader=None,
        current_state_timestamp=-1 if group.state_timestamp is None else group.state_timestamp,
        members=(),
    )
    return (GroupMetadataKey(group.group_id), value)


def group_tombstone(group_id: str) -> Record:
    """The group is gone (DeleteGroups, or offsets retention removed an Empty group)."""
    return (GroupMetadataKey(group_id), None)


def offset_commit(group_id: str, topic: str, partition: int, value: OffsetCommitValue) -> Record:
    """One committed offset (``newOffsetCommitRecord``)."""
    return (OffsetCommitKey(group_id, topic, partition), value)


def offset_tombstone(group_id: str, topic: str, partition: int) -> Record:
    """A committed offset is gone (OffsetDelete, DeleteGroups, retention, topic deletion)."""
    return (OffsetCommitKey(group_id, topic, partition), None)
