"""``/dev/{env}/…``: a dev environment's JupyterLab, proxied through its CPod's tunnel
(docs/dev-envs.md), HTTP and WebSockets alike, for its owner's console session only.

The browser never holds Jupyter's token: the cloud adds it to each request (``Authorization``), and
the environment's JupyterLab still checks XSRF and Origin as for a browser of its own (the agent
starts it with ``sxwl.agent.jupyter_identity``), so the token does not turn those checks off. The
cloud's own cookies never reach the environment, and the environment cannot set them."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
from collections.abc import AsyncIterator
from http.cookies import SimpleCookie

from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import RedirectResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.websockets import WebSocketDisconnect
from websockets.exceptions import ProtocolError
from websockets.frames import Close, Frame, Opcode
from websockets.protocol import Protocol, Side

from sxwl.cloud.api.deps import SESSION_COOKIE
from sxwl.cloud.api.websocket_relay import ClientBytes, pump_until_either_ends
from sxwl.cloud.config import Settings
from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import SessionKind, User
from sxwl.cloud.edge.body_rules import body_rule
from sxwl.cloud.errors import AppError
from sxwl.cloud.services.accounts import sessions
from sxwl.cloud.services.devenvs import dev_envs
from sxwl.cloud.tunnel import service
from sxwl.cloud.tunnel.hub import NoTunnel
from sxwl.tunnel.headers import Headers

router = APIRouter(include_in_schema=False)
METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
HEAD_TIMEOUT_S = 60.0
RETRY_AFTER_S = 5  # while the CPod's agent re-dials or takes the environment back
WS_HOLD_S = 30.0  # how long a WebSocket's handshake waits for that (_open_held)
WS_RETRY_S = 0.5
# The cloud's cookies are its own: never sent to an environment, never set by one.
OWN_COOKIES = "sxwl_"
# Request headers the cloud sets itself on the way to JupyterLab.
REPLACED = frozenset({"cookie", "authorization", "host", "sec-websocket-key", "sec-websocket-extensions"})


def _proxied_body(settings: Settings) -> tuple[int, float]:
    # JupyterLab uploads a file in chunks of 1 MiB, base64 in JSON: a bit over 1.3 MiB each.
    return max(settings.max_body_bytes, 16 * 1024 * 1024), max(settings.request_body_timeout_s, 120.0)


def _owner(ctx: CloudContext, token: str | None) -> User:
    """The console session's user: the only credential this path takes (no API token)."""
    if not token:
        raise AppError(401, "sign in to the console to open a dev environment")
    with ctx.db.session() as session:
        found = sessions.resolve(session, token, SessionKind.CONSOLE)
    if found is None:
        raise AppError(401, "your console session has ended; sign in again")
    return found[1]


def _upstream(ctx: CloudContext, token: str | None, env_id: str) -> dev_envs.Upstream:
    user = _owner(ctx, token)
    with ctx.db.session() as session:
        return dev_envs.upstream(ctx, session, user, env_id)


def _forwarded(headers: Headers, token: str) -> Headers:
    """The browser's headers for JupyterLab: without the cloud's cookies, with Jupyter's token."""
    kept = [(name, value) for name, value in headers if name.lower() not in REPLACED]
    cookies = [
        part.strip()
        for name, value in headers
        if name.lower() == "cookie"
        for part in value.split(";")
        if part.strip() and not part.strip().startswith(OWN_COOKIES)
    ]
    if cookies:
        kept.append(("cookie", "; ".join(cookies)))
    return [*kept, ("authorization", f"token {token}")]


def _answered(headers: Headers) -> Headers:
    """JupyterLab's answer headers, less any cookie it would set in the cloud's name."""
    kept: Headers = []
    for name, value in headers:
        if name == "set-cookie":
            parsed: SimpleCookie = SimpleCookie()
            with contextlib.suppress(Exception):
                parsed.load(value)
            if not parsed or any(key.startswith(OWN_COOKIES) for key in parsed):
                continue
        kept.append((name, value))
    return kept


