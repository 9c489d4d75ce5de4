"""Applies Alembic migrations; run on every start of the cloud, by every replica and worker."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

from sxwl.cloud.db import locks

MIGRATIONS = Path(__file__).parent / "migrations"


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(engine: Engine) -> bool:
    """Brings the schema to head; True when this call applied migrations, False when it found them
    applied. Replicas starting at the same moment take turns (docs/operations.md, "Several worker
    processes and metrics"): without the lock two of them would both create the first tables."""
    config = alembic_config(engine.url.render_as_string(hide_password=False))
    with _one_upgrade_at_a_time(engine), engine.begin() as connection:
        if frozenset(MigrationContext.configure(connection).get_current_heads()) == heads():
            return False
        config.attributes["connection"] = connection
        command.upgrade(config, "head")
    return True


@contextlib.contextmanager
def _one_upgrade_at_a_time(engine: Engine) -> Iterator[None]:
    """On PostgreSQL an advisory lock on a connection of its own, held across the whole upgrade
    whatever transactions Alembic opens; on SQLite a file lock beside the database."""
    if engine.dialect.name == "postgresql":
        with engine.connect() as connection, locks.advisory(connection, locks.MIGRATE_KEY):
            yield
        return
    with locks.beside_sqlite(engine.url.render_as_string(hide_password=False), "migrate"):
        yield


@functools.cache
def heads() -> frozenset[str]:
    """The newest revisions of the migrations shipped with this code: fixed for a process's life, and
    finding them executes every migration's module (a good half second of CPU)."""
    return frozenset(ScriptDirectory.from_config(alembic_config("")).get_heads())
