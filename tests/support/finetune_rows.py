"""Test setup for fine-tunes: files and catalogue models put straight into the artifact store and
the database, as services/finetune/datasets.py and services/catalog/model_catalog.py would after an
upload (those have their own tests). Only what the fine-tune tests need to start from."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.finetune_models import CatalogModel, DataFile, FileStatus, ModelKind
from sxwl.cloud.storage import Artifact
from tests.support.threads import run_on_thread


def store_bytes(ctx: CloudContext, artifact: Artifact, data: bytes) -> tuple[int, str]:
    """Puts ``data`` into the store on a thread of its own (never asyncio.run on the test's)."""

    async def chunks() -> AsyncIterator[bytes]:
        yield data

    stored = run_on_thread(ctx.artifacts.put(artifact, chunks(), len(data) + 1))
    assert stored == (len(data), hashlib.sha256(data).hexdigest())
    return stored


def add_file(
    ctx: CloudContext,
    owner_id: str,
    file_id: str,
    data: bytes,
    *,
    status: FileStatus = FileStatus.PROCESSED,
    examples: int = 3,
) -> str:
    size, sha256 = store_bytes(ctx, Artifact("files", 0, file_id), data)
    with ctx.db.session() as session:
        session.add(
            DataFile(
                id=file_id,
                owner_id=owner_id,
                purpose="fine-tune",
                filename=f"{file_id}.jsonl",
                bytes=size,
                sha256=sha256,
                status=status,
                format="chat",
                examples=examples,
                problems=[] if status == FileStatus.PROCESSED else [{"line": 1, "message": "not JSON"}],
            )
        )
    return file_id


def add_model(
    ctx: CloudContext,
    name: str,
    data: bytes,
    *,
    owner_id: str | None = None,
    kind: ModelKind = ModelKind.BASE,
    base_model_id: str | None = None,
) -> str:
    sha256 = hashlib.sha256(data).hexdigest()
    artifact = Artifact("models", 0, f"{sha256}.tar")
    size, _ = store_bytes(ctx, artifact, data)
    with ctx.db.session() as session:
        session.add(
            CatalogModel(
                id=name,
                name=name,
                owner_id=owner_id,
                kind=kind,
                base_model_id=base_model_id,
                architecture="LlamaForCausalLM",
                bytes=size,
                sha256=sha256,
                object={"job_id": artifact.job_id, "attempt": artifact.attempt, "path": artifact.path},
            )
        )
    return name
