"""Offsets log: durable commit throughput (group commit on/off), replay and compaction speed.

    python -m bench.offsets_log [--quick]

* **Durable appends/s**: C concurrent committers, each awaiting ``OffsetsLog.append`` of one
  OffsetCommit record (one partition-commit) in a loop, with ``flush=always`` (every
  acknowledged append is fsynced).  Committers are spread over the 50 partitions (each group
  maps to one partition, as in Kafka) or all on one partition.  Group commit on (default) vs
  off (``group_commit=False``: one write + fdatasync per append).  fsyncs/append is printed.
* **Replay MiB/s**: start-up recovery (read, CRC-check, decode every record, rebuild state) of a
  partition of commit batches.
* **Compaction MiB/s**: one cleaner pass over the same partition's closed segments.
* **Through the broker**: OffsetCommit v8 requests (simple groups, one partition each) from
  raw-protocol connections to a broker process with ``flush=always``, all groups on one
  ``__consumer_offsets`` partition or spread.

The data directory is a temporary directory on the file system of $TMPDIR.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from rallypoint.protocol.offsets_schema import OffsetCommitKey, OffsetCommitValue, encode_record, partition_for
from rallypoint.protocol.records import build_batch
from rallypoint.storage import OffsetsLog
from rallypoint.storage.cleaner import clean_partition
from rallypoint.storage.recovery import replay_partition
from rallypoint.storage.segments import partition_dir, segment_name

from bench.common import summarize

PARTITIONS = 50


async def _durable(
    root: Path, committers: int, seconds: float, *, group_commit: bool, spread: bool, io_threads: int
) -> dict[str, float]:
    log = OffsetsLog(
        root,
        num_partitions=PARTITIONS,
        flush="always",
        group_commit=group_commit,
        cleaner=False,
        io_threads=io_threads,
    )
    await log.start()
    groups = [f"group-{i}" if spread else "group-0" for i in range(committers)]
    stop = time.perf_counter() + seconds
    counts = [0] * committers

    async def committer(i: int) -> None:
        part = partition_for(groups[i], PARTITIONS)
        n = 0
        while time.perf_counter() < stop:
            n += 1
            await log.append(part, [(OffsetCommitKey(groups[i], "topic", i), OffsetCommitValue(n, "", 0))])
        counts[i] = n

    # warm-up: create the segment files outside the measurement
    for g in set(groups):
        await log.append(partition_for(g, PARTITIONS), [(OffsetCommitKey(g, "warm", 0), OffsetCommitValue(0, "", 0))])
    fsyncs0, appends0 = log.fsyncs, log.appends
    t0 = time.perf_counter()
    await asyncio.gather(*(committer(i) for i in range(committers)))
    elapsed = time.perf_counter() - t0
    appends = log.appends - appends0
    fsyncs = log.fsyncs - fsyncs0
    await log.stop()
    return {"appends_per_s": appends / elapsed, "fsyncs_per_append": fsyncs / max(appends, 1), "appends": appends}


def durable(
    committers: int, seconds: float, *, group_commit: bool, spread: bool, io_threads: int = 4
) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="rp-bench-olog-"))
    try:
        return asyncio.run(
            _durable(root, committers, seconds, group_commit=group_commit, spread=spread, io_threads=io_threads)
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def _e2e(
    host: str, port: int, connections: int, seconds: float, same_partition: bool, partitions: int = 1
) -> float:
    """OffsetCommit v8 requests/s (``partitions`` partitions each, simple groups) over ``connections``."""
    from bench.loadgen import Conn

    conns = [await Conn.open(host, port) for _ in range(connections)]
    if same_partition:  # groups that all hash to __consumer_offsets-0
        groups = [g for g in (f"e2e-{i}" for i in range(100_000)) if partition_for(g, PARTITIONS) == 0][:connections]
    else:
        groups = [f"e2e-{i}" for i in range(connections)]
    stop = time.perf_counter() + seconds
    done = [0]

    async def run(c: Conn, group: str) -> None:
        n = 0
        while time.perf_counter() < stop:
            n += 1
            body = {
                "group_id": group,
                "generation_id_or_member_epoch": -1,
                "member_id": "",
                "group_instance_id": None,
                "topics": [
                    {
                        "name": "e2e",
                        "partitions": [{"partition_index": p, "committed_offset": n} for p in range(partitions)],
                    }
                ],
            }
            r = await c.call(8, 8, body)
            for part in r.topics[0].partitions:
                if int(part.error_code):
                    raise RuntimeError(f"OffsetCommit error {int(part.error_code)}")
            done[0] += 1

    t0 = time.perf_counter()
    try:
        await asyncio.gather(*(run(c, g) for c, g in zip(conns, groups, strict=True)))
    finally:
        for c in conns:
            c.close()
    return done[0] / (time.perf_counter() - t0)


def end_to_end(connections: int, seconds: float, same_partition: bool, partitions: int = 1) -> float:
    """Durable OffsetCommit requests/s through a broker process (flush=always), each request
    committing ``partitions`` partitions of one topic."""
    from bench.common import rallypoint
    from tests.support import WireClient, create_topic

    with rallypoint({"rallypoint.offsets.flush": "always"}) as ep:
        with WireClient(ep.host, ep.port) as c:
            create_topic(c, "e2e", partitions)
        return asyncio.run(_e2e(ep.host, ep.port, connections, seconds, same_partition, partitions))


def _write_partition(pdir: Path, mib: int, keys: int, segment_bytes: int) -> int:
    """Commit batches (3 records each, like a consumer committing 3 partitions) over ``keys``
    distinct (group, topic, partition) keys — 10 partitions per group; returns bytes written."""
    pdir.mkdir(parents=True, exist_ok=True)
    target = mib * 2**20
    written = 0
    offset = 0
    seg_size = 0
    f = open(pdir / segment_name(0), "wb")
    i = 0
    try:
        while written < target:
            entries = [
                encode_record(
                    OffsetCommitKey(f"group-{k // 10}", "orders", k % 10),
                    OffsetCommitValue(i, "", 1_700_000_000_000 + i),
                )
                for k in ((3 * i + j) % keys for j in range(3))
            ]
            blob = build_batch(offset, entries, 1_700_000_000_000 + i)
            if seg_size and seg_size + len(blob) > segment_bytes:
                f.close()
                f = open(pdir / segment_name(offset), "wb")
                seg_size = 0
            f.write(blob)
            seg_size += len(blob)
            written += len(blob)
            offset += len(entries)
            i += 1
    finally:
        f.close()
    return written


def replay_and_compaction(mib: int) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="rp-bench-olog-"))
    try:
        pdir = partition_dir(root, 0)
        size = _write_partition(pdir, mib, keys=1000, segment_bytes=16 * 2**20)
        os.sync()
        t0 = time.perf_counter()
        rp = replay_partition(pdir, 0, repair=False)
        replay_s = time.perf_counter() - t0
        segs = rp.segments
        t0 = time.perf_counter()
        res = clean_partition(
            pdir, segs[:-1], segs[-1], now_ms=0, delete_retention_ms=86_400_000, segment_bytes=100 * 2**20
        )
        clean_s = time.perf_counter() - t0
        closed = sum(s.size for s in segs[:-1])
        return {
            "replay_mib_s": size / 2**20 / replay_s,
            "records_per_s": rp.state.records / replay_s,
            "compaction_mib_s": closed / 2**20 / clean_s,
            "mib": size / 2**20,
            "closed_mib": closed / 2**20,
            "after_mib": res.bytes_written / 2**20,
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run(quick: bool = False) -> list[dict[str, Any]]:
    seconds = 2.0 if quick else 5.0
    runs = 1 if quick else 3
    rows: list[dict[str, Any]] = []
    notes = []
    for committers, spread in ((200, True), (200, False), (1, False)):
        for gc in (True, False):
            samples = [durable(committers, seconds, group_commit=gc, spread=spread) for _ in range(runs)]
            where = "50 partitions" if spread else "1 partition"
            name = f"durable commits/s, {committers} committers on {where}, group commit {'on' if gc else 'off'}"
            stats = summarize([s["appends_per_s"] for s in samples])
            fpa = sum(s["fsyncs_per_append"] for s in samples) / len(samples)
            print(f"{name}: {stats['median']:,.0f}/s, {fpa:.3f} fsyncs/append", flush=True)
            rows.append({"name": name, "unit": "commits/s", "stats": stats})
            notes.append(f"{name}: {fpa:.3f} fsyncs per acknowledged commit")
    for threads in (1, 4, 8):
        s = durable(200, seconds, group_commit=True, spread=True, io_threads=threads)
        print(f"io threads {threads}: {s['appends_per_s']:,.0f} durable commits/s (200 committers, 50 partitions)")
        notes.append(
            f"I/O threads {threads}: {s['appends_per_s']:,.0f} durable commits/s (200 committers, 50 partitions)"
        )
    for conns, same in ((1, True), (50, True), (50, False)):
        e2e = summarize([end_to_end(conns, seconds, same) for _ in range(runs)])
        where = "one __consumer_offsets partition" if same else "50 partitions"
        name = f"durable OffsetCommit requests/s through the broker, {conns} connection(s), {where}"
        print(f"{name}: {e2e['median']:,.0f}/s", flush=True)
        rows.append({"name": name, "unit": "requests/s", "stats": e2e})
    # A consumer commits every partition it owns in one request: the durable partition-commits/s.
    per = 10
    pc = summarize([per * end_to_end(50, seconds, False, per) for _ in range(runs)])
    name = f"durable partition-commits/s through the broker, 50 connections, {per} partitions per OffsetCommit"
    print(f"{name}: {pc['median']:,.0f}/s", flush=True)
    rows.append({"name": name, "unit": "partition-commits/s", "stats": pc})
    mib = 20 if quick else 100
    rc = [replay_and_compaction(mib) for _ in range(runs)]
    rows.append(
        {"name": f"replay ({mib} MiB partition)", "unit": "MiB/s", "stats": summarize([r["replay_mib_s"] for r in rc])}
    )
    rows.append(
        {
            "name": f"replay ({mib} MiB partition)",
            "unit": "records/s",
            "stats": summarize([r["records_per_s"] for r in rc]),
        }
    )
    rows.append(
        {
            "name": "compaction (closed segments)",
            "unit": "MiB/s",
            "stats": summarize([r["compaction_mib_s"] for r in rc]),
        }
    )
    r0 = rc[0]
    msg = (
        f"replay {r0['mib']:.0f} MiB: {r0['replay_mib_s']:.1f} MiB/s ({r0['records_per_s']:,.0f} records/s); "
        f"compaction {r0['closed_mib']:.0f} MiB → {r0['after_mib']:.2f} MiB at {r0['compaction_mib_s']:.1f} MiB/s"
    )
    print(msg, flush=True)
    notes.append(msg)
    rows[-1]["note"] = "; ".join(notes)
    return rows


if __name__ == "__main__":
    p = argparse.ArgumentParser(prog="python -m bench.offsets_log")
    p.add_argument("--quick", action="store_true")
    run(p.parse_args().quick)
