"""SQLAlchemy models of the cloud."""

from __future__ import annotations

import enum
import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Enum,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from sxwl.cloud.db.json_rows import CachedRow, NodeRow, StoredInput
from sxwl.cloud.db.types import ReasonText, UTCDateTime, utcnow
from sxwl.protocol.reasons import Reason


def new_id() -> str:
    return uuid.uuid4().hex


def partial_unique(name: str, *columns: str, where: str) -> Index:
    """A unique index over the rows matching ``where`` only, on SQLite and PostgreSQL alike: how the
    database itself keeps an "only one at a time" rule (docs/operations.md, "Only one")."""
    return Index(name, *columns, unique=True, sqlite_where=text(where), postgresql_where=text(where))


def str_enum(enum_cls: type[enum.StrEnum]) -> Enum:
    """A VARCHAR holding the enum's values (not names), the same on every database."""
    return Enum(enum_cls, native_enum=False, length=16, values_callable=lambda e: [m.value for m in e])


class Base(DeclarativeBase):
    pass


class Role(enum.StrEnum):
    PROVIDER = "provider"
    USER = "user"
    ADMIN = "admin"


class SessionKind(enum.StrEnum):
    API = "api"
    CONSOLE = "console"


class User(Base):
    __tablename__ = "users"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    # Stored normalised (lower case), so the unique index is case-insensitive.
    email: Mapped[str] = mapped_column(String(320), unique=True)
    password_hash: Mapped[str] = mapped_column(String(255))
    role: Mapped[Role] = mapped_column(str_enum(Role))
    name: Mapped[str | None] = mapped_column(String(100))
    company: Mapped[str | None] = mapped_column(String(200))
    phone: Mapped[str | None] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    password_changed_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # Concurrent GPUs this user's jobs may hold; None means the cloud's default.
    max_gpus: Mapped[int | None] = mapped_column(Integer)

    access_keys: Mapped[list[AccessKey]] = relationship(
        back_populates="user", foreign_keys="AccessKey.user_id", order_by="AccessKey.created_at.desc()"
    )


class AuthSession(Base):
    """A bearer token (API) or a console cookie session; only the token's hash is kept."""

    __tablename__ = "auth_sessions"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    kind: Mapped[SessionKind] = mapped_column(str_enum(SessionKind))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime())
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    user: Mapped[User] = relationship()


