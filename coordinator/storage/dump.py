"""``rallypoint dump-log PATH``: print the offsets log like ``kafka-dump-log --offsets-decoder``.

PATH is a segment file (``00000000000000000000.log``), a partition directory
(``__consumer_offsets-7``) or a data directory (every ``__consumer_offsets-N`` in it).

Text output follows Kafka's DumpLogSegments: a ``Dumping <file>`` line, one line per batch
(``baseOffset: ... crc: ... isvalid: true``) and one ``| offset: ...`` line per record with the
key and payload as JSON (``{"type":"1","data":{...}}`` / ``{"version":"3","data":{...}}``,
``<DELETE>`` for a tombstone).  Group members show their subscription and assignment sizes.
``--json`` prints one JSON object per record instead (subscription/assignment also base64).

Exit status: 0 when every file decoded to its end; 1 when invalid bytes were found (a torn
tail or a corrupt batch; the message says which file and byte); 2 for a bad PATH or usage.
"""

from __future__ import annotations

import argparse
import base64
import json
import mmap
import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from msgspec import Struct
from rallypoint.protocol import consumer_group_records as cgr
from rallypoint.protocol import share_group_records as sgr
from rallypoint.protocol.consumer_group_records import is_consumer_record_type
from rallypoint.protocol.offsets_schema import (
    GroupMetadataKey,
    GroupMetadataValue,
    OffsetCommitKey,
    OffsetCommitValue,
    OffsetsSchemaError,
    UnknownKey,
    decode_key,
    decode_value,
    record_version,
)
from rallypoint.protocol.records import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    BatchHeader,
    Record,
    RecordsError,
    control_type,
    decode_records,
    read_header,
)

from .segments import list_partition_dirs, list_segments, parse_partition_dir, parse_segment_name


def _member(m: Any, with_bytes: bool) -> dict[str, Any]:
    d: dict[str, Any] = {
        "memberId": m.member_id,
        "groupInstanceId": m.group_instance_id,
        "clientId": m.client_id,
        "clientHost": m.client_host,
        "rebalanceTimeout": m.rebalance_timeout,
        "sessionTimeout": m.session_timeout,
        "subscriptionSize": len(m.subscription),
        "assignmentSize": len(m.assignment),
    }
    if with_bytes:
        d["subscription"] = base64.b64encode(m.subscription).decode()
        d["assignment"] = base64.b64encode(m.assignment).decode()
    return d


def key_json(key: OffsetCommitKey | GroupMetadataKey) -> dict[str, Any]:
    if isinstance(key, OffsetCommitKey):
        return {"group": key.group, "topic": key.topic, "partition": key.partition}
    return {"group": key.group}


def value_json(value: OffsetCommitValue | GroupMetadataValue, version: int, with_bytes: bool) -> dict[str, Any]:
    if isinstance(value, OffsetCommitValue):
        d: dict[str, Any] = {"offset": value.offset}
        if version >= 3:
            d["leaderEpoch"] = value.leader_epoch
        d["metadata"] = value.metadata
        d["commitTimestamp"] = value.commit_timestamp
        if version == 1:
            d["expireTimestamp"] = -1 if value.expire_timestamp is None else value.expire_timestamp
        return d
    d = {
        "protocolType": value.protocol_type,
        "generation": value.generation,
        "protocol": value.protocol,
        "leader": value.leader,
    }
    if version >= 2:
        d["currentStateTimestamp"] = value.current_state_timestamp
    d["members"] = [_member(m, with_bytes) for m in value.members]
    return d


