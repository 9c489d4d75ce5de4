"""The cloud's files are private to its user: the SQLite database with its WAL and shared-memory
files (0600, whether the cloud creates them or finds them readable by others), the artifact store
and the demo agent's log."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import stat
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from sxwl.cli import server
from sxwl.cloud.app import create_app
from sxwl.cloud.db.engine import make_engine
from sxwl.cloud.storage import Artifact
from sxwl.cloud.storage.local import LocalArtifactStore
from tests.conftest import register
from tests.support import cloud

FILES = ("sxwl.db", "sxwl.db-wal", "sxwl.db-shm")


@pytest.fixture(autouse=True)
def permissive_umask() -> Iterator[None]:
    """The usual umask, which left group and others able to read what SQLite created."""
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def modes(data_dir: Path) -> dict[str, int]:
    return {name: stat.S_IMODE((data_dir / name).stat().st_mode) for name in FILES}


def use_cloud(data_dir: Path) -> None:
    """A cloud on the default database in ``data_dir`` that writes something, as the first start does."""
    with TestClient(create_app(cloud.test_settings(data_dir, ""))) as client:
        register(client, "owner@example.com")
        assert modes(data_dir) == dict.fromkeys(FILES, 0o600)


def test_a_new_database_and_its_wal_are_created_0600(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    use_cloud(tmp_path / "data")


def test_existing_database_files_readable_by_others_are_made_0600(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    older = sqlite3.connect(data_dir / "sxwl.db")  # an older cloud's files, still open: WAL and -shm exist
    older.execute("PRAGMA journal_mode=WAL")
    older.execute("CREATE TABLE left_behind (x)")
    older.commit()
    for name in FILES:
        (data_dir / name).chmod(0o644)
    try:
        use_cloud(data_dir)
    finally:
        older.close()


def test_the_artifact_store_is_the_clouds_own(tmp_path: Path) -> None:
    # A job on a CPod that shares the machine (`sxwl up`) must not list other tenants' artifacts.
    root = tmp_path / "artifacts"
    root.mkdir(mode=0o755)  # as an older cloud left it
    store = LocalArtifactStore(root)

    async def upload() -> tuple[int, str]:
        async def chunks() -> AsyncIterator[bytes]:
            yield b"weights"

        return await store.put(Artifact("job1", 1, "ckpt/model.bin"), chunks(), max_bytes=100)

    # On a thread of its own: the browser tests' Playwright holds the main thread's event loop.
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(asyncio.run, upload()).result()[0] == 7
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert stat.S_IMODE((root / "job1" / "ckpt" / "model.bin").stat().st_mode) == 0o600


def test_the_demo_agents_log_is_private(tmp_path: Path) -> None:
    settings = cloud.test_settings(
        tmp_path, f"sqlite:///{tmp_path / 'x.db'}", public_url="http://127.0.0.1:9"
    )
    agent = server.start_local_agent(settings, "sk-not-a-real-key")
    server.stop_process(agent)
    assert stat.S_IMODE((tmp_path / "agent.log").stat().st_mode) == 0o600


def test_keeping_files_private_leaves_sqlites_locks_alone(tmp_path: Path) -> None:
    # Closing any descriptor of the database file drops all of this process's locks on it: another
    # process (`sxwl admin create-user` beside `sxwl serve`) then thinks it holds the last connection
    # and deletes the WAL under ours, which later fail with "disk I/O error".
    database = tmp_path / "sxwl.db"
    engine = make_engine(f"sqlite:///{database}")
    with engine.connect() as first:
        first.execute(text("CREATE TABLE t (x)"))
        first.commit()
        with engine.connect() as second:  # a new pooled connection: the files are made private again
            second.execute(text("SELECT 1"))
            other = (
                "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
                "c.execute('SELECT count(*) FROM t'); c.close()"
            )
            subprocess.run([sys.executable, "-c", other, str(database)], check=True, timeout=60)
            assert (tmp_path / "sxwl.db-wal").exists(), "another process removed the WAL under ours"
            first.execute(text("INSERT INTO t VALUES (1)"))
            first.commit()
    engine.dispose()
