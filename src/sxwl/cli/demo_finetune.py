"""What `sxwl up` prepares for fine-tuning (docs/finetune.md): a tiny base model of a real
architecture, built offline and registered as public, and a sample chat dataset in the demo user's
files, so a new user can start a fine-tune from the console at once and watch it finish on CPUs.

Both are built by ``python -m sxwl.trainer.tiny`` in a process of its own: the training stack
(torch, transformers, triton) never loads into the cloud's process, which would otherwise carry it
for its whole life and print its leaks when stopped."""

from __future__ import annotations

import asyncio
import importlib.util
import subprocess
import sys
import tempfile
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from sqlalchemy import select

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.finetune_models import CatalogModel, DataFile
from sxwl.cloud.db.models import User
from sxwl.cloud.services.catalog import model_catalog
from sxwl.cloud.services.catalog.model_archive import pack_directory
from sxwl.cloud.services.finetune import datasets

DEMO_MODEL = "tiny-llama"
DEMO_DATASET = "sample-translate.jsonl"
T = TypeVar("T")


def training_installed() -> bool:
    """The trainer's libraries (the `train` extra) are there: the tiny model needs them to be built,
    and the local agent to fine-tune it."""
    return all(importlib.util.find_spec(name) is not None for name in ("torch", "transformers", "peft"))


def _run(coroutine: Coroutine[object, object, T]) -> T:
    # In a thread of its own: the caller may already run an event loop.
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def ensure_demo_finetune(ctx: CloudContext, user: User) -> str | None:
    """Registers the demo model and the demo user's sample dataset once per data dir. Returns what
    is missing for the demo, or None when it is ready."""
    if not training_installed():
        return "fine-tuning needs the training extra: pip install -e '.[train]'"
    with ctx.db.session() as session:
        public = CatalogModel.owner_id.is_(None)
        demo_model = session.scalar(select(CatalogModel.id).where(CatalogModel.name == DEMO_MODEL, public))
        has_file = (
            session.scalar(
                select(DataFile.id).where(DataFile.owner_id == user.id, DataFile.filename == DEMO_DATASET)
            )
            is not None
        )
    with tempfile.TemporaryDirectory(prefix="sxwl-demo-") as scratch:
        root = Path(scratch)
        model, dataset = root / DEMO_MODEL, root / DEMO_DATASET
        build = [
            *([str(model)] if demo_model is None else []),
            *([] if has_file else ["--dataset", str(dataset)]),
        ]
        if build:
            print("Building the fine-tuning demo's model and dataset (once per data dir)…", file=sys.stderr)
            # Its output is kept unless it fails: the training stack prints its own leaks on exit.
            done = subprocess.run(
                [sys.executable, "-m", "sxwl.trainer.tiny", *build],
                capture_output=True,
                text=True,
                check=False,
            )
            if done.returncode != 0:
                said = done.stderr.strip().splitlines()[-3:]
                return f"the demo model and dataset could not be built: {' '.join(said) or done.returncode}"
        if demo_model is None:
            archive = root / "model.tar"
            pack_directory(model, archive)
            with archive.open("rb") as handle:
                _run(model_catalog.register_public(ctx, name=DEMO_MODEL, archive=handle))
        if not has_file:
            with dataset.open("rb") as handle:
                chunks = model_catalog.file_chunks(handle)
                _run(
                    datasets.upload(
                        ctx, owner_id=user.id, filename=DEMO_DATASET, purpose="fine-tune", chunks=chunks
                    )
                )
    return None
