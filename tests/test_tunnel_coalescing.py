"""What travels together through the tunnel (docs/tunnel.md), so that a /v1 call costs as few trips
as it can: a request opened with its whole body leaves in one message and reaches its target in one
write; an answer's head waits (``HEAD_HOLD_S`` at most) for its first body bytes and leaves with
them. Real h2 sessions on an in-memory pipe (tests/support/h2_pipe.py), the agent's real
forwarding, and a real target on loopback TCP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import pytest

from sxwl.agent import tunnel_forward
from sxwl.tunnel.headers import TARGET, Headers
from sxwl.tunnel.session import STREAM_WINDOW, Session, TunnelStream
from tests.support.h2_pipe import Pipe, Sent, messages_with, pipe
from tests.support.threads import run_on_thread

Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@dataclass
class Ends:
    cloud: Session
    cloud_pipe: Pipe
    agent_pipe: Pipe
    target: str


@asynccontextmanager
async def tunnel_to(answer: Answer) -> AsyncIterator[Ends]:
    """A target on loopback answering with ``answer``, and the two ends of a tunnel whose agent end
    forwards every stream to it."""
    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    cloud_pipe, agent_pipe = pipe()

    async def forward(stream: TunnelStream) -> None:
        await tunnel_forward.forward(stream, allowed=lambda _target: True)

    cloud = Session(cloud_pipe, client_side=True)
    agent = Session(agent_pipe, client_side=False, on_stream=forward)
    running = [asyncio.create_task(cloud.run()), asyncio.create_task(agent.run())]
    try:
        yield Ends(cloud, cloud_pipe, agent_pipe, f"127.0.0.1:{port}")
    finally:
        cloud_pipe.cut()
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        server.close()
        await server.wait_closed()


def opening(target: str, method: str = "GET", headers: Headers | None = None) -> Headers:
    return [
        (":method", method),
        (":scheme", "http"),
        (":authority", target),
        (":path", "/"),
        (TARGET, target),
        *(headers or []),
    ]


async def read_all(stream: TunnelStream) -> bytes:
    body = b""
    while data := await asyncio.wait_for(stream.read(), 10):
        body += data
    return body


async def request_of(reader: asyncio.StreamReader) -> bytes:
    """A whole request, its body as long as it says."""
    whole = await reader.read(1 << 20)
    while b"\r\n\r\n" not in whole:
        whole += await reader.read(1 << 20)
    head, _, body = whole.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1])
        for line in head.lower().split(b"\r\n")
        if line.startswith(b"content-length:")
    )
    while len(body) < length:
        body += await reader.read(1 << 20)
    return head + b"\r\n\r\n" + body


def kinds(frames: list[Sent]) -> list[str]:
    return [f"{f.kind}{'+END' if 'END_STREAM' in f.flags else ''}" for f in frames]


def test_a_request_opened_with_its_whole_body_leaves_in_one_message_and_reaches_its_target_in_one_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    payload = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
    seen: list[bytes] = []
    writes: list[tuple[int, bytes]] = []  # (the peer's port, what was written), by every writer
    write = asyncio.StreamWriter.write

    def recorded(writer: asyncio.StreamWriter, data: bytes | bytearray | memoryview) -> None:
        peer = writer.get_extra_info("peername")
        writes.append((peer[1] if isinstance(peer, tuple) else 0, bytes(data)))
        write(writer, data)

    monkeypatch.setattr(asyncio.StreamWriter, "write", recorded)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await request_of(reader))
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    async def run() -> tuple[list[list[str]], bool, bytes, int]:
        async with tunnel_to(answer) as ends:
            head = opening(ends.target, "POST", [("content-length", str(len(payload)))])
            stream = await ends.cloud.open(head, body=payload)
            answered = await read_all(stream)
            sent = [kinds(m) for m in messages_with(ends.cloud_pipe.sent, stream.id)]
            return sent, stream.local_ended, answered, int(ends.target.rsplit(":", 1)[1])

    sent, ended, answered, port = run_on_thread(run())
    assert ended and answered == b"ok"
    assert sent == [["HEADERS", "DATA+END"]]  # one message: the headers and the whole body
    assert seen[0].endswith(b"\r\n\r\n" + payload)
    assert [data for peer, data in writes if peer == port] == [seen[0]]  # the agent wrote it at once


def test_a_body_beyond_the_streams_first_window_is_written_after_its_opening() -> None:
    payload = b"x" * (STREAM_WINDOW + 1)
    seen: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await request_of(reader))
        writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        await writer.drain()
        writer.close()

    async def run() -> bool:
        async with tunnel_to(answer) as ends:
            head = opening(ends.target, "PUT", [("content-length", str(len(payload)))])
            stream = await ends.cloud.open(head, body=payload)
            ended_at_opening = stream.local_ended
            await stream.write(payload)
            await stream.end()
            await read_all(stream)
            return ended_at_opening

    assert not run_on_thread(run())  # the opening left without the body: the caller wrote it
    assert seen[0].endswith(b"\r\n\r\n" + payload)


def test_an_answers_head_leaves_with_its_first_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    # A hold far longer than the target's pause: the first chunk surely comes within it, however
    # loaded the machine.
    monkeypatch.setattr(tunnel_forward, "HEAD_HOLD_S", 30.0)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.2)  # an engine's prefill: the head went out alone
        writer.write(b"5\r\nfirst\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"6\r\nsecond\r\n0\r\n\r\n")
        await writer.drain()
        writer.close()

    async def run() -> tuple[list[list[str]], bytes]:
        async with tunnel_to(answer) as ends:
            stream = await ends.cloud.open(opening(ends.target), end=True)
            answered = await read_all(stream)
            return [kinds(m) for m in messages_with(ends.agent_pipe.sent, stream.id)], answered

    sent, answered = run_on_thread(run())
    assert answered == b"firstsecond"
    assert sent[0] == ["HEADERS", "DATA"]


def test_a_head_whose_body_is_late_leaves_alone_within_the_hold() -> None:
    body_may_go = asyncio.Event()

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        await writer.drain()
        await body_may_go.wait()  # a long-poll: its body waits for the client to have seen the head
        writer.write(b"4\r\nlate\r\n0\r\n\r\n")
        await writer.drain()
        writer.close()

    async def run() -> tuple[Headers, bytes]:
        async with tunnel_to(answer) as ends:
            stream = await ends.cloud.open(opening(ends.target), end=True)
            head = await asyncio.wait_for(stream.head(), 30)
            body_may_go.set()
            return head, await read_all(stream)

    head, answered = run_on_thread(run())
    assert head[0] == (":status", "200") and answered == b"late"
