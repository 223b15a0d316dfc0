"""Generated ``__consumer_offsets`` logs, plain and damaged, for the tests that run a compiled
scan and its reference on the same bytes (tests/test_replay_scan.py, tests/test_pipeline_compiled.py).

The logs mix what the compiled scans take (plain batches of offset commits -- value versions 0
to 4, with and without an expire timestamp, ASCII or not --, tombstones, group records with
members, KIP-848 and share records, keys of versions 0 and 1 for one partition, LogAppendTime
batches) with what they leave to the reference (transactional batches and their markers,
compressed batches, records with headers or without a key, keys and values that do not
decode), and :func:`damage` breaks them the ways a disk or a crash does."""

from __future__ import annotations

import gzip
import random
import struct
import uuid
from pathlib import Path

from rallypoint.protocol import records as R
from rallypoint.protocol.consumer_protocol import (
    Assignment,
    Subscription,
    TopicPartitions,
    encode_assignment,
    encode_subscription,
)
from rallypoint.protocol.offsets_schema import (
    GroupMetadataKey,
    GroupMetadataValue,
    MemberMetadata,
    OffsetCommitKey,
    OffsetCommitValue,
    encode_group_metadata_value,
    encode_offset_commit_key,
    encode_offset_commit_value,
    encode_record,
)
from rallypoint.storage.segments import segment_name

Entry = tuple[bytes | None, bytes | None]


def commit(rng: random.Random, i: int) -> Entry:
    key = OffsetCommitKey(rng.choice(("g0", "g1", "g2", "g3", "gé")), rng.choice(("a", "b")), rng.randint(0, 4))
    if rng.random() < 0.1:
        return encode_record(key, None)
    value = OffsetCommitValue(
        i,
        rng.choice(("", "m", "", "mé")),
        1_700_000_000_000 + i,
        leader_epoch=rng.choice((-1, 0, 7)),
        expire_timestamp=rng.choice((None, None, 1_800_000_000_000 + i)),
        topic_id=rng.choice((None, None, uuid.UUID(int=i + 1))),
    )
    # the version Kafka writes for it, or any other (fields a version lacks are not written)
    version = rng.choice((None, None, None, 0, 1, 2, 3, 4))
    raw_key = encode_offset_commit_key(key)
    if rng.random() < 0.01:  # the same key written as version 0: one key for the loader
        raw_key = encode_offset_commit_key(key, 0)
    return raw_key, encode_offset_commit_value(value, version)


def _member(rng: random.Random, i: int, static: bool) -> MemberMetadata:
    topics = tuple(sorted(rng.sample(("a", "b", "c"), rng.randint(0, 3))))
    sub = encode_subscription(Subscription(rng.randint(0, 3), topics, rng.choice((None, b"u"))))
    tps = tuple(TopicPartitions(t, tuple(range(rng.randint(0, 3)))) for t in topics)
    assignment = encode_assignment(Assignment(rng.randint(0, 3), tps, rng.choice((None, b"", b"x"))))
    roll = rng.random()
    if roll < 0.1:
        assignment = b""
    elif roll < 0.2:  # consumer-protocol bytes that do not decode
        assignment = assignment[: rng.randrange(len(assignment))]
    elif roll < 0.25:
        sub = b"\xff\xff"
    return MemberMetadata(
        f"m-{rng.randint(0, 9)}",
        rng.choice((None, "static-1")) if static else None,
        "client",
        rng.choice(("/10.0.0.1", "/host-é")),
        rng.choice((30_000, 300_000)),
        10_000,
        sub,
        assignment,
    )


def group_value(rng: random.Random, i: int) -> bytes:
    version = rng.choice((3, 3, 3, 0, 1, 2, 4))
    members = tuple(_member(rng, i, static=version >= 3) for _ in range(rng.choice((0, 1, 3))))
    protocol_type = rng.choice(("consumer", "consumer", "connect", ""))
    value = GroupMetadataValue(protocol_type, i, rng.choice(("range", None)), rng.choice(("m-1", None)), i, members)
    raw = encode_group_metadata_value(value, version)
    if rng.random() < 0.05:  # cut short or grown: the reference words it, or reads past the end
        raw = raw[: rng.randrange(2, len(raw))] if rng.random() < 0.5 else raw + b"\x00"
    return raw


