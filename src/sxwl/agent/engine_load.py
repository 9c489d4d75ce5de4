"""An endpoint replica's load, sent in the heartbeat beside its attempt (docs/agent.md, "Heartbeat";
docs/endpoints.md, "Load"): the requests its engine runs and those waiting. vLLM says so itself on
``GET /metrics`` (``vllm:num_requests_running``, ``vllm:num_requests_waiting``), asked over the
supervisor's socket as its health is; ``transformers serve`` has no metrics, so the agent counts the
tunnel's streams it forwards to that engine now (``InFlight``), and no waiting count is known."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence

import h11

from sxwl.agent.engine_probe import open_socket
from sxwl.agent.runtimes.base import AttemptRecord
from sxwl.protocol import JobReport, attempt_key
from sxwl.protocol.endpoints import EngineLoad

SCRAPE_S = 2.0  # a heartbeat waits at most this long for the engines' metrics (asked at once)
METRICS_MAX = 4 * 1024 * 1024  # vLLM's page is some 100 KiB; anything past this is not read
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"


class InFlight:
    """The requests the agent forwards to each engine now, by the engine's socket."""

    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()

    @contextlib.contextmanager
    def counting(self, socket: str | None) -> Iterator[None]:
        """Counts one request to ``socket`` while the block runs (None: not an engine's stream)."""
        if socket is None:
            yield
            return
        self._counts[socket] += 1
        try:
            yield
        finally:
            self._counts[socket] -= 1
            if self._counts[socket] <= 0:
                del self._counts[socket]

    def of(self, socket: str) -> int:
        return self._counts[socket]


class Loads:
    """What the heartbeat says of each engine's load. An engine that answered ``/metrics`` without
    vLLM's gauges (``transformers serve`` answers 404) is not asked again: its own log would fill
    with the refusals; one that could not be reached (still loading, restarting) is asked next time."""

    def __init__(self, in_flight: InFlight) -> None:
        self.in_flight = in_flight
        self._no_metrics: set[str] = set()

    async def reported(
        self, reports: Sequence[JobReport], jobs: Mapping[str, AttemptRecord]
    ) -> list[JobReport]:
        """``reports`` with the load of each running engine."""
        engines = {j.key: j.engine_socket for j in jobs.values() if j.engine_socket and not j.outcome}
        wanted = [(report, engines.get(attempt_key(report.job_id, report.attempt))) for report in reports]
        loads = await asyncio.gather(*(self._load(socket) for _, socket in wanted))
        return [
            report.model_copy(update={"load": load}) if load is not None else report
            for (report, _), load in zip(wanted, loads, strict=True)
        ]

    async def _load(self, socket: str | None) -> EngineLoad | None:
        if socket is None:
            return None
        if socket not in self._no_metrics:
            try:
                status, body = await asyncio.wait_for(_metrics(socket), SCRAPE_S)
            except (OSError, TimeoutError, h11.ProtocolError):
                status, body = 0, b""
            said = gauges(body.decode("utf-8", "replace")) if status == 200 else None
            if said is not None:
                return EngineLoad(running=said[0], waiting=said[1], source="engine")
            if status:
                self._no_metrics.add(socket)
        return EngineLoad(running=self.in_flight.of(socket), source="agent")


def gauges(text: str) -> tuple[int, int] | None:
    """vLLM's running and waiting requests, summed over its models; None where the page has neither."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        name, _, rest = line.partition("{") if "{" in line.split(" ", 1)[0] else line.partition(" ")
        if name not in (RUNNING, WAITING):
            continue
        value = rest.rsplit("}", 1)[-1].split()
        with contextlib.suppress(ValueError, IndexError):
            found[name] = found.get(name, 0.0) + float(value[0])
    if not found:
        return None
    return max(0, round(found.get(RUNNING, 0.0))), max(0, round(found.get(WAITING, 0.0)))


async def _metrics(socket: str) -> tuple[int, bytes]:
    """``GET /metrics`` over the supervisor's socket; a body past METRICS_MAX is cut there."""
    reader, writer = await open_socket(socket)
    try:
        conn = h11.Connection(h11.CLIENT)
        request = h11.Request(method="GET", target="/metrics", headers=[("host", "engine")])
        writer.write(conn.send(request) or b"")
        writer.write(conn.send(h11.EndOfMessage()) or b"")
        status, body = 0, bytearray()
        while len(body) < METRICS_MAX:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await reader.read(65536))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                break
        return status, bytes(body)
    finally:
        writer.transport.abort()
