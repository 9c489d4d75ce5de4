"""What the rest of the cloud calls to reach a service on a CPod through its agent's tunnel
(docs/tunnel.md): ``open_stream(tunnels, cpod_id, target, request)`` sends the request's method,
path and headers with the stream's opening (and a body given whole, where it fits, in the same
message), streams a body given as an iterator, and returns the answer as it arrives.
Free of HTTP frameworks: an endpoint's route turns its request into a ``TunnelRequest`` and the
``TunnelResponse`` into its answer.

Closing the response before its end resets the stream, which aborts the request at the target: a
route calls ``close()`` when its client disconnects. An Upgrade (``Connection: upgrade``) that the
target accepts gives ``upgraded`` True: the request's body iterator then carries the client's raw
bytes and ``chunks()`` the target's."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from types import TracebackType

from sxwl.cloud.tunnel.hub import NoTunnel, Tunnels
from sxwl.tunnel.headers import ERROR, TARGET, UPGRADE, UPGRADED, Headers, end_to_end, first, upgrade_of
from sxwl.tunnel.session import StreamReset, TunnelStream

__all__ = ["NoTunnel", "TunnelError", "TunnelRequest", "TunnelResponse", "open_stream"]


class TunnelError(Exception):
    """The stream was reset, or its tunnel closed, before or during the answer."""


@dataclass(frozen=True)
class TunnelRequest:
    method: str
    path: str  # with its query string
    headers: Headers
    body: bytes | AsyncIterable[bytes] | None = None


class TunnelResponse:
    def __init__(self, stream: TunnelStream, head: Headers, pump: asyncio.Task[None] | None) -> None:
        self._stream, self._pump = stream, pump
        status = first(head, ":status") or "502"
        self.upgraded = first(head, UPGRADED) is not None
        self.status = 101 if self.upgraded else int(status)
        # The agent's own answer (a refused or unreachable target), not the target's.
        self.from_agent = first(head, ERROR) is not None
        self.headers = end_to_end(head)
        if self.upgraded:
            self.headers += [("connection", "upgrade"), ("upgrade", first(head, UPGRADED) or "")]

    async def chunks(self) -> AsyncIterator[bytes]:
        """The answer's body as it arrives; TunnelError if it is cut. A body that has all the bytes
        its ``content-length`` declares is whole even if the stream is reset before its end: the
        agent ends a stream after its target's last byte, and an agent killed in that gap must not
        cut an answer its client already has (the client's connection would be dropped with it)."""
        received = 0
        try:
            while data := await self._stream.read():
                received += len(data)
                yield data
        except StreamReset as exc:
            if received != self._declared_length():
                raise TunnelError(str(exc)) from None

    def _declared_length(self) -> int | None:
        value = first(self.headers, "content-length")
        return int(value) if value is not None and value.isdigit() else None

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    def close(self) -> None:
        """Resets the stream unless it ended both ways: the target's request is aborted."""
        if not self._stream.done:
            self._stream.reset()
        if self._pump is not None:
            self._pump.cancel()

    async def __aenter__(self) -> TunnelResponse:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()


async def open_stream(
    tunnels: Tunnels,
    cpod_id: str,
    target: str,
    request: TunnelRequest,
    head_timeout_s: float | None = None,
    authority: str | None = None,
) -> TunnelResponse:
    """Opens a stream to ``target`` (host:port, which the agent must allow) on CPod ``cpod_id``;
    ``authority``: the Host the target is told (default: the target), for a target that compares it
    with the request's Origin. Raises NoTunnel when no replica holds a tunnel of that CPod,
    TunnelError when the stream is reset before its answer's head, TimeoutError past
    ``head_timeout_s``."""
    head = [
        (":method", request.method),
        (":scheme", "http"),
        (":authority", authority or target),
        (":path", request.path or "/"),
        (TARGET, target),
        *end_to_end(request.headers),
    ]
    upgrade = upgrade_of(request.headers)
    if upgrade is not None:
        head.append((UPGRADE, upgrade))
    try:
        whole = request.body if isinstance(request.body, bytes) else None
        stream = await tunnels.open(cpod_id, head, end=request.body is None, body=whole)
    except StreamReset as exc:
        raise TunnelError(str(exc)) from None
    pump = None if stream.local_ended else asyncio.create_task(_pump(stream, request.body))
    try:
        answer = await asyncio.wait_for(stream.head(), head_timeout_s)
    except StreamReset as exc:
        if pump is not None:
            pump.cancel()
        raise TunnelError(str(exc)) from None
    except BaseException:
        stream.reset()
        if pump is not None:
            pump.cancel()
        raise
    return TunnelResponse(stream, answer, pump)


async def _pump(stream: TunnelStream, body: bytes | AsyncIterable[bytes] | None) -> None:
    """The request's body into the stream; a body that fails (its client went away) resets it."""
    assert body is not None
    try:
        if isinstance(body, bytes):
            await stream.write(body)
        else:
            async for chunk in body:
                if chunk:
                    await stream.write(chunk)
        await stream.end()
    except StreamReset:
        return
    except Exception:
        with contextlib.suppress(StreamReset):
            stream.reset()
