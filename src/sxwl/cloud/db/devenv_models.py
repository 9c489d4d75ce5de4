"""Dev environments (docs/dev-envs.md, migration 0017): one row per environment, outliving its jobs.
A running environment's current job carries ``dev_env_id``; a stopped one keeps its row (its jobs'
usage stays in the statement) but no longer holds its name."""

from __future__ import annotations

import enum
from datetime import datetime

from sqlalchemy import JSON, ForeignKey, Index, Integer, String
from sqlalchemy.orm import Mapped, mapped_column

from sxwl.cloud.db.json_rows import StoredInput
from sxwl.cloud.db.models import Base, new_id, partial_unique, str_enum
from sxwl.cloud.db.types import ReasonText, UTCDateTime, utcnow
from sxwl.protocol.reasons import Reason


class DevEnvState(enum.StrEnum):
    ACTIVE = "active"  # its job is queued, starting or running
    PAUSED = "paused"  # its job stopped (or stopping); its workspace kept on its CPod
    STOPPED = "stopped"  # stopped by its user (or its job ended): final


class DevEnv(Base):
    __tablename__ = "dev_envs"
    __table_args__ = (
        Index("ix_dev_envs_owner_created", "owner_id", "created_at"),
        partial_unique("uq_dev_envs_owner_name_live", "owner_id", "name", where="state != 'stopped'"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    owner_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    name: Mapped[str] = mapped_column(String(100))
    state: Mapped[DevEnvState] = mapped_column(str_enum(DevEnvState), default=DevEnvState.ACTIVE)
    gpu_product: Mapped[str | None] = mapped_column(String(128))
    gpus: Mapped[int] = mapped_column(Integer)
    cpus: Mapped[int | None] = mapped_column(Integer)  # migration 0020; None: a job's defaults
    memory_gib: Mapped[int | None] = mapped_column(Integer)
    image: Mapped[str | None] = mapped_column(String(500))
    # What is mounted where: [{"kind": "model"|"file", "name": ..., "path": ...}], as the user sees it.
    mounts: Mapped[list[dict[str, str]]] = mapped_column(JSON)
    # What each of its jobs fetches onto its CPod (the jobs' own ``inputs``).
    inputs: Mapped[list[StoredInput]] = mapped_column(JSON)
    idle_timeout_min: Mapped[int] = mapped_column(Integer)
    job_id: Mapped[str | None] = mapped_column(String(32))  # its current (or last) job
    cpod_id: Mapped[str | None] = mapped_column(String(32))  # where it last ran
    reason: Mapped[Reason | None] = mapped_column(ReasonText(1000))
    # Idle culling (services/devenvs/idle.py): when the cloud last saw it in use, by its clock, and
    # JupyterLab's own last-activity mark then (compared, never read as a time: another clock).
    active_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    jupyter_activity: Mapped[str | None] = mapped_column(String(64))
    # Its workspace as its last attempt saved it to the artifact store (an input for a resume on
    # another CPod): the artifact's address, sha256 and size; None until an attempt saved one.
    saved: Mapped[StoredInput | None] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    stopped_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # When its CPod was told to remove its workspace, once it was stopped and its last job ended
    # (services/devenvs/cleanup.py; migration 0020).
    workspace_forgotten_at: Mapped[datetime | None] = mapped_column(UTCDateTime())


class SshKey(Base):
    """A public key of a user's, which the sshd of each of their environments accepts."""

    __tablename__ = "ssh_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True, default=new_id)
    owner_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    public_key: Mapped[str] = mapped_column(String(20000))  # "type base64 [comment]", one line
    fingerprint: Mapped[str] = mapped_column(String(100))  # SHA256:…, as ssh-keygen -l shows it
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
