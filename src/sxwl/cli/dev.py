"""``sxwl dev``: dev environments (docs/dev-envs.md): JupyterLab on a CPod's GPUs, opened in the
browser through the cloud, paused and resumed with the workspace kept."""

from __future__ import annotations

import webbrowser
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Column, Table

from sxwl.cli import client, ids
from sxwl.cli.client import CliError, Credentials
from sxwl.cli.output import listing, out, show, status_text
from sxwl.protocol.devenvs import DEFAULT_IDLE_TIMEOUT_MIN, MAX_CPUS, MAX_IDLE_TIMEOUT_MIN, MAX_MEMORY_GIB
from sxwl.protocol.jobs import MAX_GPUS_PER_NODE
from sxwl.protocol.money import money_text

app = typer.Typer(
    help="Dev environments: JupyterLab on a CPod's GPUs; create, open, pause, resume, stop.",
    no_args_is_help=True,
)
PATH = "/api/v1/dev-envs"
ID_HELP = "Environment id (or a unique prefix)."


def env_by_id(given: str) -> dict[str, Any]:
    def get(found: str) -> dict[str, Any]:
        body: dict[str, Any] = client.call("GET", f"{PATH}/{found}").json()
        return body

    def candidates() -> list[str]:
        return [str(env["id"]) for env in client.call("GET", PATH).json()]

    return ids.fetch(given, get, candidates, noun="dev environment", listing="sxwl dev list")


def _said(env: dict[str, Any], verb: str) -> None:
    out.print(
        f"{verb} dev environment [bold]{env['id']}[/] ({escape(env['name'])}): {status_text(env['status'])}"
    )


def _fields(exc: client.ApiError) -> str:
    if not isinstance(exc.details, list):
        return str(exc)
    return "; ".join(f"{d.get('field')}: {d.get('message')}" for d in exc.details if isinstance(d, dict))


@app.command()
def create(
    name: Annotated[str, typer.Option("--name", help="Its name (one live environment per name).")] = "dev",
    gpus: Annotated[int, typer.Option("--gpus", min=0, max=MAX_GPUS_PER_NODE, help="GPUs.")] = 0,
    gpu_product: Annotated[
        str | None, typer.Option("--gpu-product", help="e.g. NVIDIA-A100-SXM4-80GB.")
    ] = None,
    cpus: Annotated[
        int | None,
        typer.Option("--cpus", min=1, max=MAX_CPUS, help="CPU cores (billed per core without GPUs)."),
    ] = None,
    memory_gib: Annotated[
        int | None, typer.Option("--memory-gib", min=1, max=MAX_MEMORY_GIB, help="Memory limit in GiB.")
    ] = None,
    model: Annotated[list[str] | None, typer.Option("--model", help="A model to mount (repeatable).")] = None,
    file: Annotated[list[str] | None, typer.Option("--file", help="A file id to mount (repeatable).")] = None,
    image: Annotated[str | None, typer.Option("--image", help="Container image (kubernetes CPods).")] = None,
    idle_timeout: Annotated[
        int,
        typer.Option(
            "--idle-timeout", min=1, max=MAX_IDLE_TIMEOUT_MIN, help="Minutes unused before it pauses."
        ),
    ] = DEFAULT_IDLE_TIMEOUT_MIN,
) -> None:
    """Create one: `sxwl dev create --gpus 1 --model tiny-llama`."""
    body: dict[str, Any] = {
        "name": name,
        "gpus": gpus,
        "models": model or [],
        "files": file or [],
        "idle_timeout_min": idle_timeout,
    }
    given = {"gpu_product": gpu_product, "image": image, "cpus": cpus, "memory_gib": memory_gib}
    body.update({k: v for k, v in given.items() if v is not None})
    try:
        env = client.call("POST", PATH, json=body).json()
    except client.ApiError as exc:
        raise CliError(
            f"invalid dev environment: {_fields(exc)}", exit_code=2 if exc.status == 422 else 1
        ) from None
    _said(env, "created")
    for mount in env["mounts"]:
        out.print(f"  {mount['kind']} {escape(mount['name'])} at {mount['path']} (read-only)")
    out.print(f"open it with: sxwl dev open {env['id']}")


