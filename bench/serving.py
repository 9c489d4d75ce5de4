"""What the serving path costs (docs/endpoints.md): one engine reached directly (its supervisor's
unix socket, as the agent reaches it) and through the whole path (the cloud's /v1, the tunnel, the
agent, the socket), in one run.

- **added time to first token**: ``--ttft-requests`` streamed chat calls each way, one at a time,
  a direct one and one through interleaved; p50 and p99 of the first content chunk's arrival,
  direct and through, and the difference;
- **chunks/s** at 1, 16, 64 and 256 concurrent streams of ``--tokens`` one-token chunks each;
- **CPU per chunk** of each process in those runs (from /proc: the client, which is this script,
  the cloud, the agent, the engine), so the path's own cost is seen apart from the machine's load:
  the ratio of the direct run's CPU per chunk to the path's is the chunk rate's ratio on idle cores
  when both are bound by CPU.

Two engines, each run by a real agent (simulated GPUs) as an endpoint's replica in its sandbox:

- the recording vLLM stand-in (tests/support/fake_vllm.py) in its fast mode, streaming as fast as
  it can, so that the path is measured, not a model (all of the above);
- the tiny Llama the tests build, served by `transformers serve` on the CPU (a `gpus: 0` replica),
  so that a real engine's figures stand beside it: added time to first token (``--llama-requests``
  calls) and chunks/s at 1 and 4 streams of ``--llama-tokens`` (it may stop early at its EOS).

The cloud is `sxwl serve` on SQLite. Appends a dated section to bench/RESULTS.md, with the load
average (the machine is shared). Run: ``.venv/bin/python bench/serving.py``.

All of it shares the machine's cores, so on a small machine the chunk rates compare CPU costs: the
path's own CPU is taken from the engine and the client. ``--pin`` measures instead what a deployed
path costs an engine, where the cloud runs on machines of its own and the agent on a GPU host's many
cores: the client and the engine on CPU 0, the cloud and the agent on CPU 1, direct and through.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

import httpx  # noqa: E402
from bench.common import (  # noqa: E402
    Processes,
    append_results,
    cpu_s,
    interrupt_on_sigterm,
    machine_line,
    percentile,
    utc_now,
)
from tests.support.agent import eventually  # noqa: E402
from tests.test_endpoints_vllm import FAKE  # noqa: E402
from tests.test_finetune_system import MODEL, FineTuneWorld  # noqa: E402
from tests.test_jobs_process import PRODUCT  # noqa: E402

from sxwl.engine.sockets import reachable  # noqa: E402

CONCURRENCY = (1, 16, 64, 256)
HEARTBEAT_S = 10
LLAMA_CONCURRENCY = (1, 4)
BODY: dict[str, Any] = {"model": "fast", "messages": [{"role": "user", "content": "hi"}], "stream": True}


async def stream_once(
    client: httpx.AsyncClient, url: str, tokens: int, model: str = "fast"
) -> tuple[float, int]:
    """(seconds to the first content chunk, content chunks) of one streamed call."""
    started = time.perf_counter()
    first, chunks = 0.0, 0
    body = BODY | {"max_tokens": tokens, "model": model}
    async with client.stream("POST", url, json=body) as reply:
        assert reply.status_code == 200, await reply.aread()
        async for line in reply.aiter_lines():
            if line.startswith("data: {") and '"content"' in line:
                chunks += 1
                if chunks == 1:
                    first = time.perf_counter() - started
    return first, chunks


async def first_tokens(
    ways: dict[str, tuple[httpx.AsyncClient, str]], requests: int, model: str = "fast"
) -> dict[str, list[float]]:
    """Seconds to the first content chunk of ``requests`` calls each way (name: client and URL),
    interleaved, which goes first alternating: both ways meet the machine in the same state, so the
    difference of their percentiles is the path's, not a drift of the shared cores between runs."""
    found: dict[str, list[float]] = {name: [] for name in ways}
    order = list(ways)
    for call in range(requests):
        for name in order if call % 2 == 0 else order[::-1]:
            client, url = ways[name]
            found[name].append((await stream_once(client, url, 4, model))[0])
    return found


async def chunk_rate(
    client: httpx.AsyncClient, url: str, streams: int, tokens: int, model: str = "fast"
) -> float:
    """Content chunks per second of ``streams`` concurrent calls; the stand-in sends every chunk
    asked for, a model may stop at its end of sequence."""
    started = time.perf_counter()
    done = await asyncio.gather(*(stream_once(client, url, tokens, model) for _ in range(streams)))
    assert all(chunks == tokens for _, chunks in done) or model != "fast"
    return sum(chunks for _, chunks in done) / (time.perf_counter() - started)


