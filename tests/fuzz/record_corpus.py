"""Record the fuzzing seed corpus from real clients (docs/reliability.md, "Fuzzing").

    .venv/bin/python -m tests.fuzz.record_corpus [--out tests/fuzz/corpus]

Starts a broker, puts a recording TCP proxy in front of it on 127.0.0.1 (the broker advertises
the proxy's port, so every connection a client opens goes through it) and runs each client
through the same script: admin (create topics and partitions, list/describe topics and
groups, list group offsets, delete topics and groups), produce (plain, gzip, idempotent),
consume in a group with commits, and ListOffsets by timestamp.  Clients: kafka-python,
aiokafka, confluent-kafka (librdkafka) and kcat.

Each request frame a client sends is stored in ``<out>/<client>.frames`` (raw size-prefixed
frames, see ``tests/fuzz/frames.py``).  Repeats are dropped (the same bytes apart from the
correlation id), and at most ``--per-api`` variants of each (API, version) are kept per client,
so the corpus stays small (a few hundred KB) while covering every request the clients make.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.fuzz.broker import FuzzBroker
from tests.fuzz.frames import CORPUS_DIR, split_frames, write_frames

_RECV = 65536


class RecordingProxy:
    """Forwards TCP connections to ``upstream`` and records each request frame under ``label``."""

    def __init__(self, upstream: tuple[str, int] | None = None) -> None:
        self.upstream = upstream
        self.label = "unlabelled"
        self.frames: dict[str, list[bytes]] = {}
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._sockets: list[socket.socket] = []
        self._closed = False

    def start(self) -> None:
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            assert self.upstream is not None
            try:
                server = socket.create_connection(self.upstream, timeout=10)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            self._sockets += [client, server]
            threading.Thread(target=self._requests, args=(client, server), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client), daemon=True).start()

    def _record(self, body: bytes) -> None:
        with self._lock:
            self.frames.setdefault(self.label, []).append(body)

    def _requests(self, client: socket.socket, server: socket.socket) -> None:
        buf = b""
        try:
            while True:
                chunk = client.recv(_RECV)
                if not chunk:
                    break
                buf += chunk
                while len(buf) >= 4:
                    size = int.from_bytes(buf[:4], "big", signed=True)
                    if len(buf) < 4 + size:
                        break
                    self._record(buf[4 : 4 + size])
                    server.sendall(buf[: 4 + size])
                    buf = buf[4 + size :]
        except OSError:
            pass
        finally:
            for s in (client, server):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                chunk = src.recv(_RECV)
                if not chunk:
                    break
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._closed = True
        for s in [self._listener, *self._sockets]:
            try:
                s.close()
            except OSError:
                pass


# ------------------------------------------------------------------------------ the clients

MESSAGES: list[tuple[bytes, bytes, list[tuple[str, str | bytes | None]]]] = [
    (f"key-{i}".encode(), f"value-{i}-".encode() * (1 + i % 5), [("h", f"{i}".encode())]) for i in range(12)
]


def _steps(name: str, steps: list[tuple[str, Callable[[], Any]]]) -> list[str]:
    """Run each step; a step that fails is reported and the next one runs."""
    failed = []
    for what, fn in steps:
        try:
            fn()
        except Exception as e:
            failed.append(f"{name}: {what}: {type(e).__name__}: {e}")
            traceback.print_exc(limit=3)
    return failed


def run_kafka_python(bootstrap: str) -> list[str]:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka.admin import KafkaAdminClient, NewPartitions, NewTopic
    from kafka.structs import TopicPartition

    topic, tmp, group = "corpus-kp", "corpus-kp-tmp", "corpus-kp-group"
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, client_id="corpus-kafka-python")

    def produce() -> None:
        for compression in (None, "gzip"):
            p = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, compression_type=compression)
            for k, v, h in MESSAGES:
                p.send(topic, key=k, value=v, headers=h)
            p.flush(10)
            p.close(5)

    def consume() -> None:
        c = KafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=6000,
            heartbeat_interval_ms=1000,
            client_id="corpus-kafka-python",
        )
        c.subscribe([topic])
        got, deadline, heartbeats_by = 0, time.monotonic() + 20, time.monotonic() + 2.5
        while (got < 2 * len(MESSAGES) or time.monotonic() < heartbeats_by) and time.monotonic() < deadline:
            for recs in c.poll(timeout_ms=300).values():
                got += len(recs)
        c.commit()
        c.committed(TopicPartition(topic, 0))
        c.offsets_for_times({TopicPartition(topic, 0): 0})
        c.end_offsets([TopicPartition(topic, 0)])
        c.close()

    failed = _steps(
        "kafka-python",
        [
            ("create topics", lambda: admin.create_topics([NewTopic(topic, 2, 1), NewTopic(tmp, 1, 1)])),
            ("create partitions", lambda: admin.create_partitions({tmp: NewPartitions(3)})),
            ("describe topics", lambda: admin.describe_topics([topic])),
            ("produce", produce),
            ("consume", consume),
            ("list groups", admin.list_groups),
            ("describe groups", lambda: admin.describe_groups([group])),
            ("list group offsets", lambda: admin.list_group_offsets(group)),
            ("delete group offsets", lambda: admin.delete_group_offsets(group, [TopicPartition(topic, 1)])),
            ("delete topics", lambda: admin.delete_topics([tmp])),
            ("delete groups", lambda: admin.delete_groups([group])),
        ],
    )
    admin.close()
    return failed


def run_aiokafka(bootstrap: str) -> list[str]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic

    topic, tmp, group = "corpus-aio", "corpus-aio-tmp", "corpus-aio-group"
    failed: list[str] = []

    async def step(what: str, coro: Any) -> None:
        try:
            await coro
        except Exception as e:
            failed.append(f"aiokafka: {what}: {type(e).__name__}: {e}")
            traceback.print_exc(limit=3)

    async def produce() -> None:
        for kw in ({}, {"compression_type": "gzip"}, {"enable_idempotence": True}):
            p = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, **kw)
            await p.start()
            try:
                for k, v, h in MESSAGES:
                    await p.send(topic, key=k, value=v, headers=h)
                await p.flush()
            finally:
                await p.stop()

    async def consume() -> None:
        c = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            session_timeout_ms=6000,
            heartbeat_interval_ms=1000,
            client_id="corpus-aiokafka",
        )
        await c.start()
        try:
            got, deadline = 0, time.monotonic() + 20
            while got < 3 * len(MESSAGES) and time.monotonic() < deadline:
                for recs in (await c.getmany(timeout_ms=300)).values():
                    got += len(recs)
            await c.commit()
            await c.committed(TopicPartition(topic, 0))
            await c.offsets_for_times({TopicPartition(topic, 0): 0})
            await c.end_offsets([TopicPartition(topic, 0)])
        finally:
            await c.stop()

    async def main() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, client_id="corpus-aiokafka")
        await admin.start()
        try:
            await step("create topics", admin.create_topics([NewTopic(topic, 2, 1), NewTopic(tmp, 1, 1)]))
            await step("create partitions", admin.create_partitions({tmp: NewPartitions(3)}))
            await step("describe topics", admin.describe_topics([topic]))
            await step("produce", produce())
            await step("consume", consume())
            await step("list groups", admin.list_consumer_groups())
            await step("describe groups", admin.describe_consumer_groups([group]))
            await step("list group offsets", admin.list_consumer_group_offsets(group))
            await step("delete topics", admin.delete_topics([tmp]))
        finally:
            await admin.close()

    asyncio.run(main())
    return failed


def run_confluent(bootstrap: str) -> list[str]:
    from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, Producer, TopicPartition
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AdminClient,
        NewPartitions,
        NewTopic,
        OffsetSpec,
    )

    topic, tmp, group = "corpus-ck", "corpus-ck-tmp", "corpus-ck-group"
    admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": "corpus-confluent"})

    def wait(futures: Any) -> None:
        for f in futures.values() if isinstance(futures, dict) else [futures]:
            f.result(15)

    def produce() -> None:
        for extra in ({}, {"compression.type": "gzip"}, {"compression.type": "lz4"}, {"enable.idempotence": True}):
            p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all", **extra})
            for k, v, h in MESSAGES:
                p.produce(topic, key=k, value=v, headers=list(h))
            p.flush(15)

    def consume() -> None:
        c = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "session.timeout.ms": 6000,
                "heartbeat.interval.ms": 1000,
                "client.id": "corpus-confluent",
            }
        )
        c.subscribe([topic])
        got, deadline = 0, time.monotonic() + 25
        while got < 4 * len(MESSAGES) and time.monotonic() < deadline:
            m = c.poll(0.3)
            if m is not None and not m.error():
                got += 1
        c.commit(asynchronous=False)
        c.committed([TopicPartition(topic, 0)], timeout=10)
        c.offsets_for_times([TopicPartition(topic, 0, 0)], timeout=10)
        c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        c.close()

    failed = _steps(
        "confluent-kafka",
        [
            ("create topics", lambda: wait(admin.create_topics([NewTopic(topic, 2, 1), NewTopic(tmp, 1, 1)]))),
            ("create partitions", lambda: wait(admin.create_partitions([NewPartitions(tmp, 3)]))),
            ("list topics", lambda: admin.list_topics(timeout=10)),
            ("produce", produce),
            ("consume", consume),
            ("list groups", lambda: wait(admin.list_consumer_groups())),
            ("describe groups", lambda: wait(admin.describe_consumer_groups([group]))),
            (
                "list group offsets",
                lambda: wait(admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])),
            ),
            (
                "list offsets",
                lambda: wait(admin.list_offsets({TopicPartition(topic, 0): OffsetSpec.latest()})),  # type: ignore[no-untyped-call]
            ),
            ("delete topics", lambda: wait(admin.delete_topics([tmp]))),
            ("delete groups", lambda: wait(admin.delete_consumer_groups([group]))),
        ],
    )
    return failed


def run_confluent_share(bootstrap: str) -> list[str]:
    """Share groups (KIP-932): ShareGroupHeartbeat, ShareFetch with piggy-backed and explicit
    acknowledgements of every type, ShareAcknowledge, the final-epoch close, and the GROUP
    config the applications set."""
    from confluent_kafka import AcknowledgeType, Producer, ShareConsumer
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        NewTopic,
        ResourceType,
    )

    topic, group = "corpus-share", "corpus-share-group"
    admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": "corpus-share"})

    def setup() -> None:
        for f in admin.create_topics([NewTopic(topic, 2, 1)]).values():
            f.result(15)
        entry = ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)
        res = ConfigResource(ResourceType.GROUP, group, incremental_configs=[entry])
        for f in admin.incremental_alter_configs([res]).values():
            f.result(15)
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        for k, v, h in MESSAGES:
            p.produce(topic, key=k, value=v, headers=list(h))
        p.flush(15)

    def consume(mode: str) -> None:
        c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, "share.acknowledgement.mode": mode})
        c.subscribe([topic])
        types = [AcknowledgeType.ACCEPT, AcknowledgeType.RELEASE, AcknowledgeType.REJECT]
        deadline, n = time.monotonic() + 15, 0
        while time.monotonic() < deadline and n < 3 * len(MESSAGES):
            for m in c.poll(0.3):
                if m.error() is None and mode == "explicit":
                    c.acknowledge(m, types[n % 3])
                n += 1
            if mode == "explicit":
                c.commit_sync(10)
        c.close()

    return _steps(
        "confluent-kafka-share",
        [("setup", setup), ("implicit", lambda: consume("implicit")), ("explicit", lambda: consume("explicit"))],
    )


def run_kcat(bootstrap: str) -> list[str]:
    kcat = shutil.which("kcat")
    if kcat is None:
        return ["kcat: not installed (scripts/setup --test installs it); skipped"]
    topic, group = "corpus-kcat", "corpus-kcat-group"
    data = "\n".join(f"k{i}:v{i}" for i in range(12)) + "\n"
    runs: list[tuple[str, list[str], str | None]] = [
        ("metadata", ["-L"], None),
        ("produce", ["-P", "-t", topic, "-K", ":"], data),
        ("produce gzip", ["-P", "-t", topic, "-K", ":", "-z", "gzip"], data),
        ("consume", ["-C", "-t", topic, "-o", "beginning", "-e"], None),
        ("group consume", ["-G", group, topic, "-o", "beginning", "-e", "-X", "session.timeout.ms=6000"], None),
    ]
    failed = []
    for what, args, stdin in runs:
        try:
            subprocess.run(
                [kcat, "-b", bootstrap, "-q", *args], input=stdin, text=True, capture_output=True, timeout=30
            )
        except subprocess.TimeoutExpired:
            failed.append(f"kcat: {what}: timed out")
    return failed


CLIENTS: dict[str, Callable[[str], list[str]]] = {
    "kafka-python": run_kafka_python,
    "aiokafka": run_aiokafka,
    "confluent-kafka": run_confluent,
    "confluent-kafka-share": run_confluent_share,
    "kcat": run_kcat,
}


def select(frames: list[bytes], per_api: int) -> list[bytes]:
    """Distinct frames (correlation id ignored), at most ``per_api`` per (API key, version)."""
    seen: set[bytes] = set()
    count: dict[bytes, int] = {}
    out = []
    for body in frames:
        if len(body) < 8:
            continue
        key = body[:4] + body[8:]
        api = body[:4]
        if key in seen or count.get(api, 0) >= per_api:
            continue
        seen.add(key)
        count[api] = count.get(api, 0) + 1
        out.append(body)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=CORPUS_DIR)
    p.add_argument("--per-api", type=int, default=6, help="variants kept per (API, version) per client")
    p.add_argument("--clients", default=",".join(CLIENTS))
    a = p.parse_args(argv)
    proxy = RecordingProxy()
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="rp-corpus-") as tmp:
        broker = FuzzBroker(Path(tmp) / "data", advertised_port=proxy.port)
        try:
            broker.start()
            proxy.upstream = broker.address
            proxy.start()
            for name in a.clients.split(","):
                proxy.label = name
                print(f"== {name}", flush=True)
                failed += CLIENTS[name](f"127.0.0.1:{proxy.port}")
                time.sleep(0.5)  # let the last frames of closing connections arrive
        finally:
            proxy.close()
            broker.kill()
    total = 0
    for name in a.clients.split(","):
        bodies = select(proxy.frames.get(name, []), a.per_api)
        path = a.out / f"{name}.frames"
        write_frames(path, bodies)
        size = path.stat().st_size
        total += size
        apis = sorted({(b[0] << 8 | b[1], b[2] << 8 | b[3]) for b in bodies})
        print(f"{path}: {len(bodies)} frames, {size} bytes, (api, version): {apis}")
        assert list(split_frames(path.read_bytes())) == bodies
    print(f"corpus: {total} bytes")
    for f in failed:
        print("step failed:", f, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
