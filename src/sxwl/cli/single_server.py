"""SQLite serves one server process: ``--workers 2`` on it, or a second ``sxwl serve`` on the same
file, is refused with the reason instead of failing later with "database is locked" under load and
wake-ups that never cross processes (docs/operations.md, "Several worker processes and metrics")."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator

from sxwl.cli.client import CliError
from sxwl.cloud.config import Settings
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
    path = sqlite_path(url)
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{path}.server-lock", "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CliError(
                f"another sxwl server is running on the SQLite database {path}: SQLite allows one "
                f"server process; stop that one, or {HOW}",
                2,
            ) from None
        yield
