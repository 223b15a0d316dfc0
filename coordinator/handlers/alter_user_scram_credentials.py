"""AlterUserScramCredentials (51): SCRAM users managed by admin clients (docs/security.md,
"Users and credentials"), validated as Kafka's ``ScramControlManager.alterCredentials``:

* a user altered twice in one request (deletions, then upsertions): DUPLICATE_RESOURCE;
* an empty name: UNACCEPTABLE_CREDENTIAL; a mechanism other than 1 (SCRAM-SHA-256) or 2
  (SCRAM-SHA-512): UNSUPPORTED_SASL_MECHANISM; iterations outside [4096, 16384]:
  UNACCEPTABLE_CREDENTIAL; deleting a credential that does not exist: RESOURCE_NOT_FOUND;
* an upsertion carries the salt and the salted password (the client derived it); the broker
  keeps salt, StoredKey, ServerKey and iterations (``ScramFormatter``), on disk before answering.
"""

from __future__ import annotations

import asyncio
from typing import Any

from rallypoint.protocol.errors import ErrorCode
from rallypoint.security.scram import BY_TYPE, MAX_ITERATIONS, MIN_ITERATIONS, credential_from_salted

from ..broker import RequestContext
from ..logger import get as get_logger

API_KEY = 51

log = get_logger("rallypoint.security")

TWICE = "A user credential cannot be altered twice in the same request"


def _check_name_and_mechanism(name: str, mechanism: int) -> tuple[ErrorCode, str] | None:
    if not name:
        return ErrorCode.UNACCEPTABLE_CREDENTIAL, "Username must not be empty"
    if mechanism not in BY_TYPE:
        return ErrorCode.UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism"
    return None


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    store = ctx.broker.credentials
    deletions: dict[str, Any] = {}
    upsertions: dict[str, Any] = {}
    errors: dict[str, tuple[ErrorCode, str]] = {}
    for d in request.deletions:
        if d.name in errors:
            continue
        if deletions.pop(d.name, None) is not None:
            errors[d.name] = (ErrorCode.DUPLICATE_RESOURCE, TWICE)
            continue
        err = _check_name_and_mechanism(d.name, int(d.mechanism))
        if err is None and store.scram(BY_TYPE[int(d.mechanism)], d.name) is None:
            err = (ErrorCode.RESOURCE_NOT_FOUND, "Attempt to delete a user credential that does not exist")
        if err is not None:
            errors[d.name] = err
        else:
            deletions[d.name] = d
    for u in request.upsertions:
        if u.name in errors:
            continue
        if deletions.pop(u.name, None) is not None or upsertions.pop(u.name, None) is not None:
            errors[u.name] = (ErrorCode.DUPLICATE_RESOURCE, TWICE)
            continue
        err = _check_name_and_mechanism(u.name, int(u.mechanism))
        if err is None and int(u.iterations) < MIN_ITERATIONS:
            err = (ErrorCode.UNACCEPTABLE_CREDENTIAL, "Too few iterations")
        elif err is None and int(u.iterations) > MAX_ITERATIONS:
            err = (ErrorCode.UNACCEPTABLE_CREDENTIAL, "Too many iterations")
        if err is not None:
            errors[u.name] = err
        else:
            upsertions[u.name] = u
    results: list[dict[str, Any]] = []
    for name, d in deletions.items():
        store.delete(BY_TYPE[int(d.mechanism)], name)
        results.append({"user": name, "error_code": ErrorCode.NONE, "error_message": None})
        log.info("scram credential deleted", user=name, mechanism=BY_TYPE[int(d.mechanism)])
    for name, u in upsertions.items():
        mechanism = BY_TYPE[int(u.mechanism)]
        cred = credential_from_salted(mechanism, bytes(u.salted_password), bytes(u.salt), int(u.iterations))
        store.upsert(mechanism, name, cred)
        results.append({"user": name, "error_code": ErrorCode.NONE, "error_message": None})
        log.info("scram credential set", user=name, mechanism=mechanism, iterations=int(u.iterations))
    for name, (code, message) in errors.items():
        results.append({"user": name, "error_code": code, "error_message": message})
    if deletions or upsertions:
        await asyncio.to_thread(store.save)  # on disk before the answer says so
    return {"throttle_time": 0, "results": results}
