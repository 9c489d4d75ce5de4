"""One HTTP/2 connection over a message transport (a WebSocket), driven by ``h2``: streams with
their own flow-control windows, resets, GOAWAY and PING (docs/tunnel.md).

Received data is acknowledged (its window given back) only when the stream's reader takes it, so a
stream buffers at most its window and a slow reader stalls only its own stream; the connection's
window is kept at its maximum, so no stream can hold the others back by not reading."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Protocol

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
from h2.errors import ErrorCodes

from sxwl.tunnel.headers import Headers

log = logging.getLogger("sxwl.tunnel")

STREAM_WINDOW = 256 * 1024  # what one stream may have in flight toward its reader, in bytes
MAX_STREAMS = 256  # concurrent streams a side accepts on one connection
MAX_WINDOW = 2**31 - 1
MAX_FRAME = 2**24 - 1
MESSAGE_MAX = 1024 * 1024  # the largest WebSocket message a side sends (HTTP/2 bytes cut anywhere)
PING_S = 20.0  # keep-alive: below the 60 s idle timeout of common load balancers
PING_TIMEOUT_S = 20.0
CLOSE_S = 1.0


class Transport(Protocol):
    """Ordered, reliable bytes in messages: a WebSocket's binary messages."""

    async def send(self, data: bytes) -> None: ...

    async def receive(self) -> bytes | None:
        """The next message, or None when the transport closed."""

    async def close(self) -> None: ...


class StreamReset(Exception):
    """The stream was reset by either end, or its connection closed under it."""

    def __init__(self, message: str, code: int = ErrorCodes.CANCEL) -> None:
        super().__init__(message)
        self.code = code


class TunnelStream:
    """One stream. ``head()`` is what the other end opened or answered with; ``read()`` returns b""
    at the end and raises StreamReset after a reset."""

    def __init__(self, session: Session, stream_id: int) -> None:
        self.session, self.id = session, stream_id
        self._head: asyncio.Future[Headers] = asyncio.get_running_loop().create_future()
        self._chunks: deque[tuple[bytes, int]] = deque()
        self._changed = asyncio.Event()  # data, the end, a reset, or a wider window
        self.remote_ended = False
        self.local_ended = False
        self.bodiless = False  # the other end's HEADERS ended the stream: no body follows
        self.reset_reason: StreamReset | None = None

    async def head(self) -> Headers:
        return await self._head

    def whole_body(self) -> bytes | None:
        """The whole body, taken, where the other end has already sent all of it (as one that
        opened with its body does); else None, and nothing is taken."""
        if not self.remote_ended or self.reset_reason is not None:
            return None
        return self._take()

    async def read(self) -> bytes:
        while not self._chunks:
            if self.remote_ended:
                return b""  # everything came: a reset after it (the answer ended first) takes nothing
            if self.reset_reason is not None:
                raise self.reset_reason
            self._changed.clear()
            await self._changed.wait()
        return self._take()

    def _take(self) -> bytes:
        """Everything received and not yet read, its window given back."""
        if len(self._chunks) == 1:
            data, flow = self._chunks.popleft()
        else:  # what came while the reader was busy, in one piece: one step of its loop, not one each
            data, flow = b"".join(c for c, _ in self._chunks), sum(f for _, f in self._chunks)
            self._chunks.clear()
        self.session.consumed(self.id, flow)
        return data

    async def until_reset(self) -> None:
        """Raises the stream's reset when it comes; never returns."""
        while self.reset_reason is None:
            self._changed.clear()
            await self._changed.wait()
        raise self.reset_reason

    async def send_head(self, headers: Headers, end: bool = False) -> None:
        self._check()
        self.session.call(lambda c: c.send_headers(self.id, headers, end_stream=end))
        self.local_ended = end

    async def write(self, data: bytes) -> None:
        """Sends ``data`` as the peer's window for this stream allows: waits while it is shut."""
        view = memoryview(data)
        while view:
            self._check()
            conn = self.session.conn
            room = min(conn.local_flow_control_window(self.id), conn.max_outbound_frame_size, len(view))
            if room <= 0:
                self._changed.clear()
                await self._changed.wait()
                continue
            piece, view = bytes(view[:room]), view[room:]
            self.session.call(lambda c, piece=piece: c.send_data(self.id, piece))  # type: ignore[misc]
            await self.session.drained()

    async def end(self) -> None:
        if not self.local_ended:
            self._check()
            self.session.call(lambda c: c.end_stream(self.id))
            self.local_ended = True

    def reset(self, code: int = ErrorCodes.CANCEL) -> None:
        """Ends the stream both ways at once (RST_STREAM); nothing if it already ended."""
        if self.reset_reason is None and not (self.local_ended and self.remote_ended):
            self.fail(StreamReset("reset here", code))
            with contextlib.suppress(h2.exceptions.H2Error):
                self.session.call(lambda c: c.reset_stream(self.id, error_code=code))
        self.session.forget(self.id)

    @property
    def done(self) -> bool:
        return self.reset_reason is not None or (self.local_ended and self.remote_ended)

    def _check(self) -> None:
        if self.reset_reason is not None:
            raise self.reset_reason

    # What the session tells the stream.
    def got_head(self, headers: Headers, ended: bool) -> None:
        if not self._head.done():
            self._head.set_result(headers)
            self.bodiless = ended
        self.remote_ended = self.remote_ended or ended
        self._changed.set()

    def got_data(self, data: bytes, flow: int) -> None:
        self._chunks.append((data, flow))
        self._changed.set()

    def got_end(self) -> None:
        self.remote_ended = True
        self._changed.set()

    def wake(self) -> None:
        self._changed.set()

    def fail(self, reason: StreamReset) -> None:
        if self.reset_reason is None:
            self.reset_reason = reason
        if not self._head.done():
            self._head.set_exception(reason)
            self._head.exception()  # retrieved: a stream nobody awaits must not warn
        self._changed.set()


