"""Scheduling throughput and dispatch latency of a real ``sxwl serve``, on SQLite and PostgreSQL.

For each engine, against one ``python -m sxwl.cli serve`` process:

1. **Throughput.** Registers ``--cpods`` simulated CPods through the agent API (4 nodes x 8 GPUs
   each) while none is online yet, submits ``--jobs`` jobs through ``POST /api/v1/jobs`` from
   ``--users`` compute users (1, 2, 4 or 8 GPUs on one node, a few 2-node jobs), then brings every
   CPod online with a heartbeat. The queue drains as the scheduler places it. Assignments/s is
   measured from the first assignment to the last (the jobs' ``assigned_at``, the scheduler's own
   clock), and from the first heartbeat until the database shows every job assigned.
2. **Dispatch latency.** ``--pollers`` CPods long-poll ``GET /api/v1/agent/assignments?wait=25``
   and as many others poll plainly (``wait=0`` every 10 s, the upstream design), in the same run.
   ``--single`` jobs are submitted one at a time, pinned in turn to a long-polling and a
   plain-polling CPod (``cpod_id``); latency runs from the moment the POST is sent to the moment the
   agent holds the assignment. Every agent acknowledges what it gets (status ``starting``), as
   ``sxwl-agent`` does, so it leaves the pending list.

All CPods keep heartbeating (every ``--heartbeat-interval`` s) from the moment they come online.
Where assignments/s falls short of the target, one scheduler pass over the same data is timed and
profiled in-process (cProfile) on a copy of that engine's database with every job queued again, and
so is a pass that places a single job while the others hold their GPUs (the latency run's case).

Prints a table and appends a dated section to bench/RESULTS.md. Run:
``.venv/bin/python bench/scheduling.py [--cpods 1000] [--jobs 10000] [--engines sqlite,postgresql]``.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import datetime
import io
import itertools
import os
import platform
import pstats
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import psycopg  # noqa: E402
from bench.common import (  # noqa: E402
    API,
    PASSWORD,
    RESULTS,
    SECRET_KEY,
    Processes,
    append_results,
    cloud_env,
    interrupt_on_sigterm,
    machine_line,
    percentile,
    utc_now,
)
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from sqlalchemy import delete, func, select, update  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402
from tests.support.cloud import CloudProcess  # noqa: E402
from tests.support.net import free_port  # noqa: E402
from tests.support.postgres import TempPostgres  # noqa: E402

from sxwl.cloud.config import Settings  # noqa: E402
from sxwl.cloud.context import CloudContext  # noqa: E402
from sxwl.cloud.db.engine import make_engine  # noqa: E402
from sxwl.cloud.db.models import Job, JobAttempt, JobState  # noqa: E402
from sxwl.cloud.services.scheduling import scheduler  # noqa: E402

ENGINES = ("sqlite", "postgresql")

NODES_PER_CPOD = 4
GPUS_PER_NODE = 8
GPU_PRODUCT = "NVIDIA-A100-SXM4-80GB"
GPU_MEMORY_MIB = 81920
# (GPUs per node, nodes, weight): about 2.4 GPUs a job, so 10,000 jobs fill 3/4 of 1,000 CPods.
JOB_SHAPES = ((1, 1, 60), (2, 1, 20), (4, 1, 10), (8, 1, 7), (8, 2, 3))

LONG_POLL_S = 25.0
PLAIN_POLL_S = 10.0

# The targets.
TARGET_ASSIGN_PER_S = 500.0
TARGET_P50_MS = 100.0


# ---- numbers ------------------------------------------------------------------------------------------


@dataclass
class Errors:
    count: int = 0
    samples: list[str] = field(default_factory=list)

    def add(self, what: str) -> None:
        self.count += 1
        if len(self.samples) < 5:
            self.samples.append(what[:300])


async def call(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    errors: Errors,
    expect: int = 200,
    **kwargs: Any,
) -> httpx.Response | None:
    try:
        response = await client.request(method, url, **kwargs)
    except httpx.HTTPError as exc:
        errors.add(f"{method} {url}: {exc!r}")
        return None
    if response.status_code != expect:
        errors.add(f"{method} {url}: {response.status_code} {response.text}")
        return None
    return response


# ---- accounts and the simulated fleet -----------------------------------------------------------------


@dataclass
class SimCPod:
    index: int
    cpod_id: str
    token: str
    seq: int = 0
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.headers = {"Authorization": f"Bearer {self.token}"}


def sign_up(client: httpx.Client, email: str, role: str) -> str:
    """Registers an account and returns a bearer token for it."""
    response = client.post(f"{API}/auth/register", json={"email": email, "password": PASSWORD, "role": role})
    if response.status_code != 201:
        raise RuntimeError(f"register {email}: {response.status_code} {response.text}")
    response = client.post(f"{API}/auth/login", json={"email": email, "password": PASSWORD})
    response.raise_for_status()
    token: str = response.json()["access_token"]
    return token


def accounts(url: str, users: int) -> tuple[str, list[str]]:
    """The provider's accessKey and one token per compute user."""
    with httpx.Client(base_url=url, timeout=60) as client:
        provider = sign_up(client, "provider@bench.example.com", "provider")
        response = client.get(f"{API}/me/access-key", headers={"Authorization": f"Bearer {provider}"})
        response.raise_for_status()
        key: str = response.json()["access_key"]
        tokens = [sign_up(client, f"user{u}@bench.example.com", "user") for u in range(users)]
    return key, tokens


