"""A stream the cloud opened, forwarded to a target on the CPod over HTTP/1.1 (docs/tunnel.md).

The target is named by the stream's ``sxwl-target`` header and must be one the agent allows: the
cloud asks, the agent decides, so no tenant can point the tunnel at an address of its choosing. A
reset from the cloud closes the target's connection at once, which aborts its request; a target
that fails mid-answer resets the stream. An Upgrade the target accepts turns the stream into raw
bytes both ways."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence

import h11

from sxwl.agent.forward_targets import Targets, open_target
from sxwl.tunnel.headers import ERROR, TARGET, UPGRADE, UPGRADED, Headers, end_to_end, first, split_target
from sxwl.tunnel.session import StreamReset, TunnelStream

CONNECT_S = 10.0
READ_SIZE = 256 * 1024
# How long an answer's head waits for its first body bytes, to leave with them in one message: the
# cloud then has the head and the first chunk (an engine's first token) in one receive. An answer
# whose body comes later sees its head this much later, never its body.
HEAD_HOLD_S = 0.05


async def forward(
    stream: TunnelStream, allowed: Callable[[str], bool], targets: Targets | None = None
) -> None:
    """``targets``: an attempt's own service a target names (an endpoint replica's engine, a dev
    environment's JupyterLab or sshd), found by the runtime. Such targets need no --tunnel-allow:
    the agent itself runs what they lead to."""
    head = await stream.head()
    target = first(head, TARGET) or ""
    own = targets(target) if targets is not None else None
    address = split_target(target)
    if own is None and (address is None or not allowed(target)):
        await _answer(stream, 403, f"the agent does not forward to {target!r}\n")
        return
    try:
        if own is not None:
            reader, writer = await asyncio.wait_for(open_target(own), CONNECT_S)
        else:
            assert address is not None
            reader, writer = await asyncio.wait_for(asyncio.open_connection(*address), CONNECT_S)
    except (OSError, TimeoutError) as exc:
        await _answer(stream, 502, f"the agent could not reach {target}: {exc or type(exc).__name__}\n")
        return
    try:
        if own is not None and own.raw:
            await _spliced(stream, reader, writer)
        else:
            await _exchange(stream, head, target, reader, writer)
    finally:
        # Closed at once, unread data or not: the target sees its client gone.
        writer.transport.abort()


async def _exchange(
    stream: TunnelStream,
    head: Headers,
    target: str,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
) -> None:
    conn = h11.Connection(h11.CLIENT)
    upgrade = first(head, UPGRADE)
    headers = [("host", first(head, ":authority") or target), *end_to_end(head)]
    has_body = not stream.bodiless
    if upgrade is not None:
        headers += [("connection", "upgrade"), ("upgrade", upgrade)]
    elif has_body and first(headers, "content-length") is None:
        headers.append(("transfer-encoding", "chunked"))
    # A request that came whole (as a /v1 call does) leaves in one write, so its target reads it
    # at once; otherwise the body follows as it comes.
    whole = stream.whole_body() if has_body and upgrade is None else None
    try:
        request = h11.Request(
            method=first(head, ":method") or "GET", target=first(head, ":path") or "/", headers=headers
        )
        out = conn.send(request) or b""
        if whole:
            out += conn.send(h11.Data(data=whole)) or b""
        if upgrade is not None or not has_body or whole is not None:
            out += conn.send(h11.EndOfMessage()) or b""
    except h11.LocalProtocolError as exc:
        await _answer(stream, 400, f"the request cannot be sent over HTTP/1.1: {exc}\n")
        return
    writer.write(out)
    body = has_body and upgrade is None and whole is None
    upload = asyncio.create_task(_upload(stream, conn, writer, raw=False, body=body))
    download = asyncio.create_task(_download(stream, conn, reader, writer))
    try:
        done, _ = await asyncio.wait({upload, download}, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()  # a reset from either side ends both
    finally:
        for task in (upload, download):
            task.cancel()
        await asyncio.gather(upload, download, return_exceptions=True)


async def _upload(
    stream: TunnelStream, conn: h11.Connection, writer: asyncio.StreamWriter, raw: bool, body: bool
) -> None:
    """The request's body (or, after a switch, the client's bytes) to the target; then waits for a
    reset, so that one arriving while the target thinks is noticed."""
    if body:
        while data := await stream.read():
            writer.write(data if raw else conn.send(h11.Data(data=data)) or b"")
            await writer.drain()
        if raw:
            if writer.can_write_eof():
                writer.write_eof()
        else:
            writer.write(conn.send(h11.EndOfMessage()) or b"")
            await writer.drain()
    await stream.until_reset()


async def _download(
    stream: TunnelStream, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    # The body parts one read brought (an engine's SSE chunks, each its own chunk of the chunked
    # encoding) leave as one write, so one DATA frame, before the next read can wait: fewer frames
    # under load, no delay when one chunk comes alone.
    pending = bytearray()
    held: Headers | None = None  # the answer's head, until its first body bytes or HEAD_HOLD_S
    while True:
        event = conn.next_event()
        if isinstance(event, h11.Data):
            pending += event.data
            continue
        if held is not None and (pending or event is not h11.NEED_DATA):
            await stream.send_head(held)
            held = None
        if pending:
            await stream.write(bytes(pending))
            pending.clear()
        if event is h11.NEED_DATA:
            if held is None:
                conn.receive_data(await reader.read(READ_SIZE))
                continue
            try:
                async with asyncio.timeout(HEAD_HOLD_S):
                    conn.receive_data(await reader.read(READ_SIZE))
            except TimeoutError:
                await stream.send_head(held)
                held = None
        elif isinstance(event, h11.InformationalResponse) and event.status_code == 101:
            await _switched(stream, conn, event, reader, writer)
            return
        elif isinstance(event, h11.Response):
            held = [(":status", str(event.status_code)), *_decoded(event.headers)]
        elif isinstance(event, h11.EndOfMessage):
            await stream.end()
            return
        elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
            raise StreamReset("the target closed its connection mid-answer")


async def _switched(
    stream: TunnelStream,
    conn: h11.Connection,
    event: h11.InformationalResponse,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
) -> None:
    """Raw bytes both ways until either side closes."""
    upgraded = [v.decode("latin-1") for n, v in event.headers if n == b"upgrade"]
    answer = [(":status", "200"), (UPGRADED, upgraded[0] if upgraded else "1"), *_decoded(event.headers)]
    await stream.send_head(answer)
    leftover, _ = conn.trailing_data
    if leftover:
        await stream.write(bytes(leftover))
    await _both_ways(stream, conn, reader, writer)


async def _spliced(stream: TunnelStream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A raw target (an sshd): answered at once as switched, then its bytes both ways."""
    await stream.send_head([(":status", "200"), (UPGRADED, first(await stream.head(), UPGRADE) or "raw")])
    await _both_ways(stream, h11.Connection(h11.CLIENT), reader, writer)


async def _both_ways(
    stream: TunnelStream, conn: h11.Connection, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    upload = asyncio.create_task(_upload(stream, conn, writer, raw=True, body=True))
    try:
        while data := await reader.read(READ_SIZE):
            await stream.write(data)
        await stream.end()
        with contextlib.suppress(StreamReset):
            await upload  # the client's side until it ends too
    finally:
        upload.cancel()
        await asyncio.gather(upload, return_exceptions=True)


async def _answer(stream: TunnelStream, status: int, message: str) -> None:
    head = [(":status", str(status)), ("content-type", "text/plain; charset=utf-8"), (ERROR, "1")]
    await stream.send_head(head)
    await stream.write(message.encode())
    await stream.end()


def _decoded(headers: Sequence[tuple[bytes, bytes]]) -> Headers:
    return end_to_end([(name.decode("latin-1"), value.decode("latin-1")) for name, value in headers])
