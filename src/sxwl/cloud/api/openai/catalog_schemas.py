"""The objects of the OpenAI-compatible files and models API (``/v1``), with our extensions: a file's
``validation`` and a model's kind, base, architecture, size."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from sxwl.cloud.db.finetune_models import CatalogModel, DataFile, ModelKind
from sxwl.cloud.services.finetune import datasets
from sxwl.cloud.services.finetune.dataset_checks import Problem


class FileProblemOut(BaseModel):
    line: int = Field(description="1-based line of the file; 0 for the file as a whole")
    message: str


Format = Literal["chat", "prompt_completion"]


class FileTokensOut(BaseModel):
    examples: int = Field(description="examples kept after truncation to max_seq_len")
    tokens: int
    loss_tokens: int = Field(
        description="tokens the loss is computed on (the assistant's or the completion's)"
    )
    dropped: int = Field(description="examples without an assistant token within max_seq_len")


class FileValidationOut(BaseModel):
    format: Format | None
    examples: int
    problems: list[FileProblemOut] = Field(description="the first problems found (at most 100)")
    problem_count: int
    tokens: dict[str, FileTokensOut] = Field(
        default_factory=dict,
        description="by base model: what its tokenizer made of the file, once a fine-tune of it ran",
    )


class FileOut(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int = Field(description="Unix time, seconds")
    filename: str
    purpose: str
    status: Literal["processed", "error"]
    status_details: str | None
    validation: FileValidationOut


class FileListOut(BaseModel):
    object: Literal["list"] = "list"
    data: list[FileOut]
    has_more: bool


class FileDeletedOut(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool


class ModelOut(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(description="Unix time, seconds")
    owned_by: str = Field(description='"system" for public models, else the owner\'s user id')
    kind: ModelKind | Literal["endpoint"] = Field(description='"endpoint": one of your ready endpoints')
    base_model: str | None = Field(description="an adapter's base; the model an endpoint serves")
    architecture: str | None
    parameters: int | None
    bytes: int | None = Field(description="the archive's size; none for an endpoint")


class ModelListOut(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelOut]


def file_out(file: DataFile) -> FileOut:
    fmt: Format | None = "chat" if file.format == "chat" else "prompt_completion" if file.format else None
    return FileOut(
        id=file.id,
        bytes=file.bytes,
        created_at=int(file.created_at.timestamp()),
        filename=file.filename,
        purpose=file.purpose,
        status="processed" if file.status.value == "processed" else "error",
        status_details=datasets.status_details(file),
        validation=FileValidationOut(
            format=fmt,
            examples=file.examples,
            problems=[FileProblemOut(line=p.line, message=p.message) for p in map(Problem.of, file.problems)],
            problem_count=file.problem_count,
            tokens={m: FileTokensOut.model_validate(c) for m, c in file.token_counts.items()},
        ),
    )


def endpoint_model_out(name: str, serves: str, created: int, owner_id: str) -> ModelOut:
    """A ready endpoint as /v1/models lists it: its name is the ``model`` to call it with."""
    return ModelOut(
        id=name,
        created=created,
        owned_by=owner_id,
        kind="endpoint",
        base_model=serves,
        architecture=None,
        parameters=None,
        bytes=None,
    )


def model_out(model: CatalogModel) -> ModelOut:
    return ModelOut(
        id=model.name,
        created=int(model.created_at.timestamp()),
        owned_by=model.owner_id or "system",
        kind=model.kind,
        base_model=model.base.name if model.base else None,
        architecture=model.architecture,
        parameters=model.parameters,
        bytes=model.bytes,
    )
