"""Transactions as raw frames over a real socket (docs/transactions.md): the coordinator's
answers, transactional produce checks, markers, the last stable offset, read_committed fetch,
ListOffsets, TxnOffsetCommit with RequireStable, DescribeTransactions and ListTransactions."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from rallypoint.protocol import codec
from rallypoint.protocol.errors import ErrorCode as E
from rallypoint.protocol.wire import Reader

from tests.support import BrokerProcess, WireClient
from tests.test_data_plane_wire import batch, create, produce, records_of, unique

pytestmark = pytest.mark.wire


@pytest.fixture(scope="module")
def b(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    """One broker for the module: every test uses its own transactional ids, topics and groups."""
    config = {
        "group.initial.rebalance.delay.ms": "0",
        "transaction.max.timeout.ms": "60000",
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "100",
    }
    broker = BrokerProcess(data_dir=tmp_path_factory.mktemp("txn"), config=config).start()
    yield broker
    broker.kill()


@pytest.fixture
def c(b: BrokerProcess) -> Iterator[WireClient]:
    with WireClient(b.host, b.port) as client:
        yield client


def d(msg: Any) -> dict[str, Any]:
    return codec.to_dict(msg)


def init(c: WireClient, txn_id: str, timeout: int = 30000, version: int = 4, **kw: Any) -> dict[str, Any]:
    body = {"transactional_id": txn_id, "transaction_timeout": timeout, "producer_id": -1, "producer_epoch": -1}
    body.update(kw)
    return d(c.call(22, version, body))


def add(c: WireClient, txn_id: str, pid: int, epoch: int, topic: str, parts: list[int], version: int = 3) -> list[int]:
    body = {
        "v3_and_below_transactional_id": txn_id,
        "v3_and_below_producer_id": pid,
        "v3_and_below_producer_epoch": epoch,
        "v3_and_below_topics": [{"name": topic, "partitions": parts}],
    }
    r = d(c.call(24, version, body))
    return [p["partition_error_code"] for t in r["results_by_topic_v3_and_below"] for p in t["results_by_partition"]]


def end(c: WireClient, txn_id: str, pid: int, epoch: int, commit: bool, version: int = 3) -> int:
    body = {"transactional_id": txn_id, "producer_id": pid, "producer_epoch": epoch, "committed": commit}
    return int(d(c.call(26, version, body))["error_code"])


def describe(c: WireClient, *ids: str) -> list[dict[str, Any]]:
    """DescribeTransactions v0, its answer read by hand: kio's reader refuses the -1 start time
    Kafka sends when no transaction runs."""
    corr = c.send(65, 0, {"transactional_ids": list(ids)})
    r = Reader(c.recv_frame(), flexible=True)
    assert r.int32() == corr
    r.skip_tagged_fields()  # response header v1
    r.int32()  # throttle time
    out = []
    for _ in range(r.array_length()):
        state: dict[str, Any] = {
            "error_code": r.int16(),
            "transactional_id": r.string(),
            "transaction_state": r.string(),
            "transaction_timeout": r.int32(),
            "transaction_start_time": r.int64(),
            "producer_id": r.int64(),
            "producer_epoch": r.int16(),
        }
        topics = []
        for _t in range(r.array_length()):
            name = r.string()
            topics.append({"topic": name, "partitions": list(r.int32_array(r.array_length()))})
            r.skip_tagged_fields()
        state["topics"] = topics
        r.skip_tagged_fields()
        out.append(state)
    return out


def wait_state(c: WireClient, txn_id: str, state: str) -> dict[str, Any]:
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        (s,) = describe(c, txn_id)
        if s["transaction_state"] == state:
            return s
        time.sleep(0.02)
    raise AssertionError(f"{txn_id} never reached {state}: {describe(c, txn_id)}")


def list_latest(c: WireClient, topic: str, isolation: int) -> int:
    body = {
        "replica_id": -1,
        "isolation_level": isolation,
        "topics": [{"name": topic, "partitions": [{"partition_index": 0, "timestamp": -1}]}],
        "timeout": 1000,
    }
    return int(d(c.call(2, 7, body))["topics"][0]["partitions"][0]["offset"])


def fetch_part(c: WireClient, topic: str, offset: int, isolation: int) -> dict[str, Any]:
    body = {
        "replica_id": -1,
        "max_wait": 0,
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "isolation_level": isolation,
        "session_id": 0,
        "session_epoch": -1,
        "topics": [
            {"topic": topic, "partitions": [{"partition": 0, "fetch_offset": offset, "partition_max_bytes": 1 << 20}]}
        ],
        "forgotten_topics_data": [],
        "rack_id": "",
    }
    return d(c.call(1, 12, body))["responses"][0]["partitions"][0]


def test_find_coordinator_for_a_transactional_id(c: WireClient) -> None:
    body = {"key_type": 1, "coordinator_keys": ["tx-a"]}
    first = d(c.call(10, 4, body))["coordinators"][0]
    assert first["error_code"] == E.COORDINATOR_NOT_AVAILABLE  # __transaction_state is created now
    again = d(c.call(10, 4, body))["coordinators"][0]
    assert again["error_code"] == 0 and again["node_id"] >= 0


def test_init_producer_id_epochs_timeouts_and_old_version_errors(c: WireClient) -> None:
    r = init(c, "tx-init")
    assert (r["error_code"], r["producer_epoch"]) == (0, 0)
    again = init(c, "tx-init")
    assert (again["producer_id"], again["producer_epoch"]) == (r["producer_id"], 1)
    assert init(c, "tx-init", timeout=0)["error_code"] == E.INVALID_TRANSACTION_TIMEOUT
    assert init(c, "tx-init", timeout=60001)["error_code"] == E.INVALID_TRANSACTION_TIMEOUT
    # v3+ with the producer id and epoch it had: the previous epoch is a retry (same answer) ...
    retry = init(c, "tx-init", producer_id=r["producer_id"], producer_epoch=0)
    assert (retry["error_code"], retry["producer_epoch"]) == (0, 1)
    assert init(c, "tx-init", producer_id=r["producer_id"], producer_epoch=1)["producer_epoch"] == 2
    # ... an older one is fenced; before v4 the code is INVALID_PRODUCER_EPOCH
    stale = {"producer_id": r["producer_id"], "producer_epoch": 0}
    assert init(c, "tx-init", **stale)["error_code"] == E.PRODUCER_FENCED
    assert init(c, "tx-init", version=3, **stale)["error_code"] == E.INVALID_PRODUCER_EPOCH
    other = {"producer_id": r["producer_id"] + 1000, "producer_epoch": 1}
    assert init(c, "tx-init", **other)["error_code"] == E.PRODUCER_FENCED


def test_a_transaction_commits_and_aborts_with_markers_lso_and_read_committed(c: WireClient) -> None:
    t = unique("tx-data")
    create(c, t)
    r = init(c, "tx-data")
    pid, epoch = r["producer_id"], r["producer_epoch"]
    txb = batch(2, pid=pid, epoch=epoch, seq=0, transactional=True)
    # not added yet: the transaction check refuses it (v10 and older: INVALID_TXN_STATE)
    assert produce(c, t, txb, transactional_id="tx-data")["error_code"] == E.INVALID_TXN_STATE
    assert add(c, "tx-data", pid, epoch, t, [0]) == [0]
    assert add(c, "tx-data", pid, epoch, "no-such-topic", [0]) == [E.UNKNOWN_TOPIC_OR_PARTITION]
    assert produce(c, t, txb, transactional_id="tx-data")["base_offset"] == 0
    assert produce(c, t, batch(1))["base_offset"] == 2  # a plain producer's record after it
    # while open: read_committed stops at the transaction's first offset (the LSO)
    assert list_latest(c, t, 1) == 0 and list_latest(c, t, 0) == 3
    p = fetch_part(c, t, 0, 1)
    assert (p["high_watermark"], p["last_stable_offset"], p["records"]) == (3, 0, b"")
    assert fetch_part(c, t, 0, 0)["aborted_transactions"] is None
    # a plain batch of the same producer while its transaction is open
    plain = batch(1, pid=pid, epoch=epoch, seq=2)
    assert produce(c, t, plain, transactional_id=None)["error_code"] == E.INVALID_TXN_STATE
    assert end(c, "tx-data", pid, epoch, commit=False) == 0
    wait_state(c, "tx-data", "CompleteAbort")
    p = fetch_part(c, t, 0, 1)
    assert (p["high_watermark"], p["last_stable_offset"]) == (4, 4)
    assert p["aborted_transactions"] == [{"producer_id": pid, "first_offset": 0}]
    offsets = [o for o, _k, _v in records_of(p["records"])]
    assert offsets == [0, 1, 2, 3]  # the client drops 0-1 itself, and 3 is the ABORT marker
    assert end(c, "tx-data", pid, epoch, commit=False) == 0  # a retry of a completed abort
    assert end(c, "tx-data", pid, epoch, commit=True) == E.INVALID_TXN_STATE
    # the next transaction commits
    assert add(c, "tx-data", pid, epoch, t, [0]) == [0]
    txb2 = batch(1, pid=pid, epoch=epoch, seq=2, transactional=True)
    assert produce(c, t, txb2, transactional_id="tx-data")["base_offset"] == 4
    assert end(c, "tx-data", pid, epoch, commit=True) == 0
    wait_state(c, "tx-data", "CompleteCommit")
    p = fetch_part(c, t, 4, 1)
    assert (p["last_stable_offset"], p["aborted_transactions"]) == (6, [])
    assert [o for o, _k, _v in records_of(p["records"])] == [4, 5]  # 5: the COMMIT marker
    assert list_latest(c, t, 1) == 6


def test_a_second_init_fences_the_open_transaction_and_aborts_it(c: WireClient) -> None:
    t = unique("tx-fence")
    create(c, t)
    r = init(c, "tx-fence")
    pid, epoch = r["producer_id"], r["producer_epoch"]
    assert add(c, "tx-fence", pid, epoch, t, [0]) == [0]
    produce(c, t, batch(1, pid=pid, epoch=epoch, seq=0, transactional=True), transactional_id="tx-fence")
    assert init(c, "tx-fence")["error_code"] == E.CONCURRENT_TRANSACTIONS  # fenced: epoch + 1, abort
    wait_state(c, "tx-fence", "CompleteAbort")
    r2 = init(c, "tx-fence")
    while r2["error_code"] == E.CONCURRENT_TRANSACTIONS:  # Complete* still being saved: clients retry
        r2 = init(c, "tx-fence")
    assert (r2["error_code"], r2["producer_epoch"]) == (0, epoch + 2)
    # the old instance: fenced everywhere
    assert end(c, "tx-fence", pid, epoch, commit=True) == E.PRODUCER_FENCED
    assert end(c, "tx-fence", pid, epoch, commit=True, version=1) == E.INVALID_PRODUCER_EPOCH
    assert add(c, "tx-fence", pid, epoch, t, [0]) == [E.PRODUCER_FENCED]
    old = batch(1, pid=pid, epoch=epoch, seq=1, transactional=True)
    assert produce(c, t, old, transactional_id="tx-fence")["error_code"] == E.INVALID_PRODUCER_EPOCH
    p = fetch_part(c, t, 0, 1)
    assert p["aborted_transactions"] == [{"producer_id": pid, "first_offset": 0}]


def test_a_transaction_past_its_timeout_is_fenced_and_aborted(c: WireClient) -> None:
    t = unique("tx-slow")
    create(c, t)
    r = init(c, "tx-slow", timeout=200)
    pid, epoch = r["producer_id"], r["producer_epoch"]
    assert add(c, "tx-slow", pid, epoch, t, [0]) == [0]
    produce(c, t, batch(1, pid=pid, epoch=epoch, seq=0, transactional=True), transactional_id="tx-slow")
    s = wait_state(c, "tx-slow", "CompleteAbort")
    assert s["producer_epoch"] == epoch + 1
    assert end(c, "tx-slow", pid, epoch, commit=True) == E.PRODUCER_FENCED


def test_txn_offset_commit_is_pending_until_the_marker(c: WireClient) -> None:
    t = unique("tx-in")
    create(c, t, 2)
    group = unique("tx-group")
    commit = {
        "group_id": group,
        "topics": [
            {"name": t, "partitions": [{"partition_index": 0, "committed_offset": 5, "committed_metadata": ""}]}
        ],
    }
    assert (
        d(c.call(8, 2, {**commit, "generation_id_or_member_epoch": -1, "member_id": "", "retention_time": -1}))[
            "topics"
        ][0]["partitions"][0]["error_code"]
        == 0
    )

    def offset_fetch(stable: bool) -> list[tuple[int, int, int]]:
        body = {
            "groups": [{"group_id": group, "topics": [{"name": t, "partition_indexes": [0, 1]}]}],
            "require_stable": stable,
        }
        r = d(c.call(9, 8, body))
        return [
            (p["partition_index"], p["committed_offset"], p["error_code"])
            for p in r["groups"][0]["topics"][0]["partitions"]
        ]

    r = init(c, "tx-offsets")
    pid, epoch = r["producer_id"], r["producer_epoch"]

    def txn_commit(offset: int) -> int:
        body = {
            "transactional_id": "tx-offsets",
            "group_id": group,
            "producer_id": pid,
            "producer_epoch": epoch,
            "generation_id": -1,
            "member_id": "",
            "group_instance_id": None,
            "topics": [
                {
                    "name": t,
                    "partitions": [
                        {
                            "partition_index": 0,
                            "committed_offset": offset,
                            "committed_leader_epoch": -1,
                            "committed_metadata": "",
                        }
                    ],
                }
            ],
        }
        return int(d(c.call(28, 3, body))["topics"][0]["partitions"][0]["error_code"])

    assert txn_commit(10) == E.INVALID_TXN_STATE  # AddOffsetsToTxn first
    body = {"transactional_id": "tx-offsets", "producer_id": pid, "producer_epoch": epoch, "group_id": group}
    assert d(c.call(25, 3, body))["error_code"] == 0
    assert txn_commit(10) == 0
    assert offset_fetch(True) == [(0, -1, E.UNSTABLE_OFFSET_COMMIT), (1, -1, 0)]
    assert offset_fetch(False) == [(0, 5, 0), (1, -1, 0)]
    assert end(c, "tx-offsets", pid, epoch, commit=False) == 0
    wait_state(c, "tx-offsets", "CompleteAbort")
    assert offset_fetch(True) == [(0, 5, 0), (1, -1, 0)]  # aborted: the old value stays
    assert d(c.call(25, 3, body))["error_code"] == 0
    assert txn_commit(20) == 0
    assert end(c, "tx-offsets", pid, epoch, commit=True) == 0
    wait_state(c, "tx-offsets", "CompleteCommit")
    assert offset_fetch(True) == [(0, 20, 0), (1, -1, 0)]


def test_describe_and_list_transactions(c: WireClient) -> None:
    t = unique("tx-desc")
    create(c, t)
    r = init(c, "tx-desc-1")
    init(c, "tx-desc-2")
    assert add(c, "tx-desc-1", r["producer_id"], r["producer_epoch"], t, [0]) == [0]
    one, two, missing, empty = describe(c, "tx-desc-1", "tx-desc-2", "nope", "")
    assert (one["error_code"], one["transaction_state"], one["transaction_timeout"]) == (0, "Ongoing", 30000)
    assert one["topics"] == [{"topic": t, "partitions": [0]}] and one["producer_id"] == r["producer_id"]
    assert two["transaction_state"] == "Empty" and two["topics"] == []
    assert missing["error_code"] == E.TRANSACTIONAL_ID_NOT_FOUND and empty["error_code"] == E.INVALID_REQUEST
    listed = d(
        c.call(
            66,
            2,
            {
                "state_filters": ["Ongoing", "Bogus"],
                "producer_id_filters": [],
                "duration_filter": -1,
                "transactional_id_pattern": "tx-desc-.*",
            },
        )
    )
    assert listed["unknown_state_filters"] == ["Bogus"]
    assert [s["transactional_id"] for s in listed["transaction_states"]] == ["tx-desc-1"]
    everything = d(c.call(66, 0, {"state_filters": [], "producer_id_filters": []}))
    assert {"tx-desc-1", "tx-desc-2"} <= {s["transactional_id"] for s in everything["transaction_states"]}
    bad = d(
        c.call(
            66,
            2,
            {"state_filters": [], "producer_id_filters": [], "duration_filter": -1, "transactional_id_pattern": "("},
        )
    )
    assert bad["error_code"] == E.INVALID_REGULAR_EXPRESSION


def test_describe_producers_shows_the_open_transaction(c: WireClient) -> None:
    t = unique("tx-prod")
    create(c, t)
    r = init(c, "tx-prod")
    pid, epoch = r["producer_id"], r["producer_epoch"]
    assert add(c, "tx-prod", pid, epoch, t, [0]) == [0]
    produce(c, t, batch(1), transactional_id=None)
    produce(c, t, batch(2, pid=pid, epoch=epoch, seq=0, transactional=True), transactional_id="tx-prod")
    body = {"topics": [{"name": t, "partition_indexes": [0, 7]}, {"name": "no-such", "partition_indexes": [0]}]}
    got = d(c.call(61, 0, body))["topics"]
    (p0, p7) = got[0]["partitions"]
    (state,) = p0["active_producers"]
    assert (state["producer_id"], state["producer_epoch"], state["last_sequence"]) == (pid, epoch, 1)
    assert state["current_txn_start_offset"] == 1
    assert p7["error_code"] == E.UNKNOWN_TOPIC_OR_PARTITION
    assert got[1]["partitions"][0]["error_code"] == E.UNKNOWN_TOPIC_OR_PARTITION


def test_add_partitions_v4_batch_and_verify_only(c: WireClient) -> None:
    t = unique("tx-batch")
    create(c, t)
    a = init(c, "tx-batch-a")
    b = init(c, "tx-batch-b")

    def batch_call(*txns: tuple[str, dict[str, Any], bool, list[tuple[str, int]]]) -> list[list[int]]:
        body = {
            "transactions": [
                {
                    "transactional_id": txn_id,
                    "producer_id": r["producer_id"],
                    "producer_epoch": r["producer_epoch"],
                    "verify_only": verify,
                    "topics": [{"name": name, "partitions": [p]} for name, p in parts],
                }
                for txn_id, r, verify, parts in txns
            ]
        }
        resp = d(c.call(24, 4, body))
        assert resp["error_code"] == 0
        return [
            [p["partition_error_code"] for tr in res["topic_results"] for p in tr["results_by_partition"]]
            for res in resp["results_by_transaction"]
        ]

    assert batch_call(("tx-batch-a", a, False, [(t, 0)]), ("tx-batch-b", b, True, [(t, 0)])) == [
        [0],
        [E.TRANSACTION_ABORTABLE],  # b never added it: verify-only changes nothing
    ]
    assert batch_call(("tx-batch-a", a, True, [(t, 0)])) == [[0]]
    (state,) = describe(c, "tx-batch-b")
    assert state["transaction_state"] == "Empty"
    assert batch_call(("tx-batch-a", a, False, [(t, 0), ("missing", 0)])) == [
        [E.OPERATION_NOT_ATTEMPTED, E.UNKNOWN_TOPIC_OR_PARTITION]
    ]
