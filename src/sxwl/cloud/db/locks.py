"""The locks by which processes sharing one database take turns, on both engines: on PostgreSQL an
advisory lock (its keys are all here, so none is taken twice by accident), on SQLite, which serves
from one machine, an exclusive file lock beside the database file. Used by the migrations (one
upgrade at a time), the scheduler (one pass at a time), the rate limits (one count per key at a
time) and the server's guard (one server per SQLite file)."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator

from sqlalchemy import Connection, text

from sxwl.cloud.db.engine import sqlite_path

# One-key advisory locks; the rate limits' two-key locks (RATE_CLASS, a key's hash) are a key space
# of their own.
MIGRATE_KEY = 0x5358574C  # "SXWL" in one byte order
SCHEDULER_KEY = 0x5857_4C53  # "SXWL" in the other
RATE_CLASS = 0x52415445  # "RATE"


@contextlib.contextmanager
def beside_sqlite(url: str, name: str, *, wait: bool = True) -> Iterator[None]:
    """Holds an exclusive lock on ``<database>.<name>-lock`` beside the SQLite database of ``url``
    (nothing for an in-memory one). ``wait=False``: BlockingIOError at once when it is held."""
    path = sqlite_path(url)
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{path}.{name}-lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def advisory(connection: Connection, key: int) -> Iterator[None]:
    """A PostgreSQL session-level advisory lock, held on ``connection`` across whatever transactions
    it runs until the block ends."""
    connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": key})
    try:
        yield
    finally:
        connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": key})
        connection.commit()


def advisory_in_transaction(connection: Connection, key: int) -> None:
    """A PostgreSQL advisory lock that the current transaction holds until it ends."""
    connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})
