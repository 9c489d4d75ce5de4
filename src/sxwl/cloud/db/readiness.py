"""What `/readyz` answers: whether this replica may take traffic, i.e. the database answers and its
schema is at the Alembic head this code was written for (docs/helm-cloud.md, "Probes")."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from alembic.runtime.migration import MigrationContext
from sqlalchemy import Engine, text
from sqlalchemy.exc import SQLAlchemyError

from sxwl.cloud.db import migrate

log = logging.getLogger("sxwl.cloud.readiness")


@dataclass(frozen=True)
class Verdict:
    ready: bool
    # "ok", or why not: what a probe's operator reads in `kubectl describe pod`.
    database: str
    schema: str


@dataclass
class Readiness:
    engine: Engine
    heads: frozenset[str] = field(init=False)
    # Once at head, only the database's answer is checked: during a rolling upgrade the new replicas
    # migrate past this code's head, and the old ones must keep serving until they are replaced.
    at_head: bool = field(default=False, init=False)
    # One check at a time: a database that does not answer holds a connect for as long as the OS lets
    # it, and probes every few seconds must not pile up threads of the server's pool behind it.
    _checking: threading.Lock = field(default_factory=threading.Lock, init=False)

    def __post_init__(self) -> None:
        self.heads = migrate.heads()

    def check(self) -> Verdict:
        if not self._checking.acquire(blocking=False):
            return Verdict(False, "no answer yet to the previous check", "unknown")
        try:
            return self._check()
        finally:
            self._checking.release()

    def _check(self) -> Verdict:
        try:
            with self.engine.connect() as connection:
                connection.execute(text("SELECT 1"))
                current = (
                    frozenset()
                    if self.at_head
                    else frozenset(MigrationContext.configure(connection).get_current_heads())
                )
        except SQLAlchemyError as error:
            # The class only: the message of a failed connect can carry the URL's host and user.
            log.warning("readiness: the database does not answer (%s)", type(error).__name__)
            return Verdict(False, "unreachable", "unknown")
        if not self.at_head:
            if current != self.heads:
                found = ", ".join(sorted(current)) or "none"
                return Verdict(False, "ok", f"at {found}, not at head {', '.join(sorted(self.heads))}")
            self.at_head = True
        return Verdict(True, "ok", "ok")
