"""The SQLite database and its WAL and shared-memory files are private to the cloud's user (0600),
whether the cloud creates them or finds them already there readable by others."""

from __future__ import annotations

import os
import sqlite3
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from sxwl.cloud.app import create_app
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
