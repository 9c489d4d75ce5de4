"""One metering pass over ``--attempts`` running attempts on ``--cpods`` CPods, on PostgreSQL.

Seeds a throwaway PostgreSQL cluster (commits wait for the disk, as in production) with running
attempts at fixed prices, listed by their CPods' last heartbeats (tests/support/metering.py), then
times the cloud's own ``services.metering.meter_once`` in-process:

1. **first**: every attempt rated from its start (a usage line each; a ledger transaction per payer
   and provider);
2. **nothing new**: the same moment again, so nothing moves (what a pass costs between heartbeats);
3. **heartbeat advanced**: every CPod's last heartbeat 30 s later, a pass at that moment (the
   steady state: every attempt gets one more slice); ``--repeat`` times, the median reported.

For each: wall time, the process's CPU time, SQL statements sent (an executemany counts once; its
rows are counted apart), rows written (the driver's row counts of INSERT and UPDATE, plus the marks
and usage lines that the batch's one WITH statement writes) and time per attempt; afterwards the
ledger check and the exact totals (every second charged once). Prints a table and appends a dated
section to bench/RESULTS.md. Run:
``.venv/bin/python bench/metering.py [--cpods 1000] [--attempts 10000]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import (  # noqa: E402
    RESULTS,
    Processes,
    append_results,
    interrupt_on_sigterm,
    machine_line,
    utc_now,
)
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from sqlalchemy import event, func, select, update  # noqa: E402
from tests.support.metering import context, problems, seed  # noqa: E402
from tests.support.postgres import TempPostgres  # noqa: E402

from sxwl.cloud.config import Settings  # noqa: E402
from sxwl.cloud.context import CloudContext  # noqa: E402
from sxwl.cloud.db.models import CPod  # noqa: E402
from sxwl.cloud.db.money_models import UsageLine  # noqa: E402
from sxwl.cloud.services.money import metering  # noqa: E402

TARGET_S = 1.0  # a pass over 10,000 running attempts
END = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
HEARTBEAT_S = 30
BATCH = int(Settings.model_fields["metering_batch"].default)


@dataclass(frozen=True)
class Measured:
    name: str
    attempts: int  # looked at
    rated: int
    wall_s: float
    cpu_s: float  # of this process (the pass's Python and the driver)
    statements: int
    rows_sent: int  # parameter sets of those statements (an executemany sends many)
    rows_written: int

    @property
    def us_per_attempt(self) -> float:
        return self.wall_s / self.attempts * 1e6 if self.attempts else float("nan")


class Counter:
    """SQL statements and rows written, through the engine's cursor events. The statement that moves
    a batch's marks and inserts its usage lines returns only a count, so ``measure`` adds those."""

    def __init__(self, ctx: CloudContext) -> None:
        self.statements = self.rows_sent = self.rows_written = 0
        event.listen(ctx.db.engine, "before_cursor_execute", self._before)
        event.listen(ctx.db.engine, "after_cursor_execute", self._after)

    def _before(self, _c: Any, _cur: Any, _s: str, parameters: Any, _ctx: Any, executemany: bool) -> None:
        self.statements += 1
        self.rows_sent += len(parameters) if executemany else 1

    def _after(self, _c: Any, cursor: Any, statement: str, _p: Any, _ctx: Any, _many: bool) -> None:
        if statement.lstrip()[:6].upper() in ("INSERT", "UPDATE") and cursor.rowcount > 0:
            self.rows_written += cursor.rowcount

    def reset(self) -> None:
        self.statements = self.rows_sent = self.rows_written = 0


def _lines(ctx: CloudContext) -> int:
    with ctx.db.session() as session:
        return session.scalar(select(func.count()).select_from(UsageLine)) or 0


def measure(ctx: CloudContext, counter: Counter, name: str, now: datetime) -> Measured:
    lines = _lines(ctx)
    counter.reset()
    wall, cpu = time.perf_counter(), time.process_time()
    result = metering.meter_once(ctx, now=now)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    statements, sent, written = counter.statements, counter.rows_sent, counter.rows_written
    return Measured(
        name,
        result.attempts,
        result.rated,
        wall,
        cpu,
        statements,
        sent,
        written + result.rated + _lines(ctx) - lines,
    )


