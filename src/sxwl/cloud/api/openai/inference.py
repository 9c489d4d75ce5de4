"""Calling an endpoint, OpenAI-compatible (docs/endpoints.md): ``POST /v1/chat/completions`` and
``/v1/completions`` with ``model`` naming one of the caller's endpoints, proxied through the CPod's
tunnel to a replica's engine. The body is checked (and bounded, by the edge's default rule) before it
travels; a stream is passed on chunk by chunk, with ``:`` comment lines while the engine has not
produced its first bytes, so an idle timeout between the client and the cloud never cuts it; the
engine's token counts are recorded per endpoint, credential and day."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from functools import partial
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import StreamingResponse

from sxwl.cloud.api.deps import Ctx
from sxwl.cloud.api.openai.callers import Caller, InferenceCaller
from sxwl.cloud.api.openai.pacing import FIRST_BYTE_S, KEEPALIVE, paced
from sxwl.cloud.api.responses import SIGNED_IN, WITH_BODY, errors
from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.errors import AppError, error_body, invalid
from sxwl.cloud.kit import metrics
from sxwl.cloud.services.endpoints import key_limits, routing
from sxwl.cloud.services.endpoints.routes import Route, Serving
from sxwl.cloud.tunnel import service
from sxwl.cloud.tunnel.service import NoTunnel, TunnelError, TunnelRequest, TunnelResponse

router = APIRouter(tags=["inference"], responses=SIGNED_IN)  # mounted at /v1
MAX_ANSWER_BYTES = 32 * 1024 * 1024  # a non-streamed answer the cloud reads whole
ERRORS = WITH_BODY | errors(404, 429, 502, 503, 504)
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
DONE = b"data: [DONE]\n\n"
DONE_LINE = DONE.strip()
MAX_LINE = 1024 * 1024  # longer unfinished lines are not kept: no usage chunk is that long


def _checked(raw: bytes, prompt_field: str) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise invalid("body", f"not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise invalid("body", "must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model.strip() or len(model) > 200:
        raise invalid("model", "required: the name of one of your endpoints")
    prompt = body.get(prompt_field)
    if prompt_field == "messages":
        if not isinstance(prompt, list) or not prompt or not all(isinstance(m, dict) for m in prompt):
            raise invalid("messages", "required: a non-empty list of message objects")
        for index, message in enumerate(prompt):
            if not isinstance(message.get("role"), str):
                raise invalid(f"messages.{index}.role", "required: a string")
    elif not isinstance(prompt, str | list) or not prompt:
        raise invalid("prompt", "required: a string or a list of strings or tokens")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise invalid("stream", "must be true or false")
    for field in ("max_tokens", "max_completion_tokens", "n"):
        value = body.get(field)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise invalid(field, "must be a positive integer")
    return body


def _usage_of(answer: dict[str, Any]) -> tuple[int, int] | None:
    usage = answer.get("usage")
    if not isinstance(usage, dict):
        return None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    if isinstance(prompt, int) and isinstance(completion, int):
        return max(prompt, 0), max(completion, 0)
    return None


class _UsageScanner:
    """Reads the SSE lines going by for the chunk that carries ``usage`` (the last, from either
    engine), without holding more than one unfinished line. Lines are split only where a chunk's
    complete lines mention ``usage`` or ``[DONE]``: a stream's other chunks cost two byte searches,
    not a loop over their lines."""

    def __init__(self) -> None:
        self.pending = b""
        self.found: tuple[int, int] | None = None
        self.done = False  # the engine sent ``data: [DONE]``
        self.seen = False  # any of the engine's bytes

    def feed(self, chunk: bytes) -> None:
        self.seen = True
        data = self.pending + chunk if self.pending else chunk
        end = data.rfind(b"\n") + 1
        complete, self.pending = data[:end], data[end:]
        if len(self.pending) > MAX_LINE:
            self.pending = b""  # a line this long is no usage chunk
        if b"[DONE]" not in complete and b'"usage"' not in complete:
            return
        for line in complete.split(b"\n"):
            if line.strip() == DONE_LINE:
                self.done = True
            elif line.startswith(b"data:") and b'"usage"' in line:
                try:
                    said = json.loads(line[5:].strip())
                except (UnicodeDecodeError, json.JSONDecodeError):
                    continue
                if isinstance(said, dict) and (usage := _usage_of(said)) is not None:
                    self.found = usage


async def _record(ctx: CloudContext, route: Route, caller: Caller, usage: tuple[int, int] | None) -> None:
    prompt, completion = usage or (0, 0)
    metrics.ENDPOINT_TOKENS.labels(route.endpoint_id, "prompt").inc(prompt)
    metrics.ENDPOINT_TOKENS.labels(route.endpoint_id, "completion").inc(completion)

    def write() -> None:
        with ctx.db.session() as session:
            routing.record_usage(session, route.endpoint_id, caller.key_id, prompt, completion)
            if caller.counts_tokens:
                key_limits.record_tokens(session, caller.key_id, prompt + completion, utcnow())

    await run_in_threadpool(write)


def _serving(ctx: CloudContext, owner_id: str, model: str) -> Serving:
    changes = ctx.calls.changes
    with ctx.db.session() as session:
        serving = routing.serving(session, owner_id, model)
    ctx.calls.remember_serving(owner_id, model, serving, changes)
    return serving


class StreamCut(Exception):
    """An engine's stream ended before its end (its replica's CPod lost, a timeout between bytes)."""


_BACKGROUND: set[asyncio.Task[None]] = set()


def _later(work: Coroutine[None, None, None]) -> None:
    """``work`` in a task of its own: a generator closed by its client cannot await any more."""
    task = asyncio.get_running_loop().create_task(work)
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)


def _unreachable(route: Route, why: str) -> AppError:
    return AppError(
        503,
        f"endpoint {route.name}: its replica cannot be reached now ({why}); retry in a few seconds",
        code="endpoint_unreachable",
        headers={"Retry-After": str(routing.RETRY_AFTER_S)},
    )


async def _proxy(
    request: Request, caller: Caller, ctx: CloudContext, path: str, prompt_field: str
) -> Response:
    arrived = time.perf_counter()
    body = _checked(await request.body(), prompt_field)

    owner, model = caller.user.id, body["model"]
    serving = ctx.calls.serving(owner, model)
    if serving is None:
        serving = await run_in_threadpool(_serving, ctx, owner, model)
    route = routing.pick(serving, ctx.engine_loads)
    body["model"] = route.name  # the engine serves the endpoint under its name
    streaming = body.get("stream") is True
    if streaming and not isinstance(body.get("stream_options"), dict):
        body["stream_options"] = {"include_usage": True}  # the last chunk then carries the counts
    payload = json.dumps(body).encode()
    headers = [
        ("content-type", "application/json"),
        ("content-length", str(len(payload))),
        ("accept", "text/event-stream" if streaming else "application/json"),
    ]
    opening = asyncio.ensure_future(
        service.open_stream(
            ctx.tunnels,
            route.cpod_id,
            route.target,
            TunnelRequest("POST", path, headers, payload),
            FIRST_BYTE_S,
        )
    )
    try:
        if streaming:
            # An engine slow to send even its head (a long prompt): the SSE head and comment lines
            # go out meanwhile, so an idle timeout between the client and the cloud never cuts it.
            every = ctx.settings.stream_keepalive_s
            await asyncio.wait({opening}, timeout=every)
            if not opening.done():
                follow = partial(_relay, ctx, route, caller, arrived=arrived)
                relay = _late(opening, route, path, every, follow)
                return StreamingResponse(relay, media_type="text/event-stream", headers=SSE_HEADERS)
        reply = await _opened(opening, route)
    except asyncio.CancelledError:
        _abandon(opening)
        raise
    kind = next((v for n, v in reply.headers if n == "content-type"), "application/json")
    if streaming and reply.status == 200:
        stream = _relay(ctx, route, caller, reply, arrived=arrived)
        return StreamingResponse(stream, media_type="text/event-stream", headers=SSE_HEADERS)
    metrics.ENDPOINT_FIRST_TOKEN.labels(route.endpoint_id).observe(time.perf_counter() - arrived)
    data = await _whole(route, reply)
    if reply.status == 200:
        try:
            answer = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError):
            answer = {}
        await _record(ctx, route, caller, _usage_of(answer) if isinstance(answer, dict) else None)
    return Response(data, reply.status, media_type=kind)


async def _opened(opening: asyncio.Future[TunnelResponse], route: Route) -> TunnelResponse:
    """The engine's answer, once its head came; the tunnel's failures as the errors to answer."""
    try:
        reply = await opening
    except NoTunnel:
        raise _unreachable(route, "its CPod's tunnel is down") from None
    except TunnelError as exc:
        raise _unreachable(route, str(exc)) from None
    except TimeoutError:
        raise AppError(504, f"endpoint {route.name}: no answer within {FIRST_BYTE_S:.0f} s") from None
    if reply.from_agent:
        reply.close()
        raise _unreachable(route, "its engine does not answer")
    return reply


async def _whole(route: Route, reply: TunnelResponse) -> bytes:
    """A non-streamed answer (or an engine's refusal), read whole within MAX_ANSWER_BYTES."""
    metrics.ENDPOINT_REQUESTS.labels(route.endpoint_id, "ok" if reply.status == 200 else "error").inc()
    async with reply:
        parts: list[bytes] = []
        size = 0
        try:
            async for chunk in paced(reply.chunks(), None):
                parts.append(chunk)
                size += len(chunk)
                if size > MAX_ANSWER_BYTES:
                    raise AppError(502, f"endpoint {route.name}: the engine's answer is too large")
        except (TunnelError, TimeoutError) as exc:
            raise AppError(502, f"endpoint {route.name}: the answer was cut ({exc or 'timed out'})") from None
    return b"".join(parts)


def _error_event(status: int, said: bytes, path: str) -> bytes:
    """A refusal that came after the stream's 200 head, as the SSE event OpenAI's streams carry
    errors in (the ``openai`` client raises it): the engine's own error object where it gave one."""
    try:
        parsed = json.loads(said)
    except (UnicodeDecodeError, json.JSONDecodeError):
        parsed = None
    error = error_body(status, f"the engine answered {status}", details=None, path=path)["error"]
    if isinstance(parsed, dict):
        inner = parsed.get("error")
        given: dict[str, Any] = inner if isinstance(inner, dict) else parsed
        error |= {k: given[k] for k in ("message", "type", "param", "code") if given.get(k) is not None}
    return b"data: " + json.dumps({"error": error}).encode() + b"\n\n"


async def _late(
    opening: asyncio.Future[TunnelResponse],
    route: Route,
    path: str,
    every: float,
    relay: Callable[[TunnelResponse], AsyncIterator[bytes]],
) -> AsyncIterator[bytes]:
    """A stream whose 200 head went out before the engine's: a comment line at once and every
    ``every`` seconds until the engine's head (within FIRST_BYTE_S: ``open_stream``'s own timeout), then
    its stream, or its refusal as an error event."""
    taken = False
    try:
        while not opening.done():
            yield KEEPALIVE
            await asyncio.wait({opening}, timeout=every)
        try:
            reply = await _opened(opening, route)
        except AppError as exc:
            metrics.ENDPOINT_REQUESTS.labels(route.endpoint_id, "error").inc()
            said = json.dumps({"error": {"message": exc.message, "code": exc.code}}).encode()
            yield _error_event(exc.status, said, path)
            return
        taken = True
        if reply.status != 200:
            yield _error_event(reply.status, await _whole(route, reply), path)
            return
        async for chunk in relay(reply):
            yield chunk
    finally:
        if not taken:
            _abandon(opening)


def _abandon(opening: asyncio.Future[TunnelResponse]) -> None:
    """The client left before the engine's answer was taken: its opening stopped, or its stream reset."""
    if not opening.done():
        opening.cancel()
    elif not opening.cancelled() and opening.exception() is None:
        opening.result().close()


def _relay(
    ctx: CloudContext, route: Route, caller: Caller, reply: TunnelResponse, *, arrived: float
) -> AsyncIterator[bytes]:
    """The engine's stream, chunk by chunk: its usage recorded, its outcome counted, ``[DONE]``
    added where the engine leaves it out."""

    async def relay() -> AsyncIterator[bytes]:
        scanner = _UsageScanner()
        recorded = False
        open_streams = metrics.ENDPOINT_STREAMS.labels(route.endpoint_id)
        open_streams.inc()
        ended: list[str] = []  # its outcome, once counted

        def end(outcome: str) -> None:
            # Counted before the stream's last bytes go: a client that stops at [DONE] and closes
            # ends this generator at its next yield, and sees the counts already there.
            if not ended:
                ended.append(outcome)
                open_streams.dec()
                metrics.ENDPOINT_REQUESTS.labels(route.endpoint_id, outcome).inc()

        try:
            async with reply:
                try:
                    async for chunk in paced(reply.chunks(), ctx.settings.stream_keepalive_s):
                        if chunk is not KEEPALIVE:
                            if not scanner.seen:
                                metrics.ENDPOINT_FIRST_TOKEN.labels(route.endpoint_id).observe(
                                    time.perf_counter() - arrived
                                )
                            scanner.feed(chunk)
                        if scanner.found is not None and not recorded:
                            recorded = True
                            await _record(ctx, route, caller, scanner.found)
                        if scanner.done:
                            end("ok")
                        yield chunk
                except (TunnelError, TimeoutError) as exc:
                    # Raised past the response's start: the server closes the connection, which is
                    # how HTTP says a body is cut, so the client sees an error, not a short answer.
                    raise StreamCut(
                        f"endpoint {route.name}: the stream was cut ({exc or 'timed out'})"
                    ) from exc
            end("ok")
            if not scanner.done:
                yield DONE  # `transformers serve` ends without it; OpenAI's streams end with it
        finally:
            end("cut")
            if not recorded:  # a request without counts (cut, or an engine that gave none)
                _later(_record(ctx, route, caller, None))

    return relay()


@router.post("/chat/completions", responses=ERRORS)
async def chat_completions(request: Request, caller: InferenceCaller, ctx: Ctx) -> Response:
    """OpenAI's chat completions, answered by the endpoint ``model`` names."""
    return await _proxy(request, caller, ctx, "/v1/chat/completions", "messages")


@router.post("/completions", responses=ERRORS)
async def completions(request: Request, caller: InferenceCaller, ctx: Ctx) -> Response:
    """OpenAI's legacy text completions, answered by the endpoint ``model`` names."""
    return await _proxy(request, caller, ctx, "/v1/completions", "prompt")
