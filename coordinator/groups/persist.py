"""The persistence hook between the group coordinator and the offsets log.

Contract: the offsets-log component (``rallypoint.storage.OffsetsLog``, ``broker.offsets_log``) has

    async def append(self, partition: int, records: Sequence[tuple[Key, Value | None]]) -> None

which returns once the records are appended and flushed, or raises :class:`rallypoint.storage.errors.PersistError`.
One call = one record batch.  ``None`` as a value is a tombstone.

The group coordinator releases every response that depends on records only after ``append``
returned (acknowledge-after-write), and maps append failures to the error codes Kafka's
group coordinator answers with (:func:`response_error`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeAlias

from rallypoint.protocol.errors import ErrorCode
from rallypoint.protocol.offsets_schema import GroupMetadataKey, GroupMetadataValue, OffsetCommitKey, OffsetCommitValue

Key: TypeAlias = OffsetCommitKey | GroupMetadataKey
Value: TypeAlias = OffsetCommitValue | GroupMetadataValue
Record: TypeAlias = tuple[Key, Value | None]


class OffsetsLog(Protocol):
    async def append(
        self,
        partition: int,
        records: Sequence[Record],
        *,
        producer: tuple[int, int] | None = None,
        marker: bool | None = None,
    ) -> None:
        """``producer``: a transactional batch of this (producer id, epoch); with ``marker`` the
        batch is instead that producer's COMMIT (True) or ABORT (False) control batch."""
        ...

    def append_now(self, partition: int, records: Sequence[Record]) -> bool:
        """Write at once when nothing can come between, or return False (then ``append``)."""
        ...


def response_error(append_error: ErrorCode) -> ErrorCode:
    """The error a client sees when an append failed with ``append_error``.

    Kafka's new coordinator maps every write failure the same way, for JoinGroup, SyncGroup,
    OffsetCommit, DeleteGroups, OffsetDelete ... (``CoordinatorOperationExceptionHelper.
    handleOperationException``; ``GroupMetadataManager.appendGroupMetadataErrorToResponseError``
    is the same table).
    """
    if append_error in (
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.NOT_ENOUGH_REPLICAS,
        ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        ErrorCode.REQUEST_TIMED_OUT,
    ):
        return ErrorCode.COORDINATOR_NOT_AVAILABLE
    if append_error in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.KAFKA_STORAGE_ERROR):
        return ErrorCode.NOT_COORDINATOR
    if append_error in (ErrorCode.MESSAGE_TOO_LARGE, ErrorCode.RECORD_LIST_TOO_LARGE, ErrorCode.INVALID_FETCH_SIZE):
        return ErrorCode.UNKNOWN_SERVER_ERROR
    if append_error == ErrorCode.NETWORK_EXCEPTION:
        return ErrorCode.COORDINATOR_LOAD_IN_PROGRESS
    return append_error
