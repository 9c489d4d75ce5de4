"""``sxwl jobs``: submit, follow and collect training jobs."""

from __future__ import annotations

import sys
import time
from functools import partial
from pathlib import Path, PurePosixPath
from typing import Annotated, Any

import typer
import yaml
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
from rich.table import Column, Table

from sxwl.cli import client, ids
from sxwl.cli.client import ENDED_BADLY, CliError, Credentials
from sxwl.cli.output import err, listing, out, show, status_text
from sxwl.protocol.jobs import MAX_GPUS_PER_NODE, MAX_NODES, MAX_RUNTIME_S, env_problem
from sxwl.protocol.money import money_text

app = typer.Typer(
    help="Training jobs: submit, list, follow logs, cancel, download results.", no_args_is_help=True
)
TERMINAL = {"succeeded", "failed", "cancelled"}


def load_job_file(path: Path) -> tuple[dict[str, Any], dict[str, int]]:
    """The job file's mapping, and the line of each top-level key (to point at it in errors)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise CliError(f"{path}: {exc.strerror}", exit_code=2) from None
    try:
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}:{mark.column + 1}" if mark else ""
        raise CliError(
            f"{path}{where}: not valid YAML: {getattr(exc, 'problem', exc)}", exit_code=2
        ) from None
    if not isinstance(data, dict):
        raise CliError(
            f"{path}: expected a mapping of job fields (name, command, gpus_per_node, …)", exit_code=2
        )
    lines = {}
    if isinstance(node, yaml.MappingNode):
        lines = {k.value: k.start_mark.line + 1 for k, _ in node.value if isinstance(k, yaml.ScalarNode)}
    return data, lines


def parse_env(pairs: list[str]) -> dict[str, str]:
    """``--env`` flags, checked as the cloud will check them, so a mistake is named by its flag
    before anything is sent (the numeric flags are bounded by their options)."""
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise CliError(f"--env {pair!r}: expected KEY=VALUE", exit_code=2)
        if problem := env_problem(key, value):
            raise CliError(f"--env {key}=…: {problem[1]}", exit_code=2)
        env[key] = value
    return env


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def submit(
    ctx: typer.Context,
    file: Annotated[
        Path | None, typer.Option("-f", "--file", help="A job file (YAML); flags override it.")
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="Job name.")] = None,
    gpus: Annotated[
        int | None, typer.Option("--gpus", min=0, max=MAX_GPUS_PER_NODE, help="GPUs per node.")
    ] = None,
    gpu_product: Annotated[
        str | None, typer.Option("--gpu-product", help="e.g. NVIDIA-A100-SXM4-80GB.")
    ] = None,
    nodes: Annotated[
        int | None, typer.Option("--nodes", min=1, max=MAX_NODES, help="Number of nodes.")
    ] = None,
    image: Annotated[str | None, typer.Option("--image", help="Container image (kubernetes CPods).")] = None,
    env: Annotated[list[str] | None, typer.Option("--env", help="KEY=VALUE, repeatable.")] = None,
    max_runtime: Annotated[
        int | None,
        typer.Option("--max-runtime", min=1, max=MAX_RUNTIME_S, help="Seconds before it is stopped."),
    ] = None,
    cpod: Annotated[str | None, typer.Option("--cpod", help="Run only on this CPod id.")] = None,
) -> None:
    """Submit a job: `sxwl jobs submit --gpus 1 -- python3 train.py` or `sxwl jobs submit -f job.yaml`."""
    body, lines = load_job_file(file) if file else ({}, {})
    command = list(ctx.args)
    if command and command[0] == "--":
        command = command[1:]
    overrides: dict[str, Any] = {
        "name": name,
        "gpus_per_node": gpus,
        "gpu_product": gpu_product,
        "nodes": nodes,
        "image": image,
        "max_runtime_s": max_runtime,
        "cpod_id": cpod,
        "command": command or None,
    }
    body.update({k: v for k, v in overrides.items() if v is not None})
    if env:
        body["env"] = {**body.get("env", {}), **parse_env(env)}
    if "command" not in body:
        raise CliError("no command: give one after `--` or in the job file's `command`", exit_code=2)
    try:
        job = client.call("POST", "/api/v1/jobs", json=body).json()
    except client.ApiError as exc:
        raise CliError(_explain(exc, file, lines), exit_code=2 if exc.status == 422 else 1) from None
    out.print(f"submitted job [bold]{job['id']}[/] ({escape(job['name'])}): {status_text(job['state'])}")
    out.print(f"follow it with: sxwl jobs logs {job['id']} -f")


def _explain(exc: client.ApiError, file: Path | None, lines: dict[str, int]) -> str:
    if exc.status != 422 or not isinstance(exc.details, list):
        return str(exc)
    parts = []
    for detail in exc.details:
        field = str(detail.get("field", ""))
        top = field.split(".")[0]
        where = f"{file}:{lines[top]}: " if file and top in lines else ""
        parts.append(f"{where}{field}: {detail.get('message')}")
    return "invalid job: " + "; ".join(parts)


@app.command("list")
def list_jobs(
    state: Annotated[
        list[str] | None, typer.Option("--state", help="Only these states (repeatable).")
    ] = None,
    page: Annotated[int, typer.Option(help="Page number.")] = 1,
    all_users: Annotated[bool, typer.Option("--all", help="Admins: every user's jobs.")] = False,
) -> None:
    """Your jobs, newest first."""
    params: dict[str, Any] = {"page": page, "per_page": 50, "all": all_users}
    if state:
        params["state"] = state
    result = client.call("GET", "/api/v1/jobs", params=params).json()
    if not result["items"]:
        out.print("No jobs yet. Submit one with `sxwl jobs submit --gpus 1 -- python3 train.py`.")
        return
    table = listing("id", "name", "state", "GPUs", "created", "reason / exit")
    for job in result["items"]:
        detail = job["reason"] or ("" if job["exit_code"] is None else f"exit {job['exit_code']}")
        if job["queue_position"]:
            detail = f"#{job['queue_position']} in queue; {detail}"
        table.add_row(
            job["id"][:12],  # a unique prefix: every command taking a job id takes it
            escape(job["name"]),
            status_text(job["state"]),
            f"{job['nodes']}×{job['gpus_per_node']}",
            job["created_at"][:19].replace("T", " "),
            escape(detail),
        )
    show(table)
    pages = -(-result["total"] // result["per_page"])
    if pages > 1:
        out.print(
            f"page {result['page']} of {pages} ({result['total']} jobs); next: --page {result['page'] + 1}"
        )


@app.command("show")
def show_job(job_id: Annotated[str, typer.Argument(help="Job id (or a unique prefix).")]) -> None:
    """A job's details, its cost so far, and its timeline."""
    job = ids.job(job_id)
    table = Table(Column(no_wrap=True), Column(overflow="fold"), show_header=False, box=None)
    for key in (
        "id",
        "name",
        "state",
        "attempt",
        "reason",
        "exit_code",
        "queue_position",
        "cpod_id",
        "node_names",
        "gpu_product",
        "gpus_per_node",
        "nodes",
        "image",
        "command",
        "max_runtime_s",
        "created_at",
        "started_at",
        "finished_at",
    ):
        value = job.get(key)
        if value not in (None, [], ""):
            table.add_row(key, status_text(value) if key == "state" else escape(str(value)))
    if job.get("cost") is not None:
        if job["state"] in TERMINAL:
            table.add_row("cost", f"{money_text(job['cost'])} CNY")
        else:
            rate = job.get("cost_per_hour")
            per_hour = f" ({money_text(rate)} CNY/hour while running)" if rate else ""
            table.add_row("cost so far", f"{money_text(job['cost'])} CNY{per_hour}")
    out.print(table)
    events = client.call("GET", f"/api/v1/jobs/{job['id']}/events").json()
    timeline = Table("time", "attempt", "event", "detail", title="timeline", title_justify="left")
    for e in events:
        at = e["at"][:19].replace("T", " ")
        timeline.add_row(at, str(e["attempt"]), e["kind"], escape(e["detail"] or ""))
    out.print(timeline)


