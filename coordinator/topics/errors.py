"""The one exception topic operations raise: a Kafka error code and Kafka's message."""

from __future__ import annotations

from rallypoint.protocol.errors import ErrorCode


class TopicError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
