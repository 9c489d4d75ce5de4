"""An inference endpoint as the cloud, the agent and the engine's supervisor speak of it
(docs/endpoints.md): what a user asks to deploy, with its limits, and the engine spec each replica's
attempt is handed (``Assignment.engine``)."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, field_validator

from sxwl.protocol.fields import Name, NonNegInt32, Strict, Wire, WireIn
from sxwl.protocol.jobs import MAX_GPUS_PER_NODE
from sxwl.protocol.money import MAX_AMOUNT_YUAN, parse_yuan

MAX_REPLICAS = 8
MIN_MODEL_LEN, MAX_MODEL_LEN = 16, 1_048_576
# How many times a replica's engine is started again in place before the replica fails.
ENGINE_RESTARTS = 3
# An endpoint's name: what `model` names in /v1 calls, and the engine's served model name.
ENDPOINT_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
# The engine arguments a user may set, each with its type: anything else (a path, --host, a
# plugin to load) would let a tenant change what the agent relies on, so it is refused by name.
ENGINE_ARGS: dict[str, type] = {
    "dtype": str,
    "gpu_memory_utilization": float,
    "max_num_seqs": int,
    "max_num_batched_tokens": int,
    "enforce_eager": bool,
    "seed": int,
    "max_lora_rank": int,
    "kv_cache_dtype": str,
}
_ARG_VALUE = re.compile(r"^[A-Za-z0-9_.-]{1,40}$")
# vLLM, pinned: the engine image a provider sets, and the command line it is given, follow this.
VLLM_VERSION = "0.11.0"
# Where the engine's OpenAI server listens inside the attempt's own network namespace.
ENGINE_PORT = 8000
# The socket the engine's supervisor serves in the attempt's work dir: the agent's only way in.
ENGINE_SOCKET = "engine.sock"
# Where the tunnel reaches a replica's engine: "<job_id>-<attempt>" + this, as sxwl-target's host.
ENGINE_TARGET_SUFFIX = ".engine"

EngineName = Literal["vllm", "transformers"]


class EndpointRequest(Strict):
    """``POST /api/v1/endpoints``: ``model`` is a base model of the catalogue or a fine-tuned one
    (``ft:<base>:<suffix>:<id>``, served as its base plus the adapter)."""

    name: Name = Field(pattern=ENDPOINT_NAME)
    model: Name = Field(min_length=1, max_length=200)
    gpu_product: Name | None = Field(default=None, min_length=1, max_length=128)
    gpus: int = Field(default=1, ge=0, le=MAX_GPUS_PER_NODE)
    replicas: int = Field(default=1, ge=1, le=MAX_REPLICAS)
    max_model_len: int | None = Field(default=None, ge=MIN_MODEL_LEN, le=MAX_MODEL_LEN)
    engine_args: dict[str, str | int | float | bool] = Field(
        default_factory=dict, max_length=len(ENGINE_ARGS)
    )

    @field_validator("engine_args")
    @classmethod
    def _allowed(cls, value: dict[str, str | int | float | bool]) -> dict[str, str | int | float | bool]:
        for key, given in value.items():
            wanted = ENGINE_ARGS.get(key)
            if wanted is None:
                raise ValueError(
                    f"{key!r} is not an allowed engine argument ({', '.join(sorted(ENGINE_ARGS))})"
                )
            ok = isinstance(given, wanted) and not (wanted is not bool and isinstance(given, bool))
            if wanted is float and isinstance(given, int) and not isinstance(given, bool):
                ok = True
            if not ok:
                raise ValueError(f"{key} must be a {wanted.__name__}")
            if isinstance(given, str) and not _ARG_VALUE.match(given):
                raise ValueError(f"{key}: letters, digits, '.', '_', '-' only")
        return value


# A key's monthly spend cap: decimal yuan (text or a number) in, micro-yuan kept.
MonthlyCap = Annotated[
    int, BeforeValidator(lambda v: parse_yuan(v, maximum=MAX_AMOUNT_YUAN, allow_zero=False))
]
MAX_KEY_RPM, MAX_KEY_TPM = 100_000, 1_000_000_000


class KeyLimits(Strict):
    """An inference key's limits (docs/endpoints.md, "Keys"), each optional (null: none): the API's
    bodies, the console's form and the CLI's flags validate with it."""

    rpm: int | None = Field(
        default=None, ge=1, le=MAX_KEY_RPM, description="requests per minute, across replicas"
    )
    tpm: int | None = Field(
        default=None,
        ge=1,
        le=MAX_KEY_TPM,
        description="tokens (prompt + completion) per minute, across replicas",
    )
    monthly_cap: MonthlyCap | None = Field(
        default=None,
        strict=False,
        description="spend per UTC month in yuan (decimal text or number): its share of its endpoints' cost",
    )


class EngineSpec(Wire):
    """What a replica's attempt serves (``Assignment.engine``): the agent picks the engine (vLLM
    with GPUs, ``transformers serve`` without) and runs it under the supervisor, on the inputs
    ``model`` and, for a fine-tune, ``adapter``."""

    served_name: str = Field(pattern=ENDPOINT_NAME)
    adapter: bool = False
    max_model_len: int | None = Field(default=None, ge=MIN_MODEL_LEN, le=MAX_MODEL_LEN)
    engine_args: dict[str, str | int | float | bool] = Field(default_factory=dict)
    restarts: int = Field(default=ENGINE_RESTARTS, ge=0, le=20)


class EngineRun(EngineSpec):
    """An ``EngineSpec`` with where things are for this attempt: the supervisor's run file."""

    engine: EngineName
    model_dir: str
    adapter_dir: str | None = None
    socket: str | None = None  # the unix socket the supervisor serves, for the agent (local runtime)
    # Kubernetes: the TCP port the supervisor serves on the pod's address instead (a NetworkPolicy
    # admits only the agent's pod to it).
    listen_port: int | None = Field(default=None, ge=1, le=65535)
    work_dir: str  # where a merged model and the engine's last lines are written
    port: int = ENGINE_PORT
    gpus: int = 0


