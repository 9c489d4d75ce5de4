"""Refuses a replica whose SXWL_SECRET_KEY differs from the one the database was started with
(docs/replica-state.md): upload tokens, stored accessKeys and rate-limit keys are all derived from it,
and a replica with its own key (say, one generated into its own data dir) would quietly refuse the
others' tokens and count limits apart."""

from __future__ import annotations

import hmac

from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite

from sxwl.cloud.db.engine import Database
from sxwl.cloud.db.shared_state import KeyCheck
from sxwl.cloud.kit.security import SecretBox

PURPOSE = "sxwl secret key check v1"


class SecretKeyMismatchError(RuntimeError):
    pass


def verify(db: Database, box: SecretBox) -> None:
    """Records this key's check on the first start; raises ``SecretKeyMismatchError`` on a later start
    with another key."""
    mine = box.mac(PURPOSE.encode(), b"")
    dialect = postgresql if db.engine.dialect.name == "postgresql" else sqlite
    with db.session() as session:
        # Replicas starting at once: the first insert wins, the others compare with it.
        session.execute(
            dialect.insert(KeyCheck).values(purpose=PURPOSE, digest=mine).on_conflict_do_nothing()
        )
        stored = session.scalar(select(KeyCheck.digest).where(KeyCheck.purpose == PURPOSE))
    if stored is None or not hmac.compare_digest(stored, mine):
        raise SecretKeyMismatchError(
            "SXWL_SECRET_KEY differs from the key this database was first used with: every replica "
            "must be given the same key (docs/replica-state.md)"
        )
