"""A client WebSocket (the ``websockets`` library) as the session's transport: the agent's tunnel,
and a replica's relay to another."""

from __future__ import annotations

from websockets.asyncio.client import ClientConnection
from websockets.exceptions import ConnectionClosed


class ClientTransport:
    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws

    async def send(self, data: bytes) -> None:
        await self.ws.send(data)

    async def receive(self) -> bytes | None:
        try:
            message = await self.ws.recv()
        except ConnectionClosed:
            return None
        return message if isinstance(message, bytes) else None

    async def close(self) -> None:
        await self.ws.close()