def run(
    args: argparse.Namespace, console: Console, workdir: Path, url: str
) -> tuple[list[Measured], list[str]]:
    ctx = context(workdir / "data", url)
    console.print(f"seeding {args.attempts:,} running attempts on {args.cpods:,} CPods")
    seeded = seed(ctx, cpods=args.cpods, attempts=args.attempts, end=END, closed_share=0.0)
    counter = Counter(ctx)
    results = [measure(ctx, counter, "first (from each start)", END)]
    results.append(measure(ctx, counter, "nothing new", END))
    advanced: list[Measured] = []
    for beat in range(1, args.repeat + 1):
        at = END + timedelta(seconds=beat * HEARTBEAT_S)
        with ctx.db.session() as session:
            session.execute(update(CPod).values(last_heartbeat_at=at))
        advanced.append(measure(ctx, counter, f"heartbeat advanced {HEARTBEAT_S} s", at))
    results.append(sorted(advanced, key=lambda m: m.wall_s)[len(advanced) // 2])
    # What the passes charged must be exactly what the attempts ran, up to the last heartbeat.
    last = END + timedelta(seconds=args.repeat * HEARTBEAT_S)
    later_us = (last - END) // timedelta(microseconds=1)
    shifted = replace(
        seeded, end=last, attempts=[replace(a, usage_us=a.usage_us + later_us) for a in seeded.attempts]
    )
    with ctx.db.session() as session:
        found = problems(session, shifted, complete=True)
    ctx.db.dispose()
    return results, found


def print_table(console: Console, results: list[Measured]) -> None:
    table = Table(title="one metering pass on PostgreSQL")
    columns = (
        "pass",
        "attempts",
        "rated",
        "s",
        "CPU s",
        "µs/attempt",
        "statements",
        "rows sent",
        "rows written",
    )
    for column in columns:
        table.add_column(column, justify="left" if column == "pass" else "right")
    for m in results:
        table.add_row(
            m.name,
            f"{m.attempts:,}",
            f"{m.rated:,}",
            f"{m.wall_s:.3f}",
            f"{m.cpu_s:.3f}",
            f"{m.us_per_attempt:.1f}",
            f"{m.statements:,}",
            f"{m.rows_sent:,}",
            f"{m.rows_written:,}",
        )
    console.print(table)


def markdown_section(args: argparse.Namespace, results: list[Measured], found: list[str], loads: Any) -> str:
    steady = results[-1]
    lines = [
        f"## Metering: {utc_now()}",
        "",
        "`bench/metering.py`: `services.metering.meter_once` in-process against a throwaway PostgreSQL "
        "(commits wait for the disk), which shares the CPUs with it.",
        "",
        machine_line(),
        f"- Python {platform.python_version()}",
        f"- 1-minute load average: {loads[0][0]:.2f} before the run, {loads[1][0]:.2f} after it "
        "(other work on the machine skews the figures)",
        f"- {args.attempts:,} running attempts on {args.cpods:,} CPods (1, 2 or 8 GPUs, three prices, "
        f"fees 0/10/12.5 %), 5 paying users; batch {BATCH:,} attempts per transaction; "
        f"'heartbeat advanced' is the median of {args.repeat}",
        "",
        "| pass | attempts | rated | s | CPU s | µs/attempt | statements | rows sent | rows written |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for m in results:
        lines.append(
            f"| {m.name} | {m.attempts:,} | {m.rated:,} | {m.wall_s:.3f} | {m.cpu_s:.3f} | "
            f"{m.us_per_attempt:.1f} | {m.statements:,} | {m.rows_sent:,} | {m.rows_written:,} |"
        )
    verdict = "meets" if steady.wall_s < TARGET_S and results[0].wall_s < TARGET_S else "misses"
    lines += [
        "",
        f"Target (a pass over {args.attempts:,} attempts in < {TARGET_S:.0f} s): {verdict} "
        f"(first {results[0].wall_s:.2f} s, steady {steady.wall_s:.2f} s, nothing new "
        f"{results[1].wall_s:.2f} s). Ledger check and exact totals afterwards: "
        + ("every second charged once." if not found else f"{len(found)} problems: {found[:3]}"),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--cpods", type=int, default=1000)
    parser.add_argument("--attempts", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3, help="heartbeat-advanced passes (3)")
    parser.add_argument("--no-results", action="store_true", help="do not append to bench/RESULTS.md")
    args = parser.parse_args(argv)
    if min(args.cpods, args.attempts, args.repeat) < 1:
        parser.error("counts must be at least 1")
    console = Console() if Console().is_terminal else Console(width=140)
    load_before = os.getloadavg()
    processes = Processes()
    with interrupt_on_sigterm(), tempfile.TemporaryDirectory(prefix="sxwl-bench-") as tmp:
        try:
            postgres = TempPostgres(durable=True)
            processes.add(postgres.stop)
            console.print("[bold]postgresql[/]: starting a throwaway cluster")
            postgres.start()
            results, found = run(args, console, Path(tmp), postgres.create_database())
        except KeyboardInterrupt:
            console.print("[red]interrupted[/]: stopping what was started")
            return 130
        finally:
            processes.stop_all()
    print_table(console, results)
    for problem in found[:10]:
        console.print(f"[red]{problem}[/]")
    if not args.no_results:
        append_results(markdown_section(args, results, found, (load_before, os.getloadavg())))
        console.print(f"appended to {RESULTS.relative_to(ROOT)}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
