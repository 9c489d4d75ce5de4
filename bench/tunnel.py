"""What the agent's tunnel costs (docs/tunnel.md): the same target server reached directly and
through the tunnel (the cloud's service, one WebSocket carrying HTTP/2, the agent, a TCP connection
to the target), in one run.

- **streams/s**: ``--requests`` small POSTs (1 KiB each way) at ``--concurrency``;
- **MB/s**: ``--mib`` MiB streamed from the target by 1 and by 4 concurrent downloads;
- **an idle tunnel's CPU**: two more agents, one keeping its tunnel's 2 connections open and one
  with none (``--tunnel-connections 0``), both at the agent's default 10 s heartbeat, their CPU
  over ``--idle-s`` seconds with no stream: the difference is what an idle tunnel costs (its
  keep-alive PINGs, every 20 s each way on each connection).

The cloud runs in this process (its tunnel service is called in its own event loop, on a thread);
the agent and the target are processes of their own; direct requests come from this process's main
thread with one pooled httpx client. Prints each figure and the ratio tunnel / direct, and appends a
dated section to bench/RESULTS.md. Run: ``.venv/bin/python bench/tunnel.py [--requests 2000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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
    utc_now,
)
from tests.support.agent import AgentProcess, eventually, simulated_agent  # noqa: E402
from tests.support.cloud import test_settings  # noqa: E402
from tests.support.net import free_port  # noqa: E402
from tests.support.tunnel import InProcessCloud, Target, provider_key, request  # noqa: E402

from sxwl.cloud.tunnel import service  # noqa: E402

BODY = b"x" * 1024
HEARTBEAT_S = "10"  # the agent's default; the tests' 0.3 s would drown the tunnel's cost


async def direct_streams(url: str, requests: int, concurrency: int) -> float:
    async with httpx.AsyncClient(
        base_url=url, limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    ) as client:
        return await _timed(requests, concurrency, lambda: _direct_echo(client))


async def _direct_echo(client: httpx.AsyncClient) -> None:
    reply = await client.post("/echo", content=BODY)
    assert reply.status_code == 200 and reply.content == BODY


async def _timed(requests: int, concurrency: int, one: object) -> float:
    assert callable(one)
    left = requests

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await one()

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return requests / (time.perf_counter() - started)


async def direct_bytes(url: str, size: int, parallel: int) -> float:
    async def one(client: httpx.AsyncClient) -> int:
        got = 0
        async with client.stream("GET", f"/bytes?n={size}") as reply:
            async for chunk in reply.aiter_raw():
                got += len(chunk)
        return got

    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        started = time.perf_counter()
        total = sum(await asyncio.gather(*(one(client) for _ in range(parallel))))
    assert total == size * parallel
    return total / (time.perf_counter() - started) / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--idle-s", type=float, default=60.0, help="the idle window; 0: not measured")
    parser.add_argument("--serve-target", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_target:
        Target(args.serve_target).thread.join()
        return
    processes = Processes()
    with interrupt_on_sigterm(), tempfile.TemporaryDirectory() as tmp:
        try:
            run(Path(tmp), args, processes)
        finally:
            processes.stop_all()


def run(root: Path, args: argparse.Namespace, processes: Processes) -> None:
    port = free_port()
    target = subprocess.Popen([sys.executable, __file__, "--serve-target", str(port)])
    processes.add(target.terminate)
    address, direct_url = f"127.0.0.1:{port}", f"http://127.0.0.1:{port}"
    cloud = InProcessCloud(test_settings(root / "cloud", f"sqlite:///{root / 'sxwl.db'}"))
    processes.add(cloud.stop)
    key = provider_key(cloud.url)
    agent = simulated_agent(
        cloud.url,
        root / "agent",
        key,
        "--tunnel-allow",
        address,
        name="bench",
        gpus=1,
        product="X",
    )
    processes.add(agent.stop)
    eventually(lambda: (root / "agent" / "cpod.json").exists(), what="the agent to register")
    cpod = json.loads((root / "agent" / "cpod.json").read_text())["cpod_id"]
    eventually(lambda: cloud.connections(cpod) == 2, what="the tunnel's connections")
    eventually(lambda: httpx.get(f"{direct_url}/bytes?n=1").status_code == 200, what="the target")

    async def tunnel_echo() -> None:
        reply = await service.open_stream(cloud.tunnels, cpod, address, request("POST", "/echo", BODY))
        async with reply:
            assert reply.status == 200 and await reply.read() == BODY

    async def tunnel_streams() -> float:
        return await _timed(args.requests, args.concurrency, tunnel_echo)

    async def tunnel_bytes(parallel: int) -> float:
        size = args.mib * 2**20

        async def one() -> int:
            got = 0
            reply = await service.open_stream(
                cloud.tunnels, cpod, address, request("GET", f"/bytes?n={size}")
            )
            async with reply:
                async for chunk in reply.chunks():
                    got += len(chunk)
            return got

        started = time.perf_counter()
        total = sum(await asyncio.gather(*(one() for _ in range(parallel))))
        assert total == size * parallel
        return total / (time.perf_counter() - started) / 1e6

    # Warm both paths (imports, first connections) before anything is timed.
    asyncio.run(direct_streams(direct_url, 50, 8))
    cloud.call(lambda: _timed(50, 8, tunnel_echo))
    rows = []
    rows.append(
        (
            "streams/s",
            asyncio.run(direct_streams(direct_url, args.requests, args.concurrency)),
            cloud.call(tunnel_streams, 600),
        )
    )
    for parallel in (1, 4):
        direct = asyncio.run(direct_bytes(direct_url, args.mib * 2**20, parallel))
        through = cloud.call(functools.partial(tunnel_bytes, parallel), 600)
        rows.append((f"MB/s, {parallel} stream{'s' if parallel > 1 else ''}", direct, through))
    lines = [
        f"## tunnel: {utc_now()}",
        "",
        machine_line(),
        f"- {args.requests} POSTs of 1 KiB at concurrency {args.concurrency}; {args.mib} MiB downloads; "
        "cloud on SQLite in the bench process, agent with 2 connections, the target (uvicorn) a process",
        "",
        "| | direct | tunnel | tunnel / direct |",
        "|---|---|---|---|",
        *(f"| {name} | {d:,.1f} | {t:,.1f} | {t / d:.2f} |" for name, d, t in rows),
        "",
    ]
    if args.idle_s > 0:
        lines += [*idle_tunnel(root, cloud, key, args.idle_s, processes), ""]
    print("\n".join(lines))
    append_results("\n".join(lines))


def idle_tunnel(
    root: Path, cloud: InProcessCloud, key: str, seconds: float, processes: Processes
) -> list[str]:
    """CPU of an idle agent with its tunnel and of one without, over the same ``seconds``."""
    agents: dict[str, AgentProcess] = {}
    for name, connections in (("with", "2"), ("without", "0")):
        state = root / f"idle-{name}"
        agent = simulated_agent(
            cloud.url,
            state,
            key,
            "--tunnel-connections",
            connections,
            "--heartbeat-interval",
            HEARTBEAT_S,
            name=f"idle-{name}",
            gpus=1,
            product="X",
        )
        processes.add(agent.stop)
        registered = state / "cpod.json"
        eventually(registered.exists, what=f"the agent {name} a tunnel to register")
        agents[name] = agent
    cpod = json.loads((root / "idle-with" / "cpod.json").read_text())["cpod_id"]
    eventually(lambda: cloud.connections(cpod) == 2, what="the idle tunnel's connections")
    time.sleep(5)  # past both agents' start (imports, registration, first beats)
    before = {name: cpu_s(agent.proc.pid) for name, agent in agents.items()}
    time.sleep(seconds)
    spent = {name: (cpu_s(agent.proc.pid) - before[name]) / seconds * 1000 for name, agent in agents.items()}
    return [
        f"- idle agents over {seconds:.0f} s, heartbeats every {HEARTBEAT_S} s, no stream: with the "
        f"tunnel's 2 connections {spent['with']:.2f} ms of CPU per second, without a tunnel "
        f"{spent['without']:.2f}; the idle tunnel's cost {spent['with'] - spent['without']:+.2f} ms/s "
        "(/proc's clock ticks are 10 ms)",
    ]


if __name__ == "__main__":
    main()
