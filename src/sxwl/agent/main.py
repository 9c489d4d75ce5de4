"""Entry point of ``sxwl-agent``."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import Annotated

import typer

from sxwl.agent.client import Refused
from sxwl.agent.inventory.local import LocalInventory
from sxwl.agent.inventory.simulated import SimulatedGpus
from sxwl.agent.loop import Agent, AgentConfig
from sxwl.agent.state import local_cluster_uid

# Exit statuses a supervisor can tell apart: restarting helps after 1, never after 3.
EXIT_REFUSED = 3

app = typer.Typer(add_completion=False, context_settings={"help_option_names": ["-h", "--help"]})


@app.command()
def run(
    api_url: Annotated[str, typer.Option(envvar="SXWL_API_URL", help="The cloud's URL.")],
    access_key: Annotated[
        str | None,
        typer.Option(
            envvar="SXWL_ACCESS_KEY",
            help="The provider's accessKey; needed only for the first "
            "registration. Prefer the SXWL_ACCESS_KEY variable: command lines are visible to other users.",
        ),
    ] = None,
    runtime: Annotated[
        str, typer.Option(help="local (this machine); kubernetes comes with the Kubernetes runtime.")
    ] = "local",
    name: Annotated[
        str | None, typer.Option(help="CPod name shown on 算力详情 (first registration).")
    ] = None,
    heartbeat_interval: Annotated[
        float | None, typer.Option(help="Seconds between heartbeats; the cloud may clamp it.", min=0.05)
    ] = None,
    state_dir: Annotated[Path, typer.Option(help="Where the CPod token is kept (mode 0600).")] = Path(
        ".sxwl-agent"
    ),
    simulate_gpus: Annotated[
        int,
        typer.Option(
            help="SIMULATION: declare this many fake GPUs (vendor 'simulated') instead of NVML's.", min=0
        ),
    ] = 0,
    simulate_gpu_product: Annotated[str, typer.Option(help="SIMULATION: product name of the fake GPUs.")] = (
        "SIMULATED-GPU"
    ),
    stop_grace: Annotated[
        float, typer.Option(help="Seconds between SIGTERM and SIGKILL when a job is stopped.", min=0)
    ] = 10.0,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
) -> None:
    """Register this machine as a CPod of 算想云, report its CPUs, memory and GPUs, and run the jobs
    the cloud assigns to it."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if runtime != "local":
        typer.echo(f"error: --runtime {runtime}: this agent supports only the local runtime", err=True)
        raise typer.Exit(2)
    config = AgentConfig(
        api_url=api_url.rstrip("/"),
        access_key=access_key,
        runtime=runtime,
        state_dir=state_dir,
        cluster_uid=local_cluster_uid(state_dir),
        name=name,
        heartbeat_interval_s=heartbeat_interval,
        stop_grace_s=stop_grace,
    )
    gpus = SimulatedGpus(simulate_gpus, simulate_gpu_product) if simulate_gpus else None
    try:
        asyncio.run(_run(Agent(config, LocalInventory(gpus))))
    except Refused as exc:
        hint = {
            "cpod_revoked": "this CPod was revoked on 算想云; the agent stops. To register again, remove "
            f"{state_dir / 'cpod.json'} and start with the current accessKey.",
            "bad_access_key": "check the accessKey on the account page of the console.",
        }.get(exc.code, "")
        typer.echo(f"error: the cloud refused this agent: {exc}. {hint}".rstrip(), err=True)
        raise typer.Exit(EXIT_REFUSED) from None


async def _run(agent: Agent) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, agent.stop)
    await agent.run()


def main() -> None:
    app()
