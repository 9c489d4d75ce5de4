"""How a metering batch reaches the database: the attempts' new marks and their usage lines, in the
database transaction that posts the batch's ledger transactions (services/money/metering.py).

On PostgreSQL the whole batch is one statement: each column travels as one array literal (a single
text parameter the server parses, where the driver would quote every element in Python), unnested
once, and a data-modifying CTE moves the marks while the statement inserts the lines. On SQLite,
where statements cost no round trip, an executemany of each."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import cast

from sqlalchemy import Table, bindparam, insert, text, update
from sqlalchemy.orm import Session

from sxwl.cloud.db.models import JobAttempt
from sxwl.cloud.db.money_models import UsageLine

_ATTEMPTS = cast(Table, JobAttempt.__table__)
_LINES = cast(Table, UsageLine.__table__)

# A mark moves only from where the pass read it, on an attempt not rated to its end: the count of
# moved marks tells the pass whether anything changed under it.
_MOVE_AND_LINE = text(
    """
    WITH marks AS (
        SELECT * FROM unnest(
            CAST(:jobs AS VARCHAR[]), CAST(:attempts AS INTEGER[]), CAST(:froms AS BIGINT[]),
            CAST(:tos AS BIGINT[]), CAST(:charged AS BIGINT[]), CAST(:earned AS BIGINT[]),
            CAST(:done AS BOOLEAN[]), CAST(:gross AS BIGINT[]), CAST(:net AS BIGINT[]),
            CAST(:groups AS INTEGER[])
        ) AS m(job_id, attempt, from_us, to_us, charged, earned, done, gross, net, grp)
    ), moved AS (
        UPDATE job_attempts
        SET rated_us = marks.to_us, charged = marks.charged, earned = marks.earned,
            rated_done = marks.done
        FROM marks
        WHERE job_attempts.job_id = marks.job_id AND job_attempts.attempt = marks.attempt
          AND job_attempts.rated_us = marks.from_us AND NOT job_attempts.rated_done
        RETURNING 1
    ), lines AS (
        INSERT INTO usage_lines (job_id, attempt, from_us, to_us, gross, net, transaction_id)
        SELECT job_id, attempt, from_us, to_us, gross, net,
               (CAST(:transactions AS VARCHAR[]))[grp]
        FROM marks WHERE grp IS NOT NULL
    )
    SELECT count(*) FROM moved
    """
)
_MOVE = (
    update(_ATTEMPTS)
    .where(
        _ATTEMPTS.c.job_id == bindparam("b_job"),
        _ATTEMPTS.c.attempt == bindparam("b_attempt"),
        _ATTEMPTS.c.rated_us == bindparam("b_from"),
        ~_ATTEMPTS.c.rated_done,
    )
    .values(
        rated_us=bindparam("b_to"),
        charged=bindparam("b_charged"),
        earned=bindparam("b_earned"),
        rated_done=bindparam("b_done"),
    )
)


@dataclass
class Slices:
    """A batch's new marks, one per attempt, column by column; ``groups[i]`` is the index (from 1)
    of the ledger transaction that posts attempt i's usage line, None when it posts none."""

    jobs: list[str] = field(default_factory=list)
    attempts: list[int] = field(default_factory=list)
    froms: list[int] = field(default_factory=list)
    tos: list[int] = field(default_factory=list)
    charged: list[int] = field(default_factory=list)
    earned: list[int] = field(default_factory=list)
    done: list[bool] = field(default_factory=list)
    gross: list[int] = field(default_factory=list)
    net: list[int] = field(default_factory=list)
    groups: list[int | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.jobs)


def write(session: Session, slices: Slices, transaction_ids: list[str]) -> int:
    """Moves the marks of ``slices`` and inserts their usage lines, each referencing
    ``transaction_ids[group - 1]``; returns how many marks moved."""
    if session.get_bind().dialect.name == "postgresql":
        params = {
            "jobs": _texts(slices.jobs),
            "attempts": _integers(slices.attempts),
            "froms": _integers(slices.froms),
            "tos": _integers(slices.tos),
            "charged": _integers(slices.charged),
            "earned": _integers(slices.earned),
            "done": "{" + ",".join("t" if done else "f" for done in slices.done) + "}",
            "gross": _integers(slices.gross),
            "net": _integers(slices.net),
            "groups": "{" + ",".join("NULL" if g is None else str(g) for g in slices.groups) + "}",
            "transactions": _texts(transaction_ids),
        }
        return int(session.execute(_MOVE_AND_LINE, params).scalar_one())
    names = ("b_job", "b_attempt", "b_from", "b_to", "b_charged", "b_earned", "b_done")
    columns = (
        slices.jobs,
        slices.attempts,
        slices.froms,
        slices.tos,
        slices.charged,
        slices.earned,
        slices.done,
    )
    moves = [dict(zip(names, row, strict=True)) for row in zip(*columns, strict=True)]
    moved = cast(int, session.execute(_MOVE, moves).rowcount)  # type: ignore[attr-defined]
    lines = [
        {
            "job_id": slices.jobs[i],
            "attempt": slices.attempts[i],
            "from_us": slices.froms[i],
            "to_us": slices.tos[i],
            "gross": slices.gross[i],
            "net": slices.net[i],
            "transaction_id": transaction_ids[group - 1],
        }
        for i, group in enumerate(slices.groups)
        if group is not None
    ]
    if lines:
        session.execute(insert(_LINES), lines)
    return moved


def _integers(values: Iterable[int]) -> str:
    return "{" + ",".join(map(str, values)) + "}"


def _texts(values: Iterable[str]) -> str:
    """An array literal of strings, each quoted, so that no character of one is read as syntax."""
    return "{" + ",".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values) + "}"
