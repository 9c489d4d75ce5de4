"""Login and bearer-token throughput of a real ``sxwl serve``, on SQLite and on PostgreSQL.

Production argon2 parameters, generous rate limits. Prints a table and appends a dated section to
bench/RESULTS.md. Run: ``.venv/bin/python bench/auth_throughput.py [--duration S] [--concurrency N]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
from argon2 import PasswordHasher  # noqa: E402
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
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from tests.support.cloud import CloudProcess  # noqa: E402
from tests.support.net import free_port  # noqa: E402
from tests.support.postgres import TempPostgres  # noqa: E402

from sxwl.cloud.config import Settings  # noqa: E402

SEQUENTIAL_LOGINS = 20
HASH_SAMPLES = 10

HEADER = """\
# Authentication benchmark

`bench/auth_throughput.py` starts the cloud as a real process (`python -m sxwl.cli serve`) twice,
once on SQLite and once on a throwaway PostgreSQL cluster, each time with the **production**
argon2id parameters (the defaults of `Settings`) and rate limits raised so they never interfere.
For each engine it measures, with `httpx` client threads on the same machine:

- `POST /api/v1/auth/login` throughput (requests/s) and p50/p95 latency: one argon2id verification
  per request, so this is bounded by CPU cores / hash cost;
- `GET /api/v1/me` throughput and p50/p95 latency with a bearer token (a SHA-256 token lookup);
- the latency of one login at a time (median of 20 sequential logins).

It also times one argon2id hash in-process (median of 10), which is the cost apart from HTTP.
The clients share the CPUs with the server, so the figures are a lower bound for a dedicated server.

