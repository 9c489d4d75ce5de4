"""A CPod's long-poll for assignments and commands, cheap enough to hold for thousands of idle CPods.

Three things keep an idle CPod from costing its replica anything but the connection:
- the hold is long (minutes) and kept open through load balancers by a newline every
  ``longpoll_keepalive_s``: JSON allows whitespace before a value, so the body stays one JSON
  document and a client that reads it whole, as any HTTP client does, needs no change. The
  newlines of all held polls are written by one task (cloud/edge/keepalives.py), so a held poll wakes
  only when it has something to say;
- a renewal of a CPod whose last read on this replica found nothing, and that nothing has woken
  since, does not read again until the backstop is due (``Notifier.quiet_since``);
- while this process hears other processes' writes (the listener on PostgreSQL, the file's watch on
  SQLite: docs/replicas.md), a waiting poll reads only when woken or when the backstop is due.
"""

from __future__ import annotations

import asyncio
import contextlib
import math

from fastapi import Response
from starlette.types import Receive, Scope, Send

from sxwl.cloud.api.responses import NO_STORE
from sxwl.cloud.context import CloudContext
from sxwl.cloud.services.jobs import upload_tokens
from sxwl.cloud.services.scheduling import dispatch
from sxwl.protocol import AssignmentsReply

# Assignments carry pods' upload tokens and jobs' environments: no cache keeps them.
JSON_HEADERS = [(b"content-type", b"application/json"), (b"cache-control", b"no-store")]


class AssignmentPoll:
    """One held request; ``answer`` on the event loop only, then ``close``."""

    def __init__(self, ctx: CloudContext, cpod_id: str, hold_s: float) -> None:
        self._ctx = ctx
        self._cpod_id = cpod_id
        self._loop = asyncio.get_running_loop()
        self._deadline = self._loop.time() + hold_s
        self._backstop_s = ctx.notifier.reread_s(ctx.settings.longpoll_backstop_s)
        # Registered before the quiet mark is consulted: a wake-up from then on reaches this poll.
        self._event = ctx.notifier.waiter(cpod_id)
        quiet = ctx.notifier.quiet_since(cpod_id)
        self._read_at = self._loop.time() if quiet is None else quiet + self._backstop_s
        self._gone = False

    def close(self) -> None:
        self._ctx.notifier.forget(self._cpod_id, self._event)

    def abandon(self) -> None:
        """The client went away: ``answer`` returns None at once, without reading."""
        self._gone = True
        self._event.set()

    async def answer(self, until: float = math.inf) -> AssignmentsReply | None:
        """What the CPod is to be told: as soon as it has work or a command, an empty reply when the
        hold ends; None when loop time ``until`` comes first or the client has gone."""
        notifier = self._ctx.notifier
        while True:
            if self._gone:
                return None
            now = self._loop.time()
            if self._event.is_set() or now >= self._read_at:
                self._event.clear()  # before reading, so a wake-up during the read is not lost
                reply = await asyncio.to_thread(dispatch.pending, self._ctx, self._cpod_id)
                if reply.assignments or reply.commands:
                    return _with_upload_tokens(self._ctx, reply)
                now = self._loop.time()
                if not self._event.is_set():
                    notifier.note_quiet(self._cpod_id, now)
                self._read_at = now + notifier.reread_s(self._ctx.settings.longpoll_backstop_s)
            if now >= self._deadline or notifier.stopping:
                return AssignmentsReply()
            if now >= until:
                return None
            # asyncio.timeout, not wait_for: no task per wait, and thousands of polls wait at once.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(min(self._deadline, until, self._read_at)):
                    await self._event.wait()


async def respond(ctx: CloudContext, cpod_id: str, wait_s: float) -> Response:
    """A plain JSON answer when it comes before the first keep-alive is due, else a streamed one."""
    poll = AssignmentPoll(ctx, cpod_id, min(wait_s, ctx.settings.longpoll_max_s))
    loop = asyncio.get_running_loop()
    try:
        first = await poll.answer(loop.time() + ctx.settings.longpoll_keepalive_s)
    except BaseException:
        poll.close()
        raise
    if first is not None:
        poll.close()
        return Response(first.model_dump_json(), media_type="application/json", headers=NO_STORE)
    return HeldAnswer(ctx, poll)


class HeldAnswer(Response):
    """The streamed answer: newlines from the replica's keep-alive task, then the JSON reply."""

    def __init__(self, ctx: CloudContext, poll: AssignmentPoll) -> None:
        self.status_code = 200
        self.background = None
        self.raw_headers = list(JSON_HEADERS)
        self._ctx = ctx
        self._poll = poll

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        poll = self._poll
        watcher: asyncio.Task[None] | None = None
        stream = None
        try:
            # The head is bytes on the wire too: the first newline can wait for the next interval.
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            stream = self._ctx.keepalives.add(send)
            watcher = asyncio.create_task(_until_disconnect(receive, poll))
            reply = await poll.answer()
        finally:
            if stream is not None:
                self._ctx.keepalives.close(stream)
            if watcher is not None:
                watcher.cancel()
            poll.close()
        body = b"" if reply is None else reply.model_dump_json().encode()
        await send({"type": "http.response.body", "body": body, "more_body": False})


async def _until_disconnect(receive: Receive, poll: AssignmentPoll) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    poll.abandon()


def _with_upload_tokens(ctx: CloudContext, reply: AssignmentsReply) -> AssignmentsReply:
    """Each attempt with its upload token, the same in every copy of the assignment."""
    reply.assignments = [
        a.model_copy(update={"upload_token": upload_tokens.token_for(ctx.box, a.job_id, a.attempt)})
        for a in reply.assignments
    ]
    return reply