@app.command()
def logs(
    job_id: Annotated[str, typer.Argument(help="Job id (or a unique prefix).")],
    follow: Annotated[bool, typer.Option("-f", "--follow", help="Keep printing until the job ends.")] = False,
    attempt: Annotated[int | None, typer.Option(help="Which attempt (default: the latest).")] = None,
) -> None:
    """Print a job's output; with -f, until it ends, then its final state (exit status 3 unless it
    succeeded)."""
    job = ids.job(job_id)
    offset = 0
    while True:
        params: dict[str, Any] = {"offset": offset}
        if attempt:
            params["attempt"] = attempt
        response = client.call("GET", f"/api/v1/jobs/{job['id']}/logs", params=params)
        sys.stdout.buffer.write(response.content)
        sys.stdout.flush()
        # One answer holds at most the cloud's read limit: a long log takes several reads.
        next_offset = int(response.headers["X-Next-Offset"])
        moved, offset = next_offset != offset, next_offset
        if response.headers.get("X-Log-Complete") == "true":
            if follow:
                _ended(job["id"])
            return
        if not (response.content or moved or follow):
            return
        if not (response.content or moved):
            time.sleep(1.0)


def _ended(job_id: str) -> None:
    """The final state of a followed job, on standard error (standard output is its log)."""
    job = client.call("GET", f"/api/v1/jobs/{job_id}").json()
    if job["state"] not in TERMINAL:  # the attempt's log ended; the job goes on (a retry)
        now = f"{status_text(job['state'])}, attempt {job['attempt']}"
        err.print(f"this attempt's log ended; job {job_id} is {now}")
        return
    exit_code = "" if job["exit_code"] is None else f" (exit {job['exit_code']})"
    reason = f": {escape(job['reason'])}" if job["reason"] else ""
    err.print(f"job {job_id} {status_text(job['state'])}{exit_code}{reason}")
    if job["state"] != "succeeded":
        raise typer.Exit(ENDED_BADLY)