def descendants(pid: int) -> list[int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = [], [pid]
    while frontier:
        children = [child for child, parent in parents.items() if parent in frontier]
        found += children
        frontier = children
    return found


class CpuMeter:
    """CPU seconds of the client (this process), the cloud, the agent and the engine (the agent's
    descendants: its sandbox and the engine's supervisor with it) over one run."""

    def __init__(self, cloud: int, agent: int) -> None:
        self.cloud, self.agent = cloud, agent

    def now(self) -> dict[str, float]:
        return {
            "client": time.process_time(),
            "cloud": cpu_s(self.cloud),
            "agent": cpu_s(self.agent),
            "engine": sum(cpu_s(pid) for pid in descendants(self.agent)),
        }

    def since(self, before: dict[str, float]) -> dict[str, float]:
        return {name: spent - before[name] for name, spent in self.now().items()}


def pin(pids: list[int], cpu: int) -> None:
    """Every thread of ``pids`` onto ``cpu`` (threads made later inherit their maker's CPUs)."""
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(int(task.name), {cpu})


def client_for(
    make: Callable[[], httpx.AsyncClient],
) -> Callable[[Callable[[httpx.AsyncClient], Coroutine[Any, Any, Any]]], Any]:
    def run(work: Callable[[httpx.AsyncClient], Coroutine[Any, Any, Any]]) -> Any:
        async def go() -> Any:
            async with make() as client:
                return await work(client)

        return asyncio.run(go())

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ttft-requests", type=int, default=100)
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--llama-requests", type=int, default=20)
    parser.add_argument("--llama-tokens", type=int, default=32)
    parser.add_argument("--no-llama", action="store_true", help="the stand-in only")
    parser.add_argument(
        "--streams",
        default=",".join(map(str, CONCURRENCY)),
        help="the concurrent streams whose chunk rates are measured, comma-separated; '' for the "
        "time to first token only",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="client and engine on CPU 0, cloud and agent on CPU 1 (the stand-in only)",
    )
    args = parser.parse_args()
    processes = Processes()
    with interrupt_on_sigterm(), tempfile.TemporaryDirectory() as tmp:
        try:
            run(Path(tmp), args, processes)
        finally:
            processes.stop_all()


def deploy(world: FineTuneWorld, processes: Processes, name: str, gpus: int) -> Path:
    """An endpoint of the tiny Llama's model, ready; the unix socket of its replica's engine."""
    body = {"name": name, "model": MODEL, "gpus": gpus} | ({"gpu_product": PRODUCT} if gpus else {})
    created = httpx.post(f"{world.url}/api/v1/endpoints", headers=world.user, json=body).json()

    def ready() -> dict[str, Any] | None:
        found: dict[str, Any] = httpx.get(
            f"{world.url}/api/v1/endpoints/{created['id']}", headers=world.user
        ).json()
        return found if found["state"] == "ready" else None

    replica = eventually(ready, timeout=300, what=f"the endpoint {name} ready")["replica_jobs"][0]
    (socket,) = (world.root / "agent-bench" / "jobs").glob(f"{replica['job_id']}*/work/engine.sock")

    def stop_endpoint() -> None:
        """Before the agent stops (reverse order): its replica's engine ends with it."""
        httpx.delete(f"{world.url}/api/v1/endpoints/{created['id']}", headers=world.user)
        eventually(lambda: world.job(replica["job_id"])["state"] == "cancelled", timeout=60, what="stopped")

    processes.add(stop_endpoint)
    return socket


def measure(
    world: FineTuneWorld,
    socket: Path,
    model: str,
    requests: int,
    tokens: int,
    concurrency: tuple[int, ...],
    meter: CpuMeter,
) -> list[str]:
    limits = httpx.Limits(max_connections=300, max_keepalive_connections=300)
    lines: list[str] = []
    with reachable(str(socket)) as short:

        def direct_client() -> httpx.AsyncClient:
            return httpx.AsyncClient(
                transport=httpx.AsyncHTTPTransport(uds=short, limits=limits), timeout=300
            )

        direct = client_for(direct_client)
        through = client_for(lambda: httpx.AsyncClient(headers=world.user, limits=limits, timeout=300))
        direct_url, through_url = "http://engine/v1/chat/completions", f"{world.url}/v1/chat/completions"

        async def both(through_client: httpx.AsyncClient) -> dict[str, list[float]]:
            async with direct_client() as engine:
                ways = {"direct": (engine, direct_url), "through": (through_client, through_url)}
                return await first_tokens(ways, requests, model)

        firsts = through(both)
        p = {k: (percentile(v, 50) * 1000, percentile(v, 99) * 1000) for k, v in firsts.items()}
        added = (p["through"][0] - p["direct"][0], p["through"][1] - p["direct"][1])
        lines.append(
            f"- time to first token at concurrency 1 ({requests} calls each way, interleaved): direct p50 "
            f"{p['direct'][0]:.1f} ms, p99 {p['direct'][1]:.1f} ms; through the cloud p50 "
            f"{p['through'][0]:.1f} ms, p99 {p['through'][1]:.1f} ms; added p50 {added[0]:.1f} ms "
            f"(target 5 ms), p99 {added[1]:.1f} ms"
        )
        for streams in concurrency:
            rate = functools.partial(chunk_rate, streams=streams, tokens=tokens, model=model)
            before = meter.now()
            d = direct(functools.partial(rate, url=direct_url))
            direct_cpu = meter.since(before)
            before = meter.now()
            t = through(functools.partial(rate, url=through_url))
            through_cpu = meter.since(before)
            target = " (target 0.90)" if streams == 64 else ""
            chunks = streams * tokens
            each = {k: v / chunks * 1e6 for k, v in through_cpu.items()}
            direct_each = (direct_cpu["client"] + direct_cpu["engine"]) / chunks * 1e6
            lines.append(
                f"- {streams} concurrent streams of {tokens} chunks: direct {d:,.0f} chunks/s, "
                f"through {t:,.0f} chunks/s, ratio {t / d:.2f}{target}; CPU µs per chunk: direct "
                f"{direct_each:.0f} (client + engine), through {sum(each.values()):.0f} (client "
                f"{each['client']:.0f}, cloud {each['cloud']:.0f}, agent {each['agent']:.0f}, engine "
                f"{each['engine']:.0f}), ratio {direct_each / sum(each.values()):.2f}"
            )
    return lines


def run(root: Path, args: argparse.Namespace, processes: Processes) -> None:
    load_before = os.getloadavg()[0]
    # A CPod is offline after 60 s without a heartbeat, not the tests' 0.5 s: on a loaded machine
    # a late beat would otherwise requeue the replica mid-measurement.
    world = FineTuneWorld(root, f"sqlite:///{root / 'sxwl.db'}", SXWL_OFFLINE_GRACE_S="60")
    processes.add(world.close)
    fakebin = root / "fakebin"
    fakebin.mkdir()
    (fakebin / "vllm").write_text(f"#!{sys.executable}\n" + FAKE.read_text())
    (fakebin / "vllm").chmod(0o755)
    # Heartbeats at the agent's default pace, not the tests' 0.3 s: the processes' CPU per chunk
    # below then counts the path, not a heartbeat's bookkeeping three times a second.
    world.agent(
        "bench",
        1,
        "--share-dir",
        str(fakebin),
        "--heartbeat-interval",
        str(HEARTBEAT_S),
        env={"PATH": f"{fakebin}:{os.environ['PATH']}"},
    )
    world.online()
    fast = deploy(world, processes, "fast", 1)
    cloud, agent = world.cloud.proc.pid, world.agents[0].proc.pid
    meter = CpuMeter(cloud, agent)
    lines = [f"## Serving: {utc_now()}", "", machine_line(), ""]
    if args.pin:
        if len(os.sched_getaffinity(0)) < 2:
            raise SystemExit("--pin needs two CPUs")
        pin([os.getpid(), *descendants(agent)], 0)
        pin([cloud, *descendants(cloud), agent], 1)
        lines += ["- pinned: the client and the engine on CPU 0, the cloud and the agent on CPU 1", ""]
    lines += ["Against the stand-in that streams as fast as it can:", ""]
    streams = tuple(int(n) for n in args.streams.split(",") if n.strip())
    lines += measure(world, fast, "fast", args.ttft_requests, args.tokens, streams, meter)
    if not (args.no_llama or args.pin):
        tiny = deploy(world, processes, "tiny", 0)
        lines += ["", "Against the tiny Llama (`transformers serve`, CPU):", ""]
        lines += measure(
            world, tiny, "tiny", args.llama_requests, args.llama_tokens, LLAMA_CONCURRENCY, meter
        )
    lines.insert(
        3,
        f"- 1-minute load average: {load_before:.2f} before, {os.getloadavg()[0]:.2f} after (the "
        "machine's 2 cores are shared with other work; anything above ~2 skews the figures)",
    )
    print("\n".join(lines))
    append_results("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
