"""Entry point of ``sxwl-agent``."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer
import uvloop

from sxwl.agent.client import Refused
from sxwl.agent.inventory.local import LocalInventory
from sxwl.agent.inventory.simulated import SimulatedGpus
from sxwl.agent.kube_setup import DEV_ENV_HELP, job_runtime
from sxwl.agent.leader import LeadershipLost
from sxwl.agent.local_setup import FLAG_HELP, JobFlags, local_isolation, local_runtime, sandbox_setup
from sxwl.agent.loop import Agent, AgentConfig
from sxwl.agent.pod_settings import PodSettings, memory_quantity, node_selector, toleration
from sxwl.agent.runtimes.base import J
from sxwl.agent.runtimes.bounds import DEFAULT_MEMORY, DEFAULT_PIDS, DEFAULT_TMPFS, JobNetwork
from sxwl.agent.runtimes.sandbox import IsolationSetting
from sxwl.agent.state import local_cluster_uid
from sxwl.agent.tunnel_client import TUNNEL_HELP, TunnelSettings

if TYPE_CHECKING:  # the Kubernetes client is imported only by agents that use it: it is slow to load
    from kubernetes_asyncio.client import ApiClient

    from sxwl.agent.cache_server import CacheServer

# Exit statuses a supervisor can tell apart: restarting helps after 1, never after 3.
EXIT_FAILED = 1
EXIT_REFUSED = 3
DEFAULT_NAMESPACE = "sxwl-system"
DEFAULT_INPUT_CACHE_GIB = 200.0

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
        str,
        typer.Option(
            help="local (this machine) or kubernetes (the cluster this agent runs in, or --kubeconfig's)."
        ),
    ] = "local",
    kubeconfig: Annotated[
        Path | None,
        typer.Option(
            help="kubernetes runtime: the kubeconfig to use. Default: the pod's ServiceAccount when running "
            "in a pod, else $KUBECONFIG or ~/.kube/config."
        ),
    ] = None,
    namespace: Annotated[
        str,
        typer.Option(
            envvar="POD_NAMESPACE",
            help="kubernetes runtime: the agent's namespace (its token Secret and leader Lease live there).",
        ),
    ] = DEFAULT_NAMESPACE,
    leader_elect: Annotated[
        bool,
        typer.Option(
            "--leader-elect/--no-leader-elect",
            help="kubernetes runtime: elect one leader among replicas through a Lease; only it works.",
        ),
    ] = False,
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
    input_cache_gib: Annotated[
        float,
        typer.Option(
            help="GiB the cache of fine-tunes' models and datasets may hold before the least recently "
            "used are removed; 0: no limit.",
            min=0,
        ),
    ] = DEFAULT_INPUT_CACHE_GIB,
    input_cache_dir: Annotated[
        Path | None, typer.Option(help="Where that cache is kept (default: STATE_DIR/cache).")
    ] = None,
    serve_inputs: Annotated[
        str | None,
        typer.Option(
            envvar="SXWL_SERVE_INPUTS",
            metavar="HOST:PORT",
            help="kubernetes runtime: fetch fine-tunes' inputs into the agent's cache once and serve them "
            "to the CPod's pods on this address (the chart's Service points at it). Needs --trainer-image, "
            "--engine-image or --dev-env-image.",
        ),
    ] = None,
    inputs_url: Annotated[
        str | None,
        typer.Option(
            envvar="SXWL_INPUTS_URL",
            help="kubernetes runtime: --serve-inputs as the pods reach it, e.g. "
            "http://sxwl-agent-inputs.sxwl-system.svc:8471 (default: http://HOST:PORT).",
        ),
    ] = None,
    isolation: Annotated[
        IsolationSetting,
        typer.Option(
            envvar="SXWL_ISOLATION",
            help="local runtime: auto (isolate each job with bubblewrap where possible), required (refuse "
            "to start otherwise) or none (no isolation: only trusted accounts' jobs run).",
        ),
    ] = "auto",
    trust_account: Annotated[
        list[str] | None,
        typer.Option(
            help="local runtime without isolation: an account (email) besides the provider whose jobs "
            "this CPod runs; repeat for several."
        ),
    ] = None,
    job_memory_limit: Annotated[str, typer.Option(help=FLAG_HELP["memory"])] = DEFAULT_MEMORY,
    job_pids_limit: Annotated[int, typer.Option(help=FLAG_HELP["pids"], min=0)] = DEFAULT_PIDS,
    job_tmpfs_size: Annotated[str, typer.Option(help=FLAG_HELP["tmpfs"])] = DEFAULT_TMPFS,
    job_network: Annotated[
        JobNetwork, typer.Option(envvar="SXWL_JOB_NETWORK", help=FLAG_HELP["network"])
    ] = "loopback",
    share_dir: Annotated[list[Path] | None, typer.Option(help=FLAG_HELP["share"])] = None,
    upload_url: Annotated[
        str | None,
        typer.Option(
            envvar="SXWL_UPLOAD_URL",
            help="kubernetes runtime: the cloud's URL as tenant pods reach it, for their artifacts "
            "(default: --api-url).",
        ),
    ] = None,
    uploader_image: Annotated[
        str | None,
        typer.Option(
            envvar="SXWL_UPLOADER_IMAGE",
            help="kubernetes runtime: the image of each pod's uploader container (any image with python3; "
            "the chart gives the agent's own). Without it, jobs on this CPod have no artifacts.",
        ),
    ] = None,
    trainer_image: Annotated[
        str | None,
        typer.Option(
            envvar="SXWL_TRAINER_IMAGE",
            help="kubernetes runtime: the image that runs fine-tunes (the project's trainer image, "
            "deploy/docker/trainer.Dockerfile); needs --uploader-image. Without it this CPod takes no "
            "fine-tunes.",
        ),
    ] = None,
    engine_image: Annotated[
        str | None,
        typer.Option(
            envvar="SXWL_ENGINE_IMAGE",
            help="kubernetes runtime: the image that runs endpoint replicas (python3 with this project and "
            "vLLM for GPUs, or transformers' serving extra for CPUs); needs --uploader-image. Without it "
            "this CPod serves no endpoints.",
        ),
    ] = None,
    agent_pod_label: Annotated[
        list[str] | None,
        typer.Option(
            help="kubernetes runtime: KEY=VALUE, a label of the agent's own pods (in --namespace), the only "
            "pods an endpoint replica's NetworkPolicy admits; repeatable (the chart sets them).",
        ),
    ] = None,
    upload_ca_file: Annotated[
        Path | None,
        typer.Option(
            help="kubernetes runtime: a PEM CA bundle the uploaders check the cloud's certificate "
            "against, if not the system's."
        ),
    ] = None,
    pod_node_selector: Annotated[
        list[str] | None,
        typer.Option(
            help="kubernetes runtime: KEY=VALUE, a node label every tenant pod requires; repeatable."
        ),
    ] = None,
    pod_toleration: Annotated[
        list[str] | None,
        typer.Option(
            help="kubernetes runtime: KEY[=VALUE]:EFFECT, a taint every tenant pod tolerates; repeatable."
        ),
    ] = None,
    dev_env_image: Annotated[
        str | None, typer.Option(envvar="SXWL_DEV_ENV_IMAGE", help=DEV_ENV_HELP["image"])
    ] = None,
    workspace_storage_class: Annotated[str | None, typer.Option(help=DEV_ENV_HELP["class"])] = None,
    workspace_size: Annotated[str, typer.Option(help=DEV_ENV_HELP["size"])] = "20Gi",
    pod_memory_limit: Annotated[
        str | None,
        typer.Option(
            help="kubernetes runtime: the memory limit of each tenant pod's job container (e.g. 16Gi); a "
            "job that goes past it ends as failed, OOMKilled. Default: no limit of the agent's own."
        ),
    ] = None,
    tunnel_connections: Annotated[int, typer.Option(help=TUNNEL_HELP["connections"], min=0, max=8)] = 2,
    tunnel_allow: Annotated[
        list[str] | None, typer.Option(metavar="HOST:PORT", help=TUNNEL_HELP["allow"])
    ] = None,
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
    # Its debug log prints every response body, Secrets' data (CPod and upload tokens) included.
    logging.getLogger("kubernetes_asyncio").setLevel(logging.INFO)
    if runtime not in ("local", "kubernetes"):
        typer.echo(f"error: --runtime {runtime}: choose local or kubernetes", err=True)
        raise typer.Exit(2)
    try:
        tunnel = TunnelSettings.from_flags(tunnel_connections, tunnel_allow or [])
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if (trainer_image or engine_image) and not uploader_image:
        typer.echo(
            f"error: {'--trainer-image' if trainer_image else '--engine-image'} needs --uploader-image: "
            "a fine-tune's or endpoint's pod fetches its inputs with the uploader's image and token",
            err=True,
        )
        raise typer.Exit(2)
    # Resolved once, at start: every path the agent hands a job (its work and output dirs) or keeps
    # (the token, job records) derives from it and must not depend on a working directory.
    state_dir = state_dir.resolve()
    mode, setup = None, None
    if runtime == "local":
        flags = JobFlags(
            job_memory_limit, job_pids_limit, job_tmpfs_size, job_network, tuple(share_dir or ())
        )
        try:
            mode = local_isolation(isolation, trust_account or [])
            setup = sandbox_setup(flags, state_dir, mode)
        except (RuntimeError, ValueError) as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
    pods = PodSettings(
        upload_url=(upload_url or api_url).rstrip("/"),
        uploader_image=uploader_image,
        trainer_image=trainer_image,
        engine_image=engine_image,
        agent_labels=_flag_values(agent_pod_label or [], "--agent-pod-label", node_selector),
        dev_env_image=dev_env_image,
        workspace_storage_class=workspace_storage_class,
        workspace_size=_flag_values([workspace_size], "--workspace-size", memory_quantity)[0],
        upload_ca=_read_ca(upload_ca_file),
        node_selector=_flag_values(pod_node_selector or [], "--pod-node-selector", node_selector),
        tolerations=_flag_values(pod_toleration or [], "--pod-toleration", toleration),
        memory_limit=next(
            iter(
                _flag_values(
                    [pod_memory_limit] if pod_memory_limit else [], "--pod-memory-limit", memory_quantity
                )
            ),
            None,
        ),
    )
    cache_server = None
    if serve_inputs is not None:
        from sxwl.agent.cache_server import CacheServer

        try:
            cache_server, url = CacheServer.from_flags(
                serve_inputs, inputs_url, runtime, bool(trainer_image or engine_image or dev_env_image)
            )
        except ValueError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from None
        pods = PodSettings(**{**pods.__dict__, "inputs_url": url})
    config = AgentConfig(
        api_url=api_url.rstrip("/"),
        access_key=access_key,
        runtime=runtime,
        state_dir=state_dir,
        cluster_uid=local_cluster_uid(state_dir) if runtime == "local" else "",
        name=name,
        heartbeat_interval_s=heartbeat_interval,
        stop_grace_s=stop_grace,
        isolation=mode,
        trusted_accounts=tuple(trust_account or ()),
        input_cache_max_bytes=int(input_cache_gib * 2**30) or None,
        input_cache_dir=input_cache_dir.resolve() if input_cache_dir else None,
        tunnel=tunnel,
    )
    try:
        if runtime == "local":
            gpus = SimulatedGpus(simulate_gpus, simulate_gpu_product) if simulate_gpus else None
            inventory = LocalInventory(gpus)
            assert mode is not None and setup is not None
            local = local_runtime(config.state_dir, inventory.gpu_indexes(), config.stop_grace_s, mode, setup)
            # uvloop, as the cloud's uvicorn runs: a tunnel stream's hop through the agent (its
            # WebSocket, the engine's socket) measured 0.1-0.2 ms shorter each way (docs/endpoints.md).
            uvloop.run(_run(Agent(config, inventory, runtime=local)))
        else:
            uvloop.run(_run_kubernetes(config, pods, kubeconfig, namespace, leader_elect, cache_server))
    except Refused as exc:
        where = (
            f"remove {state_dir / 'cpod.json'}"
            if runtime == "local"
            else f"delete the Secret {namespace}/sxwl-agent-token"
        )
        hint = {
            "cpod_revoked": f"this CPod was revoked on 算想云; the agent stops. To register again, {where} "
            "and start with the current accessKey.",
            "bad_access_key": "check the accessKey on the account page of the console.",
        }.get(exc.code, "")
        typer.echo(f"error: the cloud refused this agent: {exc}. {hint}".rstrip(), err=True)
        raise typer.Exit(EXIT_REFUSED) from None
    except LeadershipLost as exc:
        typer.echo(f"error: {exc}; exiting so that the pod restarts as a candidate", err=True)
        raise typer.Exit(EXIT_FAILED) from None
    except KubernetesUnavailable as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(EXIT_FAILED) from None


T = TypeVar("T")


def _flag_values(values: list[str], flag: str, parse: Callable[[str], T]) -> tuple[T, ...]:
    """Each value parsed; a bad one stops the agent (status 2) with the flag and the fix named."""
    parsed = []
    for value in values:
        try:
            parsed.append(parse(value))
        except ValueError as exc:
            typer.echo(f"error: {flag} {value}: {exc}", err=True)
            raise typer.Exit(2) from None
    return tuple(parsed)


def _read_ca(path: Path | None) -> bytes | None:
    if path is None:
        return None
    try:
        pem = path.read_bytes()
    except OSError as exc:
        typer.echo(f"error: --upload-ca-file {path}: {exc.strerror or exc}", err=True)
        raise typer.Exit(2) from None
    if b"-----BEGIN CERTIFICATE-----" not in pem:
        typer.echo(f"error: --upload-ca-file {path}: not a PEM certificate bundle", err=True)
        raise typer.Exit(2)
    return pem


class KubernetesUnavailable(Exception):
    """The Kubernetes API cannot be reached or refuses what the agent must read at start."""


async def kubernetes_api(kubeconfig: Path | None) -> ApiClient:
    """An ApiClient: --kubeconfig's, else the pod's ServiceAccount in a pod, else the default
    kubeconfig."""
    from kubernetes_asyncio import config as k8s_config
    from kubernetes_asyncio.client import ApiClient, Configuration

    configuration = Configuration()
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        k8s_config.load_incluster_config(client_configuration=configuration)
    else:
        await k8s_config.load_kube_config(
            config_file=str(kubeconfig) if kubeconfig else None, client_configuration=configuration
        )
    return ApiClient(configuration=configuration)


async def _run_kubernetes(
    config: AgentConfig,
    pods: PodSettings,
    kubeconfig: Path | None,
    namespace: str,
    leader_elect: bool,
    cache_server: CacheServer | None = None,
) -> None:
    from kubernetes_asyncio.client.exceptions import ApiException

    from sxwl.agent.inventory.kubernetes import KubernetesInventory, cluster_uid
    from sxwl.agent.leader import LeaseElector
    from sxwl.agent.state import SecretState

    try:
        api = await kubernetes_api(kubeconfig)
    except Exception as exc:
        raise KubernetesUnavailable(f"no Kubernetes configuration: {exc}") from None
    async with api:
        try:
            uid = await cluster_uid(api)
        except ApiException as exc:
            raise KubernetesUnavailable(
                f"cannot read the kube-system namespace (its uid is the CPod's cluster_uid): "
                f"{exc.status} {exc.reason}"
            ) from None
        except OSError as exc:
            raise KubernetesUnavailable(f"the Kubernetes API is unreachable: {exc}") from None
        config = AgentConfig(**{**config.__dict__, "cluster_uid": uid})
        agent = Agent(
            config,
            KubernetesInventory(api),
            runtime=job_runtime(api, config, pods, namespace),
            state=SecretState(api, namespace),
            leader=LeaseElector(api, namespace) if leader_elect else None,
            cache_server=cache_server,
        )
        await _run(agent)


async def _run(agent: Agent[J]) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, agent.stop)
    await agent.run()


def main() -> None:
    app()
