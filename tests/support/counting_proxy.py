"""A TCP proxy on loopback in front of one port that counts the HTTP requests its clients send whose
request line starts with a given prefix, whether or not anything still listens behind it: how often
an agent asks is seen even while its cloud is gone."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

from tests.support.net import free_port


class CountingProxy:
    def __init__(self, target_port: int, prefix: bytes) -> None:
        self.target_port = target_port
        self.prefix = prefix
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # When each counted request was sent (time.monotonic), and whether a server took it.
        self.requests: list[tuple[float, bool]] = []
        self._lock = threading.Lock()
        self._server = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def since(self, moment: float, until: float = float("inf")) -> int:
        with self._lock:
            return sum(1 for at, _ in self.requests if moment <= at < until)

    def served_since(self, moment: float) -> int:
        with self._lock:
            return sum(1 for at, served in self.requests if at >= moment and served)

    def close(self) -> None:
        self._server.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # closed
            try:
                upstream: socket.socket | None = socket.create_connection(("127.0.0.1", self.target_port), 5)
            except OSError:
                upstream = None  # nothing listens: the client's request is still read and counted
            threading.Thread(target=self._forward, args=(client, upstream), daemon=True).start()
            if upstream is not None:
                threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()

    def _forward(self, client: socket.socket, upstream: socket.socket | None) -> None:
        """Client to server, counting request lines; without a server, until the client's first
        request has been read."""
        tail = b""
        client.settimeout(None if upstream is not None else 2.0)
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                seen = tail + data
                found = seen.count(self.prefix)
                if found:
                    now = time.monotonic()
                    with self._lock:
                        self.requests.extend([(now, upstream is not None)] * found)
                tail = seen[-(len(self.prefix) - 1) :]
                if upstream is None:
                    break
                upstream.sendall(data)
        for end in (client, upstream):
            if end is not None:
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
                end.close()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
