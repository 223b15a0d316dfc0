"""The checks a request passes before it reaches a group, in one place.

Kafka splits them between ``GroupCoordinatorService`` (the coordinator is active; the group id
is not empty, for the APIs that check it) and its runtime (the group's ``__consumer_offsets``
partition is loaded).  Which API checks what, and what it answers, is the table in
docs/groups.md, "Request pre-checks".
"""

from __future__ import annotations

from rallypoint.protocol.errors import ErrorCode

from .context import Context

E = ErrorCode


def service(ctx: Context, group_id: str | None) -> ErrorCode | None:
    """``GroupCoordinatorService``: COORDINATOR_NOT_AVAILABLE while not active, then
    INVALID_GROUP_ID for an empty group id (pass ``None`` for the APIs that do not check it)."""
    if not ctx.active:
        return E.COORDINATOR_NOT_AVAILABLE
    if group_id is not None and not group_id:
        return E.INVALID_GROUP_ID
    return None


def partition(ctx: Context, group_id: str) -> ErrorCode | None:
    """The runtime: COORDINATOR_LOAD_IN_PROGRESS while the group's partition is loading."""
    if ctx.partition_for(group_id) in ctx.loading:
        return E.COORDINATOR_LOAD_IN_PROGRESS
    return None


def request(ctx: Context, group_id: str, *, validate_id: bool = True) -> ErrorCode | None:
    """Both, in Kafka's order."""
    return service(ctx, group_id if validate_id else None) or partition(ctx, group_id)


def any_loading(ctx: Context) -> ErrorCode | None:
    """ListGroups spans every partition: it answers nothing partial while one loads."""
    return service(ctx, None) or (E.COORDINATOR_LOAD_IN_PROGRESS if ctx.loading else None)
