"""Heartbeat throughput of a real ``sxwl serve``, on SQLite and on PostgreSQL.

Registers N simulated CPods (8 nodes x 8 GPUs each) and heartbeats them as fast as the cloud answers
from asyncio tasks (a lean keep-alive HTTP client, bench/rawhttp.py), or at a fixed offered rate
with ``--rate``.
Prints a table and appends a dated section to bench/RESULTS.md.
Run: ``.venv/bin/python bench/heartbeats.py [--cpods N] [--duration S] [--concurrency C]``.

``--py-spy PATH`` samples the server with py-spy (not a project dependency: ``pip install py-spy``
anywhere) during each measurement and prints where its time goes. ``--replicas N`` runs N
``sxwl serve`` processes on one database, each CPod talking to one of them, as uvicorn workers or
replicas behind a load balancer would (``sxwl serve`` has no ``--workers``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import random
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from bench.common import (  # noqa: E402
    API,
    PASSWORD,
    RESULTS,
    Processes,
    append_results,
    cloud_env,
    interrupt_on_sigterm,
    machine_line,
    percentile,
    utc_now,
)
from bench.rawhttp import RawConnection, RawHttpError  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from tests.support.cloud import CloudProcess  # noqa: E402
from tests.support.net import free_port  # noqa: E402
from tests.support.postgres import TempPostgres  # noqa: E402

PROVIDER_EMAIL = "provider@bench.example.com"
ENGINES = ("sqlite", "postgresql")

NODES_PER_CPOD = 8
GPUS_PER_NODE = 8
GPU_PRODUCT = "NVIDIA-A100-SXM4-80GB"
GPU_MEMORY_MIB = 81920

# The target for this 2-core machine.
TARGET_PER_S = 1000.0
TARGET_P99_MS = 100.0

CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


# ---- CPU accounting through /proc ----------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces; the fields after it start at "state" (field 3).
    return text.rsplit(")", 1)[1].split()


def process_tree(root: int) -> list[int]:
    """``root`` and its live descendants (empty where /proc is missing)."""
    children: dict[int, list[int]] = defaultdict(list)
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None:
            children[int(fields[1])].append(int(entry.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def cpu_seconds(roots: list[int]) -> float:
    """User + system CPU time of the processes under ``roots`` (nan without /proc): the live ones, and
    the children they have reaped (PostgreSQL's short-lived backends end up in the postmaster's)."""
    total, seen = 0.0, False
    for root in roots:
        for pid in process_tree(root):
            fields = _stat_fields(pid)
            if fields is not None:
                seen = True
                # utime, stime, cutime, cstime
                total += sum(int(fields[i]) for i in (11, 12, 13, 14)) / CLOCK_TICKS
    return total if seen else float("nan")


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Meter:
    """CPU seconds spent by the server processes, the database and this process over a window."""

    def __init__(self, server_roots: list[int], db_roots: list[int]) -> None:
        self.server_roots = server_roots
        self.db_roots = db_roots
        self._before = (0.0, 0.0, 0.0)
        self.server_s = self.db_s = self.client_s = float("nan")

    def _read(self) -> tuple[float, float, float]:
        db = cpu_seconds(self.db_roots) if self.db_roots else 0.0
        return cpu_seconds(self.server_roots), db, own_cpu_seconds()

    def start(self) -> None:
        self._before = self._read()

    def stop(self) -> None:
        after = self._read()
        self.server_s, self.db_s, self.client_s = (a - b for a, b in zip(after, self._before, strict=True))


def postmaster_pid(postgres: TempPostgres) -> int | None:
    try:
        return int((postgres.data / "postmaster.pid").read_text().splitlines()[0])
    except (OSError, ValueError, IndexError):
        return None


# ---- the simulated fleet ----------------------------------------------------------------------------


# Distinct GPU figures per CPod, cycled: each beat differs from the one before, and the load
# generator does not spend a JSON encoding per beat (it shares the cores with the server).
VARIANTS = 16


@dataclass
class SimCPod:
    index: int
    cpod_id: str
    token: str
    url: str
    gpu_uuids: list[list[str]]
    seq: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    variants: list[bytes] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}


def new_gpu_uuids(rng: random.Random) -> list[list[str]]:
    return [
        [f"GPU-{uuid.UUID(int=rng.getrandbits(128), version=4)}" for _ in range(GPUS_PER_NODE)]
        for _ in range(NODES_PER_CPOD)
    ]


def nodes_json(cpod: SimCPod, rng: random.Random) -> bytes:
    """One inventory of ``cpod`` with random utilization, memory used and temperature per GPU."""
    nodes: list[dict[str, Any]] = []
    for n in range(NODES_PER_CPOD):
        devices = [
            {
                "index": g,
                "uuid": cpod.gpu_uuids[n][g],
                "utilization_pct": rng.randint(0, 100),
                "memory_used_mib": rng.randint(0, GPU_MEMORY_MIB),
                "temperature_c": rng.randint(30, 85),
            }
            for g in range(GPUS_PER_NODE)
        ]
        nodes.append(
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
                    "used": rng.randint(0, GPUS_PER_NODE),
                    "driver": "550.54.15",
                    "cuda": "12.4",
                    "devices": devices,
                },
            }
        )
    return json.dumps(nodes, separators=(",", ":")).encode()


def heartbeat_body(cpod: SimCPod) -> bytes:
    """The next heartbeat of ``cpod``: seq + 1, and GPU figures that differ from the last beat's."""
    cpod.seq += 1
    return b'{"seq":%d,"nodes":%s}' % (cpod.seq, cpod.variants[cpod.seq % len(cpod.variants)])


