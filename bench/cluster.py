"""Coordinator moves with several brokers in one process (docs/cluster.md, "Moving a coordinator").

A 3-node rallypoint; N groups (10 and 10,000) all on ``__consumer_offsets`` partition 0, each
with one member's GroupMetadata record (a one-member group joined through JoinGroup/SyncGroup
for the 10-group case; a "simple" group made by OffsetCommit with generation -1 for the large
case, as admin tools make them) and a committed offset.  Then the partition's coordinator is
moved back and forth with ``POST /v1/partitions/__consumer_offsets/0/leader``, and two figures
are taken per move:

* load time: what the broker reports in ``coordinators_moved`` — writes drained, groups
  unloaded, the partition replayed, groups loaded;
* answering again: from sending the move until an OffsetFetch of the last group, sent to the
  new node again and again, is answered without an error (what a client waits for).

    python -m bench.cluster [--groups 10 10000] [--moves 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from rallypoint.protocol.offsets_schema import partition_for

from bench.common import summarize
from bench.loadgen import Conn, join_single_member_group
from tests.support import BrokerProcess

PARTITION = 0


def _groups_on_partition(n: int) -> list[str]:
    out: list[str] = []
    i = 0
    while len(out) < n:
        g = f"bench-move-{i}"
        if partition_for(g, 50) == PARTITION:
            out.append(g)
        i += 1
    return out


def _post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(req, timeout=120) as r:
        out: dict[str, Any] = json.loads(r.read())
        return out


async def _fill(port: int, groups: list[str], joined: bool) -> None:
    conns = [await Conn.open("127.0.0.1", port) for _ in range(8)]
    await conns[0].call(10, 4, {"key_type": 0, "coordinator_keys": [groups[0]]})  # creates __consumer_offsets
    await conns[0].call(
        19, 5, {"topics": [{"name": "bench-move", "num_partitions": 1, "replication_factor": 1}], "timeout": 5000}
    )

    async def one(c: Conn, g: str) -> None:
        gen, member = (await join_single_member_group(c, g, 600_000)) if joined else (-1, "")
        r = await c.call(
            8,
            8,
            {
                "group_id": g,
                "generation_id_or_member_epoch": gen,
                "member_id": member,
                "group_instance_id": None,
                "topics": [{"name": "bench-move", "partitions": [{"partition_index": 0, "committed_offset": 42}]}],
            },
        )
        code = int(r.topics[0].partitions[0].error_code)
        if code:
            raise RuntimeError(f"commit for {g} failed: {code}")

    for i in range(0, len(groups), len(conns)):
        await asyncio.gather(*(one(c, g) for c, g in zip(conns, groups[i : i + len(conns)], strict=False)))
    for c in conns:
        c.close()


async def _until_answered(port: int, group: str, deadline_s: float) -> None:
    c = await Conn.open("127.0.0.1", port)
    try:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            r = await c.call(9, 8, {"groups": [{"group_id": group, "topics": None}], "require_stable": False})
            g = r.groups[0]
            if int(g.error_code) == 0 and g.topics and int(g.topics[0].partitions[0].committed_offset) == 42:
                return
            await asyncio.sleep(0.001)
        raise RuntimeError(f"group {group} not answered within {deadline_s} s")
    finally:
        c.close()


def measure(n: int, moves: int) -> tuple[list[float], list[float]]:
    groups = _groups_on_partition(n)
    with tempfile.TemporaryDirectory(prefix="rp-bench-cluster-") as tmp:
        config = {"rallypoint.brokers": "3", "rallypoint.offsets.flush": "never"}
        with BrokerProcess(Path(tmp), config, extra_args=["--control-port", "0"]).start() as b:
            ports = b.node_ports()
            control = b.events("listening")[-1]["control"]
            asyncio.run(_fill(ports[1], groups, joined=n <= 100))
            loads: list[float] = []
            answers: list[float] = []
            for i in range(moves):
                target = 2 if i % 2 == 0 else 1
                t0 = time.perf_counter()
                r = _post(f"{control}/v1/partitions/__consumer_offsets/{PARTITION}/leader", {"node": target})
                asyncio.run(_until_answered(ports[target], groups[-1], 60))
                answers.append((time.perf_counter() - t0) * 1000)
                [moved] = r["coordinators_moved"]
                if moved["groups"] != n:
                    raise RuntimeError(f"{moved['groups']} groups moved, {n} expected")
                loads.append(float(moved["ms"]))
            return loads, answers


def run(quick: bool = False) -> list[dict[str, Any]]:
    moves = 3 if quick else 7
    rows: list[dict[str, Any]] = []
    for n in (10, 1000 if quick else 10_000):
        loads, answers = measure(n, moves)
        rows.append({"name": f"coordinator move, {n:,} groups: load time", "unit": "ms", "stats": summarize(loads)})
        rows.append(
            {"name": f"coordinator move, {n:,} groups: until answered again", "unit": "ms", "stats": summarize(answers)}
        )
    rows[-1]["note"] = (
        "3 nodes in one process; every group on __consumer_offsets partition 0 with one committed offset (the "
        "10-group case: one joined member each); the partition's leader moved back and forth through the control "
        "plane; load time as the broker reports it, answered again = until an OffsetFetch of the last group "
        "sent to the new node returns its offset"
    )
    return rows


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--groups", type=int, nargs="*", default=[10, 10_000])
    p.add_argument("--moves", type=int, default=5)
    a = p.parse_args()
    for n in a.groups:
        loads, answers = measure(n, a.moves)
        print(json.dumps({"groups": n, "load_ms": summarize(loads), "answered_ms": summarize(answers)}))
