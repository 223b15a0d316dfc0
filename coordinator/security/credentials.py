"""The users SASL listeners accept (docs/security.md, "Users and credentials").

* ``rallypoint.sasl.users=alice:alice-secret,...``: users of PLAIN (their passwords stay in
  memory, never on disk) and of both SCRAM mechanisms (credentials derived at start with a
  fresh salt and ``rallypoint.sasl.scram.iterations``);
* AlterUserScramCredentials adds, changes and deletes SCRAM credentials: kept salted in
  ``<data.dir>/scram-credentials.json`` (salt, StoredKey, ServerKey, iterations, as Kafka's
  ``ScramCredential``), written atomically before the admin API answers, loaded at start.  A
  deletion of a configured user's credential is kept too (as a tombstone), so it survives a restart.
"""

from __future__ import annotations

import hmac
import json
import os
from pathlib import Path
from typing import Any

from ..logger import get as get_logger
from .scram import MECHANISMS, ScramCredential, make_credential

log = get_logger("rallypoint.security")

FILE_NAME = "scram-credentials.json"


def parse_users(value: str | None) -> dict[str, str]:
    """``alice:alice-secret,bob:bob-secret`` → {user: password}; ValueError if malformed."""
    users: dict[str, str] = {}
    for item in (value or "").split(","):
        if not item.strip():
            continue
        user, sep, password = item.strip().partition(":")
        if not sep or not user or not password:
            raise ValueError(f"rallypoint.sasl.users entry {item.strip()!r} is not user:password")
        if user in users:
            raise ValueError(f"rallypoint.sasl.users names {user!r} twice")
        users[user] = password
    return users


class CredentialStore:
    def __init__(self, users: dict[str, str], iterations: int, data_dir: Path | None) -> None:
        self._plain = dict(users)
        self._path = None if data_dir is None else data_dir / FILE_NAME
        # mechanism -> user -> credential
        self._scram: dict[str, dict[str, ScramCredential]] = {m: {} for m in MECHANISMS}
        for user, password in users.items():
            for m in MECHANISMS:
                self._scram[m][user] = make_credential(m, password, iterations)
        # what the admin APIs changed: mechanism -> user -> credential, or None (deleted)
        self._changes: dict[str, dict[str, ScramCredential | None]] = {m: {} for m in MECHANISMS}
        self._load()

    @classmethod
    def from_config(cls, cfg: Any, data_dir: Path | None) -> CredentialStore:
        return cls(parse_users(cfg["rallypoint.sasl.users"]), cfg["rallypoint.sasl.scram.iterations"], data_dir)

    # -- lookups

    def check_plain(self, user: str, password: str) -> bool:
        expected = self._plain.get(user)
        # compare in constant time even for an unknown user
        ok = hmac.compare_digest((expected or "\0").encode(), password.encode())
        return expected is not None and ok

    def scram(self, mechanism: str, user: str) -> ScramCredential | None:
        return self._scram[mechanism].get(user)

    def users(self) -> list[str]:
        return sorted({u for creds in self._scram.values() for u in creds})

    def mechanisms_of(self, user: str) -> list[tuple[str, int]]:
        """(mechanism, iterations) of ``user``'s SCRAM credentials."""
        return [(m, c.iterations) for m in MECHANISMS if (c := self._scram[m].get(user)) is not None]

    # -- changes (AlterUserScramCredentials)

    def upsert(self, mechanism: str, user: str, cred: ScramCredential) -> None:
        self._scram[mechanism][user] = cred
        self._changes[mechanism][user] = cred

    def delete(self, mechanism: str, user: str) -> bool:
        if self._scram[mechanism].pop(user, None) is None:
            return False
        self._changes[mechanism][user] = None
        return True

    def save(self) -> None:
        if self._path is None:
            return
        doc = {
            m: {u: (None if c is None else c.to_json()) for u, c in sorted(changes.items())}
            for m, changes in self._changes.items()
        }
        self._path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._path.with_suffix(".tmp")
        with open(tmp, "w") as f:
            json.dump({"version": 1, "credentials": doc}, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self._path)

    def _load(self) -> None:
        if self._path is None or not self._path.exists():
            return
        doc = json.loads(self._path.read_text())
        for m, changes in doc.get("credentials", {}).items():
            if m not in MECHANISMS:
                continue
            for user, c in changes.items():
                if c is None:
                    self._changes[m][user] = None
                    self._scram[m].pop(user, None)
                else:
                    cred = ScramCredential.from_json(c)
                    self._changes[m][user] = cred
                    self._scram[m][user] = cred
        log.info("scram credentials loaded", path=str(self._path), users=len(self.users()))
