"""The migration to ``attempt_logs`` (docs/jobs.en.md, "Logs"): logs written before it read back
whole and their attempts' agents go on from the offsets they had (SQLite and PostgreSQL)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import insert
from sqlalchemy.orm import Session

from sxwl.cloud.db import migrate
from sxwl.cloud.db.engine import make_engine
from sxwl.cloud.db.models import AttemptLog, Job, JobState, LogChunk, Role, User
from sxwl.cloud.services.jobs import job_logs
from tests.support.cloud import test_settings as settings_for

USER, JOB = "u" * 32, "j" * 32
OLD = [b"first attempt\n", b"second attempt, line 1\n", b"line 2\n"]


def _before_attempt_logs(config: Config) -> str:
    """The revision attempt_logs follows, found by the migration's name (ids are renumbered when
    branches merge)."""
    script = ScriptDirectory.from_config(config)
    (revision,) = (r for r in script.walk_revisions() if r.path.endswith("_attempt_logs.py"))
    assert isinstance(revision.down_revision, str)
    return revision.down_revision


def test_logs_from_before_read_whole_and_take_the_next_offset(db_url: str, tmp_path: Path) -> None:
    engine = make_engine(db_url)
    config = migrate.alembic_config(db_url)
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, _before_attempt_logs(config))
    with engine.begin() as connection:
        connection.execute(
            insert(User).values(id=USER, email="u@example.com", password_hash="x", role=Role.USER)
        )
        connection.execute(
            insert(Job).values(
                id=JOB, owner_id=USER, name="t", command=["true"], env={}, gpus_per_node=0, nodes=1, attempt=2
            )
        )
        connection.execute(
            insert(LogChunk),
            [
                {"job_id": JOB, "attempt": 1, "offset": 0, "data": OLD[0]},
                {"job_id": JOB, "attempt": 2, "offset": 0, "data": OLD[1]},
                {"job_id": JOB, "attempt": 2, "offset": len(OLD[1]), "data": OLD[2]},
            ],
        )
    migrate.upgrade(engine)
    settings = settings_for(tmp_path / "data", db_url)
    with Session(engine) as session, session.begin():
        states = {
            s.attempt: (s.received, s.kept, s.archived, s.dropped_at) for s in session.query(AttemptLog)
        }
        assert states == {1: (len(OLD[0]), len(OLD[0]), 0, None), 2: (len(OLD[1] + OLD[2]),) * 2 + (0, None)}
        job = session.get(Job, JOB)
        assert job is not None and job.state == JobState.QUEUED
        first = job_logs.read_log(settings, session, job, 1, 0)
        assert isinstance(first, job_logs.LogSlice) and first.data == OLD[0] and first.complete
        # The agent of attempt 2 goes on where it was; a resent chunk is skipped.
        end = len(OLD[1] + OLD[2])
        assert (
            job_logs.append_log(session, settings, job, 2, len(OLD[1]), OLD[2] + b"line 3\n").next_offset
            == end + 7
        )
        second = job_logs.read_log(settings, session, job, 2, 0)
        assert isinstance(second, job_logs.LogSlice) and second.data == OLD[1] + OLD[2] + b"line 3\n"
    engine.dispose()
