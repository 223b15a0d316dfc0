"""Share sessions (KIP-932; Kafka's ``ShareSessionCache`` and ``SharePartitionManager.newContext``):
sans-IO.  docs/share-groups.md, "Share sessions".

A session is keyed by (group id, member id) and remembers the partitions the member fetches
from, so that later requests list only changes.  Its epoch is shared by ShareFetch and
ShareAcknowledge:

* ShareFetch epoch 0 opens a session (replacing the member's old one); acknowledgements in it
  are INVALID_REQUEST; no room left (``group.share.max.share.sessions``) is
  SHARE_SESSION_LIMIT_REACHED.
* Any other epoch ≥ 1 needs the session (SHARE_SESSION_NOT_FOUND) at exactly that epoch
  (INVALID_SHARE_SESSION_EPOCH); the request's partitions are added, its forgotten ones removed,
  and the epoch moves on (wrapping after 2^31 - 1 to 1).
* Epoch -1 closes it (ShareFetch: with no partitions to fetch, else INVALID_REQUEST); the
  member's acquired records are then released by the caller.
* ShareAcknowledge never opens a session: epoch 0 is INVALID_SHARE_SESSION_EPOCH.
* A session belongs to the connection that last used it; when that connection closes, the
  session closes too (the caller releases the member's records).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from msgspec import Struct, field
from rallypoint.protocol.errors import ErrorCode

INITIAL_EPOCH = 0
FINAL_EPOCH = -1

SessionKey = tuple[str, str]  # (group id, member id)
TopicIdPartition = tuple[uuid.UUID, int]


class ShareSession(Struct):
    """One share session: its key, the epoch its next request must carry, its connection and partitions."""

    key: SessionKey
    epoch: int
    connection_id: int
    partitions: dict[TopicIdPartition, None] = field(default_factory=dict)  # ordered set
    last_used_ms: int = 0


class SessionError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def next_epoch(epoch: int) -> int:
    return 1 if epoch >= 2**31 - 1 else epoch + 1


class ShareSessions:
    def __init__(self, max_sessions: int = 2000) -> None:
        self.max_sessions = max_sessions
        self.sessions: dict[SessionKey, ShareSession] = {}

    def get(self, key: SessionKey) -> ShareSession | None:
        return self.sessions.get(key)

    def open(
        self, key: SessionKey, connection_id: int, partitions: Iterable[TopicIdPartition], now_ms: int
    ) -> ShareSession:
        """ShareFetch at epoch 0 (acknowledgements already refused by the caller)."""
        old = self.sessions.pop(key, None)
        if old is None and len(self.sessions) >= self.max_sessions:
            raise SessionError(
                ErrorCode.SHARE_SESSION_LIMIT_REACHED,
                f"The share session cache is full ({self.max_sessions} sessions)",
            )
        s = ShareSession(key, next_epoch(INITIAL_EPOCH), connection_id, dict.fromkeys(partitions), now_ms)
        self.sessions[key] = s
        return s

    def use(
        self,
        key: SessionKey,
        epoch: int,
        connection_id: int,
        now_ms: int,
        add: Iterable[TopicIdPartition] = (),
        forget: Iterable[TopicIdPartition] = (),
    ) -> ShareSession:
        """A ShareFetch or ShareAcknowledge at epoch ≥ 1: check, update, move the epoch on."""
        s = self.sessions.get(key)
        if s is None:
            raise SessionError(ErrorCode.SHARE_SESSION_NOT_FOUND, f"No share session found for member {key[1]}")
        if s.epoch != epoch:
            raise SessionError(
                ErrorCode.INVALID_SHARE_SESSION_EPOCH,
                f"Expected share session epoch {s.epoch}, got {epoch}",
            )
        for tp in forget:
            s.partitions.pop(tp, None)
        for tp in add:
            s.partitions[tp] = None
        s.epoch = next_epoch(s.epoch)
        s.connection_id = connection_id
        s.last_used_ms = now_ms
        return s

    def close(self, key: SessionKey) -> ShareSession:
        """Epoch -1: SHARE_SESSION_NOT_FOUND when there is none."""
        s = self.sessions.pop(key, None)
        if s is None:
            raise SessionError(ErrorCode.SHARE_SESSION_NOT_FOUND, f"No share session found for member {key[1]}")
        return s

    def drop(self, key: SessionKey) -> ShareSession | None:
        return self.sessions.pop(key, None)

    def of_connection(self, connection_id: int) -> list[ShareSession]:
        """The sessions a closing connection takes with it."""
        gone = [s for s in self.sessions.values() if s.connection_id == connection_id]
        for s in gone:
            del self.sessions[s.key]
        return gone

    def of_group(self, group_id: str) -> list[ShareSession]:
        return [s for s in self.sessions.values() if s.key[0] == group_id]
