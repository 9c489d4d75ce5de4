"""Request and response bodies of the REST API."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import AliasChoices, AliasPath, BaseModel, ConfigDict, Field, field_validator

from sxwl.cloud.services.accounts.accounts import MAX_PASSWORD, MIN_PASSWORD, normalize_email
from sxwl.cloud.services.money.gpu_summary import GpuSummary
from sxwl.protocol import Isolation, Node
from sxwl.protocol.fields import Name, Strict, Text
from sxwl.protocol.jobs import JobFields

PHONE_PATTERN = r"^\+?[0-9][0-9 \-]{4,30}$"


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


class StorageOut(BaseModel):
    """What the caller keeps in the store against their quota (docs/operations.md, "Storage quotas")."""

    used_bytes: int
    limit_bytes: int | None = Field(description="the quota; null: no limit")
    available_bytes: int | None = Field(description="what more fits; null: no limit")
    files_bytes: int
    models_bytes: int = Field(description="the caller's own base models (an adapter is an artifact)")
    artifacts_bytes: int = Field(description="their jobs' artifacts, adapters and checkpoints included")


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


class InputCacheOut(BaseModel):
    """What the CPod's agent last reported holding of fine-tunes' inputs (models, datasets)."""

    entries: int
    bytes: int


class CPodOut(BaseModel):
    id: str
    name: str
    owner_email: str
    status: Literal["online", "unknown", "offline"]
    revoked: bool
    runtime: str
    # "none": its jobs run without isolation, so it takes only its provider's and trusted accounts' jobs.
    isolation: Isolation
    # Whether it runs fine-tunes: the local runtime, a Kubernetes one whose agent has a trainer image.
    fine_tunes: bool
    # The scheduler prefers, among CPods that fit, one that holds a job's inputs (docs/finetune-locality.md).
    input_cache: InputCacheOut
    agent_version: str
    created_at: datetime
    last_heartbeat_at: datetime | None
    heartbeat_interval_s: float
    nodes: list[Node]
    gpu_summary: list[GpuSummary]


class CPodRenameIn(Strict):
    name: Name = Field(min_length=1, max_length=64)


class CPodEventOut(BaseModel):
    at: datetime
    kind: str
    detail: str | None
    actor: str | None


class CPodBriefOut(BaseModel):
    id: str
    name: str
    status: Literal["online", "unknown", "offline"]
    revoked: bool


class AccessKeyCheckOut(BaseModel):
    provider: str
    cpods: list[CPodBriefOut]
    # The oldest offline artifact (its manifest's version) whose 3kctl and agent this cloud accepts:
    # 3kctl stops before any host changes when its artifact is older (docs/artifact.md).
    min_artifact_version: str


class JobOut(JobFields):
    """A job as the API shows it, read from the ``Job`` row's attributes (and its owner's)."""

    # Every field is in every answer: the schema says so, defaults included.
    model_config = ConfigDict(from_attributes=True, json_schema_serialization_defaults_required=True)

    id: str
    owner_email: str = Field(validation_alias=AliasChoices("owner_email", AliasPath("owner", "email")))
    state: str
    attempt: int
    cpod_id: str | None
    node_names: list[str]
    created_at: datetime
    assigned_at: datetime | None
    started_at: datetime | None
    finished_at: datetime | None
    exit_code: int | None
    reason: str | None  # in English, from the row's code (protocol/reasons.py)
    cancel_requested: bool

    # Not a column: the lists compute it for a whole page at once (services.jobs.queue_positions).
    queue_position: int | None = None
    # Micro-yuan so far (live while it runs) and per hour while running: on a single job's answer.
    cost: int | None = None
    cost_per_hour: int | None = None


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
