"""The keep-alive newlines of every streamed long-poll of this replica, written by one task.

Thousands of idle CPods each hold a streamed long-poll that must send a byte every
``longpoll_keepalive_s`` so that load balancers keep it open. When each poll woke for its own
keep-alive, every newline cost a timer, a task step and a pass through its wait; here one task wakes
at most once a tick (``TICK_S``) and writes every newline that is due, so the held polls themselves sleep
until they have something to say. All streams share one interval, so appending a stream when it is
next due keeps the queue in due order; a closed stream is dropped when it comes up.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass

from starlette.types import Send

log = logging.getLogger(__name__)

KEEPALIVE = b"\n"
# Newlines due within one tick go out together: one wake-up a tick, whatever the number of streams;
# a tick is at most a fifth of the interval, so no newline comes more than that late.
TICK_S = 1.0


@dataclass(eq=False)
class Stream:
    send: Send
    due: float
    closed: bool = False


class Keepalives:
    """Registered streams get a newline every ``interval_s``, give or take a tick, until closed."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._tick_s = min(TICK_S, interval_s / 5)
        self._queue: deque[Stream] = deque()
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()

    def add(self, send: Send) -> Stream:
        """``send``'s stream, which has just sent its head: its first newline is an interval away."""
        loop = asyncio.get_running_loop()
        stream = Stream(send, loop.time() + self.interval_s)
        self._queue.append(stream)
        if self._task is None or self._task.done() or self._task.get_loop() is not loop:
            self._wake = asyncio.Event()
            self._task = loop.create_task(self._run(), name="keepalives")
        elif len(self._queue) == 1:
            self._wake.set()  # it waits for a first stream; any other is due after those queued
        return stream

    async def stop(self) -> None:
        """Ends the task, at the app's shutdown (the held polls have been told to answer)."""
        task, self._task = self._task, None
        if task is not None and task.get_loop() is asyncio.get_running_loop():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    @staticmethod
    def close(stream: Stream) -> None:
        """No newline is written to ``stream`` after this returns (one being written completes first,
        ahead of whatever the caller sends next, since both wait for the same transport)."""
        stream.closed = True

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while self._queue and self._queue[0].closed:
                self._queue.popleft()
            if not self._queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            now = loop.time()
            if self._queue[0].due > now:
                await asyncio.sleep(max(self._queue[0].due - now, self._tick_s))
                continue
            horizon = now + self._tick_s
            while self._queue and self._queue[0].due <= horizon:
                stream = self._queue.popleft()
                if stream.closed:
                    continue
                try:
                    # Completes at once: a newline every few seconds never fills a socket's buffer.
                    await stream.send({"type": "http.response.body", "body": KEEPALIVE, "more_body": True})
                except Exception:  # the response ended under it; its own task reports that
                    log.debug("keep-alive not written", exc_info=True)
                    stream.closed = True
                    continue
                stream.due = now + self.interval_s
                self._queue.append(stream)
