"""``rallypoint probe``: one ApiVersions round trip; exit 0 if the broker answers, else 1.

Used as the container HEALTHCHECK, so it needs nothing but the standard library,
``protocol/`` and the settings table (whose ``host`` and ``port`` defaults it probes).
"""

from __future__ import annotations

import argparse
import socket
import struct
import sys

from rallypoint.protocol import codec

from .config import default


def probe(host: str, port: int, timeout: float) -> tuple[bool, str]:
    request = codec.encode_request(18, 0, 1, {}, client_id="rallypoint-probe")
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(request)
            head = recv_exactly(s, 4)
            (size,) = struct.unpack(">i", head)
            if size <= 0 or size > 1 << 20:
                return False, f"bad response size {size}"
            body = recv_exactly(s, size)
        corr, resp = codec.decode_response_frame(18, 0, body)
    except (OSError, ValueError) as e:
        return False, str(e)
    if corr != 1:
        return False, f"wrong correlation id {corr}"
    if int(resp.error_code) != 0:
        return False, f"error code {int(resp.error_code)}"
    return True, f"ok: {len(resp.api_keys)} APIs"


def recv_exactly(s: socket.socket, n: int) -> bytes:
    """``n`` bytes from a blocking socket; ConnectionError when the peer closes first (the
    raw-frame clients of the benchmarks and tests use it too)."""
    buf = bytearray()
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by the broker")
        buf += chunk
    return bytes(buf)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="rallypoint probe", description=__doc__.splitlines()[0])
    p.add_argument("--host", default=default("host"), help="default: the broker's default host, %(default)s")
    p.add_argument("--port", type=int, default=default("port"), help="default: %(default)s")
    p.add_argument("--timeout", type=float, default=2.0, help="seconds")
    p.add_argument("--quiet", "-q", action="store_true")
    args = p.parse_args(argv)
    ok, detail = probe(args.host, args.port, args.timeout)
    if not args.quiet:
        print(f"{'healthy' if ok else 'unhealthy'}: {args.host}:{args.port} {detail}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