class Session:
    """``client_side``: this end opens the streams (the cloud); the other end (the agent) answers
    each with ``on_stream``, run as a task of its own."""

    def __init__(
        self,
        transport: Transport,
        *,
        client_side: bool,
        on_stream: Callable[[TunnelStream], Awaitable[None]] | None = None,
        window: int = STREAM_WINDOW,
        max_streams: int = MAX_STREAMS,
        ping_s: float = PING_S,
        ping_timeout_s: float = PING_TIMEOUT_S,
    ) -> None:
        self.transport, self.on_stream = transport, on_stream
        config = h2.config.H2Configuration(client_side=client_side, header_encoding="utf-8")
        self.conn = h2.connection.H2Connection(config)
        self.conn.local_settings = h2.settings.Settings(
            client=client_side,
            initial_values={
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window,
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: max_streams,
                h2.settings.SettingCodes.ENABLE_PUSH: 0,
                # Frames as large as a stream's window (the default 16 KiB costs a message each).
                h2.settings.SettingCodes.MAX_FRAME_SIZE: min(window, MAX_FRAME),
            },
        )
        # h2 reads this limit from the settings it was made with, and takes no change it never sent.
        self.conn.max_inbound_frame_size = self.conn.local_settings.max_frame_size
        self.streams: dict[int, TunnelStream] = {}
        self.ping_s, self.ping_timeout_s = ping_s, ping_timeout_s
        self.closed = asyncio.Event()
        self.going_away = False  # a GOAWAY came, or this end is closing: no new streams
        self._dirty = asyncio.Event()  # frames queued for the writer
        self._outbox = bytearray()  # frames taken from h2 early, sent before what h2 still holds
        self._idle = asyncio.Event()  # the writer has sent everything queued
        self._pings: dict[bytes, asyncio.Future[None]] = {}
        self._ping_ids = itertools.count(1)
        self._handlers: set[asyncio.Task[None]] = set()
        # The preface first, before any stream this end opens (it may open one before run()).
        self.conn.initiate_connection()
        # The connection's own window at its maximum: only the streams' windows bound what is buffered.
        self.conn.increment_flow_control_window(MAX_WINDOW - self.conn.inbound_flow_control_window)
        self._queued()

    # Called by streams and owners.
    def call(self, change: Callable[[h2.connection.H2Connection], object]) -> None:
        """Applies one change to the connection and schedules its frames; a closed session refuses."""
        if self.closed.is_set():
            raise StreamReset("the tunnel connection closed", ErrorCodes.CONNECT_ERROR)
        try:
            change(self.conn)
        except h2.exceptions.StreamClosedError:
            raise StreamReset("the stream was closed", ErrorCodes.STREAM_CLOSED) from None
        except h2.exceptions.ProtocolError as exc:
            raise StreamReset(f"tunnel protocol: {exc}", ErrorCodes.PROTOCOL_ERROR) from None
        self._queued()

    async def drained(self) -> None:
        """Waits until the writer has handed what is queued to the transport, so a fast writer
        cannot pile frames up faster than the WebSocket takes them."""
        await self._idle.wait()

    def _queued(self) -> None:
        self._idle.clear()
        self._dirty.set()

    def consumed(self, stream_id: int, flow: int) -> None:
        if flow and not self.closed.is_set():
            with contextlib.suppress(h2.exceptions.H2Error):
                self.conn.acknowledge_received_data(flow, stream_id)
                self._queued_if_any()

    def _queued_if_any(self) -> None:
        """Wakes the writer only where h2 made frames: h2 gives windows back in large steps, so most
        reads (and most received messages) make none, and a wake-up each would cost a task switch."""
        if frames := self.conn.data_to_send():
            self._outbox += frames
            self._queued()

    def forget(self, stream_id: int) -> None:
        stream = self.streams.get(stream_id)
        if stream is not None and stream.done:
            del self.streams[stream_id]

    @property
    def capacity(self) -> int:
        """How many more streams this end may open now."""
        if self.closed.is_set() or self.going_away:
            return 0
        return self.conn.remote_settings.max_concurrent_streams - self.conn.open_outbound_streams

    async def open(self, headers: Headers, end: bool = False, body: bytes | None = None) -> TunnelStream:
        """``body``: the request's whole body. Where it fits the stream's first window and one
        frame, it leaves with the headers, in the same message, and the stream is ended
        (``local_ended``): the other end has the whole request at once. Otherwise only the headers
        leave, and the caller writes the body."""
        if self.capacity <= 0:
            raise StreamReset("the tunnel connection takes no more streams", ErrorCodes.REFUSED_STREAM)
        stream_id = self.conn.get_next_available_stream_id()
        stream = TunnelStream(self, stream_id)
        self.streams[stream_id] = stream

        def opening(c: h2.connection.H2Connection) -> None:
            if not body:
                c.send_headers(stream_id, headers, end_stream=end or body is not None)
                stream.local_ended = end or body is not None
                return
            c.send_headers(stream_id, headers)
            if len(body) <= min(c.local_flow_control_window(stream_id), c.max_outbound_frame_size):
                c.send_data(stream_id, body, end_stream=True)
                stream.local_ended = True

        self.call(opening)
        return stream

    async def close(self, code: int = ErrorCodes.NO_ERROR) -> None:
        """Streams still open fail at once; then GOAWAY, if the transport takes it within
        ``CLOSE_S`` (a stalled one may not), and the transport closes."""
        data = b""
        if not self.closed.is_set():
            with contextlib.suppress(h2.exceptions.H2Error):
                self.conn.close_connection(error_code=code)
                data = bytes(self._outbox) + self.conn.data_to_send()
        self._finish()
        with contextlib.suppress(Exception):
            if data:
                await asyncio.wait_for(self.transport.send(data), CLOSE_S)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.transport.close(), CLOSE_S)

    async def ping(self) -> None:
        """Round trip of a PING; raises TimeoutError past ``ping_timeout_s``."""
        opaque = next(self._ping_ids).to_bytes(8, "big")
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pings[opaque] = waiter
        try:
            self.call(lambda c: c.ping(opaque))
            await asyncio.wait_for(waiter, self.ping_timeout_s)
        finally:
            self._pings.pop(opaque, None)

    async def run(self) -> None:
        """Until the transport closes, the peer breaks the protocol, or a PING goes unanswered."""
        tasks = [
            asyncio.create_task(self._reader(), name="tunnel-reader"),
            asyncio.create_task(self._writer(), name="tunnel-writer"),
            asyncio.create_task(self._keepalive(), name="tunnel-keepalive"),
        ]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.close()
            for handler in list(self._handlers):
                handler.cancel()
            await asyncio.gather(*self._handlers, return_exceptions=True)

    def _finish(self) -> None:
        self.closed.set()
        self.going_away = True
        self._idle.set()
        gone = StreamReset("the tunnel connection closed", ErrorCodes.CONNECT_ERROR)
        for stream in list(self.streams.values()):
            stream.fail(gone)
        self.streams.clear()
        for waiter in self._pings.values():
            if not waiter.done():
                waiter.cancel()

    async def _writer(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            data = bytes(self._outbox) + self.conn.data_to_send()
            self._outbox.clear()
            for start in range(0, len(data), MESSAGE_MAX):
                await self.transport.send(data[start : start + MESSAGE_MAX])
            if not self._dirty.is_set():
                self._idle.set()

    async def _keepalive(self) -> None:
        while True:
            await asyncio.sleep(self.ping_s)
            try:
                await self.ping()
            except TimeoutError:
                log.warning("the tunnel's peer did not answer a PING within %.0f s", self.ping_timeout_s)
                return

    async def _reader(self) -> None:
        while (data := await self.transport.receive()) is not None:
            try:
                events = self.conn.receive_data(data)
            except h2.exceptions.ProtocolError as exc:
                log.warning("tunnel protocol error: %s", exc)
                self._queued()  # the GOAWAY h2 queued
                return
            for event in events:
                self._handle(event)
            self._queued_if_any()  # h2's own answers (SETTINGS and PING acknowledgements)

    def _handle(self, event: h2.events.Event) -> None:
        if isinstance(event, h2.events.RequestReceived):
            self._accept(event.stream_id, _headers(event.headers), event.stream_ended is not None)
        elif isinstance(event, h2.events.ResponseReceived | h2.events.InformationalResponseReceived):
            if (stream := self.streams.get(event.stream_id)) is not None:
                ended = isinstance(event, h2.events.ResponseReceived) and event.stream_ended is not None
                stream.got_head(_headers(event.headers), ended)
        elif isinstance(event, h2.events.DataReceived):
            stream = self.streams.get(event.stream_id)
            if stream is None or stream.reset_reason is not None:
                self.consumed(event.stream_id, event.flow_controlled_length)
            else:
                stream.got_data(event.data, event.flow_controlled_length)
        elif isinstance(event, h2.events.StreamEnded):
            if (stream := self.streams.get(event.stream_id)) is not None:
                stream.got_end()
                self.forget(event.stream_id)
        elif isinstance(event, h2.events.StreamReset):
            if (stream := self.streams.pop(event.stream_id, None)) is not None:
                stream.fail(StreamReset("reset by the other end", event.error_code))
        elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
            stream_id = getattr(event, "stream_id", 0)
            for stream in [self.streams[stream_id]] if stream_id in self.streams else self.streams.values():
                stream.wake()
        elif isinstance(event, h2.events.PingAckReceived):
            waiter = self._pings.get(event.ping_data)
            if waiter is not None and not waiter.done():
                waiter.set_result(None)
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.going_away = True

    def _accept(self, stream_id: int, headers: Headers, ended: bool) -> None:
        stream = TunnelStream(self, stream_id)
        self.streams[stream_id] = stream
        stream.got_head(headers, ended)
        if self.on_stream is None or self.going_away:
            stream.reset(ErrorCodes.REFUSED_STREAM)
            return
        task = asyncio.create_task(self._serve(stream), name=f"tunnel-stream-{stream_id}")
        self._handlers.add(task)
        task.add_done_callback(self._handlers.discard)

    async def _serve(self, stream: TunnelStream) -> None:
        assert self.on_stream is not None
        try:
            await self.on_stream(stream)
        except StreamReset:
            pass
        except Exception:
            log.exception("tunnel stream %d failed", stream.id)
        finally:
            if not stream.done:
                stream.reset(ErrorCodes.INTERNAL_ERROR)
            self.forget(stream.id)


def _headers(raw: object) -> Headers:
    pairs = raw if isinstance(raw, list) else []
    return [(str(name), str(value)) for name, value in pairs]
