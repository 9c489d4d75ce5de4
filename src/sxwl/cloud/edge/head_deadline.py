"""uvicorn's HTTP protocol with a deadline and a size cap for each request's head.

uvicorn times out idle keep-alive connections but not a request line and headers that trickle in
(its timer restarts on every byte) nor a connection that never sends a byte, and httptools accepts
headers of any size: either way one client could hold a connection, and memory, for ever. The body
has its own deadline in the application (``middleware.BodyLimit``)."""

from __future__ import annotations

import asyncio
import json

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from sxwl.cloud.errors import error_body

MAX_HEAD_BYTES = 64 * 1024


def _refusal(status: int, reason: bytes, message: str) -> bytes:
    body = json.dumps(error_body(status, message)).encode()
    return b"".join(
        [
            b"HTTP/1.1 %d %s\r\n" % (status, reason),
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
            body,
        ]
    )


class HeadDeadlineProtocol(HttpToolsProtocol):
    """The head of the first request must arrive within ``head_timeout_s`` of the connection, that of
    each later one within ``head_timeout_s`` of its first byte; else 408 and the connection closes
    (silently when not a byte of the request came). Heads over ``MAX_HEAD_BYTES`` get 431."""

    head_timeout_s = 10.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_bytes = 0
        self._head_too_large = False
        self._head_begun = False
        self._head_pending = True
        self._head_started = self.loop.time()
        self._head_timer: asyncio.TimerHandle | None = self.loop.call_later(
            self.head_timeout_s, self._head_timed_out
        )

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        # Most heads arrive whole in one read: a timer is armed only for one that does not.
        if self._head_pending and self._head_timer is None and not self.transport.is_closing():
            deadline = self._head_started + self.head_timeout_s
            self._head_timer = self.loop.call_at(deadline, self._head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0
        self._head_begun = True
        if not self._head_pending:  # the first request keeps the deadline counted from the connection
            self._head_pending = True
            self._head_started = self.loop.time()

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value))
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._head_pending = False
        self._head_begun = False
        self._cancel_head_timer()
        super().on_headers_complete()

    def _count_head(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > MAX_HEAD_BYTES:
            self._head_too_large = True
            # Stops the parser in the middle of this read; uvicorn then refuses the request
            # (send_400_response below) and closes the connection.
            raise ValueError("request head too large")

    def send_400_response(self, msg: str) -> None:
        if self._head_too_large:
            self._refuse(_refusal(431, b"Request Header Fields Too Large", "request head too large"))
        else:
            super().send_400_response(msg)

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self._head_pending or self.transport.is_closing():
            return
        if self._head_begun:
            self._refuse(_refusal(408, b"Request Timeout", "request head not received in time"))
        else:
            self.transport.close()

    def _refuse(self, response: bytes) -> None:
        self._cancel_head_timer()
        self._head_pending = False
        if not self.transport.is_closing():
            self.transport.write(response)
            self.transport.close()

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None


def protocol_with_head_timeout(timeout_s: float) -> type[HeadDeadlineProtocol]:
    """The protocol class for ``uvicorn.Config(http=...)``, which builds it from the config alone."""
    return type("HeadDeadline", (HeadDeadlineProtocol,), {"head_timeout_s": timeout_s})
