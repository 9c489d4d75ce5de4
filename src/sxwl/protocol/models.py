"""Register and heartbeat messages, and the Node inventory they carry.

Both sides validate with these models, so a malformed heartbeat is refused by the cloud with the
field named, and an agent never sends one."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AliasChoices, Field, field_validator, model_validator

from sxwl.protocol.devenvs import DevEnvSpec
from sxwl.protocol.endpoints import EngineLoad, EngineSpec
from sxwl.protocol.fields import Int32, Int64, Name, NonNegInt32, NonNegInt64, PosInt32, Text, Wire, WireIn
from sxwl.protocol.finetune import CachedInput, JobInput, TrainerSpec
from sxwl.protocol.reasons import Reason

# Bumped on incompatible changes; the cloud accepts MIN_SUPPORTED..PROTOCOL_VERSION.
PROTOCOL_VERSION = 1
MIN_SUPPORTED_PROTOCOL = 1
PROTOCOL_HEADER = "X-SXWL-Protocol"
# The sha256 (hex) of an artifact's bytes, sent with its upload: the cloud refuses bytes that differ.
SHA256_HEADER = "X-SXWL-Sha256"

Runtime = Literal["local", "kubernetes"]


class GpuDevice(WireIn):
    index: NonNegInt32
    uuid: Text | None = Field(default=None, max_length=128)
    utilization_pct: int | None = Field(default=None, ge=0, le=100)
    memory_used_mib: NonNegInt64 | None = None
    temperature_c: int | None = Field(default=None, ge=-50, le=200)


class GpuInfo(WireIn):
    vendor: Name = Field(min_length=1, max_length=32)
    product: Name = Field(min_length=1, max_length=128)
    memory_mib: NonNegInt64
    count: int = Field(ge=0, le=1024)
    allocatable: int = Field(ge=0, le=1024)
    used: int = Field(default=0, ge=0, le=1024)
    driver: Text | None = Field(default=None, max_length=64)
    cuda: Text | None = Field(default=None, max_length=32)
    devices: list[GpuDevice] = Field(default_factory=list, max_length=1024)

    @model_validator(mode="after")
    def _counts_fit(self) -> GpuInfo:
        if self.allocatable > self.count:
            raise ValueError(f"allocatable ({self.allocatable}) is more than count ({self.count})")
        if self.used > self.count:
            raise ValueError(f"used ({self.used}) is more than count ({self.count})")
        return self


class Node(WireIn):
    name: Name = Field(min_length=1, max_length=253)
    status: Literal["ready", "not_ready"]
    cpu_cores: NonNegInt32
    memory_mib: NonNegInt64
    gpu: GpuInfo | None = None
    # Why a node is not ready, in the agent's words (a local agent whose start-up check found that
    # jobs cannot run here), for 算力详情.
    reason: Text | None = Field(default=None, max_length=500)


def attempt_key(job_id: str, attempt: int | str) -> str:
    """``<job_id>:<attempt>``: how an agent's runtime keys the attempts it holds, and how the cloud
    stores the attempts a heartbeat listed (``CPod.reported_jobs``)."""
    return f"{job_id}:{attempt}"


def split_attempt_key(key: str) -> tuple[str, int] | None:
    """The job and attempt of an ``attempt_key``; None for a key that is not one."""
    job_id, _, attempt = key.rpartition(":")
    return (job_id, int(attempt)) if job_id and attempt.isascii() and attempt.isdigit() else None


class JobReport(WireIn):
    job_id: Text = Field(min_length=1, max_length=64)
    attempt: PosInt32
    state: Text = Field(min_length=1, max_length=32)
    # An endpoint replica's engine load (None: not an engine, or not known in this beat).
    load: EngineLoad | None = None


# "isolated": every job runs in a sandbox of its own (a Kubernetes CPod's namespaces, a local agent's
# bubblewrap); "none": jobs run as the agent's user, so the CPod takes only trusted accounts' jobs.
Isolation = Literal["isolated", "none"]


class IsolationReport(WireIn):
    """How the agent runs jobs, sent at registration and again at every start (the mode can change
    between runs: bubblewrap installed, the agent no longer root)."""

    isolation: Isolation = "isolated"  # what agents before this field ran as, as far as the cloud knew
    # Accounts (by email) besides the provider whose jobs a CPod without isolation takes.
    trusted_accounts: list[str] = Field(default_factory=list, max_length=100)
    # Whether the agent fetches fine-tunes' inputs and runs the trainer; None (agents before this
    # field): the local runtime does, Kubernetes does not.
    fine_tunes: bool | None = None
    # Whether it runs endpoint replicas; None (agents before this field): the local runtime does,
    # Kubernetes does not.
    endpoints: bool | None = None
    # Whether it runs dev environments (a Kubernetes agent with a dev environment image); None
    # (agents before this field): the local runtime does, Kubernetes does not.
    dev_envs: bool | None = None

    @field_validator("trusted_accounts")
    @classmethod
    def _emails(cls, emails: list[str]) -> list[str]:
        for email in emails:
            if not 3 <= len(email) <= 254 or "@" not in email:
                raise ValueError(f"{email[:60]!r} is not an email address")
        return emails


class IsolationReply(Wire):
    # The accounts whose jobs the CPod may run; None: anyone's (it isolates them).
    accepted_owner_ids: list[str] | None


class RegisterRequest(IsolationReport):
    cluster_uid: str = Field(min_length=8, max_length=128, pattern=r"^[A-Za-z0-9._:-]+$")
    name: Name | None = Field(default=None, min_length=1, max_length=64)
    runtime: Runtime
    agent_version: Text = Field(min_length=1, max_length=64)
    protocol_version: PosInt32 = PROTOCOL_VERSION
    # The interval the agent would like; the cloud clamps it to its bounds and answers the one to use.
    heartbeat_interval_s: float | None = Field(default=None, gt=0)


class RegisterReply(Wire):
    cpod_id: str
    cpod_token: str
    heartbeat_interval_s: float
    protocol_version: int = PROTOCOL_VERSION
    last_seq: int = 0


class Heartbeat(WireIn):
    seq: NonNegInt64
    nodes: list[Node]
    jobs: list[JobReport] = Field(default_factory=list)
    # The inputs the CPod keeps fetched (docs/finetune.md, "Data near the GPUs"); None: not reported
    # in this beat (an agent sends it when it changed), so the cloud keeps what it knew.
    cache: list[CachedInput] | None = Field(default=None, max_length=10_000)
    # Optional self-check: a token used for another CPod's id is refused.
    cpod_id: Text | None = Field(default=None, max_length=64)

    @field_validator("nodes")
    @classmethod
    def _unique_node_names(cls, nodes: list[Node]) -> list[Node]:
        seen: set[str] = set()
        for node in nodes:
            if node.name in seen:
                raise ValueError(f"duplicate node name {node.name!r}")
            seen.add(node.name)
        return nodes


class HeartbeatReply(Wire):
    heartbeat_interval_s: float
    accepted: bool
    # The newest seq the cloud holds: an agent whose seq was stale continues after it.
    last_seq: int
    status: Literal["online", "unknown", "offline"]


REASON_MAX_CHARS = 500

AgentJobState = Literal["starting", "running", "succeeded", "failed", "cancelled", "lost"]


class Assignment(Wire):
    """A job attempt given to a CPod: everything the runtime needs to start it. The cloud reads it
    from the attributes of its job's row, whose ``id`` is the ``job_id`` here."""

    job_id: str = Field(validation_alias=AliasChoices("job_id", "id"))
    attempt: int = Field(ge=1)
    name: str
    owner_id: str
    command: list[str] | str
    image: str | None = None
    env: dict[str, str] = Field(default_factory=dict)
    gpu_product: str | None = None
    gpus_per_node: int = Field(ge=0)
    nodes: int = Field(ge=1)
    node_names: list[str] = Field(default_factory=list)
    max_runtime_s: int | None = Field(default=None, ge=1)
    # Cores and memory per node the attempt asked for (a dev environment's ``cpus``, ``memory_gib``):
    # the local runtime's cgroup quota and limit, a pod's requests and limits; None: the runtime's
    # defaults. A cloud that predates them sends none.
    cpus: int | None = Field(default=None, ge=1)
    memory_mib: int | None = Field(default=None, ge=1)
    # The attempt's own credential for its pods' artifact uploads (docs/agent.md, "Artifacts from
    # pods"); a cloud that predates it sends none. Never shown by repr, so never in a log line.
    upload_token: str | None = Field(default=None, repr=False)
    # What the attempt fetches onto the CPod before it starts, and for a fine-tune the trainer's
    # spec (docs/finetune.md): the agent then runs its own trainer instead of ``command``.
    inputs: list[JobInput] = Field(default_factory=list)
    trainer: TrainerSpec | None = None
    # For a dev environment's attempt, its JupyterLab (docs/dev-envs.md): the agent runs it instead
    # of ``command``. Filled in by the dev-env kind as the attempt is handed out, not read from the row.
    jupyter: DevEnvSpec | None = None
    # For an endpoint's replica (docs/endpoints.md): the engine the agent runs, under its supervisor,
    # instead of ``command``; a cloud that predates endpoints sends none.
    engine: EngineSpec | None = None
    # The largest artifact the cloud stores; None from a cloud that predates it (it still refuses).
    artifact_max_bytes: int | None = Field(default=None, ge=1)
    # The most bytes an input archive's files may add up to once unpacked (the cloud's model limit):
    # the agent refuses a larger archive from its headers, before unpacking any of it.
    archive_max_bytes: int | None = Field(default=None, ge=1)