def _same_origin(origin: str | None, host: str | None) -> bool:
    """A browser's request from a page of this cloud (or from no page at all: a script)."""
    if origin is None:
        return True
    return host is not None and origin.split("://", 1)[-1].lower() == host.lower()


def _path(scope_path: str, query: str) -> str:
    return scope_path + (f"?{query}" if query else "")


@router.get("/dev/{env_id}")
def to_slash(env_id: str) -> RedirectResponse:
    return RedirectResponse(f"/dev/{env_id}/", status_code=307)


@router.api_route("/dev/{env_id}/{rest:path}", methods=METHODS)
@body_rule(_proxied_body)
async def proxy_http(env_id: str, rest: str, request: Request) -> Response:
    ctx: CloudContext = request.app.state.ctx
    up = await run_in_threadpool(_upstream, ctx, request.cookies.get(SESSION_COOKIE), env_id)
    raw = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in request.scope["headers"]]
    has_body = request.headers.get("content-length", "0") != "0" or "transfer-encoding" in request.headers

    async def body() -> AsyncIterator[bytes]:
        async for chunk in request.stream():
            yield chunk

    call = service.TunnelRequest(
        request.method,
        _path(request.url.path, request.url.query),
        _forwarded(raw, up.token),
        body() if has_body else None,
    )
    reply = await _open(ctx, up, call, request.headers.get("host"))
    if reply.from_agent:  # the agent's own refusal: it does not hold the environment's JupyterLab yet
        reply.close()
        raise _unavailable("the environment's CPod cannot reach its JupyterLab right now")

    async def answer() -> AsyncIterator[bytes]:
        try:
            async for chunk in reply.chunks():
                yield chunk
        finally:
            reply.close()  # the browser went away, or the answer ended: nothing is left open

    return _streamed(answer(), reply.status, _answered(reply.headers))


def _streamed(chunks: AsyncIterator[bytes], status: int, headers: Headers) -> StreamingResponse:
    response = StreamingResponse(chunks, status_code=status)
    response.raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers]
    return response


async def _open(
    ctx: CloudContext, up: dev_envs.Upstream, call: service.TunnelRequest, host: str | None
) -> service.TunnelResponse:
    try:
        return await service.open_stream(
            ctx.tunnels, up.cpod_id, up.target, call, head_timeout_s=HEAD_TIMEOUT_S, authority=host
        )
    except NoTunnel:
        raise _unavailable("the environment's CPod is not connected to the cloud right now") from None
    except service.TunnelError:
        raise _unavailable("the environment's CPod closed the connection") from None
    except TimeoutError:
        raise AppError(504, "the environment's JupyterLab did not answer in time") from None


def _unavailable(why: str) -> AppError:
    """A 503 with Retry-After for what passes (the agent re-dialling, or taking the environment back
    after a restart): JupyterLab's page keeps asking after a kernel on a 503, and takes any other
    error for a dead kernel, so an agent's restart would otherwise kill the page's kernels."""
    return AppError(503, f"{why}; try again in a few seconds", headers={"Retry-After": str(RETRY_AFTER_S)})


@router.websocket("/dev/{env_id}/{rest:path}")
async def proxy_websocket(websocket: WebSocket, env_id: str, rest: str) -> None:
    """A browser's WebSocket (a kernel's channels, a terminal) to JupyterLab's: the cloud ends the
    browser's WebSocket and speaks its own to JupyterLab over the tunnel stream's raw bytes, message
    for message; pings are answered on each side."""
    ctx: CloudContext = websocket.app.state.ctx
    if not _same_origin(websocket.headers.get("origin"), websocket.headers.get("host")):
        await websocket.close(code=1008)  # another site's page riding the owner's cookie
        return
    try:
        up = await run_in_threadpool(_upstream, ctx, websocket.cookies.get(SESSION_COOKIE), env_id)
    except AppError:
        await websocket.close(code=1008)
        return
    raw = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in websocket.scope["headers"]]
    headers = _forwarded(raw, up.token)
    path, host = _path(websocket.url.path, websocket.url.query), websocket.headers.get("host")
    try:
        reply, outgoing = await _open_held(ctx, up, path, headers, host)
    except AppError:
        await websocket.close(code=1011)
        return
    async with reply:
        if not reply.upgraded:
            await websocket.close(code=1008 if reply.status in (401, 403, 404) else 1011)
            return
        chosen = next((v for k, v in reply.headers if k == "sec-websocket-protocol"), None)
        await websocket.accept(subprotocol=chosen)
        await _splice(websocket, reply, outgoing)


