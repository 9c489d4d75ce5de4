"""Test databases that start with the schema at head, copied rather than migrated.

Every in-process app (``TestClient(create_app(…))``) migrated its fresh database: Alembic executes
every migration's module and runs them all, most of a second of CPU per test, and profiled, a large
share of a test worker's. The migrations run once per test process into a template instead (SQLite:
a file copied with SQLite's backup; PostgreSQL: a database the tests' ones are created from), and
``create_app`` then finds the schema at head, as a replica restarted on its database does. The
migrations themselves are still run and checked from an empty database by their own tests
(tests/test_*_migration.py, tests/test_workers.py) and by every ``sxwl serve`` the tests start."""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

import psycopg
from sqlalchemy import URL, make_url

from sxwl.cloud.db import migrate
from sxwl.cloud.db.engine import make_engine, make_private, sqlite_path


def at_head(url: str) -> None:
    """Gives the empty database ``url`` (as ``Settings.resolved_database_url`` gives it: a SQLite file
    not made yet, or a PostgreSQL database with no tables) the schema at head with what the
    migrations put in it; any other is left as it is."""
    if url.startswith("sqlite"):
        path = sqlite_path(url)
        if path is not None and not path.exists():
            _copy_sqlite(path)
        return
    libpq = make_url(url).set(drivername="postgresql")
    if not _has_tables(_text(libpq)):
        _clone_postgres(libpq)


def _text(url: URL) -> str:
    return url.render_as_string(hide_password=False)


def _migrated(url: str) -> None:
    engine = make_engine(url)
    try:
        migrate.upgrade(engine)
    finally:
        engine.dispose()


@functools.cache
def _sqlite_template() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="sxwl-schema-"))
    atexit.register(shutil.rmtree, folder, True)
    path = folder / "head.db"
    _migrated(f"sqlite:///{path}")
    return path


def _copy_sqlite(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    make_private(path)  # 0600 from the start, as the cloud makes its own
    with (
        contextlib.closing(sqlite3.connect(_sqlite_template())) as source,
        contextlib.closing(sqlite3.connect(path)) as target,
    ):
        source.backup(target)  # with whatever the template's WAL still holds


def _has_tables(url: str) -> bool:
    with psycopg.connect(url) as conn:
        found = conn.execute(
            "SELECT EXISTS (SELECT 1 FROM information_schema.tables WHERE table_schema = 'public')"
        ).fetchone()
    return bool(found and found[0])


@functools.cache
def _postgres_template(server: URL) -> str:
    """The template database on the server of ``server`` (its maintenance database), migrated at
    first use."""
    name = f"head{os.getpid()}"
    with psycopg.connect(_text(server), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    _migrated(_text(server.set(drivername="postgresql+psycopg", database=name)))
    return name


def _clone_postgres(url: URL) -> None:
    server = url.set(database="postgres")
    template = _postgres_template(server)
    with psycopg.connect(_text(server), autocommit=True) as conn:
        # CREATE DATABASE … TEMPLATE needs the name free and nobody connected to the template.
        conn.execute(f'DROP DATABASE "{url.database}"')
        conn.execute(f'CREATE DATABASE "{url.database}" TEMPLATE "{template}"')
