"""Queued work that leaves the CPod it waits for: a dev environment resumed on the CPod that keeps its
workspace, which has no room for it or has gone offline since, goes to another CPod that has room,
with the workspace its last attempt saved (docs/dev-envs.md, "Resumed elsewhere"). A scheduling pass
decides it, under the scheduler lock, and writes it as conditional updates in the pass's transaction,
so replicas never move one job twice and a pause or cancel that commits first wins (invariant 1,
docs/architecture.md).

Which pinned jobs may leave, and what they take along, is their own domain's to say: the scheduling
domain names no kind, so each domain that pins jobs registers a ``Mover`` (services/__init__.py
installs the dev environments')."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol, cast

from sqlalchemy import Table, bindparam, insert, update
from sqlalchemy.orm import Session

from sxwl.cloud.db.json_rows import StoredInput
from sxwl.cloud.db.models import Job, JobEvent, JobState
from sxwl.protocol.reasons import Reason


@dataclass(frozen=True)
class Move:
    """A queued job unpinned from a CPod without room, or offline, and assigned to another in the same
    pass."""

    job_id: str
    attempt: int  # the attempt it is queued after: the update's guard, as the assignment's
    old: str  # the CPod it was pinned to
    new: str  # the CPod it goes to
    inputs: list[StoredInput]  # its inputs with what it takes along
    gone: bool  # ``old`` is offline (or revoked), rather than full


class Mover(Protocol):
    def leaving(self, session: Session, job_ids: Sequence[str]) -> dict[str, StoredInput]:
        """Of these queued jobs, each pinned to a CPod (which may be full or offline), those that
        may go to another CPod, each with the input that carries its state there."""
        ...

    def moved(self, session: Session, moves: Sequence[Move]) -> None:
        """These jobs were unpinned and assigned elsewhere in this unit of work (every mover is told
        of every move: each picks out its own)."""
        ...


_MOVERS: list[Mover] = []


def register(mover: Mover) -> None:
    """Installs ``mover`` (once: registering it again changes nothing)."""
    if mover not in _MOVERS:
        _MOVERS.append(mover)


def leaving(session: Session, job_ids: Sequence[str]) -> dict[str, StoredInput]:
    """What every mover says of these pinned jobs (``Mover.leaving``)."""
    found: dict[str, StoredInput] = {}
    for mover in _MOVERS if job_ids else ():
        found.update(mover.leaving(session, job_ids))
    return found


_JOBS = cast(Table, Job.__table__)

# Only while the job still waits at the attempt the pass read, pinned where the pass saw it.
_UNPIN = (
    update(_JOBS)
    .where(
        _JOBS.c.id == bindparam("b_id"),
        _JOBS.c.state == JobState.QUEUED,
        _JOBS.c.attempt == bindparam("b_attempt"),
        _JOBS.c.pinned_cpod_id == bindparam("b_old"),
    )
    .values(pinned_cpod_id=None, inputs=bindparam("b_inputs", type_=_JOBS.c.inputs.type))
)


def unpin(session: Session, moves: Sequence[Move]) -> None:
    """Before the pass's assignments: a job whose guard fails here fails the assignment's too."""
    if moves:
        session.execute(
            _UNPIN,
            [{"b_id": m.job_id, "b_attempt": m.attempt, "b_old": m.old, "b_inputs": m.inputs} for m in moves],
        )


def record(session: Session, moves: Sequence[Move], now: datetime) -> None:
    """The moves the pass won: an event on each job, and what their movers keep of it."""
    if not moves:
        return
    session.execute(
        insert(JobEvent),
        [
            {
                "job_id": m.job_id,
                "attempt": m.attempt + 1,
                "kind": "moved",
                "detail": Reason.of("job.unpinned_gone" if m.gone else "job.unpinned", cpod=m.old, new=m.new),
                "at": now,
            }
            for m in moves
        ],
    )
    for mover in _MOVERS:
        mover.moved(session, moves)