async def register_fleet(url: str, access_key: str, count: int, interval_s: float) -> list[SimCPod]:
    errors = Errors()
    fleet: list[SimCPod] = []
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        gate = asyncio.Semaphore(8)

        async def register(index: int) -> SimCPod | None:
            body = {
                "cluster_uid": f"bench-cluster-{index:06d}",
                "name": f"bench-{index:04d}",
                "runtime": "local",
                "agent_version": "bench",
                "heartbeat_interval_s": interval_s,
            }
            async with gate:
                response = await call(
                    client,
                    "POST",
                    f"{API}/agent/register",
                    errors,
                    json=body,
                    headers={"Authorization": f"Bearer {access_key}"},
                )
            if response is None:
                return None
            reply = response.json()
            return SimCPod(index, reply["cpod_id"], reply["cpod_token"])

        for cpod in await asyncio.gather(*(register(i) for i in range(count))):
            if cpod is not None:
                fleet.append(cpod)
    if errors.count:
        raise RuntimeError(f"{errors.count} CPod registrations failed: {errors.samples}")
    return fleet


NODES = [
    {
        "name": f"node-{n:02d}",
        "status": "ready",
        "cpu_cores": 128,
        "memory_mib": 2 * 1024 * 1024,
        "gpu": {
            "vendor": "nvidia",
            "product": GPU_PRODUCT,
            "memory_mib": GPU_MEMORY_MIB,
            "count": GPUS_PER_NODE,
            "allocatable": GPUS_PER_NODE,
            "used": 0,
            "driver": "550.54.15",
            "cuda": "12.4",
        },
    }
    for n in range(NODES_PER_CPOD)
]


async def heartbeat(client: httpx.AsyncClient, cpod: SimCPod, errors: Errors) -> bool:
    cpod.seq += 1
    response = await call(
        client,
        "POST",
        f"{API}/agent/heartbeat",
        errors,
        json={"seq": cpod.seq, "nodes": NODES, "jobs": []},
        headers=cpod.headers,
    )
    return response is not None


async def heartbeat_all(url: str, fleet: list[SimCPod], workers: int, errors: Errors) -> None:
    """One heartbeat from every CPod, ``workers`` at a time."""
    shares = [fleet[w::workers] for w in range(workers)]

    async def worker(share: list[SimCPod]) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            for cpod in share:
                await heartbeat(client, cpod, errors)

    await asyncio.gather(*(worker(s) for s in shares))


async def keep_heartbeating(url: str, fleet: list[SimCPod], interval_s: float, errors: Errors) -> None:
    """Every CPod heartbeats once per ``interval_s``, spread evenly, until cancelled."""
    workers = 4
    shares = [fleet[w::workers] for w in range(workers)]

    async def worker(w: int, share: list[SimCPod]) -> None:
        gap = interval_s / max(1, len(share))
        due = time.perf_counter() + gap * w / workers
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            for cpod in itertools.cycle(share):
                due += gap
                delay = due - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                await heartbeat(client, cpod, errors)

    await asyncio.gather(*(worker(w, s) for w, s in enumerate(shares)))


# ---- submitting -------------------------------------------------------------------------------------


def job_body(index: int, rng: random.Random, cpod_id: str | None = None) -> dict[str, Any]:
    if cpod_id is not None:
        gpus, nodes = 1, 1
    else:
        gpus, nodes, _ = rng.choices(JOB_SHAPES, weights=[w for *_, w in JOB_SHAPES])[0]
    body: dict[str, Any] = {
        "name": f"bench-{index:05d}",
        "command": ["python3", "train.py", "--steps", "200"],
        "env": {"TINY_LM_SEED": str(index)},
        "gpu_product": GPU_PRODUCT,
        "gpus_per_node": gpus,
        "nodes": nodes,
        "max_runtime_s": 3600,
    }
    if cpod_id is not None:
        body["cpod_id"] = cpod_id
    return body


@dataclass(frozen=True)
class Submitted:
    ids: list[str]
    elapsed_s: float
    errors: Errors

    @property
    def per_s(self) -> float:
        return len(self.ids) / self.elapsed_s if self.elapsed_s > 0 else 0.0


async def submit_many(url: str, tokens: list[str], count: int, workers: int, seed: int) -> Submitted:
    """``count`` jobs from ``workers`` clients, the users taking turns."""
    rng = random.Random(seed)
    bodies = [job_body(i, rng) for i in range(count)]
    ids: list[str] = []
    errors = Errors()
    counter = itertools.count()

    async def worker() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            while (i := next(counter)) < count:
                headers = {"Authorization": f"Bearer {tokens[i % len(tokens)]}"}
                response = await call(
                    client, "POST", f"{API}/jobs", errors, expect=201, json=bodies[i], headers=headers
                )
                if response is not None:
                    ids.append(response.json()["id"])

    began = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(workers)))
    return Submitted(ids, time.perf_counter() - began, errors)


# ---- watching the database ----------------------------------------------------------------------------


class Watch:
    """Reads the cloud's database directly (read-only queries), so watching costs the server nothing
    but the database's own work."""

    def __init__(self, database_url: str) -> None:
        self.engine = make_engine(database_url)

    def assigned(self) -> int:
        with self.engine.connect() as conn:
            return int(
                conn.execute(
                    select(func.count()).select_from(Job).where(Job.assigned_at.is_not(None))
                ).scalar()
                or 0
            )

    def times(self, ids: list[str] | None = None) -> list[tuple[datetime.datetime, datetime.datetime | None]]:
        """(created_at, assigned_at) of the given jobs, or of all."""
        stmt = select(Job.created_at, Job.assigned_at)
        rows: list[tuple[datetime.datetime, datetime.datetime | None]] = []
        with self.engine.connect() as conn:
            if ids is None:
                rows.extend((c, a) for c, a in conn.execute(stmt))
            else:
                for start in range(0, len(ids), 500):
                    chunk = ids[start : start + 500]
                    rows.extend((c, a) for c, a in conn.execute(stmt.where(Job.id.in_(chunk))))
        return rows

    def reassigned(self) -> int:
        with self.engine.connect() as conn:
            return int(
                conn.execute(select(func.count()).select_from(Job).where(Job.attempt > 1)).scalar() or 0
            )

    def states(self) -> dict[str, int]:
        with self.engine.connect() as conn:
            return {
                str(s): int(n) for s, n in conn.execute(select(Job.state, func.count()).group_by(Job.state))
            }

    def close(self) -> None:
        self.engine.dispose()


