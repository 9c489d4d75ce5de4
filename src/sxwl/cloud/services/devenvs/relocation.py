"""A resumed dev environment that waits for the CPod keeping its workspace, while that CPod has no
room (or has gone offline) and another has, goes to the other with the workspace its last run saved
(docs/dev-envs.md, "Resumed elsewhere"). The scheduling pass decides where
(services/scheduling/moves.py); this says which environments may go and keeps the move on the
environment, where its owner sees it."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import cast

from sqlalchemy import String, Table, bindparam, select, update
from sqlalchemy.orm import Session

from sxwl.cloud.db.devenv_models import DevEnv, DevEnvState
from sxwl.cloud.db.json_rows import StoredInput
from sxwl.cloud.db.models import Job, JobAttempt
from sxwl.cloud.services.scheduling.moves import Move
from sxwl.protocol.reasons import Reason


class DevEnvMover:
    def leaving(self, session: Session, job_ids: Sequence[str]) -> dict[str, StoredInput]:
        """The current jobs of active environments whose saved workspace is the one their latest run
        left: saved by the last attempt that started, of any of the environment's jobs. An older
        copy (the latest run's workspace was over the size cap, or its save failed) would lose what
        the CPod keeps, so such an environment waits for its CPod."""
        rows = session.execute(
            select(Job.id, DevEnv.id, DevEnv.saved)
            .join(DevEnv, DevEnv.id == Job.dev_env_id)
            .where(Job.id.in_(job_ids), DevEnv.job_id == Job.id, DevEnv.state == DevEnvState.ACTIVE)
        ).all()
        saved = {env_id: (job_id, copy) for job_id, env_id, copy in rows if copy is not None}
        if not saved:
            return {}
        latest: dict[str, tuple[datetime, str, int]] = {}
        started = session.execute(
            select(Job.dev_env_id, JobAttempt.started_at, JobAttempt.job_id, JobAttempt.attempt)
            .join(JobAttempt, JobAttempt.job_id == Job.id)
            .where(Job.dev_env_id.in_(saved), JobAttempt.started_at.is_not(None))
        )
        for env_id, at, job_id, attempt in started:
            assert env_id is not None and at is not None  # as the query asked
            if env_id not in latest or (at, job_id, attempt) > latest[env_id]:
                latest[env_id] = (at, job_id, attempt)
        leaving: dict[str, StoredInput] = {}
        for env_id, (job_id, copy) in saved.items():
            last = latest.get(env_id)
            if last is not None and last[1:] == (copy["object"]["job_id"], copy["object"]["attempt"]):
                leaving[job_id] = copy
        return leaving

    def moved(self, session: Session, moves: Sequence[Move]) -> None:
        """The environment's reason says where it went and why, until it is paused or stopped."""
        session.execute(
            _SAY_MOVED,
            [
                {
                    "b_job": m.job_id,
                    "b_reason": Reason.of(
                        "dev.moved_gone" if m.gone else "dev.moved", old=m.old, new=m.new
                    ).stored,
                }
                for m in moves
            ],
        )


_ENVS = cast(Table, DevEnv.__table__)

# Only an environment still active on this job: a pause or stop that committed first keeps its reason.
_SAY_MOVED = (
    update(_ENVS)
    .where(
        _ENVS.c.id == select(Job.dev_env_id).where(Job.id == bindparam("b_job")).scalar_subquery(),
        _ENVS.c.job_id == bindparam("b_job"),
        _ENVS.c.state == DevEnvState.ACTIVE,
    )
    .values(reason=bindparam("b_reason", type_=String()))  # already as stored
)

DEV_ENV_MOVER = DevEnvMover()
