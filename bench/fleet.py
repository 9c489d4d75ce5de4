"""A fleet of idle CPods against 2 replicas on PostgreSQL (issue 14's benchmark), or (``--sqlite``)
against the one server that SQLite allows.

Every simulated CPod holds a long-poll (``wait`` as sxwl-agent asks, kept open by the cloud's
keep-alive newlines) on the replica it registered with, and in the load phase also heartbeats every
10 s. The CPods start their first long-polls spread over one hold, and the idle window opens only
after a whole hold, so it sees renewals at their steady rate (and each renewal as an agent's would
be: the CPod's last read a hold ago). Measures the CPU per second of
the two replicas and of PostgreSQL while the fleet is idle and while it heartbeats, the heartbeat
p99, and submit-to-agent latency for a probe CPod long-polling the other replica than the one the
job was submitted to, against one polling the same replica (on SQLite only the latter).
Prints a table and appends a dated section to bench/RESULTS.md.
Run: ``.venv/bin/python bench/fleet.py [--cpods N] [--window S] [--probes K] [--hold S] [--sqlite]``;
a scaled-down fleet
(``--cpods``) heartbeats at the same 10 s interval, so its rate is N/10 per second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from bench.common import (  # noqa: E402
    API,
    PASSWORD,
    Processes,
    append_results,
    cloud_env,
    interrupt_on_sigterm,
    machine_line,
    percentile,
    utc_now,
)
from bench.heartbeats import Meter, postmaster_pid, provider_access_key  # noqa: E402
from bench.rawhttp import RawConnection, RawHttpError  # noqa: E402
from tests.support.cloud import CloudProcess  # noqa: E402
from tests.support.net import free_port  # noqa: E402
from tests.support.postgres import TempPostgres  # noqa: E402

from sxwl.agent.loop import LONG_POLL_S  # noqa: E402

HEARTBEAT_S = 10.0
# Heartbeats are short requests: CPods share these connections per replica, so that the client's
# file descriptors go to the long-polls, one each, as the cloud sees them from real agents.
BEAT_CONNECTIONS = 400
FLEET_PRODUCT = "NVIDIA-A100-SXM4-80GB"
# Each probe CPod has its own product, so a job for it can go nowhere else.
PROBE_PRODUCTS = ("BENCH-PROBE-SAME", "BENCH-PROBE-CROSS")
TARGET_IDLE_CORE = 0.10
TARGET_CROSS_P50_MS = 50.0


@dataclass
class Cpod:
    url: str
    cpod_id: str
    token: str
    seq: int = 0
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}


def node(product: str, gpus: int) -> dict[str, object]:
    gpu = {"vendor": "nvidia", "product": product, "memory_mib": 81920, "count": gpus, "allocatable": gpus}
    return {"name": "n1", "status": "ready", "cpu_cores": 64, "memory_mib": 524288, "gpu": {**gpu, "used": 0}}


async def register(urls: list[str], key: str, count: int, prefix: str) -> list[Cpod]:
    gate = asyncio.Semaphore(8)
    async with httpx.AsyncClient(timeout=60) as client:

        async def one(index: int) -> Cpod:
            url = urls[index % len(urls)]
            body = {
                "cluster_uid": f"{prefix}-{index:06d}",
                "runtime": "local",
                "agent_version": "bench",
                # Not judged missing while the idle phase sends no heartbeats.
                "heartbeat_interval_s": 300,
            }
            async with gate:
                reply = await client.post(
                    f"{url}{API}/agent/register", json=body, headers={"Authorization": f"Bearer {key}"}
                )
            reply.raise_for_status()
            return Cpod(url, reply.json()["cpod_id"], reply.json()["cpod_token"])

        return list(await asyncio.gather(*(one(i) for i in range(count))))


async def beat(conn: RawConnection, cpod: Cpod, body_nodes: bytes) -> float:
    cpod.seq += 1
    head = conn.head("POST", f"{API}/agent/heartbeat", cpod.headers)
    body = b'{"seq":%d,"nodes":%s}' % (cpod.seq, body_nodes)
    started = time.perf_counter()
    try:
        status, payload = await conn.request(head, body)
    except RawHttpError:
        # The server closes a keep-alive connection idle past its timeout; an agent reconnects.
        started = time.perf_counter()
        status, payload = await conn.request(head, body)
    if status != 200:
        raise RawHttpError(f"heartbeat {status}: {payload[:200]!r}")
    return time.perf_counter() - started


@dataclass
class Fleet:
    cpods: list[Cpod]
    hold: float = LONG_POLL_S
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    beating: asyncio.Event = field(default_factory=asyncio.Event)
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    polls: int = 0
    beat_pool: dict[str, list[tuple[RawConnection, asyncio.Lock]]] = field(default_factory=dict)

    def beat_connection(self, url: str, index: int) -> tuple[RawConnection, asyncio.Lock]:
        pool = self.beat_pool.setdefault(url, [])
        if len(pool) < BEAT_CONNECTIONS:
            pool.append((RawConnection(url), asyncio.Lock()))
        return pool[index % len(pool)]

    async def run_one(self, index: int, cpod: Cpod) -> None:
        """One CPod: a long-poll always held on its own connection, heartbeats on a shared one."""
        polls = RawConnection(cpod.url)
        beats, turn = self.beat_connection(cpod.url, index)
        body_nodes = json.dumps([node(FLEET_PRODUCT, 8)]).encode()
        poll_head = polls.head("GET", f"{API}/agent/assignments?wait={self.hold:g}", cpod.headers)
        # Spread over the interval, so the fleet beats at an even N/10 per second.
        phase = HEARTBEAT_S * index / len(self.cpods)

        async def poll_forever() -> None:
            await asyncio.sleep(self.hold * index / len(self.cpods))
            while not self.stop.is_set():
                try:
                    await polls.request(poll_head, b"")
                    self.polls += 1
                except RawHttpError:
                    self.errors += 1
                    await asyncio.sleep(1)

        async def one_beat() -> float:
            async with turn:
                return await beat(beats, cpod, body_nodes)

        poller = asyncio.create_task(poll_forever())
        try:
            await one_beat()  # online before anything is measured
            await self.beating.wait()
            await asyncio.sleep(phase)
            next_at = time.monotonic()
            while not self.stop.is_set():
                try:
                    self.latencies.append(await one_beat())
                except (RawHttpError, OSError):
                    self.errors += 1
                next_at += HEARTBEAT_S
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
        finally:
            poller.cancel()
            await polls.close()

    async def close(self) -> None:
        for pool in self.beat_pool.values():
            for conn, _ in pool:
                await conn.close()


async def measure_window(meter: Meter, seconds: float) -> float:
    """CPU seconds per second of the replicas (and, in ``meter.db_s``, of PostgreSQL)."""
    meter.start()
    await asyncio.sleep(seconds)
    meter.stop()
    return meter.server_s / seconds


async def dispatch_latency(
    urls: list[str], key: str, user: dict[str, str], probes: int
) -> dict[str, list[float]]:
    """Submit on replica 0; the same-replica probe long-polls replica 0, the cross one replica 1
    (when there is one)."""
    paths = [("same", (await register([urls[0]], key, 1, "probe-same"))[0], PROBE_PRODUCTS[0])]
    if len(urls) > 1:
        paths.append(("cross", (await register([urls[1]], key, 1, "probe-cross"))[0], PROBE_PRODUCTS[1]))
    found: dict[str, list[float]] = {"same": [], "cross": []}
    async with httpx.AsyncClient(timeout=60) as client:
        for _, cpod, product in paths:
            body = {"seq": 1, "nodes": [node(product, probes + 1)]}
            (
                await client.post(f"{cpod.url}{API}/agent/heartbeat", json=body, headers=cpod.headers)
            ).raise_for_status()
        for _ in range(probes):
            for name, cpod, product in paths:
                poll = asyncio.create_task(
                    client.get(
                        f"{cpod.url}{API}/agent/assignments", params={"wait": 10}, headers=cpod.headers
                    )
                )
                await asyncio.sleep(0.2)  # the long-poll is waiting
                job = {"name": "probe", "command": "true", "gpu_product": product, "gpus_per_node": 1}
                started = time.perf_counter()
                submitted = await client.post(f"{urls[0]}{API}/jobs", json=job, headers=user)
                submitted.raise_for_status()
                reply = await poll
                elapsed = time.perf_counter() - started
                assignments = reply.json()["assignments"]
                if [a["job_id"] for a in assignments] != [submitted.json()["id"]]:
                    raise RuntimeError(f"probe {name}: expected its job, got {reply.text}")
                found[name].append(elapsed)
                status = {"attempt": assignments[0]["attempt"], "state": "starting"}
                job_id = assignments[0]["job_id"]
                (
                    await client.post(
                        f"{cpod.url}{API}/agent/jobs/{job_id}/status", json=status, headers=cpod.headers
                    )
                ).raise_for_status()
    return found


def compute_user(url: str) -> dict[str, str]:
    email = "user@bench.example.com"
    httpx.post(
        f"{url}{API}/auth/register", json={"email": email, "password": PASSWORD, "role": "user"}
    ).raise_for_status()
    login = httpx.post(f"{url}{API}/auth/login", json={"email": email, "password": PASSWORD})
    login.raise_for_status()
    return {"Authorization": f"Bearer {login.json()['access_token']}"}


async def run(
    args: argparse.Namespace, urls: list[str], roots: list[int], db_pid: int | None
) -> dict[str, float]:
    key = provider_access_key(urls[0])
    user = compute_user(urls[0])
    cpods = await register(urls, key, args.cpods, "fleet")
    fleet = Fleet(cpods, hold=args.hold)
    tasks = [asyncio.create_task(fleet.run_one(i, c)) for i, c in enumerate(cpods)]
    # The first long-polls start spread over one hold; from the end of the first hold on, every
    # CPod renews as an agent would, a hold after its previous read.
    await asyncio.sleep(args.hold + 10)
    meter = Meter(roots, [db_pid] if db_pid else [])
    polls_before = fleet.polls
    idle = await measure_window(meter, args.window)
    idle_db = meter.db_s / args.window
    renewals = (fleet.polls - polls_before) / args.window
    latency = await dispatch_latency(urls, key, user, args.probes)
    fleet.beating.set()
    await asyncio.sleep(HEARTBEAT_S)  # the first round of beats is spread out
    fleet.latencies.clear()
    loaded = await measure_window(meter, args.window)
    loaded_db = meter.db_s / args.window
    beats = len(fleet.latencies)
    fleet.stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await fleet.close()
    return {
        "renewals_per_s": renewals,
        "idle_core": idle,
        "idle_db_core": idle_db,
        "load_core": loaded,
        "load_db_core": loaded_db,
        "beats_per_s": beats / args.window,
        "beat_p99_ms": percentile(fleet.latencies, 99) * 1000,
        "same_p50_ms": percentile(latency["same"], 50) * 1000,
        "same_p99_ms": percentile(latency["same"], 99) * 1000,
        "cross_p50_ms": percentile(latency["cross"], 50) * 1000,
        "cross_p99_ms": percentile(latency["cross"], 99) * 1000,
        "errors": float(fleet.errors),
    }


def section(args: argparse.Namespace, r: dict[str, float]) -> str:
    idle_ok = "met" if r["idle_core"] < TARGET_IDLE_CORE else "missed"
    cross_ok = "met" if r["cross_p50_ms"] < TARGET_CROSS_P50_MS else "missed"
    held = (
        f"each holding a {args.hold:.0f} s long-poll ({r['renewals_per_s']:.1f} renewals/s while idle); "
        f"load: a heartbeat each every {HEARTBEAT_S:.0f} s; windows of {args.window:.0f} s; "
        f"{args.probes} probe jobs per path\n\n"
    )
    head = f"## fleet: {utc_now()}\n\n{machine_line()}, load average {os.getloadavg()[0]:.2f}\n"
    if args.sqlite:
        return (
            f"{head}- {args.cpods} simulated CPods on one `sxwl serve` process on SQLite (what `make run` "
            f"starts), {held}"
            "| | server, cores |\n|---|---|\n"
            f"| idle | {r['idle_core']:.3f} |\n"
            f"| {r['beats_per_s']:.0f} heartbeats/s | {r['load_core']:.3f} |\n\n"
            f"- heartbeat p99 {r['beat_p99_ms']:.1f} ms; client errors {r['errors']:.0f}\n"
            f"- submit-to-agent p50 {r['same_p50_ms']:.1f} ms / p99 {r['same_p99_ms']:.1f} ms\n"
            f"- target: idle under {TARGET_IDLE_CORE:.0%} of a core ({idle_ok})\n"
        )
    return (
        f"{head}- {args.cpods} simulated CPods (issue: 10,000) on 2 replicas (`sxwl serve` processes) on one "
        f"PostgreSQL, {held}"
        "| | replicas, cores | PostgreSQL, cores |\n|---|---|---|\n"
        f"| idle | {r['idle_core']:.3f} | {r['idle_db_core']:.3f} |\n"
        f"| {r['beats_per_s']:.0f} heartbeats/s | {r['load_core']:.3f} | {r['load_db_core']:.3f} |\n\n"
        f"- heartbeat p99 {r['beat_p99_ms']:.1f} ms; client errors {r['errors']:.0f}\n"
        f"- submit-to-agent: same replica p50 {r['same_p50_ms']:.1f} ms / p99 {r['same_p99_ms']:.1f} ms; "
        f"across replicas p50 {r['cross_p50_ms']:.1f} ms / p99 {r['cross_p99_ms']:.1f} ms\n"
        f"- targets: idle under {TARGET_IDLE_CORE:.0%} of a core ({idle_ok}); cross-replica p50 under "
        f"{TARGET_CROSS_P50_MS:.0f} ms ({cross_ok})\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--cpods", type=int, default=10_000)
    parser.add_argument("--window", type=float, default=20.0, help="seconds of each CPU measurement")
    parser.add_argument("--probes", type=int, default=30, help="jobs timed per path")
    parser.add_argument(
        "--hold",
        type=float,
        default=LONG_POLL_S,
        help="seconds each long-poll asks for (default: the agent's)",
    )
    parser.add_argument(
        "--sqlite", action="store_true", help="one server on SQLite (`make run`), not 2 on PostgreSQL"
    )
    parser.add_argument("--no-results", action="store_true", help="do not append to bench/RESULTS.md")
    args = parser.parse_args(argv)
    processes = Processes()
    with interrupt_on_sigterm():
        try:
            root = Path(tempfile.mkdtemp(prefix="sxwl-fleet-"))
            processes.add(lambda: shutil.rmtree(root, ignore_errors=True))
            postgres = None
            if args.sqlite:
                database_url = f"sqlite:///{root / 'fleet.db'}"
            else:
                postgres = TempPostgres(durable=True).start()
                processes.add(postgres.stop)
                database_url = postgres.create_database()
            env = {
                **cloud_env(database_url),
                "SXWL_BILLING_ENABLED": "false",
                "SXWL_ARGON2_TIME_COST": "1",
                "SXWL_ARGON2_MEMORY_KIB": "1024",
                "SXWL_LONGPOLL_MAX_S": f"{args.hold:g}",
            }
            replicas = []
            for name in ("r1",) if args.sqlite else ("r1", "r2"):
                replica = CloudProcess(root / name, free_port(), env=env)
                processes.add(replica.stop)
                replicas.append(replica)
            urls = [r.url for r in replicas]
            db_pid = postmaster_pid(postgres) if postgres is not None else None
            results = asyncio.run(run(args, urls, [r.proc.pid for r in replicas], db_pid))
        finally:
            processes.stop_all()
    text = section(args, results)
    print(text)
    if not args.no_results:
        append_results(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
