"""Failed writes and fsyncs of the offsets log, through the whole broker, with a fault hook.

The broker runs in-process on a real socket; the offsets log's segment writes
(``storage.offsets_log._write``) and fsyncs (``_fdatasync``) are swapped for failing ones.
Checked: clients get Kafka's answers (a storage error on the coordinator's log is
NOT_COORDINATOR for OffsetCommit and SyncGroup, GroupMetadataManager's mapping), the log is never
left torn, other partitions are unaffected, and after the fault is cleared and the broker
restarted every acknowledged commit is there.  See docs/reliability.md, "Crash safety".
(The same with a real full disk, tmpfs, and real clients: test_full_disk.py.)
"""

from __future__ import annotations

import asyncio
import errno
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from rallypoint import config as config_mod
from rallypoint.assemble import build_broker
from rallypoint.protocol import codec
from rallypoint.protocol.errors import ErrorCode
from rallypoint.protocol.offsets_schema import partition_for
from rallypoint.server import Server
from rallypoint.storage import offsets_log as offsets_log_mod
from rallypoint.storage.recovery import replay_partition
from rallypoint.storage.segments import partition_dir

pytestmark = [pytest.mark.unit, pytest.mark.slow]

WAIT = 10.0
PARTITIONS = 2
TOPIC = "t"


def group_on(partition: int, prefix: str) -> str:
    return next(f"{prefix}-{i}" for i in range(1000) if partition_for(f"{prefix}-{i}", PARTITIONS) == partition)


class Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer, self.corr = reader, writer, 0

    async def call(self, key: int, version: int, body: dict[str, Any]) -> Any:
        self.corr += 1
        self.writer.write(codec.encode_request(key, version, self.corr, body, "faults"))
        (size,) = struct.unpack(">i", await asyncio.wait_for(self.reader.readexactly(4), WAIT))
        frame = await asyncio.wait_for(self.reader.readexactly(size), WAIT)
        return codec.decode_response_frame(key, version, frame)[1]

    async def commit(self, group: str, offset: int) -> int:
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
                         "committed_metadata": ""}
                    ],
                }
            ],
        }  # fmt: skip
        resp = await self.call(8, 8, body)
        return int(resp.topics[0].partitions[0].error_code)

    async def committed(self, group: str) -> int:
        resp = await self.call(9, 7, {"group_id": group, "topics": None, "require_stable": False})
        return next((int(p.committed_offset) for t in resp.topics for p in t.partitions), -1)


class Rig:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.server: Server | None = None
        self.client: Client | None = None

    async def start(self) -> Client:
        cfg = config_mod.load(
            {"port": "0", "data.dir": str(self.data_dir), "offsets.topic.num.partitions": str(PARTITIONS)}, env={}
        )
        self.server = Server(build_broker(cfg), "127.0.0.1", 0)
        await self.server.start()
        reader, writer = await asyncio.open_connection("127.0.0.1", self.server.port)
        self.client = Client(reader, writer)
        return self.client

    async def stop(self) -> None:
        if self.client is not None:
            self.client.writer.close()
            self.client = None
        if self.server is not None:
            await asyncio.wait_for(self.server.stop(), 30)
            self.server = None

    def torn_tails(self) -> list[Any]:
        return [t for n in range(PARTITIONS) for t in replay_partition(self.pdir(n), n, repair=False).report.truncated]

    def pdir(self, n: int) -> Path:
        return partition_dir(self.data_dir, n)

    def log_bytes(self, n: int) -> int:
        return sum(f.stat().st_size for f in self.pdir(n).glob("*.log"))


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    r = Rig(tmp_path)
    yield r
    await r.stop()


async def create_topic(c: Client) -> None:
    topic = {"name": TOPIC, "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []}
    resp = await c.call(19, 7, {"topics": [topic], "timeout": 5000, "validate_only": False})
    assert int(resp.topics[0].error_code) == 0


async def test_a_failed_write_is_rolled_back_and_answered_not_coordinator(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = await rig.start()
    await create_topic(c)
    g = group_on(0, "w")
    assert await c.commit(g, 1) == ErrorCode.NONE
    size = rig.log_bytes(0)
    calls = []
    real = offsets_log_mod._write

    def short_then_full(fd: int, data: memoryview) -> int:
        calls.append(len(data))
        if len(calls) == 1:
            return real(fd, data[:7])  # a short write: part of the batch reaches the file ...
        raise OSError(errno.ENOSPC, "No space left on device")  # ... then the disk is full

    monkeypatch.setattr(offsets_log_mod, "_write", short_then_full)
    assert await c.commit(g, 2) == ErrorCode.NOT_COORDINATOR
    assert len(calls) == 2
    assert rig.log_bytes(0) == size  # the partial batch was cut off again
    assert rig.torn_tails() == []
    monkeypatch.setattr(offsets_log_mod, "_write", real)
    assert await c.commit(g, 3) == ErrorCode.NONE  # the partition still works
    assert await c.committed(g) == 3

    await rig.stop()
    c = await rig.start()
    assert await c.committed(g) == 3
    assert rig.torn_tails() == []


async def test_a_failed_fsync_fences_the_partition_until_a_restart(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    c = await rig.start()
    await create_topic(c)
    bad, good = group_on(0, "f"), group_on(1, "f")
    assert await c.commit(bad, 1) == ErrorCode.NONE
    assert await c.commit(good, 1) == ErrorCode.NONE

    def eio(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    real = offsets_log_mod._fdatasync
    monkeypatch.setattr(offsets_log_mod, "_fdatasync", eio)
    assert await c.commit(bad, 2) == ErrorCode.NOT_COORDINATOR
    monkeypatch.setattr(offsets_log_mod, "_fdatasync", real)
    # the page cache's state is unknown after a failed fsync: the partition takes no more writes
    assert await c.commit(bad, 3) == ErrorCode.NOT_COORDINATOR
    # ... and a group on it cannot complete a rebalance (SyncGroup stores the assignment)
    member = ""
    for _ in range(2):  # v5: the first JoinGroup only hands out a member id (MEMBER_ID_REQUIRED)
        join = await c.call(
            11,
            5,
            {
                "group_id": bad,
                "session_timeout": 10000,
                "rebalance_timeout": 10000,
                "member_id": member,
                "group_instance_id": None,
                "protocol_type": "consumer",
                "protocols": [{"name": "range", "metadata": b""}],
            },
        )
        member = str(join.member_id)
    assert int(join.error_code) == ErrorCode.NONE
    sync = await c.call(
        14,
        3,
        {
            "group_id": bad,
            "generation_id": join.generation_id,
            "member_id": join.member_id,
            "group_instance_id": None,
            "assignments": [{"member_id": join.member_id, "assignment": b""}],
        },
    )
    assert int(sync.error_code) == ErrorCode.NOT_COORDINATOR
    # other partitions are unaffected
    assert await c.commit(good, 2) == ErrorCode.NONE
    assert rig.torn_tails() == []

    await rig.stop()
    c = await rig.start()
    # acknowledged: 1; tried after it: 2 (written, fsync failed) — never 3 (refused up front)
    assert await c.committed(bad) in (1, 2)
    assert await c.committed(good) == 2
    assert await c.commit(bad, 4) == ErrorCode.NONE  # the restart recovered the partition
    assert await c.committed(bad) == 4
