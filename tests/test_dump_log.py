"""``rallypoint dump-log`` and the offsets log inside a real broker process."""

from __future__ import annotations

import asyncio
import json
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from rallypoint.clock import FakeClock
from rallypoint.protocol.offsets_schema import (
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadata,
    OffsetCommitKey,
    OffsetCommitValue,
    encode_record,
)
from rallypoint.protocol.records import build_batch
from rallypoint.storage import OffsetsLog
from rallypoint.storage.segments import list_segments, partition_dir

from tests.support import ROOT, BrokerProcess

pytestmark = pytest.mark.wire

T0 = 1_700_000_000_000


def dump(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "rallypoint", "dump-log", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


@pytest.fixture
def data(tmp_path: Path) -> Path:
    async def fill() -> None:
        log = OffsetsLog(tmp_path, num_partitions=2, cleaner=False, clock=FakeClock(T0), segment_bytes=1024)
        await log.start()
        member = MemberMetadata("m-1", "static-1", "cli", "/127.0.0.1", 60000, 10000, b"x" * 17, b"y" * 29)
        await log.append(0, [(GroupMetadataKey("g"), GroupMetadataValue("consumer", 4, "range", "m-1", T0, (member,)))])
        for i in range(12):
            await log.append(0, [(OffsetCommitKey("g", "orders", i % 3), OffsetCommitValue(i, "meta", T0 + i, 2))])
        await log.append(0, [(OffsetCommitKey("g", "orders", 0), None)])
        await log.append(1, [(OffsetCommitKey("h", "t", 0), OffsetCommitValue(9, "", T0, expire_timestamp=T0 + 5))])
        await log.stop()

    asyncio.run(fill())
    return tmp_path


def test_dump_data_dir_like_kafka_dump_log(data: Path) -> None:
    r = dump(str(data))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    segs0 = list_segments(partition_dir(data, 0))
    assert len(segs0) >= 2  # rolled
    for _b, p in segs0:
        assert f"Dumping {p}\n" in out
    assert "Log starting offset: 0\n" in out
    assert "baseOffset: 0 lastOffset: 0 count: 1 baseSequence: -1 lastSequence: -1 producerId: -1" in out
    assert "compresscodec: none" in out and "isvalid: true" in out
    assert (
        "| offset: 1 CreateTime: 1700000000000 keySize: 17 valueSize: 28 sequence: -1 headerKeys: [] "
        'key: {"type":"1","data":{"group":"g","topic":"orders","partition":0}} '
        'payload: {"version":"3","data":{"offset":0,"leaderEpoch":2,"metadata":"meta","commitTimestamp":1700000000000}}'
    ) in out
    assert 'key: {"type":"2","data":{"group":"g"}} payload: {"version":"3","data":{"protocolType":"consumer"' in out
    assert '"groupInstanceId":"static-1"' in out and '"subscriptionSize":17,"assignmentSize":29' in out
    assert "payload: <DELETE>" in out
    assert '"expireTimestamp":1700000000005' in out  # value v1 when an expire timestamp is set


def test_dump_json_partition_dir_and_file(data: Path) -> None:
    r = dump("--json", str(partition_dir(data, 0)))
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines()]
    assert [d["offset"] for d in lines] == list(range(14))
    assert lines[0]["type"] == "group_metadata"
    member = lines[0]["value"]["members"][0]
    assert member["subscriptionSize"] == 17 and member["assignment"] == "eXl5" * 9 + "eXk="
    assert lines[-1] == {
        "file": str(list_segments(partition_dir(data, 0))[-1][1]),
        "partition": 0,
        "batchOffset": 13,
        "offset": 13,
        "timestamp": T0,
        "keySize": 17,
        "valueSize": -1,
        "keyVersion": 1,
        "type": "offset_commit",
        "key": {"group": "g", "topic": "orders", "partition": 0},
        "value": None,
    }
    seg = list_segments(partition_dir(data, 1))[0][1]
    r = dump("--json", str(seg))
    assert r.returncode == 0
    [line] = [json.loads(x) for x in r.stdout.splitlines()]
    assert line["partition"] == 1 and line["valueVersion"] == 1


def test_dump_unknown_keys_torn_tail_and_bad_paths(tmp_path: Path) -> None:
    pdir = partition_dir(tmp_path, 0)
    pdir.mkdir()
    seg = pdir / "00000000000000000000.log"
    unknown_key = struct.pack(">h", 15) + b"\x00\x01x"  # a share-group record type rallypoint does not decode
    good = encode_record(OffsetCommitKey("g", "t", 0), OffsetCommitValue(1, "", 0))
    raw = build_batch(0, [(unknown_key, b"\x00\x00"), good], T0) + build_batch(2, [good], T0)
    seg.write_bytes(raw[:-5])  # torn tail
    r = dump(str(seg))
    assert r.returncode == 1
    assert "key: Unknown record type 15 at offset 0, skipping." in r.stdout
    assert "invalid bytes at the end of 00000000000000000000.log" in r.stdout
    assert "invalid bytes" in r.stderr and str(seg) in r.stderr
    assert dump(str(tmp_path / "nope")).returncode == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    r = dump(str(empty))
    assert r.returncode == 2 and "not a segment file" in r.stderr


