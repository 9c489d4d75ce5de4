"""An endpoint replica's load, sent in the heartbeat beside its attempt (docs/agent.md, "Heartbeat";
docs/endpoints.md, "Load"): the requests its engine runs and those waiting. vLLM says so itself on
``GET /metrics`` (``vllm:num_requests_running``, ``vllm:num_requests_waiting``), asked over the
supervisor's socket or pod address as its health is; ``transformers serve`` has no metrics, so the
agent counts the tunnel's streams it forwards to that engine now (``InFlight``), and no waiting
count is known."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Iterator, Sequence

import h11

from sxwl.agent.engine_probe import get
from sxwl.agent.forward_targets import Target
from sxwl.agent.runtimes.base import J, Runtime
from sxwl.protocol import JobReport, attempt_key
from sxwl.protocol.endpoints import EngineLoad

SCRAPE_S = 2.0  # a heartbeat waits at most this long for the engines' metrics (asked at once)
METRICS_MAX = 4 * 1024 * 1024  # vLLM's page is some 100 KiB; anything past this is not read
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"


class InFlight:
    """The requests the agent forwards to each attempt's service now, by its target."""

    def __init__(self) -> None:
        self._counts: Counter[Target] = Counter()

    @contextlib.contextmanager
    def counting(self, target: Target | None) -> Iterator[None]:
        """Counts one request to ``target`` while the block runs (None: not an attempt's service)."""
        if target is None:
            yield
            return
        self._counts[target] += 1
        try:
            yield
        finally:
            self._counts[target] -= 1
            if self._counts[target] <= 0:
                del self._counts[target]

    def of(self, target: Target) -> int:
        return self._counts[target]


class Loads:
    """What the heartbeat says of each engine's load. An engine that answered ``/metrics`` without
    vLLM's gauges (``transformers serve`` answers 404) is not asked again: its own log would fill
    with the refusals; one that could not be reached (still loading, restarting) is asked next time."""

    def __init__(self, in_flight: InFlight) -> None:
        self.in_flight = in_flight
        self._no_metrics: set[Target] = set()

    async def reported(self, reports: Sequence[JobReport], runtime: Runtime[J]) -> list[JobReport]:
        """``reports`` with the load of each running engine."""
        engines = {
            j.key: runtime.engine_target(j)
            for j in runtime.jobs.values()
            if j.serves_engine and j.outcome is None
        }
        wanted = [(report, engines.get(attempt_key(report.job_id, report.attempt))) for report in reports]
        loads = await asyncio.gather(*(self._load(target) for _, target in wanted))
        return [
            report.model_copy(update={"load": load}) if load is not None else report
            for (report, _), load in zip(wanted, loads, strict=True)
        ]

    async def _load(self, target: Target | None) -> EngineLoad | None:
        if target is None:
            return None
        if target not in self._no_metrics:
            try:
                status, body = await asyncio.wait_for(get(target, "/metrics", METRICS_MAX), SCRAPE_S)
            except (OSError, TimeoutError, h11.ProtocolError):
                status, body = 0, b""
            said = gauges(body.decode("utf-8", "replace")) if status == 200 else None
            if said is not None:
                return EngineLoad(running=said[0], waiting=said[1], source="engine")
            if status:
                self._no_metrics.add(target)
        return EngineLoad(running=self.in_flight.of(target), source="agent")


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
