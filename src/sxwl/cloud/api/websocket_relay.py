"""What the routes that carry a client's WebSocket over an upgraded tunnel stream share (the SSH
route here, the console's JupyterLab proxy in web/devenvs): the stream's request body fed from the
client's messages, and the two pumps that end together when either side does."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Coroutine

from fastapi import WebSocket


class ClientBytes:
    """The upgraded stream's body: bytes put as the client sends them, ``end()`` when it is gone."""

    def __init__(self) -> None:
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue()

    def put(self, data: bytes) -> None:
        self._queue.put_nowait(data)

    def end(self) -> None:
        self._queue.put_nowait(None)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while (data := await self._queue.get()) is not None:
            yield data


async def pump_until_either_ends(
    websocket: WebSocket,
    to_target: Coroutine[None, None, None],
    to_client: Coroutine[None, None, None],
    close_code: Callable[[], int] = lambda: 1000,
) -> None:
    """Runs both directions; the first to finish (a side closed, a stream reset) cancels the other,
    and the client's WebSocket is closed with ``close_code()``, so neither end is left half open."""
    tasks = [asyncio.create_task(to_target), asyncio.create_task(to_client)]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await websocket.close(code=close_code())
