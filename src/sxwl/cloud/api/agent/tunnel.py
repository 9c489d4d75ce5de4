"""The WebSockets of the tunnel (docs/tunnel.md): the agents' (the CPod token in the Authorization
header, never in the URL) and other replicas' relays (a keyed hash only replicas can make). Neither
takes a user's credentials, and neither is in the OpenAPI document: tenants reach nothing here."""

from __future__ import annotations

from fastapi import APIRouter, WebSocket
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.websockets import WebSocketDisconnect

from sxwl.cloud.api.agent.routes import check_protocol
from sxwl.cloud.context import CloudContext
from sxwl.cloud.errors import AppError, error_body
from sxwl.cloud.services.fleet import cpods
from sxwl.cloud.tunnel import relay
from sxwl.protocol import PROTOCOL_HEADER, paths

router = APIRouter()


class ServerTransport:
    """The ASGI server's WebSocket (uvicorn: written with backpressure, read one message at a time)."""

    def __init__(self, ws: WebSocket) -> None:
        self.ws = ws

    async def send(self, data: bytes) -> None:
        try:
            await self.ws.send_bytes(data)
        except (WebSocketDisconnect, RuntimeError, OSError):
            raise ConnectionError("the tunnel's WebSocket closed") from None

    async def receive(self) -> bytes | None:
        try:
            message = await self.ws.receive()
        except (WebSocketDisconnect, RuntimeError, OSError):
            return None
        if message["type"] == "websocket.disconnect":
            return None
        data = message.get("bytes")
        return data if isinstance(data, bytes) else None

    async def close(self) -> None:
        try:
            await self.ws.close()
        except (RuntimeError, OSError):
            return


async def _deny(ws: WebSocket, error: AppError) -> None:
    body = error_body(error.status, error.message, error.code, error.details)
    await ws.send_denial_response(JSONResponse(body, status_code=error.status, headers=error.headers))


def _cpod_of(ctx: CloudContext, token: str | None) -> str:
    with ctx.db.session() as session:
        return cpods.authenticate(session, token).id


@router.websocket(paths.API + paths.AGENT + paths.TUNNEL)
async def agent_tunnel(ws: WebSocket) -> None:
    ctx: CloudContext = ws.app.state.ctx
    authorization = ws.headers.get("authorization", "")
    scheme, _, token = authorization.partition(" ")
    try:
        check_protocol(ws.headers.get(PROTOCOL_HEADER))
        cpod_id = await run_in_threadpool(
            _cpod_of, ctx, token if scheme.lower() == "bearer" and token else None
        )
    except AppError as error:
        await _deny(ws, error)
        return
    await ws.accept()
    await ctx.tunnels.hold(cpod_id, ServerTransport(ws))


@router.websocket(relay.PATH)
async def replica_relay(ws: WebSocket) -> None:
    ctx: CloudContext = ws.app.state.ctx
    if not ctx.tunnels.relay_token_valid(ws.headers.get(relay.RELAY_HEADER)):
        await _deny(ws, AppError(403, "not a replica of this cloud", code="forbidden"))
        return
    await ws.accept()
    await ctx.tunnels.serve_relay(ServerTransport(ws))
