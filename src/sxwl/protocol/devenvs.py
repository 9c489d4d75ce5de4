"""A dev environment (docs/dev-envs.md) as its user asks for it, and what its agent is handed: one
declaration for the REST API's body, the console's form and the CLI's flags, and the wire model of
the attempt's JupyterLab."""

from __future__ import annotations

from pydantic import BaseModel, Field

from sxwl.protocol.fields import Name, Strict, Text
from sxwl.protocol.jobs import MAX_GPUS_PER_NODE

MAX_MOUNTS = 16  # models and files each
# Cores and memory an environment may ask for: bounds of the request only; whether a CPod offers as
# much is the scheduler's answer (a queue reason naming the need).
MAX_CPUS = 1024
MAX_MEMORY_GIB = 16_384
MAX_IDLE_TIMEOUT_MIN = 7 * 24 * 60
DEFAULT_IDLE_TIMEOUT_MIN = 60
# Where the environment's JupyterLab is served, on the cloud and in the environment alike.
BASE_PATH = "/dev/"
# Where an attempt's inputs are mounted in its sandbox (the agent's JOB_WORK / "inputs").
INPUTS_SEEN_AT = "/sxwl/work/inputs"
# The input of a resumed environment's job that holds its workspace as another CPod saved it.
WORKSPACE_INPUT = "workspace"
WORKSPACE_ARTIFACT = "workspace.tar"  # the artifact each attempt leaves: its workspace, saved


def base_url(env_id: str) -> str:
    return f"{BASE_PATH}{env_id}/"


def model_input(index: int) -> str:
    return f"model-{index}"


def file_input(index: int) -> str:
    return f"file-{index}"


class DevEnvIn(Strict):
    """An environment to create (POST /api/v1/dev-envs, the console's form, ``sxwl dev create``)."""

    name: Name = Field(default="dev", min_length=1, max_length=100)
    gpu_product: Name | None = Field(default=None, min_length=1, max_length=128)
    gpus: int = Field(default=0, ge=0, le=MAX_GPUS_PER_NODE)
    # None: a job's default bounds (billed as one core without GPUs: docs/billing.md).
    cpus: int | None = Field(default=None, ge=1, le=MAX_CPUS)
    memory_gib: int | None = Field(default=None, ge=1, le=MAX_MEMORY_GIB)
    image: Text | None = Field(default=None, max_length=500)
    # Names of catalogue models (base models or adapters) and ids of uploaded files, read-only inside.
    models: list[Name] = Field(default_factory=list, max_length=MAX_MOUNTS)
    files: list[Name] = Field(default_factory=list, max_length=MAX_MOUNTS)
    idle_timeout_min: int = Field(default=DEFAULT_IDLE_TIMEOUT_MIN, ge=1, le=MAX_IDLE_TIMEOUT_MIN)


class DevEnvSpec(BaseModel):
    """What the agent runs for a dev environment's attempt (``Assignment.dev_env``): JupyterLab on
    ``base_url`` with ``token``, which is random per attempt and known only to the cloud and this
    agent (never shown by repr, so never in a log line)."""

    base_url: str = Field(pattern=r"^/dev/[A-Za-z0-9_-]{1,64}/$")
    # The environment's id: its workspace on the CPod, kept across its attempts (pause, resume).
    workspace: str = Field(pattern=r"^[A-Za-z0-9]{1,32}$")
    token: str = Field(min_length=32, max_length=128, pattern=r"^[A-Za-z0-9_-]+$", repr=False)
    idle_timeout_min: int = Field(default=DEFAULT_IDLE_TIMEOUT_MIN, ge=1, le=MAX_IDLE_TIMEOUT_MIN)
    # The owner's public keys (authorized_keys lines) that the environment's sshd accepts.
    ssh_keys: list[str] = Field(default_factory=list, max_length=50)


def ssh_target(job_id: str, attempt: int) -> str:
    """The ``sxwl-target`` of an attempt's sshd: raw bytes, no HTTP (docs/dev-envs.md, "SSH")."""
    return f"dev-ssh.{job_id}.{attempt}"


def tunnel_target(job_id: str, attempt: int) -> str:
    """The ``sxwl-target`` naming an attempt's JupyterLab: its agent maps it to the attempt's own
    socket, never to an address the cloud or a tenant chose."""
    return f"dev-env.{job_id}.{attempt}"


def parse_target(target: str) -> tuple[str, str, int] | None:
    """(``dev-env`` or ``dev-ssh``, job id, attempt) of a dev environment's target, or None."""
    parts = target.split(".")
    if len(parts) != 3 or parts[0] not in ("dev-env", "dev-ssh") or not parts[2].isdigit():
        return None
    return parts[0], parts[1], int(parts[2])