@app.command()
def cancel(job_id: Annotated[str, typer.Argument(help="Job id (or a unique prefix).")]) -> None:
    """Cancel a job: queued ones end at once, running ones get SIGTERM, then SIGKILL."""
    job = ids.job(job_id)
    try:
        result = client.call("POST", f"/api/v1/jobs/{job['id']}/cancel").json()
    except client.ApiError as exc:
        raise CliError(str(exc)) from None
    note = " (stopping on its CPod)" if result["cancel_requested"] and result["state"] not in TERMINAL else ""
    out.print(f"job {result['id']}: {status_text(result['state'])}{note}")


@app.command()
def artifacts(
    job_id: Annotated[str, typer.Argument(help="Job id (or a unique prefix).")],
    download: Annotated[
        Path | None, typer.Option("--download", help="Save every artifact under DIR.")
    ] = None,
) -> None:
    """List a job's artifacts (files it wrote to $SXWL_OUTPUT_DIR), or download them."""
    job = ids.job(job_id)
    items = client.call("GET", f"/api/v1/jobs/{job['id']}/artifacts").json()
    if not items:
        out.print("No artifacts. A job's artifacts are the files it writes to $SXWL_OUTPUT_DIR.")
        return
    if download is None:
        table = Table("path", "size", "sha256")
        for item in items:
            table.add_row(item["path"], f"{item['size']:,}", item["sha256"][:16])
        out.print(table)
        return
    creds = Credentials.load()
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
    with Progress(*columns, console=out) as progress:
        for item in items:
            relative = PurePosixPath(item["path"])
            if relative.is_absolute() or ".." in relative.parts:
                raise CliError(f"refusing the unsafe artifact path {item['path']!r}")
            target = download / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            task = progress.add_task(item["path"], total=item["size"])
            client.download(
                creds,
                f"/api/v1/jobs/{job['id']}/artifacts/{item['path']}",
                target,
                partial(progress.advance, task),
            )
    out.print(f"saved {len(items)} file(s) under {download}")
