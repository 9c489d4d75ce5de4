"""Each user's storage quota (docs/operations.md, "Storage quotas"): what their files, their base
models and their jobs' artifacts take in the store, counted from the rows that record them, against
``storage_quota_bytes``. An upload is refused (413 ``storage_quota_exceeded``) by its declared size
before a byte of it is read, by its bytes as they arrive, and once more in the transaction that
records it, where the user's row lock takes one user's records one at a time.

A fine-tune's adapter is its job's artifact, counted once as such; public models belong to nobody;
logs are bounded per attempt instead (``log_max_bytes``)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from sxwl.cloud.config import Settings
from sxwl.cloud.db.finetune_models import CatalogModel, DataFile, ModelKind
from sxwl.cloud.db.models import Artifact, Job, User
from sxwl.cloud.errors import AppError

CODE = "storage_quota_exceeded"


@dataclass(frozen=True)
class StorageUsage:
    """Bytes a user keeps in the store, by kind, and their quota (0: none)."""

    files: int
    models: int
    artifacts: int
    quota: int

    @property
    def used(self) -> int:
        return self.files + self.models + self.artifacts

    @property
    def room(self) -> int | None:
        """How many more bytes fit; None when there is no quota."""
        return max(0, self.quota - self.used) if self.quota else None


def usage(session: Session, settings: Settings, owner_id: str) -> StorageUsage:
    files = session.scalar(
        select(func.coalesce(func.sum(DataFile.bytes), 0)).where(DataFile.owner_id == owner_id)
    )
    models = session.scalar(
        select(func.coalesce(func.sum(CatalogModel.bytes), 0)).where(
            CatalogModel.owner_id == owner_id, CatalogModel.kind == ModelKind.BASE
        )
    )
    artifacts = session.scalar(
        select(func.coalesce(func.sum(Artifact.size), 0))
        .join(Job, Job.id == Artifact.job_id)
        .where(Job.owner_id == owner_id)
    )
    return StorageUsage(int(files or 0), int(models or 0), int(artifacts or 0), settings.storage_quota_bytes)


def size_text(num_bytes: int) -> str:
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            # "512 MiB", not "512.0 MiB"; "2.7 KiB" keeps its decimal.
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f}".removesuffix(".0") + f" {unit}"
        value /= 1024
    return f"{num_bytes} B"  # pragma: no cover - the loop always returns


def exceeded(found: StorageUsage, needed: int, at_least: bool = False) -> AppError:
    """The one refusal: it names the quota, what is used, the limit and what the upload needed
    (``at_least``: a body refused while it streamed in, whose whole size is unknown)."""
    need = ("at least " if at_least else "") + size_text(needed)
    return AppError(
        413,
        f"storage quota exceeded: {size_text(found.used)} of {size_text(found.quota)} used, this needs "
        f"{need}; delete files to make room, or ask an administrator for a larger quota",
        code=CODE,
        details={
            "quota": "storage",
            "used_bytes": found.used,
            "limit_bytes": found.quota,
            "needed_bytes": needed,
        },
    )


def require(found: StorageUsage, needed: int, freed: int = 0) -> None:
    """Raises unless ``needed`` more bytes fit, ``freed`` (what they replace) given back first."""
    if found.quota and found.used - freed + needed > found.quota:
        raise exceeded(found, needed)


def room_for(found: StorageUsage, freed: int = 0) -> int | None:
    return None if found.room is None else found.room + min(freed, found.used)


def lock_owner(session: Session, owner_id: str) -> None:
    """The user's row lock, held until the recording transaction ends: on PostgreSQL two uploads of
    one user are recorded one after the other, each seeing the other's bytes (SQLite's unit of work
    takes the database's write lock instead: ``Database.session(immediate=True)``)."""
    session.execute(select(User.id).where(User.id == owner_id).with_for_update())


def artifact_replaced(session: Session, job_id: str, path: str) -> int:
    """The bytes of the job's artifact at ``path`` that an upload of the path would replace."""
    size = session.scalar(select(Artifact.size).where(Artifact.job_id == job_id, Artifact.path == path))
    return int(size or 0)


def check_artifact(
    session: Session, settings: Settings, job: Job, path: str, size: int
) -> tuple[StorageUsage, int | None]:
    """Raises unless an artifact of ``size`` bytes at ``path`` fits the job owner's quota; returns the
    owner's usage and the room an upload of the path has (None: no quota)."""
    replaced = artifact_replaced(session, job.id, path)
    found = usage(session, settings, job.owner_id)
    require(found, size, replaced)
    return found, room_for(found, replaced)


def check_recorded(session: Session, settings: Settings, job: Job, path: str, size: int) -> None:
    """The check in the transaction that records a new artifact, under the owner's lock. An upload
    that replaces one of the job's artifacts was judged with the bytes it replaces before it was
    read; refused now, its bytes would be those of the path's record."""
    exists = session.scalar(select(Artifact.id).where(Artifact.job_id == job.id, Artifact.path == path))
    if exists is None:
        lock_owner(session, job.owner_id)
        require(usage(session, settings, job.owner_id), size)
