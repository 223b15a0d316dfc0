"""Topic metadata limits: partition caps, topics.json written off the loop and group-committed,
CreateTopics checked before it creates, bounded restarts (docs/reliability.md, "Limits").

Handler tests run the handlers in-process against a real broker object (no sockets); the
durability and start-up ones run real broker processes.
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from rallypoint import config as config_mod
from rallypoint.assemble import build_broker
from rallypoint.broker import Broker, RequestContext
from rallypoint.handlers import create_partitions, create_topics, metadata
from rallypoint.protocol import codec
from rallypoint.protocol.errors import ErrorCode
from rallypoint.topics import TopicError, TopicStore
from rallypoint.topics.store import TopicStateError

from tests.support import BrokerProcess, WireClient

pytestmark = [pytest.mark.wire, pytest.mark.slow]

TOO_MANY = "Excessively large number of partitions per request."


def make_broker(tmp_path: Path, **overrides: str) -> Broker:
    return build_broker(config_mod.load({"data.dir": str(tmp_path), **overrides}, env={}))


def ctx(broker: Broker, api_key: int, version: int) -> RequestContext:
    return RequestContext(broker, api_key, version, 1, "test", "127.0.0.1", 1)


def topic(name: str, partitions: int, configs: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "num_partitions": partitions,
        "replication_factor": 1,
        "assignments": [],
        "configs": [{"name": k, "value": v} for k, v in (configs or {}).items()],
    }


async def create(broker: Broker, topics: list[dict[str, Any]], version: int = 7) -> list[tuple[str, int]]:
    request = codec.build_request(19, version, {"topics": topics, "timeout": 1000, "validate_only": False})
    resp = await create_topics.handle(ctx(broker, 19, version), request)
    return [(t["name"], int(t["error_code"])) for t in resp["topics"]]


# --------------------------------------------------------------------------- partition caps


async def test_partitions_per_request_are_capped_as_kafka_caps_them(tmp_path: Path) -> None:
    broker = make_broker(tmp_path)
    assert await create(broker, [topic("a", 9_999), topic("b", 2)]) == [
        ("a", ErrorCode.POLICY_VIOLATION),
        ("b", ErrorCode.POLICY_VIOLATION),
    ]
    assert broker.topics.get("a") is None and broker.topics.get("b") is None
    # -1 counts as num.partitions; invalid counts add nothing (Kafka's validateTotalNumberOfPartitions)
    assert await create(broker, [topic("c", 10_000), topic("d", -5)]) == [
        ("c", ErrorCode.NONE),
        ("d", ErrorCode.INVALID_PARTITIONS),
    ]
    assert await create(broker, [topic("e", 9_999), topic("f", -1)], version=4) == [
        ("e", ErrorCode.NONE),
        ("f", ErrorCode.NONE),
    ]


async def test_the_per_request_cap_is_a_setting(tmp_path: Path) -> None:
    broker = make_broker(tmp_path, **{"rallypoint.create.max.partitions": "10"})
    assert await create(broker, [topic("a", 11)]) == [("a", ErrorCode.POLICY_VIOLATION)]
    assert await create(broker, [topic("a", 10)]) == [("a", ErrorCode.NONE)]


async def test_the_broker_partition_cap_refuses_topics_not_requests(tmp_path: Path) -> None:
    broker = make_broker(tmp_path, **{"rallypoint.max.broker.partitions": "100"})
    held = broker.topics.partition_count  # nothing yet: __consumer_offsets comes with a coordinator
    assert await create(broker, [topic("a", 60 - held), topic("b", 50), topic("c", 40)]) == [
        ("a", ErrorCode.NONE),
        ("b", ErrorCode.POLICY_VIOLATION),  # 60 + 50 > 100
        ("c", ErrorCode.NONE),  # 60 + 40 = 100
    ]
    assert broker.topics.partition_count == 100
    request = codec.build_request(37, 3, {"topics": [{"name": "a", "count": 61, "assignments": None}], "timeout": 1000})
    resp = await create_partitions.handle(ctx(broker, 37, 3), request)
    assert [(r["name"], int(r["error_code"])) for r in resp["results"]] == [("a", ErrorCode.POLICY_VIOLATION)]
    # internal topics are exempt (the coordinator needs them) but count
    broker.topics.create("__consumer_offsets", 5, is_internal=True)
    assert broker.topics.partition_count == 105
    with pytest.raises(TopicError) as e:
        broker.topics.create("d", 1)
    assert e.value.code == ErrorCode.POLICY_VIOLATION
    broker.topics.delete("c")
    assert broker.topics.partition_count == 65
    assert await create(broker, [topic("d", 35)]) == [("d", ErrorCode.NONE)]


async def test_create_partitions_caps_the_request_total(tmp_path: Path) -> None:
    broker = make_broker(tmp_path)
    assert await create(broker, [topic("a", 1), topic("b", 1)]) == [("a", 0), ("b", 0)]
    body: dict[str, Any] = {
        "topics": [
            {"name": "a", "count": 5001, "assignments": None},
            {"name": "b", "count": 5002, "assignments": None},
        ],
        "timeout": 1000,
    }
    resp = await create_partitions.handle(ctx(broker, 37, 3), codec.build_request(37, 3, body))
    assert [(r["name"], int(r["error_code"]), r["error_message"]) for r in resp["results"]] == [
        ("a", ErrorCode.POLICY_VIOLATION, TOO_MANY),
        ("b", ErrorCode.POLICY_VIOLATION, TOO_MANY),
    ]
    body["topics"][1]["count"] = 5001
    resp = await create_partitions.handle(ctx(broker, 37, 3), codec.build_request(37, 3, body))
    assert [int(r["error_code"]) for r in resp["results"]] == [0, 0]
    assert [len(broker.topics.get(n).partitions) for n in "ab"] == [5001, 5001]  # type: ignore[union-attr]


# --------------------------------------------------------------------------- never halfway


async def test_create_topics_checks_every_topic_before_creating_any(tmp_path: Path) -> None:
    broker = make_broker(tmp_path, **{"rallypoint.max.broker.partitions": "10"})
    calls: list[str] = []
    real_create = broker.topics.create

    def spy(name: str, *args: Any, **kwargs: Any) -> Any:
        calls.append(name)
        return real_create(name, *args, **kwargs)

    broker.topics.create = spy  # type: ignore[method-assign]
    result = await create(
        broker,
        [
            topic("ok-1", 2),
            topic("bad config", 1, {"no.such.config": "1"}),
            topic("bad-config", 1, {"no.such.config": "1"}),
            topic("too-big", 9),
            topic("ok-2", 3),
        ],
    )
    assert result == [
        ("ok-1", ErrorCode.NONE),
        ("bad config", ErrorCode.INVALID_TOPIC_EXCEPTION),
        ("bad-config", ErrorCode.INVALID_CONFIG),
        ("too-big", ErrorCode.POLICY_VIOLATION),
        ("ok-2", ErrorCode.NONE),
    ]
    assert calls == ["ok-1", "ok-2"]  # only topics that passed every check reach the store


async def test_a_topic_created_meanwhile_is_answered_as_existing(tmp_path: Path) -> None:
    """Phase 2 yields while it builds a topic's logs; a racing creation is an answer, not an error."""
    broker = make_broker(tmp_path)
    store = broker.topics
    real_build = store.build_partitions
    raced = asyncio.Event()

    async def build(name: str, count: int, start: int = 0) -> Any:
        if name == "race":
            await raced.wait()  # another connection creates "race" while this one builds it
        return await real_build(name, count, start)

    store.build_partitions = build  # type: ignore[method-assign]
    task = asyncio.create_task(create(broker, [topic("first", 3), topic("race", 1)]))
    while store.get("first") is None:
        await asyncio.sleep(0)
    store.create("race", 2)
    raced.set()
    assert await task == [("first", ErrorCode.NONE), ("race", ErrorCode.TOPIC_ALREADY_EXISTS)]


