"""ASGI middleware: request ids, access logs, metrics, and the request body limit."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sxwl.cloud.errors import error_body
from sxwl.cloud.kit.logs import request_id_var
from sxwl.protocol import paths

log = logging.getLogger("sxwl.http")

# Agents' and their pods' routes: heartbeats, long-polls, status, logs, artifacts, inputs. A CPod
# makes about one a second; a fleet, a thousand.
AGENT_PREFIX = paths.API + paths.AGENT + "/"
# A long-poll lasts as long as it waits: its duration says nothing about the cloud's speed.
LONG_POLLS = frozenset({paths.url(paths.ASSIGNMENTS)})
SLOW_S = 2.0


def request_level(path: str, status: int, elapsed_s: float) -> int:
    """Agent traffic that went well and fast is DEBUG: a log file gets one line per agent request
    otherwise. Its errors and slow requests, and every request of people, stay at INFO."""
    routine = status < 400 and path.startswith(AGENT_PREFIX)
    fast = elapsed_s < SLOW_S or path in LONG_POLLS
    return logging.DEBUG if routine and fast else logging.INFO


class HttpMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "sxwl_http_requests_total",
            "HTTP requests served",
            ["method", "route", "status"],
            registry=registry,
        )
        self.latency = Histogram(
            "sxwl_http_request_duration_seconds",
            "Time to serve an HTTP request",
            ["method", "route"],
            registry=registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )


def route_template(scope: Scope) -> str:
    """The matched route's template with its routers' prefixes, e.g. ``/api/v1/jobs/{id}``: ids in
    raw paths would explode the metrics' label set."""
    route = scope.get("route")
    template = getattr(route, "path_format", None)
    if not isinstance(template, str):
        return "unmatched"
    # Nested routers leave only the innermost part in the route; the prefixes are the rest of the path.
    try:
        matched = template.format(**scope.get("path_params", {}))
    except (KeyError, IndexError, ValueError):
        return template
    path: str = scope["path"]
    return path[: len(path) - len(matched)] + template if path.endswith(matched) else template


class RequestContext:
    """Gives each request an id (echoed as X-Request-ID), logs it (at ``request_level``), and
    records metrics by route."""

    def __init__(self, app: ASGIApp, metrics: HttpMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        # Correlation ids, not secrets: the non-cryptographic generator is enough and much cheaper.
        request_id = f"{random.getrandbits(64):016x}"
        token = request_id_var.set(request_id)
        started = time.perf_counter()
        status = 500
        response_started = response_complete = False

        async def send_with_id(message: Message) -> None:
            nonlocal status, response_started, response_complete
            if message["type"] == "http.response.start":
                status = message["status"]
                response_started = True
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"x-request-id", request_id.encode())]
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                response_complete = True
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            log.exception("unhandled error", extra={"method": scope["method"], "path": scope["path"]})
            if response_started and not response_complete:
                # Half a response cannot be taken back: the server closes the connection, which is
                # how HTTP says that the body is cut short.
                raise
            if not response_started:
                # Answered here, inside this middleware, so the 500 carries the request id; the
                # exception goes no further, so the server keeps the connection for the next request.
                await _send_json(
                    send_with_id, 500, error_body(500, "internal server error", path=scope["path"])
                )
        finally:
            elapsed = time.perf_counter() - started
            route_name = route_template(scope)
            self.metrics.requests.labels(scope["method"], route_name, str(status)).inc()
            self.metrics.latency.labels(scope["method"], route_name).observe(elapsed)
            level = request_level(scope["path"], status, elapsed)
            if log.isEnabledFor(level):
                client = scope.get("client")
                log.log(
                    level,
                    "request",
                    extra={
                        "method": scope["method"],
                        # Path only: query strings are not logged.
                        "path": scope["path"],
                        "status": status,
                        "duration_ms": round(elapsed * 1000, 1),
                        "client": client[0] if client else None,
                    },
                )
            request_id_var.reset(token)


class BodyLimit:
    """Refuses bodies over the path's limit with 413, by Content-Length or while streaming, before
    the application reads them whole, and bodies still arriving after the path's deadline (counted
    from the request's start) with 408 and a closed connection: a client that trickles its body in
    would otherwise hold the request open for ever."""

    def __init__(self, app: ASGIApp, rule_for: Callable[[str, str], tuple[int, float]]) -> None:
        self.app = app
        self.rule_for = rule_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, timeout_s = self.rule_for(scope["method"], scope["path"])
        for name, value in scope.get("headers", []):
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                await self._refuse(send, limit, scope["path"])
                return
        deadline = asyncio.get_running_loop().time() + timeout_s
        received = 0
        body_done = refused = response_started = False

        async def limited_receive() -> Message:
            nonlocal received, body_done, refused
            if refused:
                return {"type": "http.disconnect"}
            if body_done:  # later calls only wait for the client to leave (long-polls, streams)
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                refused = True
                if not response_started:
                    await _send_json(
                        send,
                        408,
                        error_body(
                            408, f"request body not received within {timeout_s:g} s", path=scope["path"]
                        ),
                        close=True,  # the rest of the body is not waited for
                    )
                return {"type": "http.disconnect"}
            if message["type"] == "http.request":
                body_done = not message.get("more_body", False)
                received += len(message.get("body", b""))
                if received > limit:
                    # Answer now and tell the app the client left, so it stops reading.
                    refused = True
                    await self._refuse(send, limit, scope["path"])
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal response_started
            if not refused:
                response_started = True
                await send(message)

        await self.app(scope, limited_receive, guarded_send)

    async def _refuse(self, send: Send, limit: int, path: str) -> None:
        message = f"request body larger than {limit} bytes"
        body = error_body(413, message, details={"max_bytes": limit}, path=path)
        await _send_json(send, 413, body)


async def _send_json(send: Send, status: int, content: dict[str, Any], close: bool = False) -> None:
    body = json.dumps(content).encode()
    headers: list[tuple[bytes, bytes]] = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