class Command(Wire):
    """Stop one job attempt; ``reason`` says why (cancelled by its user, fenced after a requeue).
    ``forget_workspace``: remove a stopped dev environment's workspace (``workspace``, its id) from
    the CPod; its job and attempt are the environment's last, already ended."""

    id: int
    kind: Literal["stop", "forget_workspace"]
    job_id: str
    attempt: int
    cancel: bool = False
    reason: str | None = None
    # Seconds between SIGTERM and SIGKILL; None: the agent's own --stop-grace.
    grace_s: float | None = None
    workspace: str | None = Field(default=None, pattern=r"^[A-Za-z0-9]{1,32}$")


class AssignmentsReply(Wire):
    assignments: list[Assignment] = Field(default_factory=list)
    commands: list[Command] = Field(default_factory=list)


class JobStatus(WireIn):
    attempt: PosInt32
    state: AgentJobState
    exit_code: Int32 | None = None
    reason: Text | None = Field(default=None, max_length=REASON_MAX_CHARS)
    # The attempt ended before its command ran (command not found, a sandbox that could not start):
    # it costs nothing, whatever it reported before (docs/billing.md). Older agents leave it out.
    never_ran: bool | None = None  # None: not said (an older agent), as False
    # The reason as a code and its parameters (protocol/reasons.py), so that the cloud words it in each
    # reader's language; ``reason`` stays the English, for a cloud that does not know the code.
    reason_code: Text | None = Field(default=None, max_length=64)
    reason_params: dict[Text, Text | Int64 | None] | None = Field(default=None, max_length=16)
    # The parameters that are reasons themselves (a failed rank's cause), each as its stored JSON.
    reason_parts: dict[Text, Annotated[Text, Field(max_length=REASON_MAX_CHARS)]] | None = Field(
        default=None, max_length=16
    )

    def said(self) -> Reason | None:
        """The reason as the cloud keeps it: its code if the cloud knows it, else its words."""
        return Reason.from_wire(self.reason_code, self.reason_params or {}, self.reason, self.reason_parts)


class JobStatusReply(Wire):
    state: str
    # Set when the cloud wants this attempt stopped (it was cancelled, or is stale).
    stop: bool = False


class LogAppendReply(Wire):
    next_offset: int


class ArtifactUpload(WireIn):
    """One artifact an uploader is about to put, or has put: the cloud presigns and later checks
    exactly these bytes (docs/object-storage.md)."""

    path: str = Field(min_length=1, max_length=4096)
    size: NonNegInt64
    sha256: str = Field(pattern="^[0-9a-f]{64}$", description="hex, lower case")


class ArtifactRecorded(Wire):
    """What the cloud recorded of an attempt's artifact: the answer of every artifact upload route."""

    path: str
    size: int
    sha256: str


class UploadTargetReply(Wire):
    """``cloud``: PUT the bytes to the cloud's artifact route, which records them. ``url``: PUT them
    to ``url`` with ``headers`` before ``expires_in_s`` pass, then report the upload done."""

    via: Literal["cloud", "url"]
    url: str | None = None
    headers: dict[str, str] = Field(default_factory=dict)
    expires_in_s: int | None = None