# --------------------------------------------------------------------------- Metadata


async def metadata_call(broker: Broker, version: int, body: dict[str, Any]) -> dict[str, Any]:
    answer = await metadata.handle(ctx(broker, 3, version), codec.build_request(3, version, body))
    if isinstance(answer, codec.Encoded):  # a cached answer (all topics known): read it back
        return codec.to_dict(codec.decode_response(3, version, answer.body))
    return answer


async def test_metadata_answers_each_topic_once(tmp_path: Path) -> None:
    broker = make_broker(tmp_path)
    await create(broker, [topic("a", 2)])
    resp = await metadata_call(broker, 12, {"topics": [{"name": n} for n in ["a", "x", "a", "x", "a"]]})
    assert [(t["name"], int(t["error_code"])) for t in resp["topics"]] == [("a", 0), ("x", 0)]


async def test_metadata_auto_creation_is_capped_per_request(tmp_path: Path) -> None:
    broker = make_broker(tmp_path, **{"rallypoint.auto.create.topics.max.per.request": "3"})
    names = [f"t{i}" for i in range(5)]
    body = {"topics": [{"name": n} for n in names], "allow_auto_topic_creation": True}
    resp = await metadata_call(broker, 12, body)
    assert [int(t["error_code"]) for t in resp["topics"]] == [0, 0, 0, 3, 3]
    resp = await metadata_call(broker, 12, body)  # the client retries: the rest are created now
    assert [int(t["error_code"]) for t in resp["topics"]] == [0, 0, 0, 0, 0]


async def test_metadata_auto_creation_respects_the_partition_caps(tmp_path: Path) -> None:
    broker = make_broker(tmp_path, **{"num.partitions": "4", "rallypoint.create.max.partitions": "10"})
    resp = await metadata_call(broker, 4, {"topics": [{"name": f"t{i}"} for i in range(4)]})
    assert [int(t["error_code"]) for t in resp["topics"]] == [0, 0, 3, 3]  # 4 + 4 <= 10 < 12
    small = make_broker(tmp_path / "small", **{"rallypoint.max.broker.partitions": "2"})
    resp = await metadata_call(small, 4, {"topics": [{"name": f"t{i}"} for i in range(3)]})
    assert [int(t["error_code"]) for t in resp["topics"]] == [0, 0, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION]


