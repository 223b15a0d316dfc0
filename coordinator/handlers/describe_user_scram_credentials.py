"""DescribeUserScramCredentials (50): the SCRAM mechanisms and iteration counts of users
(docs/security.md, "Users and credentials"), as Kafka's ``ScramImage.describe``:

* no user list (null or empty): every user with a SCRAM credential;
* a user named twice: DUPLICATE_RESOURCE; a user without credentials: RESOURCE_NOT_FOUND,
  each with Kafka's message.  Salts and keys are never sent.
"""

from __future__ import annotations

from typing import Any

from rallypoint.protocol.errors import ErrorCode
from rallypoint.security.scram import MECHANISMS

from ..broker import RequestContext

API_KEY = 50

DUPLICATE = "Cannot describe SCRAM credentials for the same user twice in a single request: "
NOT_FOUND = "Attempt to describe a user credential that does not exist: "


async def handle(ctx: RequestContext, request: Any) -> dict[str, Any]:
    store = ctx.broker.credentials
    asked = [u.name for u in request.users] if request.users else store.users()
    counts: dict[str, int] = {}
    for name in asked:
        counts[name] = counts.get(name, 0) + 1
    results = []
    for name, n in counts.items():
        if n > 1:
            results.append(
                {
                    "user": name,
                    "error_code": ErrorCode.DUPLICATE_RESOURCE,
                    "error_message": DUPLICATE + name,
                    "credential_infos": [],
                }
            )
            continue
        infos = [{"mechanism": MECHANISMS[m][1], "iterations": it} for m, it in store.mechanisms_of(name)]
        if infos:
            results.append(
                {"user": name, "error_code": ErrorCode.NONE, "error_message": None, "credential_infos": infos}
            )
        else:
            results.append(
                {
                    "user": name,
                    "error_code": ErrorCode.RESOURCE_NOT_FOUND,
                    "error_message": NOT_FOUND + name,
                    "credential_infos": [],
                }
            )
    return {"throttle_time": 0, "error_code": ErrorCode.NONE, "error_message": None, "results": results}
