"""A job as its user declares it, and the limits of each field: one declaration that the REST API's
body, the console's submit form and the CLI's flags all validate with."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, Field, field_validator

from sxwl.protocol.fields import Name, Strict, Text, refuse_nul

MAX_NAME = 100
MAX_COMMAND = 100_000  # characters, over every argument together
MAX_GPUS_PER_NODE = 64
MAX_NODES = 256
MAX_RUNTIME_S = 30 * 24 * 3600
MAX_ENV = 200
MAX_ENV_VALUE = 32_768
MIN_PRIORITY, MAX_PRIORITY = -100, 100
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Set by the agent for every job (its ids, output directory, the GPUs it was given): a job that
# chose them itself could write where another attempt's files are, or see GPUs it was not given.
RESERVED_ENV = ("SXWL_", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")

EnvProblem = Literal["bad_name", "reserved", "too_long"]


def env_problem(key: str, value: str) -> tuple[EnvProblem, str] | None:
    """Why ``key=value`` cannot be in a job's environment (a kind for the console's words, and the
    English message), or None."""
    if not ENV_NAME.match(key):
        return "bad_name", f"{key!r} is not a valid variable name"
    if key.startswith(RESERVED_ENV):
        return "reserved", f"{key} is set by the platform"
    if len(value) > MAX_ENV_VALUE:
        return "too_long", f"value of {key} is longer than {MAX_ENV_VALUE} characters"
    return None


class JobFields(BaseModel):
    """What a job's user chooses: taken by ``JobIn``, shown back by the API's ``JobOut``."""

    name: Name = Field(default="job", min_length=1, max_length=MAX_NAME)
    command: list[str] | str
    image: Text | None = Field(default=None, max_length=500)
    env: dict[str, Text] = Field(default_factory=dict, max_length=MAX_ENV)
    gpu_product: Name | None = Field(default=None, min_length=1, max_length=128)
    gpus_per_node: int = Field(default=0, ge=0, le=MAX_GPUS_PER_NODE)
    nodes: int = Field(default=1, ge=1, le=MAX_NODES)
    max_runtime_s: int | None = Field(default=None, ge=1, le=MAX_RUNTIME_S)
    priority: int = Field(default=0, ge=MIN_PRIORITY, le=MAX_PRIORITY)

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str] | str) -> list[str] | str:
        # Checked here rather than typed as Text: errors then name "command", not a branch of the union.
        parts = [value] if isinstance(value, str) else value
        if not parts or not parts[0].strip():
            raise ValueError("must not be empty")
        if sum(len(part) for part in parts) > MAX_COMMAND:
            raise ValueError(f"is longer than {MAX_COMMAND} characters")
        for part in parts:
            refuse_nul(part)
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for key, item in value.items():
            if problem := env_problem(key, item):
                raise ValueError(problem[1])
        return value


class JobIn(Strict, JobFields):
    """A job to submit (POST /api/v1/jobs, the console's form, ``sxwl jobs submit``)."""

    # Where the user pins it; the job's ``cpod_id`` once placed is the CPod it runs on.
    cpod_id: Text | None = Field(default=None, max_length=32)
