"""Replica to replica: a stream for a CPod whose tunnel another replica holds travels on one
HTTP/2-over-WebSocket connection to that replica (its SXWL_REPLICA_URL), authenticated with a
short-lived keyed hash that only holders of SXWL_SECRET_KEY can make, and goes on there into the
tunnel, byte for byte, resets included (docs/tunnel.md)."""

from __future__ import annotations

import asyncio

import websockets
from h2.errors import ErrorCodes
from websockets.exceptions import InvalidStatus, WebSocketException

from sxwl.tunnel.session import MESSAGE_MAX, StreamReset, TunnelStream
from sxwl.tunnel.websocket import ClientTransport

PATH = "/internal/tunnel-relay"
RELAY_HEADER = "X-Sxwl-Relay"
NOT_HERE = ErrorCodes.REFUSED_STREAM  # the replica asked holds no tunnel of that CPod (any more)
DIAL_TIMEOUT_S = 10.0


class RelayRefused(Exception):
    pass


async def dial(replica_url: str, token: str) -> ClientTransport:
    base = replica_url.rstrip("/")
    scheme, rest = base.split("://", 1)
    url = f"{'wss' if scheme == 'https' else 'ws'}://{rest}{PATH}"
    try:
        ws = await websockets.connect(
            url,
            additional_headers={RELAY_HEADER: token},
            open_timeout=DIAL_TIMEOUT_S,
            ping_interval=None,
            max_size=2 * MESSAGE_MAX,
            compression=None,
        )
    except InvalidStatus as exc:
        raise RelayRefused(f"{url}: HTTP {exc.response.status_code}") from None
    except WebSocketException as exc:
        raise RelayRefused(f"{url}: {exc}") from None
    return ClientTransport(ws)


async def splice(incoming: TunnelStream, outgoing: TunnelStream) -> None:
    """Copies ``incoming``'s body to ``outgoing`` and ``outgoing``'s answer back until the answer
    ends; a reset of either resets the other."""
    request = asyncio.create_task(_request(incoming, outgoing))
    answer = asyncio.create_task(_answer(outgoing, incoming))
    try:
        done, _ = await asyncio.wait({request, answer}, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()
    except StreamReset as exc:
        incoming.reset(exc.code)
        outgoing.reset(exc.code)
    finally:
        for task in (request, answer):
            task.cancel()
        await asyncio.gather(request, answer, return_exceptions=True)


async def _request(source: TunnelStream, sink: TunnelStream) -> None:
    """The body (or an upgraded stream's bytes), then waits for a reset, which ends the splice."""
    while data := await source.read():
        await sink.write(data)
    await sink.end()  # nothing where the opening ended it
    await source.until_reset()


async def _answer(source: TunnelStream, sink: TunnelStream) -> None:
    await sink.send_head(await source.head())
    while data := await source.read():
        await sink.write(data)
    await sink.end()
