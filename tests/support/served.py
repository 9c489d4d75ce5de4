"""An application served by uvicorn on loopback, configured as ``sxwl serve`` configures it, in a
thread of the test process: tests can add routes to the app and see its log records."""

from __future__ import annotations

import socket
import threading
import time
from types import TracebackType

import uvicorn
from fastapi import FastAPI

from sxwl.cli.server import uvicorn_config
from sxwl.cloud.config import Settings
from tests.support.net import free_port


class Served:
    def __init__(self, app: FastAPI, settings: Settings) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn_config(app, settings, "127.0.0.1", self.port))
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)

    def __enter__(self) -> Served:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.server.should_exit = True
        self.thread.join(30)

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=10)


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (or the socket's timeout)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data