@dataclass(frozen=True)
class Throughput:
    jobs: int
    assigned: int
    submit: Submitted
    online_s: float  # first heartbeat of the release to the last one answered
    first_delay_s: float  # first heartbeat to the first assignment
    span_s: float  # first assignment to the last (server clock)
    observed_s: float  # first heartbeat to the database showing every job assigned
    half_s: float  # first heartbeat to half the jobs assigned (observed)
    heartbeat_errors: Errors
    reassigned: int  # jobs on their second attempt or later: lost and queued again (should be 0)

    @property
    def per_s(self) -> float:
        return (self.assigned - 1) / self.span_s if self.span_s > 0 and self.assigned > 1 else 0.0

    @property
    def observed_per_s(self) -> float:
        return self.assigned / self.observed_s if self.observed_s > 0 else 0.0


async def measure_throughput(
    plan: Plan,
    url: str,
    fleet: list[SimCPod],
    tokens: list[str],
    watch: Watch,
    hb_errors: Errors,
    online: asyncio.Event,
) -> Throughput:
    console = plan.console
    console.print(f"  submitting {plan.jobs:,} jobs from {len(tokens)} users (no CPod online yet)")
    submitted = await submit_many(url, tokens, plan.jobs, plan.submit_workers, plan.seed)
    console.print(
        f"  submitted {len(submitted.ids):,} in {submitted.elapsed_s:.1f} s ({submitted.per_s:.0f}/s), "
        f"{submitted.errors.count} errors"
    )
    if submitted.errors.samples:
        console.print(f"  [yellow]first submit errors[/]: {submitted.errors.samples[:2]}")
    total = len(submitted.ids)
    console.print(f"  bringing {len(fleet):,} CPods online ({NODES_PER_CPOD} nodes × {GPUS_PER_NODE} GPUs)")
    release_wall = datetime.datetime.now(datetime.UTC)
    began = time.perf_counter()
    online_s = float("nan")
    half_s = observed_s = float("nan")

    async def release() -> None:
        nonlocal online_s
        await heartbeat_all(url, fleet, 16, hb_errors)
        online_s = time.perf_counter() - began
        online.set()  # from now on every CPod keeps heartbeating, or it would go unknown

    releasing = asyncio.create_task(release())
    last_count, last_change = -1, time.perf_counter()
    while True:
        count = await asyncio.to_thread(watch.assigned)
        now = time.perf_counter()
        if count != last_count:
            last_count, last_change = count, now
        if count * 2 >= total and half_s != half_s:
            half_s = now - began
        if count >= total:
            observed_s = now - began
            break
        if now - last_change > plan.stall_s and releasing.done():
            console.print(f"  [red]no progress for {plan.stall_s:.0f} s[/]: {count:,} of {total:,} assigned")
            observed_s = now - began
            break
        await asyncio.sleep(0.1)
    await releasing
    times = [a for _, a in await asyncio.to_thread(watch.times, submitted.ids) if a is not None]
    again = await asyncio.to_thread(watch.reassigned)
    first, last = (min(times), max(times)) if times else (release_wall, release_wall)
    result = Throughput(
        jobs=total,
        assigned=len(times),
        submit=submitted,
        online_s=online_s,
        first_delay_s=(first - release_wall).total_seconds(),
        span_s=(last - first).total_seconds(),
        observed_s=observed_s,
        half_s=half_s,
        heartbeat_errors=hb_errors,
        reassigned=again,
    )
    console.print(
        f"  {result.assigned:,} assigned: {result.per_s:.0f}/s first→last over {result.span_s:.1f} s; "
        f"all seen {result.observed_s:.1f} s after the first heartbeat ({result.observed_per_s:.0f}/s)"
    )
    return result


# ---- dispatch latency ---------------------------------------------------------------------------------


@dataclass
class Receipts:
    at: dict[str, float] = field(default_factory=dict)
    polls: dict[str, int] = field(default_factory=lambda: {"long-poll": 0, "plain": 0})
    acked: int = 0
    errors: Errors = field(default_factory=Errors)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)

    async def wait_for(self, ids: list[str], timeout_s: float) -> None:
        """Until every job in ``ids`` has reached its agent, or ``timeout_s`` passed."""
        deadline = time.perf_counter() + timeout_s
        while not all(j in self.at for j in ids) and (left := deadline - time.perf_counter()) > 0:
            self.arrived.clear()
            try:
                await asyncio.wait_for(self.arrived.wait(), timeout=left)
            except TimeoutError:
                return


async def take(client: httpx.AsyncClient, cpod: SimCPod, reply: dict[str, Any], receipts: Receipts) -> int:
    """What an agent does with a reply: note each new assignment and acknowledge it (``starting``)."""
    now = time.perf_counter()
    for item in reply.get("assignments", []):
        receipts.at.setdefault(item["job_id"], now)
        receipts.arrived.set()
    for item in reply.get("assignments", []):
        response = await call(
            client,
            "POST",
            f"{API}/agent/jobs/{item['job_id']}/status",
            receipts.errors,
            json={"attempt": item["attempt"], "state": "starting"},
            headers=cpod.headers,
        )
        receipts.acked += response is not None
    return len(reply.get("assignments", []))


