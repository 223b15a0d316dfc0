"""Topic helpers over the raw wire client: create topics and make sure they exist.

Each takes a :class:`~tests.support.broker.BrokerProcess` (a connection is opened for the call)
or an open :class:`~tests.support.wire.WireClient`, and asserts the broker answered without error.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from rallypoint.protocol import codec

from .broker import BrokerProcess
from .wire import WireClient

Target = BrokerProcess | WireClient


@contextmanager
def _client(target: Target) -> Iterator[WireClient]:
    if isinstance(target, WireClient):
        yield target
    else:
        with WireClient(target.host, target.port) as c:
            yield c


def create_topic(
    target: Target, name: str, partitions: int = 1, configs: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """CreateTopics (v7) for one topic; returns its result entry (error_code 0 asserted)."""
    body = {
        "topics": [
            {
                "name": name,
                "num_partitions": partitions,
                "replication_factor": 1,
                "assignments": [],
                "configs": [{"name": k, "value": v} for k, v in (configs or {}).items()],
            }
        ],
        "timeout": 5000,
        "validate_only": False,
    }
    with _client(target) as c:
        result: dict[str, Any] = codec.to_dict(c.call(19, 7, body))["topics"][0]
    assert result["error_code"] == 0, result
    return result


def ensure_topics(target: Target, *names: str) -> dict[str, int]:
    """Metadata (v12) with auto-creation: every topic in ``names`` exists afterwards (created
    with the broker's ``num.partitions`` if it did not).  Returns {name: partition count}."""
    with _client(target) as c:
        md = codec.to_dict(c.call(3, 12, {"topics": [{"name": n} for n in names], "allow_auto_topic_creation": True}))
    got = {t["name"]: t for t in md["topics"]}
    assert set(got) == set(names) and all(t["error_code"] == 0 for t in got.values()), md
    return {n: len(t["partitions"]) for n, t in got.items()}
