"""``sxwl admin register-model``: a public base model put straight into the server's own store and
database, through the same service as ``POST /api/v1/admin/models`` (how `make run` seeds the demo)."""

from __future__ import annotations

import asyncio
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated

import typer

from sxwl.cli.client import CliError
from sxwl.cli.cloud_settings import settings_for
from sxwl.cli.output import out

DataDir = Annotated[
    Path, typer.Option("--data-dir", envvar="SXWL_DATA_DIR", help="Where the database and keys live.")
]


def _register(data_dir: Path, name: str, archive: Path) -> str:
    from sxwl.cloud.context import CloudContext
    from sxwl.cloud.db import migrate
    from sxwl.cloud.errors import AppError
    from sxwl.cloud.services.catalog import model_catalog

    ctx = CloudContext.from_settings(settings_for(data_dir))
    migrate.upgrade(ctx.db.engine)
    try:
        # In a thread of its own: the caller may already run an event loop (a test, a notebook).
        with archive.open("rb") as handle, ThreadPoolExecutor(1) as pool:
            model = pool.submit(
                asyncio.run, model_catalog.register_public(ctx, name=name, archive=handle)
            ).result()
    except AppError as exc:
        raise CliError(
            f"{archive}: {exc.message}" if exc.status != 409 else exc.message, exit_code=1
        ) from None
    finally:
        ctx.db.dispose()
    params = f"{model.parameters:,} parameters" if model.parameters is not None else "parameters unknown"
    return f"registered public model {model.name} ({model.architecture or 'unknown architecture'}, {params})"


def register(admin_app: typer.Typer) -> None:
    @admin_app.command("register-model")
    def register_model(
        path: Annotated[Path, typer.Argument(help="A model directory, or a .tar / .tar.gz of one.")],
        name: Annotated[str, typer.Option("--name", help="The model's id, as users name it.")],
        data_dir: DataDir = Path(".sxwl"),
    ) -> None:
        """Register a public base model (config.json, a tokenizer, *.safetensors) without HTTP."""
        if not path.exists():
            raise CliError(f"{path}: no such file or directory", exit_code=2)
        if path.is_dir():
            from sxwl.cloud.services.catalog.model_archive import pack_directory

            with tempfile.TemporaryDirectory(prefix="sxwl-pack-") as scratch:
                archive = Path(scratch) / "model.tar"
                try:
                    pack_directory(path, archive)
                except OSError as exc:
                    raise CliError(f"{path}: cannot pack the directory: {exc}", exit_code=1) from None
                out.print(_register(data_dir, name, archive))
        else:
            out.print(_register(data_dir, name, path))