async def long_poller(url: str, cpod: SimCPod, receipts: Receipts) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=LONG_POLL_S + 30) as client:
        while True:
            receipts.polls["long-poll"] += 1
            response = await call(
                client,
                "GET",
                f"{API}/agent/assignments",
                receipts.errors,
                params={"wait": LONG_POLL_S},
                headers=cpod.headers,
            )
            if response is None:
                await asyncio.sleep(1)
                continue
            await take(client, cpod, response.json(), receipts)


async def plain_poller(url: str, cpod: SimCPod, receipts: Receipts, offset_s: float) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        due = time.perf_counter() + offset_s
        while True:
            delay = due - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            due += PLAIN_POLL_S
            receipts.polls["plain"] += 1
            response = await call(
                client,
                "GET",
                f"{API}/agent/assignments",
                receipts.errors,
                params={"wait": 0},
                headers=cpod.headers,
            )
            if response is not None:
                await take(client, cpod, response.json(), receipts)


async def drain(url: str, cpods: list[SimCPod], errors: Errors) -> int:
    """The pollers' CPods finish what the throughput run gave them (starting, then succeeded), so
    they start empty with every GPU free."""
    finished = 0

    async def one(client: httpx.AsyncClient, cpod: SimCPod) -> None:
        nonlocal finished
        while True:
            response = await call(
                client, "GET", f"{API}/agent/assignments", errors, params={"wait": 0}, headers=cpod.headers
            )
            items = response.json().get("assignments", []) if response is not None else []
            if not items:
                return
            for item in items:
                for state in ("starting", "succeeded"):
                    body: dict[str, Any] = {"attempt": item["attempt"], "state": state}
                    if state == "succeeded":
                        body["exit_code"] = 0
                    await call(
                        client,
                        "POST",
                        f"{API}/agent/jobs/{item['job_id']}/status",
                        errors,
                        json=body,
                        headers=cpod.headers,
                    )
                finished += 1

    async def worker(share: list[SimCPod]) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            for cpod in share:
                await one(client, cpod)

    await asyncio.gather(*(worker(cpods[w::8]) for w in range(8)))
    return finished


@dataclass(frozen=True)
class ModeLatency:
    mode: str
    pollers: int
    submitted: int
    received: int
    latencies_ms: list[float]
    scheduling_ms: list[float]  # created_at -> assigned_at, server clock
    polls: int


@dataclass(frozen=True)
class Dispatch:
    modes: list[ModeLatency]
    drained: int
    errors: Errors
    submit_errors: Errors


