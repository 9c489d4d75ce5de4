"""Request and response bodies of the REST API."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sxwl.cloud.services.accounts import MAX_PASSWORD, MIN_PASSWORD, normalize_email
from sxwl.protocol import Node
from sxwl.protocol.fields import Name, Text, refuse_nul

PHONE_PATTERN = r"^\+?[0-9][0-9 \-]{4,30}$"


class Strict(BaseModel):
    """A request body: unknown fields refused, and strict types (``"2"`` or ``true`` for a number is
    a 422, not coerced). The console's forms, whose values are all text, validate with
    ``strict=False``."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True, strict=True)


class RegisterIn(Strict):
    email: Text = Field(max_length=320)
    password: Text = Field(min_length=MIN_PASSWORD, max_length=MAX_PASSWORD)
    role: Literal["provider", "user"]
    name: Name | None = Field(default=None, max_length=100)
    company: Name | None = Field(default=None, max_length=200)
    phone: str | None = Field(default=None, pattern=PHONE_PATTERN)

    @field_validator("email")
    @classmethod
    def _email(cls, value: str) -> str:
        return normalize_email(value)

    @field_validator("name", "company", "phone", mode="before")
    @classmethod
    def _blank_is_none(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value


class AdminCreateUserIn(RegisterIn):
    role: Literal["provider", "user", "admin"]  # type: ignore[assignment]


class LoginIn(Strict):
    # Not validated as an email: a malformed one must get the same 401 as a wrong password.
    email: Text = Field(min_length=1, max_length=320)
    password: Text = Field(min_length=1, max_length=MAX_PASSWORD)


class TokenOut(BaseModel):
    access_token: str
    token_type: Literal["bearer"] = "bearer"  # noqa: S105 - a scheme name, not a secret
    expires_in: int


class PasswordChangeIn(Strict):
    current_password: Text = Field(min_length=1, max_length=MAX_PASSWORD)
    new_password: Text = Field(min_length=MIN_PASSWORD, max_length=MAX_PASSWORD)


class UserOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: str
    email: str
    role: Literal["provider", "user", "admin"]
    name: str | None
    company: str | None
    phone: str | None
    created_at: datetime
    max_gpus: int | None = None


class UserPageOut(BaseModel):
    items: list[UserOut]
    total: int
    page: int
    per_page: int


class AccessKeyOut(BaseModel):
    access_key: str
    created_at: datetime


class AccessKeyRecordOut(BaseModel):
    hint: str
    created_at: datetime
    created_by: str | None
    revoked_at: datetime | None
    revoked_by: str | None


class GpuSummaryOut(BaseModel):
    product: str
    memory_mib: int
    total: int
    allocatable: int
    used: int
    available: int


class CPodOut(BaseModel):
    id: str
    name: str
    owner_email: str
    status: Literal["online", "unknown", "offline"]
    revoked: bool
    runtime: str
    agent_version: str
    created_at: datetime
    last_heartbeat_at: datetime | None
    heartbeat_interval_s: float
    nodes: list[Node]
    gpu_summary: list[GpuSummaryOut]


class CPodRenameIn(Strict):
    name: Name = Field(min_length=1, max_length=64)


class CPodEventOut(BaseModel):
    at: datetime
    kind: str
    detail: str | None
    actor: str | None


class GpuTypeOut(BaseModel):
    product: str
    memory_mib: int
    available: int
    total: int


class CPodBriefOut(BaseModel):
    id: str
    name: str
    status: Literal["online", "unknown", "offline"]
    revoked: bool


class AccessKeyCheckOut(BaseModel):
    provider: str
    cpods: list[CPodBriefOut]


ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
RESERVED_ENV = ("SXWL_", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")


class JobIn(Strict):
    name: Name = Field(default="job", min_length=1, max_length=100)
    command: list[str] | str
    image: Text | None = Field(default=None, max_length=500)
    env: dict[str, Text] = Field(default_factory=dict, max_length=200)
    gpu_product: Name | None = Field(default=None, min_length=1, max_length=128)
    gpus_per_node: int = Field(default=0, ge=0, le=64)
    nodes: int = Field(default=1, ge=1, le=256)
    max_runtime_s: int | None = Field(default=None, ge=1, le=30 * 24 * 3600)
    cpod_id: Text | None = Field(default=None, max_length=32)
    priority: int = Field(default=0, ge=-100, le=100)

    @field_validator("command")
    @classmethod
    def _command(cls, value: list[str] | str) -> list[str] | str:
        # Checked here rather than typed as Text: errors then name "command", not a branch of the union.
        if isinstance(value, str):
            if not value.strip():
                raise ValueError("must not be empty")
            if len(value) > 100_000:
                raise ValueError("is longer than 100000 characters")
            return refuse_nul(value)
        if not value or not value[0].strip():
            raise ValueError("must not be empty")
        if sum(len(v) for v in value) > 100_000:
            raise ValueError("is longer than 100000 characters")
        for part in value:
            refuse_nul(part)
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for key, item in value.items():
            if not re.match(ENV_NAME, key):
                raise ValueError(f"{key!r} is not a valid variable name")
            if key.startswith(RESERVED_ENV):
                raise ValueError(f"{key} is set by the platform")
            if len(item) > 32_768:
                raise ValueError(f"value of {key} is longer than 32768 characters")
        return value


class JobOut(BaseModel):
    id: str
    name: str
    owner_email: str
    state: str
    attempt: int
    cpod_id: str | None
    node_names: list[str]
    command: list[str] | str
    image: str | None
    env: dict[str, str]
    gpu_product: str | None
    gpus_per_node: int
    nodes: int
    max_runtime_s: int | None
    priority: int
    created_at: datetime
    assigned_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    exit_code: int | None
    reason: str | None
    queue_position: int | None
    cancel_requested: bool


class JobPageOut(BaseModel):
    items: list[JobOut]
    total: int
    page: int
    per_page: int


class JobEventOut(BaseModel):
    at: datetime
    attempt: int
    kind: str
    detail: str | None


class ArtifactOut(BaseModel):
    path: str
    size: int
    sha256: str
    attempt: int


class UserLimitsIn(Strict):
    max_gpus: int | None = Field(ge=0, le=100_000)
