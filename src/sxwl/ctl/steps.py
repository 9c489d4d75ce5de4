"""Named, idempotent steps with a ledger for ``--resume``, one log file per step, a Rich progress
display and a ``--dry-run`` plan of the exact commands. Used by ``deploy all``, ``deploy install
ceph`` and ``add nodes``."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cached_property
from pathlib import Path
from typing import Any, TextIO

import yaml
from rich.console import Console
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from sxwl.ctl.artifact import Chart, Manifest, load_manifest
from sxwl.ctl.cluster import ClusterConfig, Host
from sxwl.ctl.errors import CtlError, UsageError
from sxwl.ctl.runner import Command, Outcome, Runner, Tools
from sxwl.ctl.ssh import KnownHosts, SshPool
from sxwl.ctl.workdir import WorkDir

HELM_TIMEOUT = "15m"


class StepFailed(Exception):
    """A step could not finish; ``str`` says what went wrong and what to do."""


@dataclass
class Step:
    name: str
    title: str
    plan: Callable[[Context], list[str]]
    run: Callable[[Context, TextIO], None]


@dataclass
class Context:
    """Everything steps share. ``secrets`` are redacted from plans and logs."""

    config: ClusterConfig
    work: WorkDir
    tools: Tools
    console: Console
    artifact_root: Path | None = None
    access_key: str | None = None
    cloud: str = ""
    provider: str = ""
    wait_timeout: float = 900.0
    poll_interval: float = 2.0
    concurrency: int = 64
    connect_timeout: float = 10.0
    assume_yes: bool = False
    state: dict[str, Any] = field(default_factory=dict)  # the ledger section of the running command
    extra: dict[str, Any] = field(default_factory=dict)  # what a command decided before its steps
    ledger: Ledger | None = None  # the running command's ledger (steps may record more in it)

    @cached_property
    def manifest(self) -> Manifest:
        if self.artifact_root is None:
            raise CtlError("no artifact given: pass --artifact PATH (the unpacked 3k-artifact folder)")
        return load_manifest(self.artifact_root)

    @property
    def kubekey_artifact(self) -> Path:
        return self.manifest.path(self.manifest.kubekey_artifact)

    def pool(self) -> SshPool:
        return SshPool(KnownHosts(self.work.known_hosts), self.concurrency, self.connect_timeout)

    def call(self, runner: Runner, log: TextIO, command: Command, what: str) -> Outcome:
        outcome = runner.run(command, log)
        if not outcome.ok:
            raise StepFailed(f"{what} failed (exit {outcome.rc}):\n{outcome.tail()}")
        return outcome

    def kubectl(self, *args: str, stdin: str | None = None, shown: str | None = None) -> Command:
        return Command([self.tools.kubectl, "--kubeconfig", str(self.work.kubeconfig), *args], stdin, shown)

    def helm_install(self, chart: Chart, *extra: str) -> Command:
        return Command(
            [
                self.tools.helm,
                "upgrade",
                "--install",
                chart.release,
                str(self.manifest.path(chart.path)),
                "--namespace",
                chart.namespace,
                "--create-namespace",
                "--kubeconfig",
                str(self.work.kubeconfig),
                "--values",
                str(self.values_path(chart)),
                *extra,
                "--wait",
                "--timeout",
                HELM_TIMEOUT,
            ]
        )

    def values_path(self, chart: Chart) -> Path:
        return self.work.root / "values" / f"{chart.release}.yaml"

    def write_values(self, chart: Chart, extra: dict[str, Any] | None = None) -> Path:
        """The chart's values from the manifest, images pointed at the private registry."""
        values = _substitute({**chart.values, **(extra or {})}, "{registry}", self.manifest.registry_prefix)
        text = yaml.safe_dump(values, sort_keys=False)
        path = self.values_path(chart)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def first_control_plane(self) -> Host:
        return self.config.control_planes[0]


def _substitute(value: Any, placeholder: str, replacement: str) -> Any:
    if isinstance(value, str):
        return value.replace(placeholder, replacement)
    if isinstance(value, dict):
        return {k: _substitute(v, placeholder, replacement) for k, v in value.items()}
    if isinstance(value, list):
        return [_substitute(v, placeholder, replacement) for v in value]
    return value