def provider_access_key(url: str) -> str:
    with httpx.Client(base_url=url, timeout=60) as client:
        body = {"email": PROVIDER_EMAIL, "password": PASSWORD, "role": "provider"}
        response = client.post(f"{API}/auth/register", json=body)
        if response.status_code != 201:
            raise RuntimeError(f"register provider: {response.status_code} {response.text}")
        response = client.post(f"{API}/auth/login", json={"email": PROVIDER_EMAIL, "password": PASSWORD})
        response.raise_for_status()
        token = response.json()["access_token"]
        response = client.get(f"{API}/me/access-key", headers={"Authorization": f"Bearer {token}"})
        response.raise_for_status()
        key: str = response.json()["access_key"]
        return key


def queue_unplaceable_jobs(url: str, count: int) -> None:
    """``count`` jobs of a compute user for a GPU product that no CPod has: they stay queued."""
    email = "user@bench.example.com"
    with httpx.Client(base_url=url, timeout=60) as client:
        body = {"email": email, "password": PASSWORD, "role": "user"}
        response = client.post(f"{API}/auth/register", json=body)
        if response.status_code != 201:
            raise RuntimeError(f"register user: {response.status_code} {response.text}")
        response = client.post(f"{API}/auth/login", json={"email": email, "password": PASSWORD})
        response.raise_for_status()
        headers = {"Authorization": f"Bearer {response.json()['access_token']}"}
        for index in range(count):
            job = {
                "name": f"bench-queued-{index}",
                "command": ["true"],
                "gpu_product": "BENCH-NO-SUCH-GPU",
                "gpus_per_node": 8,
            }
            response = client.post(f"{API}/jobs", json=job, headers=headers)
            if response.status_code != 201:
                raise RuntimeError(f"submit job: {response.status_code} {response.text}")


async def register_fleet(urls: list[str], access_key: str, count: int, rng: random.Random) -> list[SimCPod]:
    """Registers ``count`` CPods, spread over ``urls`` (each CPod keeps talking to its own)."""
    limits = httpx.Limits(max_connections=8)
    fleet: list[SimCPod] = []
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        gate = asyncio.Semaphore(8)

        async def register(index: int) -> SimCPod:
            url = urls[index % len(urls)]
            body = {"cluster_uid": f"bench-cluster-{index:06d}", "runtime": "local", "agent_version": "bench"}
            async with gate:
                response = await client.post(
                    f"{url}{API}/agent/register",
                    json=body,
                    headers={"Authorization": f"Bearer {access_key}"},
                )
            if response.status_code != 200:
                raise RuntimeError(f"register CPod {index}: {response.status_code} {response.text}")
            reply = response.json()
            cpod = SimCPod(index, reply["cpod_id"], reply["cpod_token"], url, new_gpu_uuids(rng))
            cpod.variants = [nodes_json(cpod, rng) for _ in range(VARIANTS)]
            return cpod

        fleet = list(await asyncio.gather(*(register(i) for i in range(count))))
    return fleet


