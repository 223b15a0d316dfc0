"""Test support, shared by the tests and the benchmarks (bench/ imports only this package).

- :mod:`.broker`   — :class:`BrokerProcess`: a real broker process on 127.0.0.1 and a free port
- :mod:`.wire`     — :class:`WireClient` (raw requests at any version), :class:`FrameProxy`
- :mod:`.topics`   — :func:`create_topic`, :func:`ensure_topics`
- :mod:`.members`  — :class:`Member`: a consumer-group member of a real client library, in its
  own process (``consumer_member.py``)
- :mod:`.waits`    — :func:`wait_until` (and :func:`async_wait_until`): every wait is bounded
- :mod:`.paths`    — ``ROOT``, ``JS_DIR``

Fixtures (``broker``, ``broker_factory``, ``kcat``, ``node_js``) are in tests/conftest.py.
"""

from __future__ import annotations

from .broker import START_TIMEOUT_S, BrokerProcess, free_port
from .members import CLIENTS, Member, explain_members
from .paths import JS_DIR, ROOT
from .topics import create_topic, ensure_topics
from .waits import async_wait_until, wait_until
from .wire import FrameProxy, WireClient

__all__ = [
    "CLIENTS",
    "JS_DIR",
    "ROOT",
    "START_TIMEOUT_S",
    "BrokerProcess",
    "FrameProxy",
    "Member",
    "WireClient",
    "async_wait_until",
    "create_topic",
    "ensure_topics",
    "explain_members",
    "free_port",
    "wait_until",
]
