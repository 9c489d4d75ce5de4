"""SQLite serves one server process: ``--workers 2`` on it, or a second ``sxwl serve`` on the same
file, is refused with the reason instead of failing later with "database is locked" under load and
wake-ups that never cross processes (docs/operations.md, "Several worker processes and metrics")."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from sxwl.cli.client import CliError
from sxwl.cloud.config import Settings
from sxwl.cloud.db import locks
from sxwl.cloud.db.engine import sqlite_path

HOW = "use PostgreSQL (SXWL_DATABASE_URL) for several server processes: docs/operations.md"


@contextlib.contextmanager
def guard(settings: Settings, workers: int) -> Iterator[None]:
    """Holds, for the server's life, an exclusive lock on a file beside a SQLite database. Only
    servers take it: ``sxwl admin`` commands still work beside a running server."""
    url = settings.resolved_database_url()
    if not url.startswith("sqlite"):
        yield
        return
    if workers > 1:
        raise CliError(f"--workers {workers} needs PostgreSQL: SQLite allows one server process; {HOW}", 2)
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(locks.beside_sqlite(url, "server", wait=False))
        except BlockingIOError:
            raise CliError(
                f"another sxwl server is running on the SQLite database {sqlite_path(url)}: SQLite "
                f"allows one server process; stop that one, or {HOW}",
                2,
            ) from None
        yield
