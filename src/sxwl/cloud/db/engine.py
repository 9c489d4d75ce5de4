"""Engine and session factory for one database URL."""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, Select, create_engine, event, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from sxwl.cloud.db.types import encode_json

log = logging.getLogger(__name__)

T = TypeVar("T")

# The execution option that makes a unit of work on SQLite start with BEGIN IMMEDIATE.
_IMMEDIATE = "sxwl_sqlite_immediate"
# SQLite creates these beside the database with the database file's own mode.
_SQLITE_COMPANIONS = ("", "-wal", "-shm", "-journal")


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL; None for an in-memory or URI-addressed database."""
    database = make_url(url).database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database)


def make_private(path: Path) -> None:
    """Creates the database file 0600 if it is missing (so its WAL and shared-memory files are born
    0600 too) and takes group and other access away from the files already there: they hold
    password hashes and the encrypted accessKeys (docs/operations.md, "Files on disk")."""
    # Never open an existing database file here: closing any descriptor of it drops every POSIX
    # lock this process holds on it, SQLite's included, and another process closing its last
    # connection would then delete the WAL under our open ones ("disk I/O error").
    if path.parent.is_dir() and not path.exists():
        with contextlib.suppress(FileExistsError):  # created at this moment by another process
            os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
    for name in _SQLITE_COMPANIONS:
        companion = path.with_name(path.name + name)
        try:
            mode = companion.stat().st_mode
            if mode & 0o077:
                companion.chmod(mode & 0o700)
        except FileNotFoundError:
            continue
        except PermissionError:
            log.warning("%s is readable by others and not ours to change (chmod 600 it)", companion)


def _sqlite_engine(url: str) -> Engine:
    engine = create_engine(
        url, connect_args={"check_same_thread": False, "timeout": 30}, json_serializer=encode_json
    )
    path = sqlite_path(url)

    @event.listens_for(engine, "do_connect")
    def _private_files(*_args: Any) -> None:
        # Before SQLite opens (and would create) the file, on every new pooled connection: chmod
        # takes no lock and opens nothing, so it is safe while other connections are open.
        if path is not None:
            make_private(path)

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
        cursor = dbapi_conn.cursor()
        # WAL lets readers proceed while one writer commits; FKs are off by default in SQLite.
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin_immediate(conn: Connection) -> None:
        # The driver itself starts a transaction only before the first INSERT/UPDATE/DELETE, so what
        # was read before it may be stale by then; BEGIN IMMEDIATE takes the write lock up front.
        if conn.get_execution_options().get(_IMMEDIATE):
            conn.exec_driver_sql("BEGIN IMMEDIATE")

    @event.listens_for(engine, "savepoint")
    def _savepoint_takes_the_write_lock(conn: Connection, _name: str | None) -> None:
        # A SAVEPOINT outside a transaction opens a deferred one: its reads fix a snapshot, and its
        # first write then fails at once ("database is locked", no busy wait) if another connection
        # committed in between. Savepoints here only ever guard writes, so take the lock up front.
        dbapi = conn.connection.dbapi_connection
        if dbapi is not None and not dbapi.in_transaction:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        return _sqlite_engine(url)
    # A pool as large as the concurrency the server sees: opening and closing overflow connections
    # cost PostgreSQL more CPU per heartbeat than the heartbeat itself.
    return create_engine(url, pool_size=40, max_overflow=20, pool_pre_ping=True, json_serializer=encode_json)


class Database:
    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        # Lone reads (Database.scalar) go to a small pool of autocommitted connections, not pinged.
        self._reads = (
            self.engine
            if url.startswith("sqlite")
            else create_engine(url, pool_size=4, max_overflow=8, isolation_level="AUTOCOMMIT")
        )
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)
        self.immediate_sessions = sessionmaker(
            self.engine.execution_options(**{_IMMEDIATE: True}), expire_on_commit=False
        )

    @contextmanager
    def session(self, immediate: bool = False) -> Iterator[Session]:
        """A unit of work: committed when the block ends normally, rolled back otherwise.

        ``immediate``: on SQLite, the unit of work holds the database's write lock from its first
        statement, so a check it makes first (is this accessKey still active?) still holds when it
        commits. SQLite has no row locks (FOR UPDATE / FOR SHARE compile to nothing there); on
        PostgreSQL such a unit of work locks the rows it checks instead, and the flag changes nothing.
        """
        factory = self.immediate_sessions if immediate else self.sessions
        with factory() as session, session.begin():
            yield session

    def scalar(self, statement: Select[T]) -> T | None:
        """The first value of one read outside any transaction, on a connection not pinged first:
        PostgreSQL is spared the ping, BEGIN and COMMIT round trips (a CPod's long-poll renewal is
        one token check). A connection the server dropped fails the read, which is then run once
        more on a fresh one: a lone read is safe to repeat."""
        try:
            return self._scalar_once(statement)
        except DBAPIError as exc:
            if not exc.connection_invalidated:
                raise
        return self._scalar_once(statement)

    def _scalar_once(self, statement: Select[T]) -> T | None:
        with self._reads.connect() as connection:
            return connection.scalar(statement)

    def dispose(self) -> None:
        self.engine.dispose()
        self._reads.dispose()
