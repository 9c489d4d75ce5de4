"""Two real h2 sessions, the cloud's and an agent's, joined by an in-memory pipe instead of a
WebSocket: each message one end sends is one the other receives, and each is recorded, so a test
can see which frames travelled together."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from hyperframe.frame import Frame

FRAME_HEADER = 9


class Pipe:
    """One end of an in-memory message pipe; ``cut()`` ends both directions at once, as a dead TCP
    connection does. ``sent``: every message this end sent, in order."""

    def __init__(self, inbox: asyncio.Queue[bytes | None], outbox: asyncio.Queue[bytes | None]) -> None:
        self.inbox, self.outbox = inbox, outbox
        self.sent: list[bytes] = []

    async def send(self, data: bytes) -> None:
        self.sent.append(data)
        await self.outbox.put(data)

    async def receive(self) -> bytes | None:
        return await self.inbox.get()

    async def close(self) -> None:
        self.cut()

    def cut(self) -> None:
        self.inbox.put_nowait(None)
        self.outbox.put_nowait(None)


def pipe() -> tuple[Pipe, Pipe]:
    """The cloud's end and the agent's."""
    one: asyncio.Queue[bytes | None] = asyncio.Queue()
    two: asyncio.Queue[bytes | None] = asyncio.Queue()
    return Pipe(one, two), Pipe(two, one)


@dataclass(frozen=True)
class Sent:
    """One frame of a message: its type (``HEADERS``, ``DATA`` ...), stream and flags."""

    kind: str
    stream_id: int
    flags: frozenset[str]


def frames(message: bytes) -> list[Sent]:
    """The frames of one message (the HTTP/2 connection preface skipped)."""
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
    view = message[len(preface) :] if message.startswith(preface) else message
    found: list[Sent] = []
    while len(view) >= FRAME_HEADER:
        frame, length = Frame.parse_frame_header(memoryview(view[:FRAME_HEADER]))
        found.append(Sent(_name(frame), frame.stream_id, frozenset(frame.flags)))
        view = view[FRAME_HEADER + length :]
    return found


def _name(frame: Frame) -> str:
    return type(frame).__name__.removesuffix("Frame").upper()


def messages_with(sent: list[bytes], stream_id: int) -> list[list[Sent]]:
    """The frames of ``stream_id`` in each message that carried any, in order."""
    found = [[f for f in frames(m) if f.stream_id == stream_id] for m in sent]
    return [m for m in found if m]
