"""Real clients over SASL and TLS listeners (tests/test_security_clients.py): each produces one
message, consumes it as a member of a group and commits, with the same security settings an
application would give it."""

from __future__ import annotations

import asyncio
import subprocess
import time
from dataclasses import dataclass
from typing import Any

DEADLINE_S = 30.0


@dataclass(frozen=True)
class Sec:
    protocol: str  # PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL
    mechanism: str | None = None
    user: str = "alice"
    password: str = "alice-secret"
    ca: str | None = None  # CA file; the broker's host name is checked against its certificate

    def kafka_python(self) -> dict[str, Any]:
        out: dict[str, Any] = {"security_protocol": self.protocol}
        if self.mechanism:
            out |= {"sasl_mechanism": self.mechanism, "sasl_plain_username": self.user}
            out["sasl_plain_password"] = self.password
        if self.ca:
            out |= {"ssl_cafile": self.ca, "ssl_check_hostname": True}
        return out

    def aiokafka(self) -> dict[str, Any]:
        out: dict[str, Any] = {"security_protocol": self.protocol}
        if self.mechanism:
            out |= {"sasl_mechanism": self.mechanism, "sasl_plain_username": self.user}
            out["sasl_plain_password"] = self.password
        if self.ca:
            from aiokafka.helpers import create_ssl_context

            out["ssl_context"] = create_ssl_context(cafile=self.ca)  # checks the host name
        return out

    def librdkafka(self) -> dict[str, str]:
        out = {"security.protocol": self.protocol}
        if self.mechanism:
            out |= {"sasl.mechanism": self.mechanism, "sasl.username": self.user, "sasl.password": self.password}
        if self.ca:
            out |= {"ssl.ca.location": self.ca, "ssl.endpoint.identification.algorithm": "https"}
        return out


def kafka_python_roundtrip(bootstrap: str, sec: Sec, topic: str, group: str) -> list[bytes]:
    from kafka import KafkaConsumer, KafkaProducer

    p = KafkaProducer(bootstrap_servers=bootstrap, **sec.kafka_python())
    p.send(topic, b"kafka-python").get(DEADLINE_S)
    p.close()
    c = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=int(DEADLINE_S * 1000),
        **sec.kafka_python(),
    )
    got = []
    for m in c:
        got.append(m.value)
        break
    c.commit()
    c.close()
    return got


def aiokafka_roundtrip(bootstrap: str, sec: Sec, topic: str, group: str) -> list[bytes]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    async def run() -> list[bytes]:
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, **sec.aiokafka())
        await p.start()
        try:
            await p.send_and_wait(topic, b"aiokafka")
        finally:
            await p.stop()
        c = AIOKafkaConsumer(
            topic,
            bootstrap_servers=bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            **sec.aiokafka(),
        )
        await c.start()
        try:
            m = await asyncio.wait_for(c.getone(), DEADLINE_S)
            await c.commit()
            return [m.value or b""]
        finally:
            await c.stop()

    return asyncio.run(run())


def confluent_roundtrip(bootstrap: str, sec: Sec, topic: str, group: str, run_s: float = 0.0) -> list[bytes]:
    """``run_s``: keep the consumer polling this long after the first message (re-authentication)."""
    from confluent_kafka import Consumer, Producer

    errors: list[str] = []
    conf = {"bootstrap.servers": bootstrap, "error_cb": lambda e: errors.append(str(e)), **sec.librdkafka()}
    p = Producer(conf)
    p.produce(topic, b"confluent-kafka")
    assert p.flush(DEADLINE_S) == 0, errors
    c = Consumer({**conf, "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.subscribe([topic])
    got: list[bytes] = []
    deadline = time.monotonic() + DEADLINE_S
    while not got and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            got.append(m.value() or b"")
            c.commit(m, asynchronous=False)
    end = time.monotonic() + run_s
    while time.monotonic() < end:
        c.poll(0.2)
        p.produce(topic, b"more")
        p.poll(0)
    assert p.flush(DEADLINE_S) == 0, errors
    c.close()
    return got


def kcat_args(sec: Sec) -> list[str]:
    out = []
    for k, v in sec.librdkafka().items():
        out += ["-X", f"{k}={v}"]
    return out


def kcat_roundtrip(kcat: str, bootstrap: str, sec: Sec, topic: str, group: str) -> list[bytes]:
    base = [kcat, "-b", bootstrap, *kcat_args(sec)]
    subprocess.run([*base, "-P", "-t", topic], input=b"kcat\n", check=True, timeout=DEADLINE_S)
    # a balanced consumer (-G): joins the group, exits after one message, commits on close
    r = subprocess.run(
        [*base, "-X", "auto.offset.reset=earliest", "-G", group, "-c", "1", "-f", "%s\n", topic],
        capture_output=True,
        check=True,
        timeout=DEADLINE_S,
    )
    return [line for line in r.stdout.splitlines() if line]


def committed(bootstrap: str, group: str, topic: str) -> int | None:
    """The group's committed offset of partition 0 (asked over a PLAINTEXT listener), or None."""
    from .wire import WireClient

    host, _, port = bootstrap.rpartition(":")
    with WireClient(host, int(port)) as c:
        r = c.call(
            9,
            7,
            {"group_id": group, "topics": [{"name": topic, "partition_indexes": [0]}], "require_stable": False},
        )
    offset = int(r.topics[0].partitions[0].committed_offset) if r.topics else -1
    return None if offset < 0 else offset