def engine_target(job_id: str, attempt: int) -> str:
    """The ``sxwl-target`` naming a replica's engine (the agent maps it to the attempt's socket)."""
    return f"{job_id}-{attempt}{ENGINE_TARGET_SUFFIX}:80"


def vllm_argv(run: EngineRun) -> list[str]:
    """vLLM's OpenAI server (pinned: VLLM_VERSION) for ``run``: the served name is the endpoint's, so
    requests need no rewriting; an adapter is a LoRA module of that name on its base."""
    argv = ["vllm", "serve", run.model_dir, "--host", "127.0.0.1", "--port", str(run.port)]
    if run.adapter_dir is not None:
        argv += ["--enable-lora", "--lora-modules", f"{run.served_name}={run.adapter_dir}"]
        argv += ["--served-model-name", f"{run.served_name}-base"]
    else:
        argv += ["--served-model-name", run.served_name]
    if run.gpus > 1:
        argv += ["--tensor-parallel-size", str(run.gpus)]
    if run.max_model_len is not None:
        argv += ["--max-model-len", str(run.max_model_len)]
    for key, value in sorted(run.engine_args.items()):
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            argv += [flag] if value else []
        else:
            argv += [flag, str(value)]
    return argv


class EngineLoad(WireIn):
    """An endpoint replica's load as its agent last saw it, sent in the heartbeat beside the attempt
    (docs/agent.md, "Heartbeat"): ``engine``, from the engine's own metrics (vLLM's
    ``vllm:num_requests_running`` and ``vllm:num_requests_waiting``); ``agent``, where the engine
    has none (``transformers serve``), the requests the agent forwards to it now, with no waiting
    count (None: not known)."""

    running: NonNegInt32
    waiting: NonNegInt32 | None = None
    source: Literal["engine", "agent"]