def describe_record(rec: Record, with_bytes: bool = False) -> dict[str, Any]:
    """A record of ``__consumer_offsets`` as a JSON-able dict (the ``--json`` line, minus location)."""
    out: dict[str, Any] = {
        "offset": rec.offset,
        "timestamp": rec.timestamp,
        "keySize": -1 if rec.key is None else len(rec.key),
        "valueSize": -1 if rec.value is None else len(rec.value),
    }
    if rec.key is None:
        out["type"] = "error"
        out["error"] = "record without a key"
        return out
    try:
        key = decode_key(rec.key)
        out["keyVersion"] = record_version(rec.key)
        if isinstance(key, UnknownKey):
            if is_consumer_record_type(key.version) or sgr.is_share_record_type(key.version):
                return _consumer_record(rec, out)
            out["type"] = "unknown"
            return out
        out["type"] = "offset_commit" if isinstance(key, OffsetCommitKey) else "group_metadata"
        out["key"] = key_json(key)
        value = decode_value(key, rec.value)
        if value is None:
            out["value"] = None
        else:
            assert rec.value is not None
            vv = record_version(rec.value)
            out["valueVersion"] = vv
            out["value"] = value_json(value, vv, with_bytes)
    except OffsetsSchemaError as e:
        out["type"] = "error"
        out["error"] = str(e)
    return out


# KIP-848 record types 3-8 and 16 (``protocol/consumer_group_records.py``), named as Kafka's
# coordinator record types are.
_CONSUMER_TYPES = {
    3: "consumer_group_metadata",
    4: "consumer_group_partition_metadata",
    5: "consumer_group_member_metadata",
    6: "consumer_group_target_assignment_metadata",
    7: "consumer_group_target_assignment_member",
    8: "consumer_group_current_member_assignment",
    16: "consumer_group_regular_expression",
}


def _camel(name: str) -> str:
    """The field names of Kafka's JSON record schemas (``memberEpoch``, ``groupId`` ...)."""
    head, *rest = name.split("_")
    return head + "".join(w[:1].upper() + w[1:] for w in rest)


def _json_of(value: Any) -> Any:
    if isinstance(value, Struct):
        return {
            _camel(name): _json_of(getattr(value, name)) for name in value.__struct_fields__ if name != "record_type"
        }
    if isinstance(value, tuple | list):
        return [_json_of(v) for v in value]
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return value


def _consumer_record(rec: Record, out: dict[str, Any]) -> dict[str, Any]:
    """A KIP-848 consumer-group or KIP-932 share-group record, decoded (docs/consumer-groups.md
    and docs/share-groups.md, "Records")."""
    assert rec.key is not None
    key: Any
    try:
        if sgr.is_share_record_type(record_version(rec.key)):
            key = sgr.decode_key(rec.key)
            value: Any = sgr.decode_value(key, rec.value)
            out["type"] = sgr.RECORD_NAMES[key.record_type]
        else:
            key = cgr.decode_key(rec.key)
            value = cgr.decode_value(key, rec.value)
            out["type"] = _CONSUMER_TYPES.get(key.record_type, f"consumer_group_{key.record_type}")
    except (cgr.ConsumerRecordError, ValueError) as e:
        out["type"] = "error"
        out["error"] = str(e)
        return out
    out["key"] = _json_of(key)
    if value is None:
        out["value"] = None
    else:
        assert rec.value is not None
        out["valueVersion"] = record_version(rec.value)
        out["value"] = _json_of(value)
    return out


def _text_record(rec: Record, h: BatchHeader) -> str:
    line = (
        f"| offset: {rec.offset} {h.timestamp_type}: {rec.timestamp} "
        f"keySize: {-1 if rec.key is None else len(rec.key)} valueSize: {-1 if rec.value is None else len(rec.value)} "
        f"sequence: {h.base_sequence if h.base_sequence < 0 else h.base_sequence + rec.offset - h.base_offset} "
        f"headerKeys: [{','.join(k for k, _v in rec.headers)}]"
    )
    if h.is_control:
        kind = control_type(rec)
        name = {CONTROL_ABORT: "ABORT", CONTROL_COMMIT: "COMMIT"}.get(kind, f"UNKNOWN({kind})")
        return line + f" endTxnMarker: {name}"
    d = describe_record(rec)
    if d["type"] == "unknown":
        return line + f" key: Unknown record type {d['keyVersion']} at offset {rec.offset}, skipping."
    if d["type"] == "error":
        return line + f" key: Error at offset {rec.offset}, skipping. {d['error']}"
    key = json.dumps({"type": str(d["keyVersion"]), "data": d["key"]}, separators=(",", ":"))
    if d["value"] is None:
        payload = "<DELETE>"
    else:
        payload = json.dumps({"version": str(d["valueVersion"]), "data": d["value"]}, separators=(",", ":"))
    return line + f" key: {key} payload: {payload}"


