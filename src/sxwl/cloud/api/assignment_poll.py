"""A CPod's long-poll for assignments and commands, cheap enough to hold for thousands of idle CPods.

Three things keep an idle CPod from costing its replica anything but the connection:
- the hold is long (minutes) and kept open through load balancers by a newline every
  ``longpoll_keepalive_s``: JSON allows whitespace before a value, so the body stays one JSON
  document and a client that reads it whole, as any HTTP client does, needs no change;
- a renewal of a CPod whose last read on this replica found nothing, and that nothing has woken
  since, does not read again until the backstop is due (``Notifier.quiet_since``);
- while the listener hears other replicas (docs/replicas.md), a waiting poll reads only when woken
  or when the backstop is due.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fastapi import Response
from fastapi.responses import StreamingResponse

from sxwl.cloud.context import CloudContext
from sxwl.cloud.services import dispatch, upload_tokens
from sxwl.protocol import AssignmentsReply

KEEPALIVE = b"\n"


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

    def close(self) -> None:
        self._ctx.notifier.forget(self._cpod_id, self._event)

    async def answer(self, until: float) -> AssignmentsReply | None:
        """What the CPod is to be told: as soon as it has work or a command, an empty reply when the
        hold ends; None when loop time ``until`` comes first (time for a keep-alive)."""
        notifier = self._ctx.notifier
        while True:
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
        return Response(first.model_dump_json(), media_type="application/json")
    return StreamingResponse(_stream(poll, ctx.settings.longpoll_keepalive_s), media_type="application/json")


async def _stream(poll: AssignmentPoll, keepalive_s: float) -> AsyncIterator[bytes]:
    # Starlette cancels this generator when the client goes away, which releases the waiter.
    try:
        loop = asyncio.get_running_loop()
        while True:
            yield KEEPALIVE
            reply = await poll.answer(loop.time() + keepalive_s)
            if reply is not None:
                yield reply.model_dump_json().encode()
                return
    finally:
        poll.close()


def _with_upload_tokens(ctx: CloudContext, reply: AssignmentsReply) -> AssignmentsReply:
    """Each attempt with its upload token, the same in every copy of the assignment."""
    reply.assignments = [
        a.model_copy(update={"upload_token": upload_tokens.token_for(ctx.box, a.job_id, a.attempt)})
        for a in reply.assignments
    ]
    return reply
