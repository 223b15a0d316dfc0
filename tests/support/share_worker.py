"""A share consumer in its own process, for tests that kill it (tests/test_share_groups_clients.py).

    python -m tests.support.share_worker BOOTSTRAP GROUP TOPIC

Subscribes in explicit acknowledgement mode, polls until one poll returns records, prints one
JSON line ``{"held": [[partition, offset, delivery_count], ...]}`` and then holds them (never
acknowledging) until it is killed.
"""

from __future__ import annotations

import json
import sys
import time

import confluent_kafka as ck


def main() -> None:
    bootstrap, group, topic = sys.argv[1], sys.argv[2], sys.argv[3]
    c = ck.ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, "share.acknowledgement.mode": "explicit"})
    c.subscribe([topic])
    held: list[list[int]] = []
    deadline = time.monotonic() + 30
    while not held and time.monotonic() < deadline:
        for m in c.poll(0.5):
            if m.error() is None:
                held.append([m.partition(), m.offset(), m.delivery_count()])
    print(json.dumps({"held": held}), flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