async def measure_dispatch(
    plan: Plan, url: str, fleet: list[SimCPod], tokens: list[str], watch: Watch
) -> Dispatch:
    console = plan.console
    pollers = min(plan.pollers, len(fleet) // 2)
    long_cpods, plain_cpods = fleet[:pollers], fleet[pollers : 2 * pollers]
    errors = Errors()
    console.print(f"  draining the {2 * pollers} polling CPods of their throughput-run jobs")
    drained = await drain(url, long_cpods + plain_cpods, errors)
    receipts = Receipts(errors=errors)
    rng = random.Random(plan.seed + 1)
    tasks = [asyncio.create_task(long_poller(url, c, receipts)) for c in long_cpods]
    tasks += [
        asyncio.create_task(plain_poller(url, c, receipts, rng.uniform(0, PLAIN_POLL_S))) for c in plain_cpods
    ]
    await asyncio.sleep(1.0)  # the long-polls are waiting
    sent: dict[str, tuple[str, float]] = {}
    submit_errors = Errors()
    console.print(
        f"  {pollers} CPods long-poll (wait={LONG_POLL_S:g}), {pollers} poll every {PLAIN_POLL_S:g} s; "
        f"submitting {plan.single} jobs one at a time, {plan.gap_s:g} s apart"
    )
    try:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            for i in range(plan.single):
                mode, group = ("long-poll", long_cpods) if i % 2 == 0 else ("plain", plain_cpods)
                cpod = group[(i // 2) % len(group)]
                headers = {"Authorization": f"Bearer {tokens[i % len(tokens)]}"}
                body = job_body(100_000 + i, rng, cpod_id=cpod.cpod_id)
                began = time.perf_counter()
                response = await call(
                    client, "POST", f"{API}/jobs", submit_errors, expect=201, json=body, headers=headers
                )
                if response is not None:
                    sent[response.json()["id"]] = (mode, began)
                await asyncio.sleep(plan.gap_s)
        await receipts.wait_for(list(sent), PLAIN_POLL_S + 10)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    scheduling = await asyncio.to_thread(scheduling_by_id, watch, list(sent))
    modes = []
    for mode, count in (("long-poll", len(long_cpods)), ("plain", len(plain_cpods))):
        ids = [j for j, (m, _) in sent.items() if m == mode]
        latencies = [(receipts.at[j] - sent[j][1]) * 1000 for j in ids if j in receipts.at]
        modes.append(
            ModeLatency(
                mode=mode,
                pollers=count,
                submitted=len(ids),
                received=len(latencies),
                latencies_ms=latencies,
                scheduling_ms=[scheduling[j] for j in ids if j in scheduling],
                polls=receipts.polls[mode],
            )
        )
    return Dispatch(modes, drained, errors, submit_errors)


def scheduling_by_id(watch: Watch, ids: list[str]) -> dict[str, float]:
    result: dict[str, float] = {}
    with watch.engine.connect() as conn:
        for start in range(0, len(ids), 500):
            rows = conn.execute(
                select(Job.id, Job.created_at, Job.assigned_at).where(Job.id.in_(ids[start : start + 500]))
            )
            for job_id, created, assigned in rows:
                if assigned is not None:
                    result[job_id] = (assigned - created).total_seconds() * 1000
    return result


# ---- one engine -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    cpods: int
    jobs: int
    users: int
    pollers: int
    single: int
    gap_s: float
    heartbeat_interval_s: float
    submit_workers: int
    stall_s: float
    seed: int
    profile: str  # "auto", "always" or "never"
    tmp: Path
    console: Console
    processes: Processes


@dataclass(frozen=True)
class EngineResult:
    engine: str
    register_s: float
    throughput: Throughput
    dispatch: Dispatch
    states: dict[str, int]
    background_heartbeats: int
    database_url: str = ""
    sqlite_path: Path | None = None


async def run_engine(plan: Plan, engine: str, database_url: str) -> EngineResult:
    console = plan.console
    data_dir = plan.tmp / engine
    port = free_port()
    console.print(f"[bold]{engine}[/]: starting sxwl serve on port {port}")
    # One log line per assignment would be part of the cost; the shipped default is INFO.
    cloud = CloudProcess(data_dir, port, cloud_env(database_url, log_level="WARNING"))
    plan.processes.add(cloud.stop)
    url = cloud.url
    resolved = Settings(data_dir=data_dir, database_url=database_url).resolved_database_url()
    watch = Watch(resolved)
    try:
        key, tokens = await asyncio.to_thread(accounts, url, plan.users)
        began = time.perf_counter()
        fleet = await register_fleet(url, key, plan.cpods, plan.heartbeat_interval_s)
        register_s = time.perf_counter() - began
        console.print(f"  registered {len(fleet):,} CPods in {register_s:.1f} s")
        hb_errors = Errors()
        online = asyncio.Event()

        async def heartbeating() -> None:
            await online.wait()
            await keep_heartbeating(url, fleet, plan.heartbeat_interval_s, hb_errors)

        heartbeats = asyncio.create_task(heartbeating())
        try:
            throughput = await measure_throughput(plan, url, fleet, tokens, watch, hb_errors, online)
            beats_before = sum(c.seq for c in fleet)
            dispatch = await measure_dispatch(plan, url, fleet, tokens, watch)
        finally:
            heartbeats.cancel()
            await asyncio.gather(heartbeats, return_exceptions=True)
        states = await asyncio.to_thread(watch.states)
        background = sum(c.seq for c in fleet) - beats_before
    finally:
        watch.close()
    cloud.stop()
    sqlite_path = data_dir / "sxwl.db" if not database_url else None
    return EngineResult(engine, register_s, throughput, dispatch, states, background, resolved, sqlite_path)


# ---- profiling one scheduler pass -----------------------------------------------------------------------


@dataclass(frozen=True)
class PassProfile:
    engine: str
    queued: int
    assigned: int
    one_job_pass_ms: float  # a pass that places one job, with the benchmark's active jobs in place
    capacity_ms: float  # bringing the capacity cache up to date (CPod versions, active job attempts)
    seconds: float
    profiled_seconds: float
    top_self: list[tuple[str, float, int]]  # function, seconds, calls
    top_cumulative: list[tuple[str, float, int]]

    @property
    def per_s(self) -> float:
        return self.assigned / self.seconds if self.seconds > 0 else 0.0


def short_name(key: tuple[str, int, str]) -> str:
    filename, line, name = key
    if filename == "~":
        return name
    for marker in ("/sxwl/", "/sqlalchemy/", "/site-packages/", "/lib/python"):
        if marker in filename:
            filename = filename.split(marker, 1)[1]
            break
    return f"{name} ({filename}:{line})"


# Library entry points whose inclusive time says what the scheduler's own calls cost.
CUMULATIVE_FRAMES = (
    ("orm/session.py", "execute"),
    ("orm/session.py", "scalars"),
    ("orm/session.py", "flush"),
    ("orm/session.py", "commit"),
    ("orm/session.py", "add"),
    ("orm/loading.py", "instances"),
    ("engine/base.py", "_execute_context"),
    ("sql/elements.py", "_compile_w_cache"),
)


def worth_cumulative(key: tuple[str, int, str]) -> bool:
    filename, _, name = key
    if "/sxwl/" in filename:
        return name not in ("schedule_once", "_pass", "session", "<genexpr>", "<lambda>", "<listcomp>")
    return any(filename.endswith(path) and name == fn for path, fn in CUMULATIVE_FRAMES)


def requeue_all(ctx: CloudContext) -> int:
    """Puts every job back in the queue as if never assigned, and forgets the attempts."""
    with ctx.db.session() as session:
        session.execute(delete(JobAttempt))
        session.execute(
            update(Job).values(
                state=JobState.QUEUED,
                attempt=0,
                cpod_id=None,
                node_names=[],
                assigned_at=None,
                started_at=None,
                finished_at=None,
                exit_code=None,
                reason="waiting for the scheduler",
            )
        )
        return int(session.scalar(select(func.count()).select_from(Job)) or 0)


def one_job_passes(ctx: CloudContext, count: int) -> tuple[list[float], list[float]]:
    """Seconds of ``count`` passes that each place one job (queued again) while every other job of
    the benchmark holds its GPUs, as in the latency run; and of as many refreshes of the (warm)
    capacity cache, the part of such a pass that grows with the fleet and the active jobs."""
    passes, reads = [], []
    for _ in range(count):
        cache = ctx.capacity
        with ctx.db.session() as session, cache.lock:
            began = time.perf_counter()
            cache.refresh(session)
            reads.append(time.perf_counter() - began)
            job_id = session.scalar(select(Job.id).where(Job.state == JobState.ASSIGNED).limit(1))
            if job_id is None:
                continue
            session.execute(
                update(Job)
                .where(Job.id == job_id)
                .values(state=JobState.QUEUED, cpod_id=None, node_names=[], assigned_at=None)
            )
        began = time.perf_counter()
        scheduler.schedule_once(ctx)
        passes.append(time.perf_counter() - began)
    return passes, reads


def clone_database(result: EngineResult, work: Path) -> str:
    """A copy of the database a run left behind (its server stopped), to profile on."""
    work.mkdir(parents=True, exist_ok=True)
    if result.sqlite_path is not None:
        copy = work / "profile.db"
        with sqlite3.connect(result.sqlite_path) as src, sqlite3.connect(copy) as dst:
            src.backup(dst)
        return f"sqlite:///{copy}"
    url = make_url(result.database_url)
    name = f"{url.database}_profile"
    admin = url.set(drivername="postgresql", database="postgres").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{url.database}"')
    return url.set(database=name).render_as_string(hide_password=False)


def profile_pass(engine: str, database_url: str, work: Path, batch: int) -> PassProfile:
    """One ``schedule_once`` over a copy of the benchmark's database (CPods online, every job queued
    again): timed plainly, then again under cProfile."""
    settings = Settings(
        data_dir=work,
        database_url=database_url,
        secret_key=SECRET_KEY,
        scheduler_batch=batch,
        log_level="WARNING",
    )
    ctx = CloudContext.from_settings(settings)
    try:
        small_passes, capacity_reads = one_job_passes(ctx, 5)
        queued = requeue_all(ctx)
        began = time.perf_counter()
        assigned = len(scheduler.schedule_once(ctx))
        seconds = time.perf_counter() - began
        requeue_all(ctx)
        profiler = cProfile.Profile()
        began = time.perf_counter()
        profiler.enable()
        scheduler.schedule_once(ctx)
        profiler.disable()
        profiled = time.perf_counter() - began
    finally:
        ctx.db.dispose()
    stats = pstats.Stats(profiler, stream=io.StringIO())
    entries: dict[tuple[str, int, str], tuple[int, int, float, float, Any]] = stats.stats  # type: ignore[attr-defined]
    by_self = sorted(entries.items(), key=lambda kv: kv[1][2], reverse=True)[:12]
    by_cum = sorted(
        ((k, v) for k, v in entries.items() if worth_cumulative(k)), key=lambda kv: kv[1][3], reverse=True
    )[:14]
    return PassProfile(
        engine=engine,
        queued=min(queued, batch),
        assigned=assigned,
        one_job_pass_ms=statistics.median(small_passes) * 1000 if small_passes else float("nan"),
        capacity_ms=statistics.median(capacity_reads) * 1000,
        seconds=seconds,
        profiled_seconds=profiled,
        top_self=[(short_name(k), v[2], v[1]) for k, v in by_self],
        top_cumulative=[(short_name(k), v[3], v[1]) for k, v in by_cum],
    )


# ---- report ---------------------------------------------------------------------------------------------


def ms(value: float) -> str:
    if value != value:
        return "n/a"
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def verdict(ok: bool) -> str:
    return "meets" if ok else "misses"


def print_tables(
    console: Console, plan: Plan, results: list[EngineResult], profiles: list[PassProfile]
) -> None:
    table = Table(
        title=f"Scheduling throughput: {plan.jobs:,} queued jobs, {plan.cpods:,} CPods come online",
        title_justify="left",
    )
    columns = ("engine", "submit/s", "assigned", "assign/s first→last", "first→last s", "online→all seen s")
    for column in (*columns, f"≥ {TARGET_ASSIGN_PER_S:.0f}/s"):
        table.add_column(column, justify="left" if column == "engine" else "right")
    for r in results:
        t = r.throughput
        table.add_row(
            r.engine,
            f"{t.submit.per_s:.0f}",
            f"{t.assigned:,} / {t.jobs:,}",
            f"{t.per_s:.0f}",
            f"{t.span_s:.1f}",
            f"{t.observed_s:.1f}",
            verdict(t.per_s >= TARGET_ASSIGN_PER_S),
        )
    console.print(table)

    table = Table(
        title=f"Submit-to-agent latency: {plan.single} jobs one at a time, {plan.gap_s:g} s apart",
        title_justify="left",
    )
    for column in (
        "engine",
        "agent polls",
        "received",
        "p50 ms",
        "p90 ms",
        "p99 ms",
        "max ms",
        "scheduled p50 ms",
        "scheduled p90 ms",
    ):
        table.add_column(column, justify="left" if column in ("engine", "agent polls") else "right")
    table.add_column(f"p50 < {TARGET_P50_MS:.0f} ms", justify="right")
    for r in results:
        for m in r.dispatch.modes:
            p50 = percentile(m.latencies_ms, 50)
            table.add_row(
                r.engine,
                describe_mode(m),
                f"{m.received} / {m.submitted}",
                ms(p50),
                ms(percentile(m.latencies_ms, 90)),
                ms(percentile(m.latencies_ms, 99)),
                ms(max(m.latencies_ms, default=float("nan"))),
                ms(percentile(m.scheduling_ms, 50)),
                ms(percentile(m.scheduling_ms, 90)),
                verdict(p50 < TARGET_P50_MS) if m.mode == "long-poll" else "",
            )
    console.print(table)
    for r in results:
        problems = [
            f"{name}: {e.count} ({e.samples[0]})"
            for name, e in (
                ("submit", r.throughput.submit.errors),
                ("single submit", r.dispatch.submit_errors),
                ("agent calls", r.dispatch.errors),
            )
            if e.count
        ]
        beats = r.throughput.heartbeat_errors
        if beats.count:
            problems.append(f"heartbeats: {beats.count} ({beats.samples[0]})")
        if r.throughput.reassigned:
            problems.append(f"{r.throughput.reassigned} jobs were lost and assigned again")
        if problems:
            console.print(f"[yellow]{r.engine} errors[/]: " + "; ".join(problems))
    for profile in profiles:
        print_profile(console, profile)


def describe_mode(m: ModeLatency) -> str:
    if m.mode == "long-poll":
        return f"{m.pollers} × long-poll wait={LONG_POLL_S:g}"
    return f"{m.pollers} × wait=0 every {PLAIN_POLL_S:g} s"


def print_profile(console: Console, profile: PassProfile) -> None:
    console.print(
        f"[bold]{profile.engine}[/]: one scheduler pass in-process over {profile.queued:,} queued jobs: "
        f"{profile.assigned:,} assigned in {profile.seconds:.2f} s ({profile.per_s:.0f}/s); "
        f"{profile.profiled_seconds:.2f} s under cProfile"
    )
    console.print(
        f"A pass placing one job among the benchmark's active jobs: median {profile.one_job_pass_ms:.0f} ms, "
        f"of which refreshing capacity {profile.capacity_ms:.0f} ms"
    )
    for title, rows in (
        ("self time (where the CPU goes)", profile.top_self),
        ("inclusive time: sxwl functions and SQLAlchemy entry points", profile.top_cumulative),
    ):
        table = Table(title=f"{profile.engine} scheduler pass, {title}", title_justify="left")
        table.add_column("function")
        table.add_column("s", justify="right")
        table.add_column("share", justify="right")
        table.add_column("calls", justify="right")
        for name, seconds, calls in rows:
            share = seconds / profile.profiled_seconds if profile.profiled_seconds else 0.0
            table.add_row(name, f"{seconds:.2f}", f"{share:.0%}", f"{calls:,}")
        console.print(table)


def markdown_section(
    plan: Plan,
    results: list[EngineResult],
    profiles: list[PassProfile],
    loads: tuple[tuple[float, float, float], tuple[float, float, float]],
) -> str:
    now = utc_now()
    lines = [
        f"## Scheduling: {now}",
        "",
        "`bench/scheduling.py`: a real `sxwl serve` (log level WARNING); simulated CPods and users "
        "talk to it over loopback HTTP from one asyncio process, which shares the CPUs with it.",
        "",
        machine_line(),
        f"- Python {platform.python_version()}",
        f"- 1-minute load average: {loads[0][0]:.2f} before the run, {loads[1][0]:.2f} after it "
        "(the latter includes its own load; other work on the machine skews the figures)",
        f"- fleet: {plan.cpods:,} CPods × {NODES_PER_CPOD} nodes × {GPUS_PER_NODE} {GPU_PRODUCT}, "
        f"heartbeating every {plan.heartbeat_interval_s:g} s once online",
        f"- throughput: {plan.jobs:,} jobs from {plan.users} users ({plan.submit_workers} submitting "
        "clients), shapes 1/2/4/8 GPUs on one node and 2 × 8 GPUs, weights "
        f"{'/'.join(str(w) for *_, w in JOB_SHAPES)}; submitted while no CPod is online, then every CPod "
        "comes online with one heartbeat; assign/s = (assigned − 1) / (last − first `assigned_at`)",
        f"- latency: {plan.pollers} CPods long-poll (wait={LONG_POLL_S:g}) and {plan.pollers} poll with "
        f"wait=0 every {PLAIN_POLL_S:g} s; {plan.single} one-GPU jobs submitted one at a time "
        f"{plan.gap_s:g} s apart, pinned in turn to one of each; measured from sending the POST to the "
        'agent holding the assignment; every assignment acknowledged (`starting`); "scheduled" = '
        "`assigned_at − created_at`",
        "",
        "| engine | submit/s | assigned | assign/s first→last | first→last s | online→all seen s "
        f"| ≥ {TARGET_ASSIGN_PER_S:.0f}/s |",
        "|---|--:|--:|--:|--:|--:|---|",
    ]
    for r in results:
        t = r.throughput
        lines.append(
            f"| {r.engine} | {t.submit.per_s:.0f} | {t.assigned:,} / {t.jobs:,} | {t.per_s:.0f} | "
            f"{t.span_s:.1f} | {t.observed_s:.1f} | {verdict(t.per_s >= TARGET_ASSIGN_PER_S)} |"
        )
    lines += [
        "",
        "| engine | agent polls | received | p50 ms | p90 ms | p99 ms | max ms | scheduled p50 ms "
        f"| scheduled p90 ms | p50 < {TARGET_P50_MS:.0f} ms |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    for r in results:
        for m in r.dispatch.modes:
            p50 = percentile(m.latencies_ms, 50)
            lines.append(
                f"| {r.engine} | {describe_mode(m)} | {m.received} / {m.submitted} | {ms(p50)} | "
                f"{ms(percentile(m.latencies_ms, 90))} | {ms(percentile(m.latencies_ms, 99))} | "
                f"{ms(max(m.latencies_ms, default=float('nan')))} | {ms(percentile(m.scheduling_ms, 50))} | "
                f"{ms(percentile(m.scheduling_ms, 90))} | "
                f"{verdict(p50 < TARGET_P50_MS) if m.mode == 'long-poll' else ''} |"
            )
    errors = []
    for r in results:
        counts = (
            r.throughput.submit.errors.count,
            r.dispatch.submit_errors.count,
            r.dispatch.errors.count,
            r.throughput.heartbeat_errors.count,
        )
        errors.append(f"{r.engine} {sum(counts)}")
    lines += ["", "Errors (submits, agent calls, heartbeats): " + ", ".join(errors) + "."]
    again = [f"{r.engine} {r.throughput.reassigned}" for r in results if r.throughput.reassigned]
    if again:
        lines.append("Jobs lost and assigned again during the throughput run: " + ", ".join(again) + ".")
    for profile in profiles:
        lines += [
            "",
            f"**{profile.engine}**: one scheduler pass in-process (a copy of the database, CPods online, "
            "every job queued again, batch "
            f"{profile.queued:,}): {profile.assigned:,} assigned in {profile.seconds:.2f} s "
            f"({profile.per_s:.0f}/s). A pass placing one job while the benchmark's other jobs hold their "
            f"GPUs (as in the latency run): median {profile.one_job_pass_ms:.0f} ms, of which refreshing "
            f"the capacity cache {profile.capacity_ms:.0f} ms. Top self time of the big pass under cProfile "
            f"({profile.profiled_seconds:.2f} s):",
            "",
            "| function | s | share | calls |",
            "|---|--:|--:|--:|",
        ]
        for name, seconds, calls in profile.top_self[:10]:
            share = seconds / profile.profiled_seconds if profile.profiled_seconds else 0.0
            lines.append(f"| `{name}` | {seconds:.2f} | {share:.0%} | {calls:,} |")
        lines += [
            "",
            "Inclusive time of the scheduler's functions and the SQLAlchemy calls they make:",
            "",
            "| function | s | share | calls |",
            "|---|--:|--:|--:|",
        ]
        for name, seconds, calls in profile.top_cumulative[:8]:
            share = seconds / profile.profiled_seconds if profile.profiled_seconds else 0.0
            lines.append(f"| `{name}` | {seconds:.2f} | {share:.0%} | {calls:,} |")
    return "\n".join(lines) + "\n"


# ---- main ----------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--cpods", type=int, default=1000, help="simulated CPods (1000)")
    parser.add_argument("--jobs", type=int, default=10_000, help="jobs queued for the throughput run (10000)")
    parser.add_argument("--users", type=int, default=5, help="compute users submitting them (5)")
    parser.add_argument("--pollers", type=int, default=50, help="CPods per polling style (50)")
    parser.add_argument("--single", type=int, default=200, help="jobs for the latency run (200)")
    parser.add_argument("--gap", type=float, default=0.25, help="seconds between those submissions (0.25)")
    parser.add_argument("--heartbeat-interval", type=float, default=30.0, help="seconds (30)")
    parser.add_argument("--submit-workers", type=int, default=8, help="concurrent submitting clients (8)")
    parser.add_argument("--stall", type=float, default=60.0, help="give up after this long without progress")
    parser.add_argument("--engines", default=",".join(ENGINES), help="comma-separated: sqlite,postgresql")
    parser.add_argument(
        "--profile",
        choices=("auto", "always", "never"),
        default="auto",
        help="profile a scheduler pass per engine: auto = where it misses the assignment target",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-results", action="store_true", help="do not append to bench/RESULTS.md")
    args = parser.parse_args(argv)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if not engines or any(e not in ENGINES for e in engines):
        parser.error(f"--engines takes a comma-separated subset of {','.join(ENGINES)}")
    args.engines = engines
    if min(args.cpods, args.jobs, args.users, args.single, args.submit_workers) < 1 or args.pollers < 1:
        parser.error("counts must be at least 1")
    if args.cpods < 2 * args.pollers:
        parser.error("--cpods must be at least twice --pollers")
    if not 1 <= args.heartbeat_interval <= 300:
        parser.error("--heartbeat-interval must be within the cloud's bounds, 1..300 s")
    return args


async def run_all(plan: Plan, engines: list[str]) -> list[EngineResult]:
    results = []
    for engine in engines:
        if engine == "sqlite":
            results.append(await run_engine(plan, engine, ""))
        else:
            postgres = TempPostgres()
            plan.processes.add(postgres.stop)
            plan.console.print("[bold]postgresql[/]: starting a throwaway cluster")
            await asyncio.to_thread(postgres.start)
            results.append(await run_engine(plan, engine, postgres.create_database()))
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console()
    if not console.is_terminal:
        console = Console(width=140)
    load_before = os.getloadavg()
    processes = Processes()
    profiles: list[PassProfile] = []
    with interrupt_on_sigterm(), tempfile.TemporaryDirectory(prefix="sxwl-bench-") as tmp:
        plan = Plan(
            cpods=args.cpods,
            jobs=args.jobs,
            users=args.users,
            pollers=args.pollers,
            single=args.single,
            gap_s=args.gap,
            heartbeat_interval_s=args.heartbeat_interval,
            submit_workers=args.submit_workers,
            stall_s=args.stall,
            seed=args.seed,
            profile=args.profile,
            tmp=Path(tmp),
            console=console,
            processes=processes,
        )
        try:
            results = asyncio.run(run_all(plan, args.engines))
            batch = int(Settings.model_fields["scheduler_batch"].default)
            for result in results:
                short = result.throughput.per_s < TARGET_ASSIGN_PER_S
                if args.profile == "always" or (args.profile == "auto" and short):
                    console.print(f"{result.engine}: profiling one scheduler pass in-process on a copy")
                    work = Path(tmp) / f"profile-{result.engine}"
                    url = clone_database(result, work)
                    profiles.append(profile_pass(result.engine, url, work, batch))
        except KeyboardInterrupt:
            console.print("[red]interrupted[/]: stopping what was started")
            return 130
        finally:
            processes.stop_all()
    print_tables(console, plan, results, profiles)
    loads = (load_before, os.getloadavg())
    if not args.no_results:
        append_results(markdown_section(plan, results, profiles, loads))
        console.print(f"appended to {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
