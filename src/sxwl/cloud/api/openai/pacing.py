"""The pace of an engine's answer as the cloud relays it (docs/endpoints.md): comment lines while
the engine has not begun, so an idle timeout between the client and the cloud never cuts a stream,
and the timeouts before its first byte and between two of its chunks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

# Seconds until the engine's answer starts (its head), and between two of its chunks after that.
FIRST_BYTE_S = 120.0
BETWEEN_BYTES_S = 120.0
KEEPALIVE = b": waiting for the first token\n\n"


async def paced(
    chunks: AsyncIterator[bytes], keepalive_s: float | None, between_s: float = BETWEEN_BYTES_S
) -> AsyncIterator[bytes]:
    """``chunks`` with the between-bytes timeout (``between_s``); until the first, KEEPALIVE every
    ``keepalive_s`` (None: none), its wait counting toward FIRST_BYTE_S. After the first, each chunk
    is awaited in place under one lazy watchdog (_Watchdog): a task or a timeout scope per chunk
    cost more than the relay's own work at many streams."""
    it = aiter(chunks)
    step = asyncio.ensure_future(anext(it))
    waited = 0.0
    try:
        while True:
            limit = keepalive_s if keepalive_s is not None else between_s
            done, _ = await asyncio.wait({step}, timeout=limit)
            if done:
                break
            if keepalive_s is None or waited >= FIRST_BYTE_S:
                raise TimeoutError(f"nothing for {limit:.0f} s")
            waited += limit
            yield KEEPALIVE
        try:
            chunk = step.result()
        except StopAsyncIteration:
            return
    finally:
        if not step.done():
            step.cancel()
    yield chunk
    with _Watchdog(between_s) as watchdog:
        while True:
            watchdog.waiting()
            try:
                chunk = await anext(it)
            except StopAsyncIteration:
                return
            except asyncio.CancelledError:
                watchdog.raise_if_expired()
                raise
            watchdog.given()
            yield chunk


class _Watchdog:
    """Cancels the task that waits (between ``waiting()`` and ``given()``) longer than ``limit_s``
    for a chunk, as ``asyncio.timeout`` would, but with one timer per ``limit_s`` rather than one
    per chunk: its timer, when it fires, looks at when the wait began and sets itself again. Time
    spent outside a wait (the client taking a chunk) never counts."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self.loop = asyncio.get_running_loop()
        self.task = asyncio.current_task()
        self.since: float | None = None  # when the current wait began; None: not waiting
        self.expired = False
        self.timer: asyncio.TimerHandle | None = None

    def __enter__(self) -> _Watchdog:
        self.timer = self.loop.call_at(self.loop.time() + self.limit_s, self._check)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.timer is not None:
            self.timer.cancel()

    def waiting(self) -> None:
        self.since = self.loop.time()

    def given(self) -> None:
        self.since = None

    def raise_if_expired(self) -> None:
        """Where the cancellation was the watchdog's own (and no one else's): a TimeoutError."""
        if self.expired and self.task is not None and self.task.uncancel() == 0:
            raise TimeoutError(f"nothing for {self.limit_s:.0f} s") from None

    def _check(self) -> None:
        now = self.loop.time()
        if self.since is not None and now - self.since >= self.limit_s and self.task is not None:
            self.expired = True
            self.task.cancel()
            return
        start = self.since if self.since is not None else now
        self.timer = self.loop.call_at(start + self.limit_s, self._check)
