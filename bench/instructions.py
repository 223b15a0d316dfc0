"""Instructions the broker executes per request on a hot-path row, counted by valgrind.

    python -m bench.instructions ROW [--level CONNSxDEPTH] [--requests N] [--json]

ROW is the start of a row name of :mod:`bench.hot_paths` ("ApiVersions", "Heartbeat (Stable",
"OffsetFetch" ...).  The broker runs under callgrind with instrumentation off; the requests
are sent once to warm it up (schemas loaded, caches filled), then instrumentation is switched
on, exactly N more are answered, and it is switched off again: what is counted is the
broker's user-space instructions for those N requests (the kernel's share of the socket calls
is not), divided by N.

Why: requests/s on this shared 2-core machine move by ±10 % between runs of the same code
and by far more between hours, so a change worth a few per cent cannot be seen in them.  The
count is the same to about 0.1 % from run to run, whatever else the machine is doing, so it is
the A/B measure for a change to the request path (run it on both versions).  It is not a
speed: it leaves out system calls, cache misses and the event loop's waiting, and under
valgrind the broker is slow enough that every connection always has all of its requests
buffered (the batching of a loaded broker, never that of 1×1).  Needs valgrind (Debian's
``valgrind`` package; ``scripts/setup --test`` installs it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import hot_paths as hp
from bench.common import Endpoint
from tests.support import free_port

START_TIMEOUT_S = 120.0
LOAD_TIMEOUT_S = 600.0


class _Counted(hp._Hammer):
    """A :class:`bench.hot_paths._Hammer` that sends exactly ``budget`` requests, then reports."""

    def __init__(self, frame: bytes, depth: int, budget: int, done: asyncio.Future[None]) -> None:
        super().__init__(frame, depth)
        self.budget = budget
        self.sent = depth
        self.answered = 0
        self.done = done

    def data_received(self, data: bytes) -> None:
        n = self.answers_in(data)
        self.answered += n
        more = min(n, self.budget - self.sent)
        if more > 0 and self.transport is not None:
            self.transport.write(self.frame * more)
            self.sent += more
        if self.answered >= self.budget and not self.done.done():
            self.done.set_result(None)


def parse_total(text: str) -> int:
    """The instruction total of a callgrind output file (its ``summary:`` or ``totals:`` line)."""
    totals = [int(m.group(1)) for m in re.finditer(r"^(?:summary|totals):\s+(\d+)", text, re.MULTILINE)]
    if not totals:
        raise ValueError("no summary or totals line in the callgrind output")
    return max(totals)


def _control(pid: int, *args: str) -> None:
    subprocess.run(
        ["callgrind_control", *args, str(pid)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
        timeout=60,
    )


async def _load(ep: Endpoint, row: hp.Row, connections: int, depth: int, per_connection: int) -> None:
    await hp._ensure_topic(ep)
    frames = await hp._frames(ep, row, connections)
    loop = asyncio.get_running_loop()
    for counted in (False, True):  # a warm-up round, then the counted one
        if counted:
            _control(ep.pid, "--instr=on")
        dones: list[asyncio.Future[None]] = []
        hammers: list[_Counted] = []
        for frame in frames:
            done: asyncio.Future[None] = loop.create_future()
            dones.append(done)
            _t, h = await loop.create_connection(
                lambda f=frame, d=done: _Counted(f, depth, per_connection, d),  # type: ignore[misc]
                ep.host,
                ep.port,
            )
            hammers.append(h)
        try:
            await asyncio.wait_for(asyncio.gather(*dones), LOAD_TIMEOUT_S)
        finally:
            if counted:
                _control(ep.pid, "--instr=off")
            for h in hammers:
                h.running = False
                if h.transport is not None:
                    h.transport.close()
        await asyncio.sleep(0.2)


def measure(row_prefix: str, connections: int, depth: int, requests: int) -> dict[str, Any]:
    """Broker instructions per request for ``requests`` requests of the row named ``row_prefix``."""
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise RuntimeError("valgrind is not installed (Debian package valgrind)")
    row = next((r for r in hp.ROWS if r.name.startswith(row_prefix)), None)
    if row is None:
        raise ValueError(f"no hot-path row starts with {row_prefix!r}: {[r.name for r in hp.ROWS]}")
    per_connection = max(1, requests // connections)
    with tempfile.TemporaryDirectory(prefix="rp-instr-") as tmp:
        out = Path(tmp) / "callgrind.out"
        port = free_port()
        argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}"]
        argv += [sys.executable, "-m", "rallypoint", "--port", str(port), "--data-dir", f"{tmp}/data"]
        argv += ["--control-port", "0", "--log-level", "warning"]
        argv += ["-c", "group.initial.rebalance.delay.ms=0", "-c", "rallypoint.offsets.flush=never"]
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("the broker did not start under valgrind") from None
                    time.sleep(0.2)
            ep = Endpoint("rallypoint", "127.0.0.1", port, proc.pid)
            asyncio.run(_load(ep, row, connections, depth, per_connection))
        finally:
            proc.terminate()  # callgrind writes its output at exit
            try:
                proc.wait(LOAD_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        text = "\n".join(p.read_text(errors="replace") for p in Path(tmp).glob("callgrind.out*"))
    counted = per_connection * connections
    return {
        "row": row.name,
        "level": f"{connections}x{depth}",
        "requests": counted,
        "instructions_per_request": parse_total(text) / counted,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("row")
    p.add_argument("--level", default="4x8", help="connections x requests in flight (default 4x8)")
    p.add_argument("--requests", type=int, default=4000)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    conns, depth = (int(x) for x in a.level.lower().split("x"))
    result = measure(a.row, conns, depth, a.requests)
    if a.json:
        print(json.dumps(result))
    else:
        print(
            f"{result['row']} {result['level']}: {result['instructions_per_request']:,.0f} "
            f"instructions/request ({result['requests']} requests)"
        )


if __name__ == "__main__":
    main()