async def _open_held(
    ctx: CloudContext, up: dev_envs.Upstream, path: str, headers: Headers, host: str | None
) -> tuple[service.TunnelResponse, ClientBytes]:
    """JupyterLab's WebSocket over the tunnel, the handshake held for up to ``WS_HOLD_S`` while the
    environment's CPod is away (its agent re-dialling, or taking the environment back): JupyterLab
    asks after a kernel whose socket was refused and, on the 503 it then meets, waits 10 to 30 s
    before it tries again, so a refused handshake would leave the page's kernel "Unknown" that long
    after the agent is back, while a held one connects as soon as it is."""
    deadline = asyncio.get_running_loop().time() + WS_HOLD_S
    while True:
        outgoing = ClientBytes()
        key = base64.b64encode(os.urandom(16)).decode()
        call = service.TunnelRequest("GET", path, [*headers, ("sec-websocket-key", key)], outgoing)
        last_try = asyncio.get_running_loop().time() >= deadline
        try:
            reply = await _open(ctx, up, call, host)
        except AppError as exc:
            if exc.status != 503 or last_try:
                raise
        else:
            if not reply.from_agent or last_try:
                return reply, outgoing
            reply.close()
        await asyncio.sleep(WS_RETRY_S)


def _close_code(data: bytes) -> int:
    """The code of a close frame's ``data``: 1000 where it gives none (1005 is never sent) or a bad one."""
    try:
        code = Close.parse(data).code
    except (ProtocolError, ValueError):
        return 1000
    return 1000 if code in (1005, 1006) else code


# The browser's WebSocket closed because the tunnel or the agent cut it, not because JupyterLab
# closed its own: "try again later". JupyterLab's page takes 1000 and 1001 for a kernel closed on
# purpose and never reconnects it; on any other code it reconnects to the same kernel.
CUT = 1013


async def _splice(websocket: WebSocket, reply: service.TunnelResponse, outgoing: ClientBytes) -> None:
    upstream = Protocol(Side.CLIENT, max_size=None)
    closed_by_lab: list[int] = []  # JupyterLab's own close code, passed on to the browser

    def flush() -> None:
        for data in upstream.data_to_send():
            if data:
                outgoing.put(data)

    async def from_browser() -> None:
        try:
            while True:
                message = await websocket.receive()
                if message["type"] == "websocket.disconnect":
                    break
                if message.get("text") is not None:
                    upstream.send_text(message["text"].encode())
                elif message.get("bytes") is not None:
                    upstream.send_binary(message["bytes"])
                flush()
        except WebSocketDisconnect:
            pass
        with contextlib.suppress(Exception):
            upstream.send_close(1000)
            flush()
        outgoing.end()

    async def to_browser() -> None:
        opcode, parts = Opcode.TEXT, []
        async for chunk in reply.chunks():
            upstream.receive_data(chunk)
            for event in upstream.events_received():
                if not isinstance(event, Frame):
                    continue
                if event.opcode in (Opcode.TEXT, Opcode.BINARY):
                    opcode, parts = event.opcode, [event.data]
                elif event.opcode == Opcode.CONT:
                    parts.append(event.data)
                elif event.opcode == Opcode.CLOSE:
                    closed_by_lab.append(_close_code(bytes(event.data)))
                    flush()
                    return
                else:
                    continue  # pings (answered by ``upstream``) and pongs
                if event.fin:
                    data = b"".join(parts)
                    if opcode == Opcode.TEXT:
                        await websocket.send_text(data.decode())
                    else:
                        await websocket.send_bytes(data)
            flush()

    await pump_until_either_ends(
        websocket, from_browser(), to_browser(), lambda: closed_by_lab[0] if closed_by_lab else CUT
    )
