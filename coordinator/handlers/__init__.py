"""One module per API, each with ``API_KEY`` and ``async def handle(ctx, request)``.

``ctx`` is the :class:`~rallypoint.broker.RequestContext` (the broker's typed parts, the request
header, the client's address); ``request`` is the decoded body (a kio entity of the request's
version).  ``handle`` returns a dict (the response body, built for the request's version by
``protocol.codec``) or ``None`` when no response is sent (Produce with acks=0).
Handlers are thin: decode (done by the server) → ask the broker's components → answer.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from rallypoint.protocol.apis import SERVED_APIS

from ..broker import RequestContext

Handler = Callable[[RequestContext, Any], Awaitable[Mapping[str, Any] | None]]

# Module per served API key.  Keep in step with protocol/apis.py (a test checks both ways).
MODULES: dict[int, str] = {
    18: "api_versions",
    3: "metadata",
    0: "produce",
    1: "fetch",
    2: "list_offsets",
    19: "create_topics",
    20: "delete_topics",
    22: "init_producer_id",
    23: "offset_for_leader_epoch",
    37: "create_partitions",
    8: "offset_commit",
    9: "offset_fetch",
    10: "find_coordinator",
    11: "join_group",
    12: "heartbeat",
    13: "leave_group",
    14: "sync_group",
    15: "describe_groups",
    16: "list_groups",
    42: "delete_groups",
    47: "offset_delete",
    68: "consumer_group_heartbeat",
    69: "consumer_group_describe",
    76: "share_group_heartbeat",
    77: "share_group_describe",
    78: "share_fetch",
    79: "share_acknowledge",
    17: "sasl_handshake",
    36: "sasl_authenticate",
    50: "describe_user_scram_credentials",
    51: "alter_user_scram_credentials",
    32: "describe_configs",
    33: "alter_configs",
    44: "incremental_alter_configs",
    21: "delete_records",
    60: "describe_cluster",
    75: "describe_topic_partitions",
    35: "describe_log_dirs",
    43: "elect_leaders",
    24: "add_partitions_to_txn",
    25: "add_offsets_to_txn",
    26: "end_txn",
    28: "txn_offset_commit",
    61: "describe_producers",
    65: "describe_transactions",
    66: "list_transactions",
}


def load_handlers() -> dict[int, Handler]:
    handlers: dict[int, Handler] = {}
    for key, name in MODULES.items():
        mod = importlib.import_module(f"{__name__}.{name}")
        assert mod.API_KEY == key, name
        handlers[key] = mod.handle
    missing = set(SERVED_APIS) - set(handlers)
    if missing:
        raise RuntimeError(f"APIs advertised without a handler: {sorted(missing)}")
    return handlers
