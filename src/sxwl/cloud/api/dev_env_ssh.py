"""``GET /api/v1/dev-envs/{id}/ssh``: a WebSocket carrying an SSH session to the caller's running
dev environment (docs/dev-envs.md, "SSH"), for ``sxwl dev ssh-proxy`` as OpenSSH's ProxyCommand.
Its binary messages are the SSH connection's bytes, passed through the agent's tunnel to the
environment's sshd, which accepts only the owner's keys. The caller signs in with an API token."""

from __future__ import annotations

import contextlib

from fastapi import APIRouter, WebSocket
from starlette.concurrency import run_in_threadpool
from starlette.websockets import WebSocketDisconnect

from sxwl.cloud.api.deps import bearer_token
from sxwl.cloud.api.websocket_relay import ClientBytes, pump_until_either_ends
from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import SessionKind
from sxwl.cloud.errors import AppError
from sxwl.cloud.services.accounts import sessions
from sxwl.cloud.services.devenvs import dev_envs
from sxwl.cloud.tunnel import service
from sxwl.cloud.tunnel.hub import NoTunnel

router = APIRouter()


def _upstream(ctx: CloudContext, token: str | None, env_id: str) -> dev_envs.Upstream:
    if not token:
        raise AppError(401, "sign in: sxwl login")
    with ctx.db.session() as session:
        found = sessions.resolve(session, token, SessionKind.API)
        if found is None:
            raise AppError(401, "token is invalid, expired or revoked; sign in again")
        return dev_envs.ssh_upstream(ctx, session, found[1], env_id)


@router.websocket("/api/v1/dev-envs/{env_id}/ssh")
async def ssh(websocket: WebSocket, env_id: str) -> None:
    ctx: CloudContext = websocket.app.state.ctx
    try:
        up = await run_in_threadpool(_upstream, ctx, bearer_token(websocket), env_id)  # type: ignore[arg-type]
    except AppError:
        await websocket.close(code=1008)
        return
    incoming = ClientBytes()
    call = service.TunnelRequest("GET", "/", [("connection", "upgrade"), ("upgrade", "ssh")], incoming)
    try:
        reply = await service.open_stream(ctx.tunnels, up.cpod_id, up.target, call, head_timeout_s=30)
    except (NoTunnel, service.TunnelError, TimeoutError):
        await websocket.close(code=1011)
        return
    async with reply:
        if not reply.upgraded:
            await websocket.close(code=1011)
            return
        await websocket.accept()

        async def from_client() -> None:
            with contextlib.suppress(WebSocketDisconnect):
                while True:
                    message = await websocket.receive()
                    if message["type"] == "websocket.disconnect":
                        break
                    if message.get("bytes"):
                        incoming.put(message["bytes"])
            incoming.end()

        async def to_client() -> None:
            async for chunk in reply.chunks():
                await websocket.send_bytes(chunk)

        await pump_until_either_ends(websocket, from_client(), to_client())
