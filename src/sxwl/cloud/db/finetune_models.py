"""The fine-tuning tables (docs/finetune.md): uploaded files, the model catalogue, fine-tunes with
their events and checkpoints. A fine-tune is an ordinary job underneath (``FineTune.job_id``)."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

from sqlalchemy import JSON, BigInteger, Float, ForeignKey, Index, Integer, String, UniqueConstraint, text
from sqlalchemy.orm import Mapped, mapped_column, relationship

from sxwl.cloud.db.json_rows import StoredAt
from sxwl.cloud.db.models import Base, partial_unique, str_enum
from sxwl.cloud.db.types import ReasonText, UTCDateTime, utcnow
from sxwl.protocol.reasons import Reason


class FileStatus(enum.StrEnum):
    PROCESSED = "processed"  # valid: a fine-tune may use it
    ERROR = "error"  # kept with its problems, so the user sees each line that is wrong


class DataFile(Base):
    """A training or validation file (JSONL), validated line by line when it was uploaded."""

    __tablename__ = "data_files"
    __table_args__ = (Index("ix_data_files_owner_created", "owner_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # "file-…"
    owner_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    purpose: Mapped[str] = mapped_column(String(32))
    filename: Mapped[str] = mapped_column(String(255))
    bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    status: Mapped[FileStatus] = mapped_column(str_enum(FileStatus))
    format: Mapped[str | None] = mapped_column(String(24))  # "chat" or "prompt_completion"
    examples: Mapped[int] = mapped_column(Integer, default=0)
    # [{line, message}], the first ones found (bounded); empty when the file is valid.
    problems: Mapped[list[dict[str, Any]]] = mapped_column(JSON, default=list)
    problem_count: Mapped[int] = mapped_column(Integer, default=0)  # all of them, past those kept
    # {base model id: {examples, tokens, loss_tokens, dropped}}: what that base's tokenizer made of
    # the file when a fine-tune of it tokenized it (DatasetCount less its role).
    token_counts: Mapped[dict[str, dict[str, int]]] = mapped_column(
        JSON, default=dict, server_default=text("'{}'")
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class ModelKind(enum.StrEnum):
    BASE = "base"  # a model directory (config.json, tokenizer, safetensors) as a tar
    ADAPTER = "adapter"  # a LoRA adapter a fine-tune produced, tied to its base


class CatalogModel(Base):
    """A model of the catalogue. ``owner_id`` None: public (registered by an admin). Names are the
    owner's (docs/finetune.md, "Models"): one of each among the public models and among each user's
    own, so a private name neither blocks nor reveals another user's. ``id`` is the row's key,
    never shown: ``model-…`` for a base model, the name itself for an adapter (``ft:…``, unique by
    its fine-tune's id); rows from before migration 0015 keep their names as ids."""

    __tablename__ = "catalog_models"
    __table_args__ = (
        Index("uq_catalog_models_owner_name", "owner_id", "name", unique=True),
        partial_unique("uq_catalog_models_public_name", "name", where="owner_id IS NULL"),
    )

    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    name: Mapped[str] = mapped_column(String(200))  # what users call it: /v1/models' id
    owner_id: Mapped[str | None] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    kind: Mapped[ModelKind] = mapped_column(str_enum(ModelKind))
    base_model_id: Mapped[str | None] = mapped_column(ForeignKey("catalog_models.id", ondelete="RESTRICT"))
    # An adapter's base, read with it (its name is what the API shows as ``base_model``).
    base: Mapped[CatalogModel | None] = relationship(remote_side=[id], lazy="joined", join_depth=1)
    architecture: Mapped[str | None] = mapped_column(String(100))  # config.json's "architectures"[0]
    parameters: Mapped[int | None] = mapped_column(BigInteger)
    bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64))
    # Where the store keeps the tar: {job_id, attempt, path} of storage.Artifact.
    object: Mapped[StoredAt] = mapped_column(JSON)
    fine_tune_id: Mapped[str | None] = mapped_column(String(40))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class FineTune(Base):
    """A fine-tune: what its user asked for, and the progress its trainer last reported. Its status
    follows its job's state (docs/finetune.md, "3. Follow it")."""

    __tablename__ = "fine_tunes"
    __table_args__ = (Index("ix_fine_tunes_owner_created", "owner_id", "created_at"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # "ftjob-…"
    owner_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), unique=True)
    model: Mapped[str] = mapped_column(ForeignKey("catalog_models.id", ondelete="RESTRICT"))
    # The base model's name as the user gave it, shown wherever the fine-tune is (a name never
    # changes, and a page of fine-tunes then reads no model rows).
    model_name: Mapped[str] = mapped_column(String(200))
    training_file: Mapped[str] = mapped_column(ForeignKey("data_files.id"))
    validation_file: Mapped[str | None] = mapped_column(ForeignKey("data_files.id"))
    hyperparameters: Mapped[dict[str, Any]] = mapped_column(JSON)  # resolved: numbers, never "auto"
    lora: Mapped[dict[str, Any]] = mapped_column(JSON)
    suffix: Mapped[str | None] = mapped_column(String(64))
    seed: Mapped[int] = mapped_column(Integer)
    max_cost: Mapped[int | None] = mapped_column(BigInteger)  # micro-yuan
    fine_tuned_model: Mapped[str | None] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    # The trainer's last report, and how far the job's log has been read for reports.
    step: Mapped[int] = mapped_column(BigInteger, default=0)
    total_steps: Mapped[int] = mapped_column(BigInteger, default=0)
    loss: Mapped[float | None] = mapped_column(Float)
    eval_loss: Mapped[float | None] = mapped_column(Float)
    tokens_per_s: Mapped[float | None] = mapped_column(Float)
    trained_tokens: Mapped[int | None] = mapped_column(BigInteger)
    progress_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    parsed_attempt: Mapped[int] = mapped_column(Integer, default=0)
    parsed_offset: Mapped[int] = mapped_column(BigInteger, default=0)


class FineTuneEvent(Base):
    __tablename__ = "fine_tune_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    fine_tune_id: Mapped[str] = mapped_column(ForeignKey("fine_tunes.id", ondelete="CASCADE"), index=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    level: Mapped[str] = mapped_column(String(8), default="info")  # info, warn, error
    type: Mapped[str] = mapped_column(String(16), default="message")  # message, metrics
    message: Mapped[Reason] = mapped_column(ReasonText(500))
    data: Mapped[dict[str, Any] | None] = mapped_column(JSON)


class FineTuneCheckpoint(Base):
    """A checkpoint that reached the cloud: an artifact of one attempt, and where a resume starts."""

    __tablename__ = "fine_tune_checkpoints"
    __table_args__ = (UniqueConstraint("fine_tune_id", "attempt", "path", name="uq_fine_tune_checkpoints"),)

    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # "ftckpt-…"
    fine_tune_id: Mapped[str] = mapped_column(ForeignKey("fine_tunes.id", ondelete="CASCADE"), index=True)
    attempt: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(String(1024))
    step: Mapped[int] = mapped_column(BigInteger)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
