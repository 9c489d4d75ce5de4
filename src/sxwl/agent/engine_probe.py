"""An endpoint replica's engine as the agent sees it (docs/endpoints.md): whether it serves (its
health and its model list, asked where the runtime says its supervisor listens), which attempt a
tunnel stream's target names, and why a replica whose engine gave up failed (local runtime)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

import h11

from sxwl.agent.forward_targets import Target, open_target
from sxwl.agent.runtimes.base import AttemptRecord
from sxwl.engine.supervisor import FAILED_FILE
from sxwl.protocol.endpoints import ENGINE_TARGET_SUFFIX
from sxwl.protocol.models import attempt_key
from sxwl.protocol.reasons import Reason

PROBE_S = 5.0
REASON_LINES = 8  # of the engine's last lines, in the replica's reason


J = TypeVar("J", bound=AttemptRecord)


async def get(engine: Target, target: str, limit: int | None = None) -> tuple[int, bytes]:
    """``GET target`` of the engine's supervisor: its status and body (cut at ``limit`` bytes)."""
    reader, writer = await open_target(engine)
    try:
        conn = h11.Connection(h11.CLIENT)
        writer.write(conn.send(h11.Request(method="GET", target=target, headers=[("host", "engine")])) or b"")
        writer.write(conn.send(h11.EndOfMessage()) or b"")
        status, body = 0, b""
        while limit is None or len(body) < limit:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await reader.read(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                body += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                break
        return status, body
    finally:
        writer.transport.abort()


async def serving(engine: Target | None) -> bool:
    """Its health is good and it lists a model: requests can be sent to it. None (the runtime does
    not know where it listens yet): not serving."""
    if engine is None:
        return False
    try:
        health, _ = await asyncio.wait_for(get(engine, "/health"), PROBE_S)
        if health != 200:
            return False
        status, body = await asyncio.wait_for(get(engine, "/v1/models"), PROBE_S)
        listed = json.loads(body).get("data") if status == 200 else None
    except (OSError, TimeoutError, h11.ProtocolError, ValueError, AttributeError):
        return False
    return bool(listed)


def engine_job(jobs: Mapping[str, J], target: str) -> J | None:
    """The running replica's attempt a stream's target names (``<job>-<attempt>.engine:80``)."""
    host = target.rpartition(":")[0].lower()
    if not host.endswith(ENGINE_TARGET_SUFFIX):
        return None
    job_id, _, attempt = host.removesuffix(ENGINE_TARGET_SUFFIX).rpartition("-")
    if not attempt.isdigit():
        return None
    found = next((j for j in jobs.values() if j.key.lower() == attempt_key(job_id, int(attempt))), None)
    if found is None or found.outcome is not None or not found.serves_engine:
        return None
    return found


def failure(job: AttemptRecord) -> str | None:
    """The stored reason of an engine the supervisor gave up on, with its last lines."""
    if job.engine_socket is None:
        return None
    try:
        said = json.loads((Path(job.engine_socket).parent / FAILED_FILE).read_text())
        lines = [str(line) for line in said["lines"]][-REASON_LINES:]
        exits = int(said["exits"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return Reason.of("endpoint.engine_failed", exits=exits, lines="\n".join(lines)).stored
