"""On SQLite, a unit of work that opens a savepoint (a ledger posting, a log chunk) holds the write lock
from that moment: another connection's commit between its read and its write makes the other wait,
instead of failing this one with "database is locked" (a top-up did, while the metering loop ran)."""

from __future__ import annotations

import threading
from pathlib import Path

from sqlalchemy import Column, Integer, MetaData, Table, func, insert, select

from sxwl.cloud.db.engine import Database

ROWS = Table("rows", MetaData(), Column("id", Integer, primary_key=True), Column("who", Integer))


def test_a_commit_between_a_savepoints_read_and_write_waits_instead_of_failing_it(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'x.db'}")
    ROWS.metadata.create_all(db.engine)
    other_done = threading.Event()
    errors: list[BaseException] = []

    def other_writer() -> None:
        try:
            with db.session() as session:
                session.execute(insert(ROWS).values(who=2))
        except BaseException as error:  # the assertion below reports it
            errors.append(error)
        other_done.set()

    try:
        with db.session() as session, session.begin_nested():
            seen = session.scalar(select(func.count()).select_from(ROWS))
            thread = threading.Thread(target=other_writer)
            thread.start()
            # Without the lock the other commits now, and the insert below fails at once.
            other_done.wait(0.5)
            session.execute(insert(ROWS).values(who=1))
        thread.join(30)
        assert not errors, errors
        assert seen == 0
        with db.session() as session:
            assert sorted(session.scalars(select(ROWS.c.who))) == [1, 2]
    finally:
        db.dispose()


def test_a_savepoint_inside_a_transaction_that_already_writes_is_unchanged(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 'x.db'}")
    ROWS.metadata.create_all(db.engine)
    try:
        with db.session() as session:
            session.execute(insert(ROWS).values(who=1))
            with session.begin_nested():
                session.execute(insert(ROWS).values(who=2))
        # No second BEGIN was sent ("cannot start a transaction within a transaction").
        with db.session() as session:
            assert sorted(session.scalars(select(ROWS.c.who))) == [1, 2]
    finally:
        db.dispose()