Run it with `make bench`, or `.venv/bin/python bench/auth_throughput.py --duration 10 --concurrency 8`.
Each run appends a dated section below.
"""


@dataclass(frozen=True)
class Argon2Params:
    time_cost: int
    memory_kib: int
    parallelism: int


@dataclass(frozen=True)
class Throughput:
    requests: int
    errors: int
    elapsed_s: float
    latencies_ms: list[float]

    @property
    def per_s(self) -> float:
        return self.requests / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def percentile(self, q: int) -> float:
        return percentile(self.latencies_ms, q)


@dataclass(frozen=True)
class EngineResult:
    engine: str
    login: Throughput
    me: Throughput
    single_login_ms: float


def production_argon2() -> Argon2Params:
    """The shipped defaults of ``Settings``, not whatever ``SXWL_ARGON2_*`` this shell may export."""
    fields = Settings.model_fields
    return Argon2Params(
        time_cost=int(fields["argon2_time_cost"].default),
        memory_kib=int(fields["argon2_memory_kib"].default),
        parallelism=int(fields["argon2_parallelism"].default),
    )


def server_env(params: Argon2Params, database_url: str) -> dict[str, str]:
    return {
        "SXWL_ARGON2_TIME_COST": str(params.time_cost),
        "SXWL_ARGON2_MEMORY_KIB": str(params.memory_kib),
        "SXWL_ARGON2_PARALLELISM": str(params.parallelism),
        **cloud_env(database_url),
    }


def register_accounts(url: str, count: int) -> list[str]:
    emails = [f"bench{i}@example.com" for i in range(count)]
    with httpx.Client(base_url=url, timeout=60) as client:
        for email in emails:
            body = {"email": email, "password": PASSWORD, "role": "user"}
            response = client.post(f"{API}/auth/register", json=body)
            if response.status_code != 201:
                raise RuntimeError(f"register {email}: {response.status_code} {response.text}")
    return emails


def login(client: httpx.Client, email: str) -> str:
    response = client.post(f"{API}/auth/login", json={"email": email, "password": PASSWORD})
    if response.status_code != 200:
        raise RuntimeError(f"login {email}: {response.status_code} {response.text}")
    token: str = response.json()["access_token"]
    return token


def run_load(
    url: str,
    duration_s: float,
    concurrency: int,
    make_request: Callable[[httpx.Client, int], httpx.Request],
    expected_status: int,
) -> Throughput:
    """``concurrency`` threads, one keep-alive client each, send requests until the deadline."""
    start = threading.Barrier(concurrency + 1)
    stop = threading.Event()
    lock = threading.Lock()
    latencies: list[float] = []
    errors = [0]
    failures: list[str] = []

    def worker(index: int) -> None:
        try:
            load(index)
        except threading.BrokenBarrierError:
            pass
        except BaseException as exc:
            failures.append(f"worker {index}: {exc!r}")
            start.abort()  # unblocks the main thread, which then raises
            raise

    def load(index: int) -> None:
        mine: list[float] = []
        bad = 0
        with httpx.Client(base_url=url, timeout=60) as client:
            request = make_request(client, index)
            start.wait()
            deadline = time.perf_counter() + duration_s
            while not stop.is_set() and time.perf_counter() < deadline:
                began = time.perf_counter()
                try:
                    response = client.send(request)
                except httpx.HTTPError as exc:
                    bad += 1
                    if len(failures) < 3:
                        failures.append(repr(exc))
                    continue
                if response.status_code == expected_status:
                    mine.append((time.perf_counter() - began) * 1000)
                else:
                    bad += 1
                    if len(failures) < 3:
                        failures.append(f"{response.status_code} {response.text[:200]}")
        with lock:
            latencies.extend(mine)
            errors[0] += bad

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(concurrency)]
    for thread in threads:
        thread.start()
    try:
        start.wait()
        began = time.perf_counter()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - began
    finally:
        stop.set()
        start.abort()
    if failures:
        print(f"warning: {errors[0]} failed requests, e.g. {failures}", file=sys.stderr)
    return Throughput(len(latencies), errors[0], elapsed, latencies)


@dataclass(frozen=True)
class Plan:
    params: Argon2Params
    duration_s: float
    concurrency: int
    workdir: Path
    console: Console
    processes: Processes


def measure_engine(plan: Plan, engine: str, database_url: str) -> EngineResult:
    console, concurrency, duration_s = plan.console, plan.concurrency, plan.duration_s
    console.print(f"[bold]{engine}[/]: starting the cloud")
    cloud = CloudProcess(plan.workdir / engine, free_port(), server_env(plan.params, database_url))
    plan.processes.add(cloud.stop)
    try:
        emails = register_accounts(cloud.url, concurrency)
        with httpx.Client(base_url=cloud.url, timeout=60) as client:
            tokens = [login(client, email) for email in emails]  # also warms the server up
            for token in tokens:
                client.get(f"{API}/me", headers={"Authorization": f"Bearer {token}"}).raise_for_status()
            console.print(f"[bold]{engine}[/]: {SEQUENTIAL_LOGINS} sequential logins")
            single: list[float] = []
            for _ in range(SEQUENTIAL_LOGINS):
                began = time.perf_counter()
                login(client, emails[0])
                single.append((time.perf_counter() - began) * 1000)

        def login_request(client: httpx.Client, index: int) -> httpx.Request:
            body = {"email": emails[index], "password": PASSWORD}
            return client.build_request("POST", f"{API}/auth/login", json=body)

        def me_request(client: httpx.Client, index: int) -> httpx.Request:
            headers = {"Authorization": f"Bearer {tokens[index]}"}
            return client.build_request("GET", f"{API}/me", headers=headers)

        console.print(f"[bold]{engine}[/]: login load, {concurrency} threads × {duration_s:g} s")
        login_load = run_load(cloud.url, duration_s, concurrency, login_request, 200)
        console.print(f"[bold]{engine}[/]: /me load, {concurrency} threads × {duration_s:g} s")
        me_load = run_load(cloud.url, duration_s, concurrency, me_request, 200)
    finally:
        cloud.stop()
    return EngineResult(engine, login_load, me_load, statistics.median(single))


def time_hashing(params: Argon2Params) -> float:
    hasher = PasswordHasher(
        time_cost=params.time_cost, memory_cost=params.memory_kib, parallelism=params.parallelism
    )
    hasher.hash(PASSWORD)  # first call pays for allocation
    samples: list[float] = []
    for _ in range(HASH_SAMPLES):
        began = time.perf_counter()
        hasher.hash(PASSWORD)
        samples.append((time.perf_counter() - began) * 1000)
    return statistics.median(samples)


def ratio(numerator: float, denominator: float) -> str:
    return f"{numerator / denominator:.1f}×" if denominator > 0 else "n/a"


def print_table(console: Console, results: list[EngineResult], hash_ms: float) -> None:
    table = Table(title="Authentication throughput (production argon2id)", title_justify="left")
    for column in ("engine", "login req/s", "login p50/p95 ms", "single login ms", "me req/s"):
        table.add_column(column, justify="right" if column != "engine" else "left")
    table.add_column("me p50/p95 ms", justify="right")
    table.add_column("me/login", justify="right")
    table.add_column("errors", justify="right")
    for r in results:
        table.add_row(
            r.engine,
            f"{r.login.per_s:.1f}",
            f"{r.login.percentile(50):.0f} / {r.login.percentile(95):.0f}",
            f"{r.single_login_ms:.0f}",
            f"{r.me.per_s:.0f}",
            f"{r.me.percentile(50):.1f} / {r.me.percentile(95):.1f}",
            ratio(r.me.per_s, r.login.per_s),
            str(r.login.errors + r.me.errors),
        )
    console.print(table)
    console.print(f"argon2id hash alone, in-process: median {hash_ms:.0f} ms")
    if len(results) == 2:
        sqlite, pg = results
        console.print(
            f"{pg.engine}/{sqlite.engine}: login {ratio(pg.login.per_s, sqlite.login.per_s)}, "
            f"me {ratio(pg.me.per_s, sqlite.me.per_s)}"
        )


def markdown_section(
    results: list[EngineResult],
    hash_ms: float,
    params: Argon2Params,
    duration_s: float,
    concurrency: int,
    loads: tuple[tuple[float, float, float], tuple[float, float, float]],
) -> str:
    now = utc_now()
    lines = [
        f"## {now}",
        "",
        machine_line(),
        f"- Python {platform.python_version()}",
        f"- 1-minute load average: {loads[0][0]:.2f} before the run, {loads[1][0]:.2f} after it "
        "(the latter includes its own load; other work on the machine skews the figures)",
        f"- argon2id: time_cost={params.time_cost}, memory_kib={params.memory_kib}, "
        f"parallelism={params.parallelism}; one hash in-process: median {hash_ms:.0f} ms "
        f"({HASH_SAMPLES} samples)",
        f"- load: {concurrency} client threads, {duration_s:g} s per measurement",
        "",
        "| engine | login req/s | login p50 / p95 ms | single login ms (median of "
        f"{SEQUENTIAL_LOGINS}) | me req/s | me p50 / p95 ms | me/login | errors |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in results:
        lines.append(
            f"| {r.engine} | {r.login.per_s:.1f} | {r.login.percentile(50):.0f} / "
            f"{r.login.percentile(95):.0f} | {r.single_login_ms:.0f} | {r.me.per_s:.0f} | "
            f"{r.me.percentile(50):.1f} / {r.me.percentile(95):.1f} | {ratio(r.me.per_s, r.login.per_s)} | "
            f"{r.login.errors + r.me.errors} |"
        )
    if len(results) == 2:
        sqlite, pg = results
        lines += [
            "",
            f"{pg.engine}/{sqlite.engine}: login {ratio(pg.login.per_s, sqlite.login.per_s)}, "
            f"me {ratio(pg.me.per_s, sqlite.me.per_s)}.",
        ]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per measurement (10)")
    parser.add_argument("--concurrency", type=int, default=8, help="client threads (8)")
    args = parser.parse_args(argv)
    if args.duration <= 0 or args.concurrency < 1:
        parser.error("--duration must be positive and --concurrency at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    duration_s: float = args.duration
    concurrency: int = args.concurrency
    console = Console()
    if not console.is_terminal:
        console = Console(width=130)
    load_before = os.getloadavg()
    params = production_argon2()
    processes = Processes()
    results: list[EngineResult] = []
    with interrupt_on_sigterm(), tempfile.TemporaryDirectory(prefix="sxwl-bench-") as tmp:
        plan = Plan(params, duration_s, concurrency, Path(tmp), console, processes)
        try:
            console.print(f"argon2id {params}: timing {HASH_SAMPLES} hashes in-process")
            hash_ms = time_hashing(params)
            results.append(measure_engine(plan, "sqlite", ""))
            postgres = TempPostgres()
            processes.add(postgres.stop)
            console.print("[bold]postgresql[/]: starting a throwaway cluster")
            postgres.start()
            results.append(measure_engine(plan, "postgresql", postgres.create_database()))
        except KeyboardInterrupt:
            console.print("[red]interrupted[/]: stopping what was started")
            return 130
        finally:
            processes.stop_all()
    print_table(console, results, hash_ms)
    loads = (load_before, os.getloadavg())
    append_results(markdown_section(results, hash_ms, params, duration_s, concurrency, loads), HEADER)
    console.print(f"appended to {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