class AccessKey(Base):
    """A provider's accessKey: hashed for lookup, encrypted so its owner can see it again."""

    __tablename__ = "access_keys"
    __table_args__ = (
        Index("ix_access_keys_user_active", "user_id", "revoked_at"),
        partial_unique("uq_access_keys_one_active", "user_id", where="revoked_at IS NULL"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    key_encrypted: Mapped[str] = mapped_column(String(512))
    hint: Mapped[str] = mapped_column(String(8))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    created_by_id: Mapped[str | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    revoked_by_id: Mapped[str | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))

    user: Mapped[User] = relationship(back_populates="access_keys", foreign_keys=[user_id])
    created_by: Mapped[User | None] = relationship(foreign_keys=[created_by_id])
    revoked_by: Mapped[User | None] = relationship(foreign_keys=[revoked_by_id])


class CPodStatus(enum.StrEnum):
    ONLINE = "online"
    UNKNOWN = "unknown"
    OFFLINE = "offline"


class CPod(Base):
    """A cluster registered by a provider's agent. The node snapshot is one JSON document, replaced
    whole by each accepted heartbeat (one row update, atomic on every engine)."""

    __tablename__ = "cpods"
    __table_args__ = (UniqueConstraint("owner_id", "cluster_uid", name="uq_cpods_owner_cluster"),)

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    owner_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    cluster_uid: Mapped[str] = mapped_column(String(128))
    runtime: Mapped[str] = mapped_column(String(16))
    agent_version: Mapped[str] = mapped_column(String(64))
    token_hash: Mapped[str | None] = mapped_column(String(64), unique=True)
    status: Mapped[CPodStatus] = mapped_column(str_enum(CPodStatus), default=CPodStatus.OFFLINE)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    last_heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    last_seq: Mapped[int] = mapped_column(BigInteger, default=0)
    heartbeat_interval_s: Mapped[float] = mapped_column(Float)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    nodes: Mapped[list[NodeRow]] = mapped_column(JSON, default=list)
    # The job attempts the agent said it holds in its last heartbeat: "<job_id>:<attempt>".
    reported_jobs: Mapped[list[str]] = mapped_column(JSON, default=list)
    # "isolated", or "none": the agent cannot keep tenants apart, so the CPod takes only the jobs of
    # its provider and of the accounts in trusted_owner_ids (docs/agent.md, "Isolation").
    isolation: Mapped[str] = mapped_column(String(16), default="isolated")
    trusted_owner_ids: Mapped[list[str]] = mapped_column(JSON, default=list)
    # GPU time offered is counted up to here (services/money/offers.py): utilisation is sold ÷ offered.
    offered_until: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # The inputs the agent last reported holding in its cache: [{sha256, size}] (docs/finetune.md).
    cached_inputs: Mapped[list[CachedRow]] = mapped_column(JSON, server_default=text("'[]'"))
    # Whether its agent fetches a fine-tune's inputs and runs the trainer (the local runtime; a
    # Kubernetes one with a trainer image), as it said at its last start.
    takes_fine_tunes: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # Likewise whether it runs endpoint replicas (an engine) and dev environments (JupyterLab).
    takes_endpoints: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    takes_dev_envs: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # Set by triggers on every write of a column the scheduler reads (services/scheduling/capacity_marks.py),
    # never by the code: a scheduling pass reads only the CPods marked since its last one.
    capacity_mark: Mapped[int] = mapped_column(BigInteger, server_default=text("0"), index=True)

    owner: Mapped[User] = relationship()

    def takes_only(self) -> frozenset[str] | None:
        """The owners whose jobs this CPod may run; None: anyone's."""
        return None if self.isolation == "isolated" else frozenset([self.owner_id, *self.trusted_owner_ids])


class CPodEvent(Base):
    __tablename__ = "cpod_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    cpod_id: Mapped[str] = mapped_column(ForeignKey("cpods.id", ondelete="CASCADE"), index=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    kind: Mapped[str] = mapped_column(String(32))
    detail: Mapped[Reason | None] = mapped_column(ReasonText(500))
    actor_id: Mapped[str | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))


REASON_CHARS = 500  # a job's reason, as stored


class JobState(enum.StrEnum):
    QUEUED = "queued"
    ASSIGNED = "assigned"
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    LOST = "lost"


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
ACTIVE_STATES = frozenset({JobState.ASSIGNED, JobState.STARTING, JobState.RUNNING})


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_state_priority", "state", "priority", "created_at"),
        Index("ix_jobs_owner_created", "owner_id", "created_at"),
        Index("ix_jobs_cpod_state", "cpod_id", "state"),
        # A dev environment's jobs (migration 0022): read when one waits for its full CPod.
        Index(
            "ix_jobs_dev_env",
            "dev_env_id",
            sqlite_where=text("dev_env_id IS NOT NULL"),
            postgresql_where=text("dev_env_id IS NOT NULL"),
        ),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    owner_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(100))
    command: Mapped[Any] = mapped_column(JSON)  # a list of argv strings, or one shell string
    image: Mapped[str | None] = mapped_column(String(500))
    env: Mapped[dict[str, str]] = mapped_column(JSON, default=dict)
    gpu_product: Mapped[str | None] = mapped_column(String(128))
    gpus_per_node: Mapped[int] = mapped_column(Integer)
    nodes: Mapped[int] = mapped_column(Integer)
    max_runtime_s: Mapped[int | None] = mapped_column(Integer)
    # Cores and memory per node it asked for (a dev environment's; migration 0020): placed only on
    # nodes that have them, enforced by the runtime; None: the runtime's defaults, billed as 1 core.
    cpus: Mapped[int | None] = mapped_column(Integer)
    memory_mib: Mapped[int | None] = mapped_column(Integer)
    pinned_cpod_id: Mapped[str | None] = mapped_column(String(32))
    priority: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)

    state: Mapped[JobState] = mapped_column(str_enum(JobState), default=JobState.QUEUED)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    cpod_id: Mapped[str | None] = mapped_column(ForeignKey("cpods.id", ondelete="SET NULL"))
    node_names: Mapped[list[str]] = mapped_column(JSON, default=list)
    reason: Mapped[Reason | None] = mapped_column(ReasonText(REASON_CHARS))
    exit_code: Mapped[int | None] = mapped_column(Integer)
    cancel_requested_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # Why the cloud asked the attempt to stop ("balance exhausted"): the job's reason once it ends.
    cancel_reason: Mapped[Reason | None] = mapped_column(ReasonText(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    assigned_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # What an attempt fetches onto its CPod (protocol.finetune.JobInput, each with "object": where
    # the store keeps it) and, for a fine-tune, the trainer's spec (docs/finetune.md).
    inputs: Mapped[list[StoredInput]] = mapped_column(JSON, server_default=text("'[]'"))
    trainer: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    # The dev environment this job runs (db/devenv_models.py), which names the job's kind.
    dev_env_id: Mapped[str | None] = mapped_column(String(32))
    # For an endpoint's replica, the engine it serves (protocol.endpoints.EngineSpec; migration 0018).
    engine: Mapped[dict[str, Any] | None] = mapped_column(JSON)

    owner: Mapped[User] = relationship()

    @property
    def cancel_requested(self) -> bool:
        return self.cancel_requested_at is not None


class JobEvent(Base):
    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    attempt: Mapped[int] = mapped_column(Integer)
    kind: Mapped[str] = mapped_column(String(32))
    detail: Mapped[Reason | None] = mapped_column(ReasonText(1000))


class LogChunk(Base):
    """A job attempt's output, stored by byte offset so appends are idempotent."""

    __tablename__ = "log_chunks"
    __table_args__ = (UniqueConstraint("job_id", "attempt", "offset", name="uq_log_chunks_position"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    offset: Mapped[int] = mapped_column(BigInteger)
    data: Mapped[bytes] = mapped_column(LargeBinary)


class AttemptLog(Base):
    """Where a job attempt's log stands (docs/jobs.en.md, "Logs"). ``received`` counts the bytes its
    agent sent (the offsets the agent speaks), ``kept`` those a reader gets: the same until the
    attempt's log reached its cap at ``dropped_at``, after which one line says so and nothing more is
    kept. The first ``archived`` bytes of the kept log lie in the artifact store, in segments of
    ``segment_bytes``; only the rest is in ``log_chunks``."""

    __tablename__ = "attempt_logs"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    received: Mapped[int] = mapped_column(BigInteger, default=0)
    kept: Mapped[int] = mapped_column(BigInteger, default=0)
    dropped_at: Mapped[int | None] = mapped_column(BigInteger)
    archived: Mapped[int] = mapped_column(BigInteger, default=0)
    segment_bytes: Mapped[int] = mapped_column(BigInteger)


class Artifact(Base):
    __tablename__ = "artifacts"
    __table_args__ = (UniqueConstraint("job_id", "path", name="uq_artifacts_job_path"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(String(1024))
    size: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


FORGET_WORKSPACE = "forget_workspace"  # an AgentCommand's kind beside "stop" and "cancel"


class AgentCommand(Base):
    """An instruction for one CPod's agent (stop a job attempt), delivered by long-poll until acked."""

    __tablename__ = "agent_commands"
    __table_args__ = (Index("ix_agent_commands_pending", "cpod_id", "acked_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    cpod_id: Mapped[str] = mapped_column(ForeignKey("cpods.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16))
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    reason: Mapped[str | None] = mapped_column(String(200))
    # Seconds between SIGTERM and SIGKILL the cloud asks for; None: the agent's own setting.
    grace_s: Mapped[float | None] = mapped_column(Float)
    # Of a "forget_workspace" command: the stopped dev environment whose workspace goes (migration 0020).
    workspace: Mapped[str | None] = mapped_column(String(32))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    acked_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class JobAttempt(Base):
    """One placement of a job on a CPod: fencing checks it, and its usage is rated from it. The price
    is fixed here when the attempt is placed (invariant 9, docs/architecture.md)."""

    __tablename__ = "job_attempts"
    # One row per (job, attempt) is the primary key; at most one of a job's attempts is open.
    __table_args__ = (
        partial_unique("uq_job_attempts_one_open", "job_id", where="finished_at IS NULL"),
        Index(
            "ix_job_attempts_unrated",
            "started_at",
            sqlite_where=text("rated_done = 0"),
            postgresql_where=text("NOT rated_done"),
        ),
    )

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    cpod_id: Mapped[str | None] = mapped_column(ForeignKey("cpods.id", ondelete="SET NULL"), index=True)
    node_names: Mapped[list[str]] = mapped_column(JSON, default=list)
    gpus: Mapped[int] = mapped_column(Integer)
    assigned_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    outcome: Mapped[str | None] = mapped_column(String(16))

    # What the attempt is billed for: "gpu" (units = its GPUs) or "cpu" (units = its nodes' cores).
    resource: Mapped[str] = mapped_column(String(8), default="gpu")
    units: Mapped[int] = mapped_column(Integer, default=0)
    gpu_product: Mapped[str | None] = mapped_column(String(128))
    price_per_hour: Mapped[int] = mapped_column(BigInteger, default=0)  # micro-yuan per unit-hour
    fee_bp: Mapped[int] = mapped_column(Integer, default=0)  # the platform's fee, basis points
    payer_id: Mapped[str | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    provider_id: Mapped[str | None] = mapped_column(ForeignKey("users.id", ondelete="SET NULL"))
    # The last moment something proves the attempt alive, kept when a heartbeat stops listing it
    # and fixed when it closes; while its CPod lists it, that CPod's last heartbeat is the proof.
    proven_until: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # Rated so far: microseconds of usage from started_at, and the running totals they cost and
    # earned. Totals are computed from the whole duration, so passes never accumulate rounding.
    rated_us: Mapped[int] = mapped_column(BigInteger, default=0)
    charged: Mapped[int] = mapped_column(BigInteger, default=0)
    earned: Mapped[int] = mapped_column(BigInteger, default=0)
    rated_done: Mapped[bool] = mapped_column(default=False)