def test_broker_creates_the_partition_directories(broker_factory: Callable[..., BrokerProcess]) -> None:
    b = broker_factory(config={"offsets.topic.num.partitions": "7"})
    assert b.stop() == 0
    names = sorted(p.name for p in b.data_dir.iterdir() if p.name.startswith("__consumer_offsets-"))
    assert names == sorted(f"__consumer_offsets-{n}" for n in range(7))
    recovered = [e for e in b.events("offsets_log.recovered")]
    assert recovered and recovered[0]["partitions"] == 7
    b.start()  # restarts on the same directories
    other = BrokerProcess(data_dir=b.data_dir, config={"offsets.topic.num.partitions": "7"})
    with pytest.raises(RuntimeError, match="another rallypoint process is using the data directory"):
        other.start()  # a second broker on the same data directory is refused
    assert b.stop() == 0


def test_broker_refuses_a_corrupt_offsets_log_with_a_clear_error(
    tmp_path: Path, broker_factory: Callable[..., BrokerProcess]
) -> None:
    data_dir = tmp_path / "corrupt"
    pdir = partition_dir(data_dir, 3)
    pdir.mkdir(parents=True)
    good = encode_record(OffsetCommitKey("g", "t", 0), OffsetCommitValue(1, "", 0))
    raw = bytearray(build_batch(0, [good], T0) + build_batch(1, [good], T0))
    raw[30] ^= 0x40  # first batch: CRC mismatch, followed by a good batch
    (pdir / "00000000000000000000.log").write_bytes(bytes(raw))
    with pytest.raises(RuntimeError) as ei:
        broker_factory(data_dir=data_dir)
    text = str(ei.value)
    assert "__consumer_offsets-3/00000000000000000000.log is corrupt at byte 0" in text
    assert "CRC mismatch" in text and "rallypoint: error:" in text
    assert "listening" not in text


def test_the_documented_reader_snippet_works(data: Path) -> None:
    """docs/offsets-log-format.md, "Reading the files yourself": the example runs and finds the commits."""
    doc = (ROOT / "docs" / "offsets-log-format.md").read_text()
    section = doc[doc.index("## Reading the files yourself") :]
    code = section[section.index("```python") + len("```python") : section.index("```", section.index("```python") + 9)]
    scope: dict[str, object] = {"data_dir": str(data)}
    exec(code, scope)
    latest = scope["latest"]
    assert isinstance(latest, dict)
    assert latest[OffsetCommitKey("g", "orders", 0)] == (13, None)  # the tombstone is last
    assert latest[OffsetCommitKey("g", "orders", 2)][1] == OffsetCommitValue(11, "meta", T0 + 11, 2)


def test_dump_decodes_consumer_group_records(tmp_path: Path) -> None:
    """KIP-848 records (types 3-8, 16) come out decoded, with Kafka's field names."""
    import uuid

    from rallypoint.protocol import consumer_group_records as cgr

    pdir = partition_dir(tmp_path, 0)
    pdir.mkdir()
    tid = uuid.UUID(int=7)
    entries = [
        cgr.encode_record(cgr.GroupMetadataKey("cg"), cgr.GroupMetadataValue(3, 0)),
        cgr.encode_record(
            cgr.CurrentMemberAssignmentKey("cg", "m-1"),
            cgr.CurrentMemberAssignmentValue(3, 2, 0, (cgr.EpochTopicPartitions(tid, (0, 1), (3, 3)),), ()),
        ),
        cgr.encode_record(cgr.MemberMetadataKey("cg", "m-2"), None),
    ]
    (pdir / "00000000000000000000.log").write_bytes(build_batch(0, entries, T0))
    r = dump("--json", str(pdir))
    assert r.returncode == 0, r.stderr
    lines = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    kinds = [(d["type"], d["key"]) for d in lines]
    assert kinds == [
        ("consumer_group_metadata", {"groupId": "cg"}),
        ("consumer_group_current_member_assignment", {"groupId": "cg", "memberId": "m-1"}),
        ("consumer_group_member_metadata", {"groupId": "cg", "memberId": "m-2"}),
    ]
    assigned = lines[1]["value"]
    assert assigned["memberEpoch"] == 3 and assigned["assignedPartitions"][0]["topicId"] == str(tid)
    assert lines[2]["value"] is None
    text = dump(str(pdir)).stdout
    assert 'key: {"type":"8","data":{"groupId":"cg","memberId":"m-1"}}' in text
