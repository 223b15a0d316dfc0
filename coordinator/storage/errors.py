"""Errors of the storage layer: failed appends, and errors that stop the broker before it listens."""

from __future__ import annotations

from rallypoint.protocol.errors import ErrorCode


class OffsetsLogStartError(Exception):
    """The offsets log cannot be opened safely (the CLI prints it and exits 1)."""


class PersistError(Exception):
    """An append to ``__consumer_offsets`` failed.

    ``error`` is the *storage-level* error, as Kafka's log layer would report it (a failed
    write or fsync is ``KAFKA_STORAGE_ERROR``); the coordinator maps it to the error the
    client sees with :func:`response_error`.
    """

    def __init__(self, message: str, error: ErrorCode = ErrorCode.KAFKA_STORAGE_ERROR) -> None:
        super().__init__(message)
        self.error = error
