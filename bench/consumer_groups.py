"""Consumer groups (KIP-848): time to Stable for N consumer-protocol members, and the server
assignors' time for M members x P partitions.

* time to Stable: one raw asyncio connection per member speaking ConsumerGroupHeartbeat v1 like
  a consumer (join with a client-generated id, then heartbeat at the interval the coordinator
  says, reporting the partitions it owns, i.e. acknowledging every assignment it was given).
  Timed from the first join sent until ConsumerGroupDescribe reports the group Stable with
  all N members.  Broker: Kafka's defaults (assignor at most once a second) but a heartbeat
  interval of 500 ms.
* assignor: ``uniform`` (homogeneous) and ``range`` over M members x P partitions of one topic,
  in process, from an empty current assignment.

    python -m bench.consumer_groups [--sizes 10 100 1000] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid
from typing import Any

from rallypoint.groups.assignors import GroupSpec, MemberSpec, RangeAssignor, UniformAssignor

from bench.common import rallypoint, summarize
from bench.loadgen import Conn

HB_MS = 500
# Kafka's defaults but a 500 ms heartbeat interval (Kafka's least is 5 s): the assignor runs at
# most once a second (group.consumer.assignment.interval.ms), as in Kafka
BROKER = {
    "group.consumer.heartbeat.interval.ms": str(HB_MS),
    "group.consumer.min.heartbeat.interval.ms": str(HB_MS),
}
PARTITIONS = 1000


async def _time_to_stable(host: str, port: int, members: int, topic: str) -> float:
    conns = [await Conn.open(host, port) for _ in range(members)]
    admin = await Conn.open(host, port)
    group = f"cg-bench-{members}-{uuid.uuid4().hex[:8]}"
    stop = asyncio.Event()

    async def member(c: Conn) -> None:
        mid = uuid.uuid4().hex[:22]
        epoch = 0
        owned: list[dict[str, Any]] = []
        body: dict[str, Any] = {
            "group_id": group,
            "member_id": mid,
            "member_epoch": 0,
            "rebalance_timeout": 60000,
            "subscribed_topic_names": [topic],
            "subscribed_topic_regex": "",
            "topic_partitions": [],
        }
        while not stop.is_set():
            r = await c.call(68, 1, body)
            if int(r.error_code) != 0:
                raise RuntimeError(f"heartbeat error {int(r.error_code)}: {r.error_message}")
            epoch = int(r.member_epoch)
            if r.assignment is not None:
                owned = [
                    {"topic_id": tp.topic_id, "partitions": list(tp.partitions)} for tp in r.assignment.topic_partitions
                ]
            body = {"group_id": group, "member_id": mid, "member_epoch": epoch, "rebalance_timeout": -1}
            body["topic_partitions"] = owned
            try:
                await asyncio.wait_for(stop.wait(), HB_MS / 1000)
            except TimeoutError:
                pass

    start = time.perf_counter()
    tasks = [asyncio.create_task(member(c)) for c in conns]
    try:
        while True:
            await asyncio.sleep(0.02)
            for t in tasks:
                if t.done() and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
            d = await admin.call(69, 1, {"group_ids": [group], "include_authorized_operations": False})
            g = d.groups[0]
            if int(g.error_code) == 0 and g.group_state == "Stable" and len(g.members) == members:
                elapsed = time.perf_counter() - start
                break
            if time.perf_counter() - start > 120:
                raise RuntimeError(f"not Stable after 120 s: {g.group_state}, {len(g.members)} members")
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        for c in [*conns, admin]:
            c.close()
    return elapsed


async def _create_topic(host: str, port: int, topic: str, partitions: int) -> None:
    c = await Conn.open(host, port)
    try:
        r = await c.call(
            19, 5, {"topics": [{"name": topic, "num_partitions": partitions, "replication_factor": 1}], "timeout": 5000}
        )
        if int(r.topics[0].error_code) != 0:
            raise RuntimeError(f"CreateTopics error {int(r.topics[0].error_code)}")
    finally:
        c.close()


def time_to_stable(sizes: list[int], runs: int) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    with rallypoint(BROKER) as ep:
        topic = "cg-bench"
        asyncio.run(_create_topic(ep.host, ep.port, topic, PARTITIONS))
        for n in sizes:
            samples = [asyncio.run(_time_to_stable(ep.host, ep.port, n, topic)) * 1000 for _ in range(runs)]
            out[n] = samples
            print(f"{n:>5} consumer-protocol members: Stable after {summarize(samples)['median']:8.1f} ms", flush=True)
    return out


def assignor_time(members: int, partitions: int, runs: int) -> dict[str, list[float]]:
    tid = uuid.uuid4()
    specs = {f"member-{i:05d}": MemberSpec(f"member-{i:05d}", None, None, frozenset({tid})) for i in range(members)}
    spec = GroupSpec(specs, True, {tid: partitions})
    out: dict[str, list[float]] = {}
    for assignor in (UniformAssignor(), RangeAssignor()):
        samples = []
        for _ in range(runs):
            t0 = time.perf_counter()
            assignor.assign(spec)
            samples.append((time.perf_counter() - t0) * 1000)
        out[assignor.name] = samples
        print(
            f"{assignor.name} assignor, {members} members x {partitions} partitions: "
            f"{summarize(samples)['median']:8.1f} ms",
            flush=True,
        )
    return out


def run(quick: bool = False) -> list[dict[str, Any]]:
    runs = 2 if quick else 5
    rows: list[dict[str, Any]] = []
    for n, samples in time_to_stable([10, 100, 1000], runs).items():
        rows.append({"name": f"consumer group Stable, {n:,} members", "unit": "ms", "stats": summarize(samples)})
    rows[-1]["note"] = (
        f"one raw connection per member, ConsumerGroupHeartbeat v1 every {HB_MS} ms acknowledging its "
        f"assignment; one topic of {PARTITIONS} partitions; group.consumer.assignment.interval.ms 1000 "
        "(Kafka's default); timed from the first join until ConsumerGroupDescribe reports Stable"
    )
    for name, samples in assignor_time(1000, 1000, runs).items():
        rows.append(
            {"name": f"{name} assignor, 1,000 members x 1,000 partitions", "unit": "ms", "stats": summarize(samples)}
        )
    return rows


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", type=int, nargs="*", default=[10, 100, 1000])
    p.add_argument("--runs", type=int, default=3)
    a = p.parse_args()
    assignor_time(1000, 1000, a.runs)
    time_to_stable(a.sizes, a.runs)