@pytest.mark.parametrize("version", [10, 11])
async def test_metadata_v10_v11_refuse_null_names_and_topic_ids(tmp_path: Path, version: int) -> None:
    broker = make_broker(tmp_path)
    tid = uuid.uuid4()
    resp = await metadata_call(broker, version, {"topics": [{"name": "a"}, {"name": "b", "topic_id": tid}]})
    assert [(t["name"], t["topic_id"], int(t["error_code"])) for t in resp["topics"]] == [
        ("a", uuid.UUID(int=0), ErrorCode.INVALID_REQUEST),
        ("b", tid, ErrorCode.INVALID_REQUEST),
    ]
    assert resp["brokers"] == [] and resp["controller_id"] == -1
    codec.encode_response(3, version, 1, resp)  # and it can be sent


# --------------------------------------------------------------------------- topics.json


async def test_metadata_changes_share_one_write_done_off_the_loop(tmp_path: Path) -> None:
    store = TopicStore(data_dir=tmp_path)
    writes: list[str] = []
    real_write = store._write

    def spy(state: dict[str, Any], generation: int, reserved: Any) -> None:
        writes.append(threading.current_thread().name)
        real_write(state, generation, reserved)

    store._write = spy  # type: ignore[method-assign]
    for i in range(200):
        store.create(f"t{i}", 1)
    assert writes == []  # in the broker (a loop runs), a change waits for persist()
    await asyncio.gather(*(store.persist() for _ in range(50)))
    assert len(writes) == 1 and writes[0] != threading.current_thread().name
    state = json.loads((tmp_path / "topics.json").read_text())
    assert len(state["topics"]) == 200
    await store.persist()  # nothing new: no write
    assert len(writes) == 1


async def test_a_change_made_during_a_write_gets_its_own(tmp_path: Path) -> None:
    store = TopicStore(data_dir=tmp_path)
    gate = threading.Event()
    real_write = store._write

    def slow(state: dict[str, Any], generation: int, reserved: Any) -> None:
        gate.wait(5)
        real_write(state, generation, reserved)

    store._write = slow  # type: ignore[method-assign]
    store.create("first", 1)
    first = asyncio.create_task(store.persist())
    await asyncio.sleep(0.01)
    store.create("second", 1)
    second = asyncio.create_task(store.persist())
    await asyncio.sleep(0.01)
    assert not first.done() and not second.done()
    gate.set()
    await asyncio.wait_for(asyncio.gather(first, second), 5)
    names = [t["name"] for t in json.loads((tmp_path / "topics.json").read_text())["topics"]]
    assert names == ["first", "second"]


def test_without_a_loop_changes_are_written_at_once(tmp_path: Path) -> None:
    store = TopicStore(data_dir=tmp_path)
    store.create("a", 2)
    assert [t["name"] for t in json.loads((tmp_path / "topics.json").read_text())["topics"]] == ["a"]


def test_a_state_file_beyond_the_cap_is_refused_at_start(tmp_path: Path) -> None:
    store = TopicStore(data_dir=tmp_path)
    store.create("wide", 500)
    refusal = r"holds 500 partitions, more than rallypoint\.max\.broker\.partitions=100"
    with pytest.raises(TopicStateError, match=refusal):
        TopicStore(data_dir=tmp_path, max_partitions=100)
    assert TopicStore(data_dir=tmp_path, max_partitions=500).partition_count == 500


def test_the_broker_refuses_to_start_with_an_oversized_state_file(tmp_path: Path) -> None:
    TopicStore(data_dir=tmp_path).create("wide", 200)
    broker = BrokerProcess(data_dir=tmp_path, config={"rallypoint.max.broker.partitions": "100"})
    with pytest.raises(RuntimeError, match="broker did not start"):
        broker.start()
    assert broker.proc is None or broker.proc.returncode == 1
    assert any("more than rallypoint.max.broker.partitions=100" in line for line in broker.log_lines)


def test_created_topics_are_on_disk_before_the_answer(tmp_path: Path) -> None:
    """kill -9 right after the CreateTopics / CreatePartitions answers: all of it is back."""
    broker = BrokerProcess(data_dir=tmp_path, config={}).start()
    try:
        with WireClient(broker.host, broker.port, timeout=10) as c:
            body = {"topics": [topic(f"d{i}", 3) for i in range(50)], "timeout": 1000, "validate_only": False}
            assert all(int(t.error_code) == 0 for t in c.call(19, 7, body).topics)
            grow = {"topics": [{"name": "d0", "count": 7, "assignments": None}], "timeout": 1000}
            assert int(c.call(37, 3, grow).results[0].error_code) == 0
        broker.kill()
        broker.start()
        with WireClient(broker.host, broker.port, timeout=10) as c:
            md = c.call(3, 12, {"topics": None, "allow_auto_topic_creation": False})
            counts = {t.name: len(t.partitions) for t in md.topics}
        assert {n: counts.get(n) for n in ("d0", "d1", "d49")} == {"d0": 7, "d1": 3, "d49": 3}
    finally:
        broker.kill()
