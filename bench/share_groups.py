"""Share groups (KIP-932): records/s delivered and acknowledged through confluent-kafka's
``ShareConsumer`` (librdkafka 2.16, implicit acknowledgement) with 1 and with 4 consumers of one
share group on a 4-partition topic pre-filled with N records of 100 bytes, side by side with
librdkafka's mock cluster in the same run (docs/share-groups.md).

    python -m bench.share_groups [--quick]

``run(quick: bool) -> list[dict]`` (bench/__main__.py).  One run, the same on both brokers:

1. A fresh topic and a fresh share group.  The topic is created by Metadata auto-creation
   (bench.compare's helper): rallypoint is started with ``num.partitions=4``, the mock's
   default is 4; a run checks that the topic has 4 partitions.
2. The consumers subscribe and poll the still empty topic for a settling time, then stop
   polling.  By then they have joined, their assignments have settled (for 4 consumers: longer
   than one share heartbeat interval, 5 s on both brokers, so the members that joined first
   have taken the assignment computed after the last join) and every share partition has been
   fetched once on an empty log, which starts it at offset 0.
3. N records are produced round-robin over the 4 partitions while nobody polls.  The producer
   stays open until the run ends (see "The mock" below).  Not quite nothing is acquired
   meanwhile: once a poll has asked for records, librdkafka sends ShareFetch again in the
   background each time one comes back empty, until one returns records; so up to one batch
   per consumer (``max.poll.records``, 500) can be acquired during the filling and handed out
   by the first poll after the clock starts (seen with rallypoint, which answers that held
   fetch as soon as records arrive) — at most 0.5 % of N = 100,000 with one consumer and 2 %
   with four, within the runs' spread.
4. The clock starts.  Each consumer polls in its own thread and counts the (partition, offset)
   pairs ``poll`` returned.  When N distinct records have been delivered, every consumer calls
   ``commit_sync`` (implicit mode: that accepts its last batch; each earlier batch was accepted
   by the ShareFetch of the poll after it), and the clock stops when the last ``commit_sync``
   has returned.  Figure: N / elapsed.
5. Checks after the clock: the acknowledgement-commit callbacks must confirm N accepted offsets
   (acknowledgements that rode on a ShareFetch the broker holds for up to ``fetch.wait.max.ms``
   because nothing is left to acquire are confirmed only when it answers — rallypoint holds it
   as Kafka does, the mock answers at once — so they are awaited but not timed), and no record
   may be missing or delivered twice, no poll, acknowledgement or commit may fail; else the run
   raises.

Where a share partition starts: rallypoint's share groups default to
``share.auto.offset.reset=latest`` (as Kafka's); the bench sets ``earliest`` on rallypoint's
group with ``AdminClient.incremental_alter_configs`` (ResourceType.GROUP) before consuming, as
applications do.  librdkafka's mock does not serve that: its ApiVersions lists neither
IncrementalAlterConfigs nor AlterConfigs nor DescribeConfigs, and the admin client gives up
"waiting for controller"; its share groups start at ``latest`` unless the C-only mock API
``rd_kafka_mock_sharegroup_set_auto_offset_reset`` is called, which confluent-kafka does not
expose.  Step 2 is what makes the comparison fair: under ``latest`` a share partition starts at
the log end when it is first fetched, which on the empty topic is offset 0, so both brokers
deliver exactly the N pre-filled records (a run that delivers fewer fails).

Threads, not processes: the figures come from a 2-core machine and the broker under test (one
asyncio process for rallypoint; one C thread in its own process for the mock) needs one core.
A ``ShareConsumer`` does its network I/O and record decoding in librdkafka's C threads, outside
the GIL; what runs under the GIL here is a loop that counts offsets.  So threads keep the client
side near one core for both brokers, while four consumer processes (four interpreters, four
librdkafka instances) would contend with the broker for the second core and make the 4-consumer
figure depend on the scheduler more than on the broker.  Each consumer is created, used and
closed by its own thread (they are not thread-safe).

The mock, as found while writing this (librdkafka's rdkafka_mock_handlers.c and
rdkafka_mock_sharegrp.c as of the commits leading to 2.16; the behaviour was checked against the
librdkafka 2.16.0 that confluent-kafka 2.16.1 bundles):

- Its acquisition looks up every offset's state in a linked list of all records ever acquired
  in the partition for the group (states are never freed once the start offset moves past
  them) and every offset's message set in a linked list of all message sets, so its ShareFetch
  costs grow with what the partition has delivered.  Measured while writing this (one
  consumer, CPU time of the broker process while the clock ran): the mock spent about 11 µs
  per record with 20,000 records and 48 µs with 100,000, and could not deliver 200,000 within
  120 s; rallypoint spent about 5 µs per record at 20,000, 100,000 and 400,000 records, without
  saturating its core (one consumer is bound by round trips).  Hence the rows name N and one
  row repeats the 1-consumer run with a shorter log; the ratio depends on N.
- When any client connection to a mock broker closes, it closes every share session on that
  broker (``rd_kafka_mock_sharegrps_node_connection_closed``), releasing all acquired records
  of every member: destroying an unrelated producer while a consumer held records made that
  consumer's acknowledgement fail with SHARE_SESSION_NOT_FOUND and its records be delivered
  again (delivery count 2).  Kafka closes only the sessions of the connection that closed, and
  so does rallypoint.
- Assignments differ: the mock gives each of 4 members one partition; rallypoint runs Kafka's
  ``simple`` assignor (the first member keeps the 4 partitions it got alone, the others are
  hashed onto one each, so partitions are shared by several members).
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from bench.common import MOCK, Endpoint, side_by_side
from bench.compare import _ensure_topic

PARTITIONS = 4
RECORD_BYTES = 100
HEARTBEAT_S = 5.0  # the share heartbeat interval: Kafka's default, rallypoint's and the mock's
# rallypoint otherwise at its defaults (durable share-partition state, fsync per write round)
BROKER = {"num.partitions": str(PARTITIONS)}
TIMEOUT_S = 120.0
Record = tuple[int | None, int | None]  # (partition, offset) as confluent-kafka types them


@dataclass
class _Shared:
    """What the consumer threads and the timing thread share (``lock`` guards the counters)."""

    records: int
    consumers: int
    lock: threading.Lock = field(default_factory=threading.Lock)
    seen: set[Record] = field(default_factory=set)
    redelivered: int = 0
    accepted: int = 0
    errors: list[str] = field(default_factory=list)
    finished: list[float] = field(default_factory=list)
    stop_settling: threading.Event = field(default_factory=threading.Event)
    go: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    paused: threading.Barrier = field(init=False)
    committed: threading.Barrier = field(init=False)

    def __post_init__(self) -> None:
        self.paused = threading.Barrier(self.consumers + 1, timeout=TIMEOUT_S)
        self.committed = threading.Barrier(self.consumers + 1, timeout=TIMEOUT_S)

    def fail(self, what: str) -> None:
        with self.lock:
            self.errors.append(what)
        self.done.set()

    def delivered(self, keys: list[Record]) -> None:
        with self.lock:
            before = len(self.seen)
            self.seen.update(keys)
            self.redelivered += len(keys) - (len(self.seen) - before)
            if len(self.seen) >= self.records:
                self.done.set()

    def on_commit(self, offsets: dict[Any, set[int]], error: Exception | None) -> None:
        """The acknowledgement-commit callback (served on the consumer's own thread)."""
        if error is not None:
            self.fail(f"acknowledgement commit failed: {error}")
            return
        with self.lock:
            self.accepted += sum(len(o) for o in offsets.values())

    def all_accepted(self) -> bool:
        with self.lock:
            return self.accepted >= self.records


def _consumer(ep: Endpoint, group: str, topic: str, shared: _Shared) -> None:
    """One share consumer, from creation to close, in its own thread (module docstring)."""
    from confluent_kafka import ShareConsumer

    c = ShareConsumer({"bootstrap.servers": ep.bootstrap, "group.id": group, "log_level": 0})
    try:
        c.set_acknowledgement_commit_callback(shared.on_commit)
        c.subscribe([topic])
        while not shared.stop_settling.is_set():  # step 2
            if c.poll(0.1):
                shared.fail("records delivered while the topic was empty")
        shared.paused.wait()
        shared.go.wait(TIMEOUT_S)
        while not shared.done.is_set():  # step 4
            keys: list[Record] = []
            for m in c.poll(0.1):
                if m.error() is not None:
                    shared.fail(f"poll returned an error: {m.error()}")
                else:
                    keys.append((m.partition(), m.offset()))
            if keys:
                shared.delivered(keys)
        for tp, result in c.commit_sync(30).items():
            if result is not None:
                shared.fail(f"commit_sync {tp.topic}[{tp.partition}]: {result}")
        with shared.lock:
            shared.finished.append(time.perf_counter())
        shared.committed.wait()
        deadline = time.monotonic() + 10  # step 5: the callbacks are served from inside poll
        while not shared.all_accepted() and time.monotonic() < deadline:
            if c.poll(0.05):
                shared.fail("records delivered after all N were")
    except Exception as e:
        shared.fail(f"{type(e).__name__}: {e}")
        shared.paused.abort()
        shared.committed.abort()
    finally:
        c.close()


def _fill(producer: Any, ep: Endpoint, topic: str, records: int) -> None:
    payload = b"x" * RECORD_BYTES
    for i in range(records):
        while True:
            try:
                producer.produce(topic, payload, partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.01)
    if producer.flush(60) != 0:
        raise RuntimeError(f"records not all produced to {ep.name}")


def _set_earliest(ep: Endpoint, group: str) -> None:
    from confluent_kafka.admin import (  # type: ignore[attr-defined]  # (imported there, not re-exported)
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        ResourceType,
    )

    entry = ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)
    admin = AdminClient({"bootstrap.servers": ep.bootstrap, "log_level": 0})
    resource = ConfigResource(ResourceType.GROUP, group, incremental_configs=[entry])
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(10)


