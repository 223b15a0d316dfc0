"""A full disk under a running broker: a 2 MB tmpfs as its data directory, filled up.

Checked: commits are answered NOT_COORDINATOR (the coordinator's mapping of the log's
KAFKA_STORAGE_ERROR) while the disk is full, a Produce that needs a new end-offset reservation
gets KAFKA_STORAGE_ERROR, the broker keeps serving, the offsets log is never left torn, a real
client (kafka-python) retries its commit until there is room again, and after a SIGKILL and a
restart every acknowledged commit is there.  Needs root (mount); skipped otherwise.
See docs/reliability.md, "Crash safety".
"""

from __future__ import annotations

import errno
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.record.default_records import DefaultRecordBatchBuilder
from kafka.structs import OffsetAndMetadata
from rallypoint.protocol.errors import ErrorCode
from rallypoint.storage.recovery import replay_partition
from rallypoint.storage.segments import partition_dir

from tests.support import BrokerProcess, WireClient

pytestmark = pytest.mark.clients

TOPIC = "t"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "disk"
    mnt.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command here")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def fill(disk: Path) -> Path:
    """Fill the file system; returns the filler file (delete it to make room)."""
    filler = disk / "filler"
    chunk = b"\0" * 4096
    with open(filler, "wb", buffering=0) as f:
        while True:
            try:
                f.write(chunk)
            except OSError as e:
                assert e.errno == errno.ENOSPC
                return filler


def commit(c: WireClient, group: str, offset: int) -> int:
    body = {
        "group_id": group,
        "generation_id_or_member_epoch": -1,
        "member_id": "",
        "group_instance_id": None,
        "retention_time_ms": -1,
        "topics": [
            {
                "name": TOPIC,
                "partitions": [
                    {"partition_index": 0, "committed_offset": offset, "committed_leader_epoch": -1,
                     "committed_metadata": "m" * 200}
                ],
            }
        ],
    }  # fmt: skip
    return int(c.call(8, 8, body).topics[0].partitions[0].error_code)


def committed(c: WireClient, group: str) -> int:
    resp = c.call(9, 7, {"group_id": group, "topics": None, "require_stable": False})
    return next((int(p.committed_offset) for t in resp.topics for p in t.partitions if p.partition_index == 0), -1)


def produce(c: WireClient, records: int) -> tuple[int, int]:
    """(error code, base offset) of one Produce of ``records`` records to partition 1."""
    b = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 24)
    for i in range(records):
        b.append(i, 1_700_000_000_000, None, b"x", [])
    body: dict[str, Any] = {
        "transactional_id": None,
        "acks": -1,
        "timeout": 5000,
        "topic_data": [{"name": TOPIC, "partition_data": [{"index": 1, "records": bytes(b.build())}]}],
    }
    p = c.call(0, 9, body).responses[0].partition_responses[0]
    return int(p.error_code), int(p.base_offset)


def torn_tails(data_dir: Path) -> list[Any]:
    return replay_partition(partition_dir(data_dir, 0), 0, repair=False).report.truncated


def test_full_disk(small_disk: Path, broker_factory: Callable[..., BrokerProcess]) -> None:
    data = small_disk / "data"
    broker = broker_factory(data_dir=data, config={"offsets.topic.num.partitions": "1"})
    with WireClient(broker.host, broker.port) as c:
        topic = {"name": TOPIC, "num_partitions": 2, "replication_factor": 1, "assignments": [], "configs": []}
        assert c.call(19, 7, {"topics": [topic], "timeout": 5000, "validate_only": False}).topics[0].error_code == 0
        assert commit(c, "w", 1) == ErrorCode.NONE
        filler = fill(small_disk)

        # Commits go on while the last partly filled page of the segment has room, then fail.
        acked, errors = 1, []
        for i in range(2, 2000):
            code = commit(c, "w", i)
            if code == ErrorCode.NONE:
                acked = i
                assert not errors, "a commit was acknowledged after one failed on a still full disk"
            else:
                errors.append(code)
                if len(errors) == 5:
                    break
        assert errors == [ErrorCode.NOT_COORDINATOR] * 5
        assert torn_tails(data) == []  # every failed write was cut off again
        assert committed(c, "w") == acked
        # a Produce needing a new end-offset reservation cannot save it
        assert produce(c, 1500) == (ErrorCode.KAFKA_STORAGE_ERROR, -1)
        assert c.call(18, 3, {"client_software_name": "t", "client_software_version": "1"}).error_code == 0

        # A real client's commit is retried by the client until there is room again.
        done: list[BaseException | None] = []
        tp = TopicPartition(TOPIC, 0)

        def kafka_python_commit() -> None:
            consumer = KafkaConsumer(bootstrap_servers=broker.bootstrap, group_id="kp", enable_auto_commit=False)
            try:
                consumer.assign([tp])
                consumer.commit({tp: OffsetAndMetadata(100, "k" * 1000, -1)})  # more than any page tail left
                done.append(None)
            except BaseException as e:
                done.append(e)
            finally:
                consumer.close(autocommit=False)

        t = threading.Thread(target=kafka_python_commit, daemon=True)
        t.start()
        time.sleep(2)
        assert not done, f"kafka-python's commit finished on a full disk: {done}"
        filler.unlink()
        t.join(30)
        assert done == [None]

        assert commit(c, "w", 5000) == ErrorCode.NONE
        assert produce(c, 1500) == (ErrorCode.NONE, 0)

    problems = [e for e in broker.events() if e.get("level") in ("warning", "error")]
    assert not [e for e in problems if "exception" in e], "a full disk must not end in a traceback"
    broker.kill()
    broker.start()
    assert not broker.events("offsets_log.torn_tail_truncated")
    with WireClient(broker.host, broker.port) as c:
        assert committed(c, "w") == 5000
        resp = c.call(9, 7, {"group_id": "kp", "topics": None, "require_stable": False})
        assert [int(p.committed_offset) for t in resp.topics for p in t.partitions] == [100]
        assert produce(c, 1)[1] >= 1500  # past every offset handed out