def entry(rng: random.Random, i: int) -> Entry:
    roll = rng.random()
    if roll < 0.6:
        return commit(rng, i)
    if roll < 0.75:
        gkey = GroupMetadataKey(f"g{rng.randint(0, 3)}")
        if rng.random() < 0.2:
            return encode_record(gkey, None)
        return encode_record(gkey, None)[0], group_value(rng, i)
    if roll < 0.85:  # a KIP-848 (3-8, 16) or share-group record, or an unknown version
        version = rng.choice((3, 4, 5, 8, 16, 9, 99, -1))
        return struct.pack(">h", version) + bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 12))), (
            None if rng.random() < 0.2 else b"\x00\x01v%d" % i
        )
    if roll < 0.9:  # a value that does not decode: counted once, in the result
        key, _ = commit(rng, i)
        return key, rng.choice((b"\x00\x03\x01", b"\x00\x09", b"\x00", b"\x00\x01" + bytes(12)))
    return commit(rng, i)


def odd_entry(rng: random.Random) -> Entry:
    """An entry the loader's reference path words: no key, a short key, a key that does not
    decode (a version-1 key whose group string runs past the key)."""
    return rng.choice(((None, b"x"), (b"\x00", b"x"), (b"\x00\x01\x00\x09ab", b"x"), (b"\x00\x02\x00", None)))


def batch(rng: random.Random, base: int, pid_state: dict[int, int]) -> bytes:
    kind = rng.random()
    ts = 1_700_000_000_000 + base
    n = rng.randint(1, 5)
    if kind < 0.7:
        entries = [entry(rng, base + j) for j in range(n)]
        if rng.random() < 0.05:
            entries[rng.randrange(n)] = odd_entry(rng)
        if rng.random() < 0.1:  # records a second apart; or LogAppendTime, stamped by the broker
            blob = R.encode_batch(
                [R.Record(base + j, ts + 1000 * j, *e) for j, e in enumerate(entries)], base_offset=base
            )
            return R.with_max_timestamp(blob, ts + 5, log_append_time=True) if rng.random() < 0.5 else blob
        return R.build_batch(base, entries, ts)
    recs = [R.Record(base + j, ts, *entry(rng, base + j)) for j in range(n)]
    if kind < 0.8:  # a transactional batch of some producer
        pid = rng.randint(1, 3)
        pid_state[pid] = base
        return R.encode_batch(recs, base_offset=base, producer_id=pid, producer_epoch=0, transactional=True)
    if kind < 0.88 and pid_state:  # its marker
        pid = rng.choice(sorted(pid_state))
        del pid_state[pid]
        return R.end_txn_marker(base, ts, pid, 0, rng.random() < 0.7)
    if kind < 0.94:  # compressed
        h = R.parse_header(R.encode_batch(recs, base_offset=base))
        payload = gzip.compress(bytes(R.encode_records(recs, base, ts)))
        return R.assemble_batch(h._replace(attributes=h.attributes | 1), payload)
    # a record with a header
    recs[0] = recs[0]._replace(headers=(("h", b"v"),))
    return R.encode_batch(recs, base_offset=base)


def segments(rng: random.Random, batches: int) -> list[tuple[int, bytearray]]:
    """Segments (base offset, bytes) of a generated log: gaps between batches sometimes (as after
    compaction), a new segment now and then."""
    segs: list[tuple[int, bytearray]] = [(0, bytearray())]
    offset = 0
    pid_state: dict[int, int] = {}
    for _ in range(batches):
        if rng.random() < 0.1:
            offset += rng.randint(1, 5)
        if rng.random() < 0.08 and segs[-1][1]:
            segs.append((offset, bytearray()))
        blob = batch(rng, offset, pid_state)
        segs[-1][1].extend(blob)
        offset = R.parse_header(blob).next_offset
    return segs


def damage(rng: random.Random, segs: list[tuple[int, bytearray]]) -> None:
    roll = rng.random()
    _, data = segs[rng.randrange(len(segs))]
    if roll < 0.3 and data:  # a flipped byte anywhere
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
    elif roll < 0.5 and segs[-1][1]:  # a torn tail
        del segs[-1][1][rng.randrange(len(segs[-1][1])) :]
    elif roll < 0.6:  # zeros after the last batch
        segs[-1][1].extend(bytes(rng.randint(1, 100)))
    elif roll < 0.7 and data:  # a batch whose CRC is recomputed after a change in its records
        pos = 0
        while pos < len(data):
            h = R.read_header(data, pos, verify_crc=False)
            if rng.random() < 0.3 or h.end >= len(data):
                body = bytearray(data[pos + R.HEADER_SIZE : h.end])
                if body:
                    body[rng.randrange(len(body))] = rng.getrandbits(8)
                data[pos : h.end] = R.assemble_batch(h, bytes(body))
                break
            pos = h.end


def write(pdir: Path, segs: list[tuple[int, bytearray]]) -> None:
    pdir.mkdir(parents=True)
    for base, data in segs:
        (pdir / segment_name(base)).write_bytes(bytes(data))