def settle_seconds(consumers: int) -> float:
    """How long the consumers poll the empty topic before it is filled (step 2)."""
    return 2.0 if consumers == 1 else HEARTBEAT_S + 2.0


def delivered_per_s(ep: Endpoint, consumers: int, records: int, settle_s: float | None = None) -> float:
    """One run (module docstring): records/s delivered and acknowledged by ``consumers`` share
    consumers of a fresh group on a fresh topic pre-filled with ``records`` records."""
    from confluent_kafka import Producer

    topic = f"bench-share-{uuid.uuid4().hex[:8]}"
    group = f"bench-share-{uuid.uuid4().hex[:8]}"
    _ensure_topic(ep, topic)
    # One producer for the whole run, destroyed after the consumers are closed: the mock closes
    # every share session of its broker when any client connection to it closes.
    producer = Producer({"bootstrap.servers": ep.bootstrap, "linger.ms": 5, "log_level": 0})
    got = len(producer.list_topics(topic, timeout=10).topics[topic].partitions)
    if got != PARTITIONS:
        raise RuntimeError(f"{ep.name} created {topic} with {got} partitions, not {PARTITIONS}")
    if ep.name != MOCK:
        _set_earliest(ep, group)
    shared = _Shared(records, consumers)
    threads = [
        threading.Thread(target=_consumer, args=(ep, group, topic, shared), name=f"share-consumer-{i}", daemon=True)
        for i in range(consumers)
    ]
    for t in threads:
        t.start()
    elapsed: float | None = None
    try:
        shared.done.wait(settle_seconds(consumers) if settle_s is None else settle_s)  # ends early on a failure
        shared.stop_settling.set()
        shared.paused.wait()
        _fill(producer, ep, topic, records)
        start = time.perf_counter()
        shared.go.set()
        shared.committed.wait()
        elapsed = max(shared.finished) - start
    except threading.BrokenBarrierError:
        shared.fail("timed out" if not shared.errors else "a consumer failed")
    finally:
        shared.stop_settling.set()
        shared.go.set()
        shared.done.set()
        for t in threads:
            t.join(TIMEOUT_S)
    outcome = (
        f"{len(shared.seen)}/{records} delivered, {shared.redelivered} delivered again, "
        f"{shared.accepted}/{records} acknowledged"
    )
    if shared.errors or elapsed is None:
        raise RuntimeError(f"{ep.name}, {consumers} consumer(s): {'; '.join(shared.errors[:5])} ({outcome})")
    if len(shared.seen) != records or shared.redelivered or shared.accepted != records:
        raise RuntimeError(f"{ep.name}, {consumers} consumer(s): {outcome}")
    return records / elapsed


