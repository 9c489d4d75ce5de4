"""The tunnel's parts under test: a cloud served by uvicorn in a thread of the test process (so a
test calls the tunnel's service in the cloud's own event loop), a real agent process, and a target
server on the CPod's side that records what reached it."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar
from urllib.parse import parse_qs

import httpx
import uvicorn

from sxwl.cloud.app import create_app
from sxwl.cloud.config import Settings
from sxwl.cloud.tunnel import service
from sxwl.cloud.tunnel.hub import Tunnels
from tests.support.net import free_port
from tests.support.served import Served

T = TypeVar("T")
Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class InProcessCloud:
    """The whole cloud app on loopback; ``call`` runs a coroutine in its loop and waits for it."""

    def __init__(self, settings: Settings, port: int | None = None) -> None:
        self.settings = settings
        self.app = create_app(settings)
        self.served = Served(self.app, settings)
        if port is not None:
            self.served = _on_port(self.served, port)
        self.url = self.served.url
        self.served.__enter__()

    @property
    def tunnels(self) -> Tunnels:
        tunnels: Tunnels = self.app.state.ctx.tunnels
        return tunnels

    def call(self, make: Callable[[], Coroutine[Any, Any, T]], timeout: float = 60) -> T:
        loop = self.tunnels.loop
        assert loop is not None, "the cloud's lifespan has not started"
        return asyncio.run_coroutine_threadsafe(make(), loop).result(timeout)

    def connections(self, cpod_id: str) -> int:
        """Held connections that take streams: one a test cut may stay listed a moment, closed."""
        return sum(1 for session in self.tunnels.held.get(cpod_id, []) if session.capacity > 0)

    def stop(self) -> None:
        self.app.state.ctx.notifier.shutdown()  # as `sxwl serve` does on its signal: held polls end
        self.served.__exit__(None, None, None)


def _on_port(served: Served, port: int) -> Served:
    """The same app on a given port (a restarted cloud keeps its address)."""
    served.port, served.url = port, f"http://127.0.0.1:{port}"
    served.server.config.port = port
    return served


def provider_key(url: str, email: str = "owner@example.com") -> str:
    body = {"email": email, "password": "correct horse", "role": "provider"}
    httpx.post(f"{url}/api/v1/auth/register", json=body).raise_for_status()
    login = httpx.post(f"{url}/api/v1/auth/login", json={"email": email, "password": "correct horse"})
    headers = {"Authorization": f"Bearer {login.json()['access_token']}"}
    key: str = httpx.get(f"{url}/api/v1/me/access-key", headers=headers).json()["access_key"]
    return key


def request(
    method: str, path: str, body: bytes | None = None, headers: list[tuple[str, str]] | None = None
) -> service.TunnelRequest:
    async def chunks() -> Any:
        yield body

    return service.TunnelRequest(method, path, headers or [], chunks() if body is not None else None)


class Target:
    """An HTTP/1.1 server (uvicorn, a plain ASGI app) on loopback, on the CPod's side of the tunnel:
    ``/echo`` answers its body, ``/bytes?n=N`` streams N bytes, ``/hold?id=X`` sends a line and holds
    the answer open until its client goes (recorded in ``gone``), ``/cut`` fails mid-answer, ``/ws``
    echoes WebSocket messages."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.gone: set[str] = set()
        self.requests = 0
        config = uvicorn.Config(
            self._app,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan="off",
            interface="asgi3",
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="target", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "the target did not start"
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    async def _app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await self._echo_ws(receive, send)
            return
        self.requests += 1
        query = {k: v[0] for k, v in parse_qs(scope["query_string"].decode()).items()}
        path = scope["path"]
        if path == "/echo":
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            headers = [(b"x-method", scope["method"].encode()), (b"x-seen", _header(scope, b"x-probe"))]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": body})
        elif path == "/bytes":
            size, chunk = int(query["n"]), b"x" * 65536
            await send({"type": "http.response.start", "status": 200, "headers": []})
            while size > 0:
                piece = chunk[: min(size, len(chunk))]
                size -= len(piece)
                await send({"type": "http.response.body", "body": piece, "more_body": size > 0})
        elif path == "/hold":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"started\n", "more_body": True})
            while (await receive())["type"] != "http.disconnect":
                pass
            self.gone.add(query["id"])
        elif path == "/cut":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"partial", "more_body": True})
            raise RuntimeError("the target fails mid-answer")  # uvicorn drops the connection
        else:
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b"no such path"})

    async def _echo_ws(self, receive: Receive, send: Send) -> None:
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        while True:
            message = await receive()
            if message["type"] != "websocket.receive":
                return
            await send({"type": "websocket.send", "bytes": b"echo:" + (message.get("bytes") or b"")})


def _header(scope: Scope, name: bytes) -> bytes:
    return next((v for k, v in scope["headers"] if k == name), b"")


class StallingProxy:
    """A TCP proxy on loopback in front of one port that can silence one connection: while a
    connection is in ``stalled``, whatever passes on it is dropped, both ways, and nothing is closed
    (a path that went quiet). ``tunnels`` lists the connections whose first bytes asked for a tunnel."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.tunnels: list[int] = []
        self.stalled: set[int] = set()
        self._count = 0
        self._server = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._server.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            self._count += 1
            number = self._count
            threading.Thread(target=self._pipe, args=(number, client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(number, upstream, client, False), daemon=True).start()

    def _pipe(self, number: int, source: socket.socket, sink: socket.socket, outbound: bool) -> None:
        first = outbound
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if first and data.startswith(b"GET /api/v1/agent/tunnel "):
                    self.tunnels.append(number)
                first = False
                if number not in self.stalled:
                    sink.sendall(data)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