def _text_batch(h: BatchHeader) -> str:
    dh = h.delete_horizon_ms
    return (
        f"baseOffset: {h.base_offset} lastOffset: {h.last_offset} count: {h.record_count} "
        f"baseSequence: {h.base_sequence} lastSequence: {h.last_sequence} producerId: {h.producer_id} "
        f"producerEpoch: {h.producer_epoch} partitionLeaderEpoch: {h.partition_leader_epoch} "
        f"isTransactional: {str(h.is_transactional).lower()} isControl: {str(h.is_control).lower()} "
        f"deleteHorizonMs: {'OptionalLong.empty' if dh is None else f'OptionalLong[{dh}]'} "
        f"position: {h.position} {h.timestamp_type}: {h.max_timestamp} size: {h.size} magic: {h.magic} "
        f"compresscodec: {h.compression_name} crc: {h.crc} isvalid: true"
    )


def _segments_of(path: Path) -> Iterator[tuple[int | None, Path]]:
    """(partition or None, segment file) for a file, partition dir or data dir."""
    if path.is_file():
        yield parse_partition_dir(path.parent.name), path
        return
    n = parse_partition_dir(path.name)
    if n is not None:
        for _base, seg in list_segments(path):
            yield n, seg
        return
    dirs = list_partition_dirs(path)
    if not dirs:
        raise FileNotFoundError(f"{path} is not a segment file, a __consumer_offsets-N directory or a data directory")
    for n, pdir in dirs.items():
        for _base, seg in list_segments(pdir):
            yield n, seg


def dump_file(partition: int | None, path: Path, out: TextIO, as_json: bool) -> str | None:
    """Print one segment; returns a problem description when the file does not decode to its end."""
    base = parse_segment_name(path.name)
    if not as_json:
        out.write(f"Dumping {path}\n")
        if base is not None:
            out.write(f"Log starting offset: {base}\n")
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return None
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            pos = 0
            while pos < size:
                try:
                    h = read_header(mm, pos)
                    records = decode_records(mm, h)
                except RecordsError as e:
                    if not as_json:
                        out.write(f"Found {size - pos} invalid bytes at the end of {path.name}\n")
                    return f"{path}: {size - pos} invalid bytes from byte {pos}: {e}"
                if not as_json:
                    out.write(_text_batch(h) + "\n")
                for rec in records:
                    if as_json:
                        d: dict[str, Any] = {"file": str(path), "partition": partition, "batchOffset": h.base_offset}
                        if h.is_control:
                            d.update(offset=rec.offset, timestamp=rec.timestamp, type="control")
                            d["control"] = "COMMIT" if control_type(rec) == CONTROL_COMMIT else "ABORT"
                        else:
                            d.update(describe_record(rec, with_bytes=True))
                        out.write(json.dumps(d, separators=(",", ":")) + "\n")
                    else:
                        out.write(_text_record(rec, h) + "\n")
                pos = h.end
    return None


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="rallypoint dump-log",
        description="Print __consumer_offsets segments with their records decoded "
        "(like kafka-dump-log --offsets-decoder).",
        epilog="Exit status: 0 all decoded; 1 invalid bytes found (torn tail or corruption); 2 bad path.",
    )
    p.add_argument("path", help="a segment file, a __consumer_offsets-N directory, or a data directory")
    p.add_argument("--json", action="store_true", help="one JSON object per record")
    try:
        args = p.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    path = Path(args.path)
    if not path.exists():
        print(f"rallypoint dump-log: error: {path} does not exist", file=sys.stderr)
        return 2
    problems: list[str] = []
    out = sys.stdout
    try:
        for partition, seg in _segments_of(path):
            problem = dump_file(partition, seg, out, args.json)
            if problem:
                problems.append(problem)
    except FileNotFoundError as e:
        print(f"rallypoint dump-log: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `| head`
        return 0
    for problem in problems:
        print(f"rallypoint dump-log: invalid bytes: {problem}", file=sys.stderr)
    return 1 if problems else 0