@app.command("list")
def list_envs() -> None:
    """Your dev environments, newest first."""
    envs = client.call("GET", PATH).json()
    if not envs:
        out.print("No dev environments yet. Create one with `sxwl dev create --gpus 1`.")
        return
    table = listing("id", "name", "status", "GPUs", "CPod", "cost (CNY)", "reason")
    for env in envs:
        table.add_row(
            env["id"][:12],
            escape(env["name"]),
            status_text(env["status"]),
            f"{env['gpus']}" + (f" × {escape(env['gpu_product'])}" if env["gpu_product"] else ""),
            (env["cpod_id"] or "")[:12],
            money_text(env["cost"]),
            escape(env["reason"] or ""),
        )
    show(table)


@app.command("show")
def show_env(env_id: Annotated[str, typer.Argument(help=ID_HELP)]) -> None:
    """One environment: its status, where it runs, what is mounted, what it cost."""
    env = env_by_id(env_id)
    table = Table(Column(no_wrap=True), Column(overflow="fold"), show_header=False, box=None)
    for key in ("id", "name", "status", "reason", "gpus", "gpu_product", "cpus", "memory_gib", "image",
                "cpod_id", "job_id", "idle_timeout_min", "created_at", "started_at", "stopped_at",
                "saved_workspace_bytes"):  # fmt: skip
        value = env.get(key)
        if value not in (None, ""):
            table.add_row(key, status_text(value) if key == "status" else escape(str(value)))
    table.add_row("url", f"{Credentials.load().url.rstrip('/')}{env['url']}")
    table.add_row("cost", f"{money_text(env['cost'])} CNY")
    if env.get("storage_cost"):
        table.add_row("storage cost", f"{money_text(env['storage_cost'])} CNY (saved workspace)")
    for mount in env["mounts"]:
        table.add_row(mount["kind"], f"{escape(mount['name'])} at {mount['path']}")
    show(table)


@app.command("open")
def open_env(
    env_id: Annotated[str, typer.Argument(help=ID_HELP)],
    browser: Annotated[bool, typer.Option("--browser/--no-browser", help="Open it in the browser.")] = True,
) -> None:
    """Its JupyterLab, in the browser signed in to the console (the link works for you alone)."""
    env = env_by_id(env_id)
    url = f"{Credentials.load().url.rstrip('/')}{env['url']}"
    if env["status"] != "running":
        out.print(f"it is {status_text(env['status'])}; JupyterLab answers once it runs")
    out.print(url)
    if browser:
        webbrowser.open(url)


@app.command()
def pause(env_id: Annotated[str, typer.Argument(help=ID_HELP)]) -> None:
    """Stop its processes and its billing; its workspace is kept."""
    _said(client.call("POST", f"{PATH}/{env_by_id(env_id)['id']}/pause").json(), "paused")


@app.command()
def resume(env_id: Annotated[str, typer.Argument(help=ID_HELP)]) -> None:
    """Run it again, with its workspace, on the CPod that keeps it."""
    _said(client.call("POST", f"{PATH}/{env_by_id(env_id)['id']}/resume").json(), "resumed")


@app.command()
def stop(
    env_id: Annotated[str, typer.Argument(help=ID_HELP)],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for a confirmation.")] = False,
) -> None:
    """Stop it for good: its processes, its billing, its name."""
    env = env_by_id(env_id)
    if not yes and not typer.confirm(f"Stop dev environment {env['name']} ({env['id']}) for good?"):
        raise CliError("not stopped")
    _said(client.call("DELETE", f"{PATH}/{env['id']}").json(), "stopped")