# ---- the load -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Load:
    ok: int
    accepted: int
    errors: int
    elapsed_s: float
    latencies_ms: list[float]
    failures: list[str]

    @property
    def per_s(self) -> float:
        return self.ok / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def accepted_ratio(self) -> float:
        return self.accepted / self.ok if self.ok else float("nan")

    def percentile(self, q: int) -> float:
        return percentile(self.latencies_ms, q)


async def heartbeat_load(
    fleet: list[SimCPod],
    duration_s: float,
    concurrency: int,
    rate: float,
    on_start: Callable[[], None] = lambda: None,
    on_end: Callable[[], None] = lambda: None,
) -> Load:
    """``concurrency`` tasks, each owning a share of the CPods (so each CPod's heartbeats are sent in
    order, as by one agent) through its own keep-alive client. With ``rate`` > 0 each task paces
    itself to its share of the rate and latency counts from when a beat was due (no coordinated
    omission); otherwise each task sends its next beat as soon as the previous one is answered.
    ``on_start`` and ``on_end`` are called around the measured window, after the warm-up."""
    tasks = min(concurrency, len(fleet))
    shares = [fleet[i::tasks] for i in range(tasks)]
    latencies: list[float] = []
    failures: list[str] = []
    counts = Counter[str]()
    path = f"{API}/agent/heartbeat"
    # One keep-alive connection per task and server, as one agent has; the lean client keeps the load
    # generator's CPU per beat well below the server's on the shared cores.
    connections = [{url: RawConnection(url) for url in {c.url for c in share}} for share in shares]
    heads = {
        c.cpod_id: connections[t][c.url].head("POST", path, c.headers)
        for t in range(tasks)
        for c in shares[t]
    }
    async with AsyncExitStack() as stack:
        for by_url in connections:
            for connection in by_url.values():
                await stack.enter_async_context(connection)

        async def beat(t: int, cpod: SimCPod) -> float | None:
            """One heartbeat from task ``t``; when it was sent, or None when it failed."""
            body = heartbeat_body(cpod)
            began = time.perf_counter()
            try:
                status, answer = await connections[t][cpod.url].request(heads[cpod.cpod_id], body)
            except (OSError, RawHttpError) as exc:
                counts["errors"] += 1
                if len(failures) < 3:
                    failures.append(repr(exc))
                return None
            if status != 200:
                counts["errors"] += 1
                if len(failures) < 3:
                    failures.append(f"{status} {answer[:200]!r}")
                return None
            counts["ok"] += 1
            if b'"accepted":true' in answer:
                counts["accepted"] += 1
            return began

        # Warm-up, not measured: one beat per CPod (the first one records the "online" event) opens
        # the connections and fills the server's caches.
        async def warm(t: int) -> None:
            for cpod in shares[t]:
                await beat(t, cpod)

        await asyncio.gather(*(warm(t) for t in range(tasks)))
        counts.clear()
        failures.clear()

        on_start()
        start = time.perf_counter()
        deadline = start + duration_s
        period = tasks / rate if rate > 0 else 0.0

        async def worker(t: int) -> None:
            share = shares[t]
            due = start + period * t / tasks
            i = 0
            while True:
                if period:
                    if due >= deadline:
                        return
                    now = time.perf_counter()
                    if due > now:
                        await asyncio.sleep(due - now)
                elif time.perf_counter() >= deadline:
                    return
                sent = await beat(t, share[i % len(share)])
                i += 1
                if sent is not None:
                    latencies.append((time.perf_counter() - (due if period else sent)) * 1000)
                due += period

        await asyncio.gather(*(worker(t) for t in range(tasks)))
        elapsed = time.perf_counter() - start
        on_end()
    return Load(counts["ok"], counts["accepted"], counts["errors"], elapsed, latencies, failures)