def run(quick: bool = False) -> list[dict[str, Any]]:
    runs = 2 if quick else 5
    records = 10_000 if quick else 100_000
    shorter = records // 5
    rows: list[dict[str, Any]] = []
    for consumers, n in ((1, records), (4, records), (1, shorter)):
        name = (
            f"records/s delivered and acknowledged, {consumers} share consumer{'s' if consumers > 1 else ''}, "
            f"{n:,} records"
        )
        measure = partial(lambda c, k, ep: delivered_per_s(ep, c, k), consumers, n)
        rows.append(side_by_side(name, "rec/s", measure, runs, rallypoint_config=BROKER))
    rows[-1]["note"] = ((rows[-1]["note"] + "; ") if rows[-1].get("note") else "") + (
        "confluent-kafka ShareConsumer threads (implicit acknowledgement), 4-partition topic pre-filled with "
        f"{RECORD_BYTES}-byte records; clock from the first poll to the last consumer's commit_sync after every "
        "record was delivered, N acknowledgements then confirmed by the commit callbacks; each share partition "
        "starts at offset 0 because the consumers fetched the topic empty first (the mock serves no "
        "IncrementalAlterConfigs for share.auto.offset.reset=earliest); rallypoint at its defaults (durable "
        "share-partition state). The mock's ShareFetch scans every record state and message set of the "
        "partition per offset, so its cost per record grows with the log and the ratio depends on N (the last "
        "row: a shorter log); rallypoint's CPU per record does not, its rate is bound by round trips"
    )
    return rows


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    for r in run(p.parse_args().quick):
        print(r)
