"""A raw Kafka wire client, and a proxy that sees (and may rewrite) what a client sends."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable, Mapping
from typing import Any

from rallypoint.probe import recv_exactly
from rallypoint.protocol import codec


class WireClient:
    """A blocking raw-protocol client: send any request at any version, read the answer."""

    def __init__(self, host: str, port: int, timeout: float = 10.0, client_id: str | None = "wire-test") -> None:
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.settimeout(timeout)
        self.client_id = client_id
        self._corr = 0

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> WireClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv_frame(self) -> bytes:
        (size,) = struct.unpack(">i", recv_exactly(self.sock, 4))
        return recv_exactly(self.sock, size)

    def send(self, api_key: int, version: int, body: Mapping[str, Any]) -> int:
        self._corr += 1
        self.sock.sendall(codec.encode_request(api_key, version, self._corr, body, self.client_id))
        return self._corr

    def receive(self, api_key: int, version: int, corr: int | None = None) -> Any:
        got, msg = codec.decode_response_frame(api_key, version, self.recv_frame())
        if corr is not None:
            assert got == corr, f"correlation id {got} != {corr}"
        return msg

    def call(self, api_key: int, version: int, body: Mapping[str, Any]) -> Any:
        corr = self.send(api_key, version, body)
        return self.receive(api_key, version, corr)

    def is_closed_by_peer(self, timeout: float = 5.0) -> bool:
        """True when the broker closes this connection within ``timeout``."""
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False


class FrameProxy:
    """A TCP proxy in front of a broker that sees (and may rewrite) each client request frame.

    ``rewrite(n, frame)`` gets the n-th request frame (0-based, per connection, bytes after the
    size) and returns the frame to forward.  ``seen`` lists (api_key, api_version) as the client
    sent them.  Responses pass through untouched.
    """

    def __init__(self, upstream: tuple[str, int], rewrite: Callable[[int, bytes], bytes] | None = None) -> None:
        self.upstream = upstream
        self.rewrite = rewrite
        self.seen: list[tuple[int, int]] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._sockets: list[socket.socket] = [self._listener]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream, timeout=10)
            server.settimeout(None)
            self._sockets += [client, server]
            threading.Thread(target=self._requests, args=(client, server), daemon=True).start()
            threading.Thread(target=self._responses, args=(server, client), daemon=True).start()

    def _requests(self, client: socket.socket, server: socket.socket) -> None:
        n = 0
        try:
            while True:
                head = recv_exactly(client, 4)
                (size,) = struct.unpack(">i", head)
                frame = recv_exactly(client, size)
                self.seen.append(struct.unpack_from(">hh", frame))
                if self.rewrite is not None:
                    frame = self.rewrite(n, frame)
                n += 1
                server.sendall(struct.pack(">i", len(frame)) + frame)
        except (OSError, ConnectionError):
            pass
        finally:
            _shut(server)

    def _responses(self, server: socket.socket, client: socket.socket) -> None:
        try:
            while data := server.recv(65536):
                client.sendall(data)
        except OSError:
            pass
        finally:
            _shut(client)

    def close(self) -> None:
        self._closed = True
        for s in self._sockets:
            _shut(s)
            s.close()


def _shut(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