class Ledger:
    """``state.json`` in the work dir: per command, the steps done, failed or interrupted."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.data: dict[str, Any] = {}
        if path.exists():
            try:
                self.data = json.loads(path.read_text())
            except ValueError:
                raise CtlError(f"{path} is damaged: move it away to start over") from None

    def section(self, name: str) -> dict[str, Any]:
        section: dict[str, Any] = self.data.setdefault(name, {})
        section.setdefault("steps", {})
        return section

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2, ensure_ascii=False) + "\n")
        os.replace(tmp, self.path)


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def print_plan(ctx: Context, section: str, steps: list[Step], done: set[str]) -> None:
    console = ctx.console
    console.print(
        f"[bold]Plan of `{section}`[/] for {ctx.config.name} ({len(ctx.config.cluster_hosts)} hosts); "
        "nothing is run (--dry-run):"
    )
    for number, step in enumerate(steps, start=1):
        skipped = " [dim](done earlier: skipped with --resume)[/]" if step.name in done else ""
        console.print(f"\n[bold]{number:>2}. {step.name}[/] — {step.title}{skipped}")
        for line in step.plan(ctx):
            for index, part in enumerate(line.splitlines()):
                console.print(
                    ("     $ " if index == 0 else "       ") + part,
                    markup=False,
                    highlight=False,
                    soft_wrap=True,
                )


def execute(ctx: Context, section: str, steps: list[Step], *, resume: bool, dry_run: bool) -> None:
    ledger = Ledger(ctx.work.ledger)
    state = ledger.section(section)
    previous = state.get("steps", {})
    if resume and previous and state.get("config_sha256") not in (None, ctx.config.fingerprint):
        raise UsageError(
            f"{ctx.config.path} changed since the steps in {ctx.work.ledger} were done, so --resume "
            "could skip "
            f"work the new config needs: run `3kctl {section}` without --resume (every step is safe to redo)"
        )
    done = {name for name, s in previous.items() if s.get("status") == "done"} if resume else set()
    if dry_run:
        print_plan(ctx, section, steps, done)
        return
    if not resume:
        unfinished = [n for n, s in previous.items() if s.get("status") != "done"]
        if unfinished:
            ctx.console.print(
                f"[yellow]note:[/] the last `{section}` stopped at step {unfinished[0]!r}; running "
                "every step "
                "again (use --resume to skip the completed ones)"
            )
        state["steps"] = {}
    state["config_sha256"] = ctx.config.fingerprint
    state["config"] = str(ctx.config.path.resolve())
    state["started_at"] = now()
    ctx.state = state
    ctx.ledger = ledger
    ledger.save()
    ctx.work.logs.mkdir(parents=True, exist_ok=True)
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns, console=ctx.console, transient=True) as progress:
        task = progress.add_task(section, total=len(steps))
        for number, step in enumerate(steps, start=1):
            label = f"[{number}/{len(steps)}] {step.name}"
            if step.name in done:
                progress.console.print(f"[green]✓[/] {label}: {step.title} [dim](done earlier, skipped)[/]")
                progress.advance(task)
                continue
            progress.update(task, description=f"{label}: {step.title}")
            log_path = ctx.work.log(step.name)
            state["steps"][step.name] = {"status": "running", "started_at": now(), "log": str(log_path)}
            ledger.save()
            started = time.monotonic()
            with log_path.open("a") as log:
                log.write(f"=== 3kctl {section}: step {step.name} ({step.title}) at {now()} ===\n")
                try:
                    step.run(ctx, log)
                except (StepFailed, CtlError) as exc:
                    log.write(f"FAILED: {exc}\n")
                    state["steps"][step.name].update(status="failed", error=str(exc), finished_at=now())
                    ledger.save()
                    progress.console.print(f"[red]✗[/] {label}: {step.title}")
                    raise CtlError(
                        f"step {step.name!r} failed: {exc}\n  log: {log_path}\n  after fixing it, "
                        "continue with "
                        f"`3kctl {section} … --resume` (the {number - 1} completed steps are not redone)"
                    ) from None
                except KeyboardInterrupt:
                    log.write("INTERRUPTED\n")
                    state["steps"][step.name].update(status="interrupted", finished_at=now())
                    ledger.save()
                    raise CtlError(
                        f"interrupted during step {step.name!r}; it may be half done, and is redone by "
                        f"`3kctl {section} … --resume` (completed steps are not)\n  log: {log_path}"
                    ) from None
                log.write(f"=== done in {time.monotonic() - started:.1f}s ===\n")
            state["steps"][step.name].update(status="done", finished_at=now())
            ledger.save()
            progress.console.print(
                f"[green]✓[/] {label}: {step.title} [dim]({time.monotonic() - started:.1f}s)[/]"
            )
            progress.advance(task)
    state["finished_at"] = now()
    ledger.save()