# ---- profiling with py-spy ----------------------------------------------------------------------------


def start_py_spy(py_spy: str, pid: int, duration_s: float, output: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [
            py_spy,
            "record",
            "--pid",
            str(pid),
            "--rate",
            "200",
            "--duration",
            str(max(1, math.ceil(duration_s))),
            "--format",
            "raw",
            "--nolineno",
            "--nonblocking",
            "--gil",
            "--output",
            str(output),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


# Where a sampled frame's file lies, checked in order.
CATEGORIES = (
    ("sxwl/cloud/kit/logs.py", "logging (sxwl JSON logs)"),
    ("/logging/", "logging (sxwl JSON logs)"),
    ("sxwl/cloud/edge/middleware.py", "sxwl middleware (metrics, body limit)"),
    ("prometheus_client/", "sxwl middleware (metrics, body limit)"),
    ("sxwl/", "sxwl code"),
    ("sqlalchemy/", "SQLAlchemy"),
    ("psycopg", "psycopg"),
    ("sqlite3/", "sqlite3"),
    ("pydantic", "pydantic"),
    ("fastapi/", "FastAPI"),
    ("starlette/", "Starlette"),
    ("anyio/", "anyio (thread pool)"),
    ("uvicorn/", "uvicorn / h11"),
    ("h11/", "uvicorn / h11"),
    ("httptools", "uvicorn / h11"),
    ("/json/", "json"),
    ("asyncio/", "asyncio"),
    ("concurrent/", "threads"),
    ("threading.py", "threads"),
)


# Library frames worth their inclusive share next to the project's own (whose file is under sxwl/).
STAGE_FRAMES = (
    "H11Protocol.data_received",
    "Request.body (starlette",
    "Request.json (starlette",
    "solve_dependencies (fastapi",
    "request_body_to_args (fastapi",
    "serialize_response (fastapi",
    "run_in_threadpool (starlette",
    "Session.commit (sqlalchemy",
    "Session.close (sqlalchemy",
    "Session.__exit__ (sqlalchemy",
    "Pool.connect (sqlalchemy",
    "_JsonLoader.load (psycopg",
    "_JsonDumper.dump (psycopg",
    "JSONFormatter.format",
    "BaseModel.model_dump (pydantic",
)


def frame_category(frame: str) -> str:
    for needle, name in CATEGORIES:
        if needle in frame:
            return name
    return "other"


@dataclass(frozen=True)
class Profile:
    samples: int
    self_by_category: list[tuple[str, int]]
    self_by_function: list[tuple[str, int]]
    inclusive_by_function: list[tuple[str, int]]


def read_profile(path: Path, top: int = 20) -> Profile | None:
    """Aggregates py-spy's collapsed stacks (``frame;frame;... count``): self samples by category and
    function (where the CPU was), and inclusive samples by function (what it was done for)."""
    if not path.exists():
        return None
    total = 0
    by_category: Counter[str] = Counter()
    self_counts: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [short_frame(f) for f in stack.split(";")]
        if not frames:
            continue
        total += count
        self_counts[frames[-1]] += count
        by_category[frame_category(stack.split(";")[-1])] += count
        for frame in set(frames):
            inclusive[frame] += count
    if total == 0:
        return None
    return Profile(
        total,
        by_category.most_common(),
        self_counts.most_common(top),
        [(f, c) for f, c in inclusive.most_common() if is_stage(f)][:top],
    )


def is_stage(frame: str) -> bool:
    """The project's own frames below the CLI's, and the library stages named above."""
    if "(sxwl/cli/" in frame:
        return False
    return "(sxwl/" in frame or any(needle in frame for needle in STAGE_FRAMES)


def short_frame(frame: str) -> str:
    """``run (/x/site-packages/uvicorn/server.py)`` → ``run (uvicorn/server.py)``."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    for marker in ("site-packages/", "/src/", "/lib/python3"):
        if marker in where:
            where = where.split(marker, 1)[1]
            if marker == "/lib/python3":
                where = where.split("/", 1)[1] if "/" in where else where
            break
    return f"{name} ({where})" if where else name


def print_profile(console: Console, engine: str, profile: Profile) -> None:
    console.print(f"[bold]{engine}[/]: py-spy, {profile.samples} samples of the thread holding the GIL")
    table = Table(title=f"{engine}: where the server's CPU goes (self samples)", title_justify="left")
    table.add_column("category")
    table.add_column("share", justify="right")
    for name, count in profile.self_by_category:
        table.add_row(name, f"{100 * count / profile.samples:.1f} %")
    console.print(table)
    for title, rows in (
        ("hottest functions (self)", profile.self_by_function),
        ("project code and stages of a request (inclusive)", profile.inclusive_by_function),
    ):
        table = Table(title=f"{engine}: {title}", title_justify="left")
        table.add_column("function")
        table.add_column("share", justify="right")
        for frame, count in rows:
            table.add_row(frame, f"{100 * count / profile.samples:.1f} %")
        console.print(table)


# ---- one engine ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    cpods: int
    duration_s: float
    concurrency: int
    rate: float
    replicas: int
    log_level: str
    queued_jobs: int
    py_spy: str | None
    profile_dir: Path
    workdir: Path
    console: Console
    processes: Processes


@dataclass(frozen=True)
class EngineResult:
    engine: str
    load: Load
    server_cpu_s: float
    db_cpu_s: float
    client_cpu_s: float
    online: int
    gpus_seen: int
    profile: Profile | None

    def ms_per_beat(self, cpu_s: float) -> float:
        return 1000 * cpu_s / self.load.ok if self.load.ok else float("nan")


def fleet_state(url: str) -> tuple[int, int]:
    """How many CPods the provider sees online, and the GPUs it sees in all."""
    with httpx.Client(base_url=url, timeout=120) as client:
        response = client.post(f"{API}/auth/login", json={"email": PROVIDER_EMAIL, "password": PASSWORD})
        response.raise_for_status()
        headers = {"Authorization": f"Bearer {response.json()['access_token']}"}
        response = client.get(f"{API}/cpods", headers=headers)
        response.raise_for_status()
        rows = response.json()
    online = sum(1 for row in rows if row["status"] == "online")
    gpus = sum(g["total"] for row in rows for g in row["gpu_summary"])
    return online, gpus


def measure_engine(plan: Plan, engine: str, database_url: str, db_pid: int | None) -> EngineResult:
    console = plan.console
    console.print(f"[bold]{engine}[/]: starting {plan.replicas} cloud process(es)")
    env = cloud_env(database_url, plan.log_level)
    clouds: list[CloudProcess] = []
    for replica in range(plan.replicas):
        # One after the other: the first applies the migrations.
        cloud = CloudProcess(plan.workdir / f"{engine}-{replica}", free_port(), env)
        plan.processes.add(cloud.stop)
        clouds.append(cloud)
    try:
        urls = [cloud.url for cloud in clouds]
        access_key = provider_access_key(urls[0])
        console.print(f"[bold]{engine}[/]: registering {plan.cpods} CPods")
        fleet = asyncio.run(register_fleet(urls, access_key, plan.cpods, random.Random(0)))
        if plan.queued_jobs:
            console.print(f"[bold]{engine}[/]: queueing {plan.queued_jobs} jobs that no CPod can take")
            queue_unplaceable_jobs(urls[0], plan.queued_jobs)
        pace = f"at {plan.rate:g}/s offered" if plan.rate > 0 else "as fast as answered"
        console.print(
            f"[bold]{engine}[/]: heartbeats {pace}, {min(plan.concurrency, plan.cpods)} tasks × "
            f"{plan.duration_s:g} s ({NODES_PER_CPOD} nodes × {GPUS_PER_NODE} GPUs each)"
        )
        meter = Meter([cloud.proc.pid for cloud in clouds], [db_pid] if db_pid else [])
        profile_path = plan.profile_dir / f"heartbeats-{engine}.txt"
        spy: list[subprocess.Popen[bytes]] = []

        def on_start() -> None:
            meter.start()
            if plan.py_spy:
                profile_path.unlink(missing_ok=True)
                spy.append(start_py_spy(plan.py_spy, clouds[0].proc.pid, plan.duration_s, profile_path))
                plan.processes.add(lambda: _stop_spy(spy[0]))

        load = asyncio.run(
            heartbeat_load(fleet, plan.duration_s, plan.concurrency, plan.rate, on_start, meter.stop)
        )
        if load.failures:
            console.print(f"[yellow]warning[/]: {load.errors} failed heartbeats, e.g. {load.failures}")
        profile = None
        if spy:
            _, err = spy[0].communicate(timeout=plan.duration_s + 60)
            profile = read_profile(profile_path)
            if profile is None:
                console.print(f"[yellow]py-spy recorded nothing[/]: {err.decode()[-500:]}")
            else:
                console.print(f"[bold]{engine}[/]: profile in {profile_path}")
        online, gpus = fleet_state(urls[0])
    finally:
        for cloud in clouds:
            cloud.stop()
    return EngineResult(engine, load, meter.server_s, meter.db_s, meter.client_s, online, gpus, profile)


def _stop_spy(spy: subprocess.Popen[bytes]) -> None:
    if spy.poll() is None:
        spy.terminate()
        spy.wait(10)


# ---- report -------------------------------------------------------------------------------------------


def verdict(result: EngineResult) -> str:
    load = result.load
    rate_ok = load.per_s >= TARGET_PER_S
    p99_ok = load.percentile(99) < TARGET_P99_MS
    met = "met" if rate_ok and p99_ok else "not met"
    return (
        f"{met}: {load.per_s:.0f}/s is {load.per_s / TARGET_PER_S:.2f}× the {TARGET_PER_S:.0f}/s target, "
        f"p99 {load.percentile(99):.0f} ms vs < {TARGET_P99_MS:.0f} ms"
    )


def ceiling(result: EngineResult, replicas: int) -> float:
    """Heartbeats/s this machine could serve without the load generator, at the measured CPU per beat:
    a GIL-bound server process uses at most about one core, and server and database share the CPUs."""
    if not result.load.ok:
        return float("nan")
    server = result.server_cpu_s / result.load.ok
    both = server + max(result.db_cpu_s, 0.0) / result.load.ok
    if server <= 0:
        return float("nan")
    return min(replicas / server, (os.cpu_count() or 1) / both)


def source_revision() -> str:
    """The commit measured, and whether src/ had uncommitted changes."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--", "src"],
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{commit} (src/ with uncommitted changes)" if dirty else commit


ROW_HEADERS = (
    "engine",
    "heartbeats/s",
    "p50 ms",
    "p99 ms",
    "errors",
    "accepted",
    "server CPU ms/beat",
    "DB CPU ms/beat",
    "client CPU ms/beat",
    "online / GPUs seen",
)


def row(result: EngineResult) -> list[str]:
    load = result.load
    return [
        result.engine,
        f"{load.per_s:.0f}",
        f"{load.percentile(50):.1f}",
        f"{load.percentile(99):.1f}",
        str(load.errors),
        f"{100 * load.accepted_ratio:.1f} %",
        f"{result.ms_per_beat(result.server_cpu_s):.2f}",
        f"{result.ms_per_beat(result.db_cpu_s):.2f}" if result.engine == "postgresql" else "-",
        f"{result.ms_per_beat(result.client_cpu_s):.2f}",
        f"{result.online} / {result.gpus_seen}",
    ]


def print_table(console: Console, plan: Plan, results: list[EngineResult]) -> None:
    table = Table(
        title=f"Heartbeats: {plan.cpods} CPods × {NODES_PER_CPOD} nodes × {GPUS_PER_NODE} GPUs",
        title_justify="left",
    )
    for header in ROW_HEADERS:
        table.add_column(header, justify="left" if header == "engine" else "right")
    for result in results:
        table.add_row(*row(result))
    console.print(table)
    for result in results:
        console.print(
            f"{result.engine}: target {verdict(result)}; without the load generator ≈ "
            f"{ceiling(result, plan.replicas):.0f}/s at this CPU per beat"
        )
        if result.profile is not None:
            print_profile(console, result.engine, result.profile)


def summary(plan: Plan, result: EngineResult) -> dict[str, Any]:
    load = result.load
    return {
        "engine": result.engine,
        "cpods": plan.cpods,
        "tasks": min(plan.concurrency, plan.cpods),
        "replicas": plan.replicas,
        "queued_jobs": plan.queued_jobs,
        "rate": plan.rate,
        "heartbeats_per_s": round(load.per_s, 1),
        "p50_ms": round(load.percentile(50), 1),
        "p99_ms": round(load.percentile(99), 1),
        "errors": load.errors,
        "accepted_ratio": round(load.accepted_ratio, 4),
        "server_cpu_ms_per_beat": round(result.ms_per_beat(result.server_cpu_s), 3),
        "db_cpu_ms_per_beat": round(result.ms_per_beat(result.db_cpu_s), 3),
        "client_cpu_ms_per_beat": round(result.ms_per_beat(result.client_cpu_s), 3),
        "ceiling_without_load_generator_per_s": round(ceiling(result, plan.replicas), 1),
        "online": result.online,
        "gpus_seen": result.gpus_seen,
    }


def markdown_section(plan: Plan, results: list[EngineResult], loads: tuple[Any, Any]) -> str:
    now = utc_now()
    pace = (
        f"offered at {plan.rate:g}/s in all"
        if plan.rate > 0
        else "each sent as soon as the last was answered"
    )
    tasks = min(plan.concurrency, plan.cpods)
    lines = [
        f"## Heartbeats — {now}",
        "",
        "`bench/heartbeats.py`: one `sxwl serve` per engine"
        + (
            f" ({plan.replicas} replicas on one database, CPods spread over them)"
            if plan.replicas > 1
            else ""
        )
        + f", a provider registered through the REST API, {plan.cpods} CPods registered through "
        f"`POST /api/v1/agent/register`, then `POST /api/v1/agent/heartbeat` from {tasks} asyncio tasks "
        f"(a lean keep-alive HTTP/1.1 client, `bench/rawhttp.py`), {pace}. Each heartbeat carries "
        f"{NODES_PER_CPOD} nodes × {GPUS_PER_NODE} {GPU_PRODUCT} with per-GPU utilization, memory and "
        f"temperature that change on every beat ({VARIANTS} pre-encoded variants per CPod, cycled; ≈10 KB "
        "of JSON); each CPod's beats go in order with a rising seq. One warm-up beat "
        "per CPod is not counted.",
        "",
        machine_line(),
        f"- Python {platform.python_version()}; server log level {plan.log_level}; sxwl at "
        f"{source_revision()}",
        f"- 1-minute load average: {loads[0][0]:.2f} before the run, {loads[1][0]:.2f} after it (the "
        "latter includes the run itself; anything above ~2 before it means other work shared the cores)",
        f"- load: {plan.duration_s:g} s per engine; latency is measured by the client, from "
        + ("when a beat was due" if plan.rate > 0 else "sending to the answer"),
        "- **the load generator runs on the same cores as the server** (and PostgreSQL): CPU per beat "
        "below is measured from /proc for each side, so the split is visible",
    ]
    if plan.queued_jobs:
        lines.append(
            f"- {plan.queued_jobs} jobs queued for a GPU product no CPod has, so every scheduling pass "
            "(woken by accepted heartbeats) reads every CPod's nodes"
        )
    if plan.py_spy:
        lines.append("- the server was sampled by py-spy (200 Hz, non-blocking, GIL holder) during the run")
    lines += [
        "",
        "| " + " | ".join(ROW_HEADERS) + " |",
        "|---|" + "--:|" * (len(ROW_HEADERS) - 1),
    ]
    lines += ["| " + " | ".join(row(result)) + " |" for result in results]
    lines.append("")
    for result in results:
        lines.append(
            f"- {result.engine}: target (≥ {TARGET_PER_S:.0f}/s on PostgreSQL at p99 < "
            f"{TARGET_P99_MS:.0f} ms) {verdict(result)}. Without the load generator, at this CPU per "
            f"beat, the machine could serve ≈ {ceiling(result, plan.replicas):.0f}/s "
            f"({plan.replicas} GIL-bound server process{'es' if plan.replicas > 1 else ''})."
        )
        if result.profile is not None:
            shares = ", ".join(
                f"{name} {100 * count / result.profile.samples:.0f} %"
                for name, count in result.profile.self_by_category[:8]
            )
            lines.append(f"  - py-spy, where the server's CPU went: {shares}")
    if len(results) == 2:
        a, b = results
        if a.load.per_s > 0:
            lines.append(f"- {b.engine}/{a.engine}: {b.load.per_s / a.load.per_s:.2f}× the heartbeats/s.")
    return "\n".join(lines) + "\n"


# ---- main ---------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--cpods", type=int, default=200, help="simulated CPods (200)")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds per engine (15)")
    parser.add_argument("--concurrency", type=int, default=32, help="asyncio tasks sending beats (32)")
    parser.add_argument(
        "--engines", default=",".join(ENGINES), help="comma-separated: sqlite,postgresql (both)"
    )
    parser.add_argument(
        "--rate", type=float, default=0.0, help="offered heartbeats/s in all; 0: as fast as answered (0)"
    )
    parser.add_argument("--replicas", type=int, default=1, help="sxwl serve processes on one database (1)")
    parser.add_argument("--log-level", default="INFO", help="server log level (INFO, as shipped)")
    parser.add_argument(
        "--queued-jobs",
        type=int,
        default=0,
        help="jobs left queued (a GPU product no CPod has), so every scheduling pass reads all CPods (0)",
    )
    parser.add_argument("--py-spy", metavar="PATH", help="sample the server with this py-spy binary")
    parser.add_argument(
        "--profile-dir", type=Path, default=None, help="where py-spy's stacks go (a temp dir)"
    )
    parser.add_argument("--no-record", action="store_true", help="do not append to bench/RESULTS.md")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if not engines or any(e not in ENGINES for e in engines):
        parser.error(f"--engines: expected some of {','.join(ENGINES)}, got {args.engines!r}")
    args.engines = engines
    if args.queued_jobs < 0:
        parser.error("--queued-jobs must be at least 0")
    if args.duration <= 0 or args.concurrency < 1 or args.cpods < 1 or args.replicas < 1 or args.rate < 0:
        parser.error("--duration must be positive, --cpods/--concurrency/--replicas at least 1, --rate ≥ 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console()
    if not console.is_terminal:
        console = Console(width=150)
    load_before = os.getloadavg()
    processes = Processes()
    results: list[EngineResult] = []
    with interrupt_on_sigterm(), tempfile.TemporaryDirectory(prefix="sxwl-bench-") as tmp:
        profile_dir: Path = args.profile_dir or Path(tmp)
        profile_dir.mkdir(parents=True, exist_ok=True)
        plan = Plan(
            cpods=args.cpods,
            duration_s=args.duration,
            concurrency=args.concurrency,
            rate=args.rate,
            replicas=args.replicas,
            log_level=args.log_level,
            queued_jobs=args.queued_jobs,
            py_spy=args.py_spy,
            profile_dir=profile_dir,
            workdir=Path(tmp),
            console=console,
            processes=processes,
        )
        try:
            for engine in args.engines:
                if engine == "sqlite":
                    results.append(measure_engine(plan, engine, "", None))
                    continue
                postgres = TempPostgres(durable=True)
                processes.add(postgres.stop)
                console.print("[bold]postgresql[/]: starting a throwaway cluster")
                postgres.start()
                url = postgres.create_database()
                results.append(measure_engine(plan, engine, url, postmaster_pid(postgres)))
        except KeyboardInterrupt:
            console.print("[red]interrupted[/]: stopping what was started")
            return 130
        finally:
            processes.stop_all()
        print_table(console, plan, results)
        loads = (load_before, os.getloadavg())
        if args.json is not None:
            args.json.write_text(json.dumps([summary(plan, result) for result in results], indent=2) + "\n")
        if not args.no_record:
            append_results(markdown_section(plan, results, loads))
            console.print(f"appended to {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
