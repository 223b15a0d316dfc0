"""Throughput over TLS and SASL listeners vs PLAINTEXT: confluent-kafka produces N messages, then
consumes them, through each listener of one broker (docs/security.md).

    python -m bench.security [--messages 100000]

One broker with PLAINTEXT, SSL, SASL_PLAINTEXT (SCRAM-SHA-512) and SASL_SSL listeners and a
throwaway CA (``rallypoint certs``); each listener gets its own topic, runs alternate.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from rallypoint.security.certs import generate

from bench.common import summarize
from bench.produce_consume import measure
from tests.support import BrokerProcess
from tests.support.secure_clients import Sec

LISTENERS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


def _broker(tmp: Path) -> BrokerProcess:
    certs = generate(tmp / "certs")
    config = {
        "log.retention.bytes": "-1",
        "listeners": ",".join(f"{name}://127.0.0.1:0" for name in LISTENERS),
        "advertised.listeners": "SSL://localhost:0,SASL_SSL://localhost:0",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(certs["broker.pem"]),
        "rallypoint.sasl.users": "alice:alice-secret",
    }
    return BrokerProcess(data_dir=tmp / "data", config=config).start()


def _sec(listener: str, ca: str) -> tuple[str, dict[str, str]]:
    host = "localhost" if listener.endswith("SSL") else "127.0.0.1"
    mechanism = "SCRAM-SHA-512" if listener.startswith("SASL") else None
    return host, Sec(listener, mechanism, ca=ca if listener.endswith("SSL") else None).librdkafka()


def run(quick: bool = False, messages: int | None = None) -> list[dict[str, Any]]:
    """Entry point for ``python -m bench``."""
    args = argparse.Namespace(
        messages=messages or (30_000 if quick else 100_000), size=100, partitions=4, compression="none", acks="all"
    )
    prod: dict[str, list[float]] = {name: [] for name in LISTENERS}
    cons: dict[str, list[float]] = {name: [] for name in LISTENERS}
    with tempfile.TemporaryDirectory() as tmp:
        broker = _broker(Path(tmp))
        try:
            ca = str(Path(tmp) / "certs" / "ca.pem")
            for round_ in range(2 if quick else 3):
                for name in LISTENERS:
                    host, conf = _sec(name, ca)
                    bootstrap = f"{host}:{broker.listener_port(name)}"
                    p, c = measure(broker, args, bootstrap, conf, topic=f"bench-{name.lower()}-{round_}")
                    prod[name].append(p)
                    cons[name].append(c)
        finally:
            broker.stop()
    label = f"{args.messages:,} × {args.size} B, 4 partitions, acks=all"
    rows: list[dict[str, Any]] = []
    base_p = summarize(prod["PLAINTEXT"])["median"]
    base_c = summarize(cons["PLAINTEXT"])["median"]
    for name in LISTENERS:
        sp, sc = summarize(prod[name]), summarize(cons[name])
        rows.append({"name": f"produce over {name} (confluent-kafka), {label}", "unit": "msgs/s", "stats": sp})
        rows.append({"name": f"consume over {name} (confluent-kafka), {label}", "unit": "msgs/s", "stats": sc})
        if name != "PLAINTEXT":
            rows[-1]["note"] = (
                f"{name}: produce {sp['median'] / base_p:.0%} and consume {sc['median'] / base_c:.0%} "
                "of PLAINTEXT's median"
            )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=100_000)
    a = ap.parse_args()
    for row in run(messages=a.messages):
        print(row["name"], f"{row['stats']['median']:,.0f}", row["unit"])


if __name__ == "__main__":
    main()
