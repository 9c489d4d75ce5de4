"""An empty balance stops work, it does not destroy it: the user's charged jobs get a stop signal
(SIGTERM first, then the grace to save a checkpoint) and end ``cancelled`` with the reason "balance
exhausted". Their queued jobs stay queued; the scheduler places them again after a top-up."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import Job, JobAttempt, JobState
from sxwl.cloud.db.money_models import LedgerAccount
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.services.jobs.attempts import stop_command
from sxwl.cloud.services.jobs.job_events import add_event
from sxwl.cloud.services.money import ledger
from sxwl.protocol.reasons import Reason, english

BALANCE_EXHAUSTED = Reason.of("job.balance_exhausted")


def stop_exhausted(ctx: CloudContext) -> list[str]:
    """Asks every charged running job of a user whose balance is not positive to stop; the ids."""
    if not ctx.settings.billing_enabled:
        return []
    with ctx.db.session(immediate=True) as session:
        return _stop(session, ctx.settings.balance_stop_grace_s)


def _stop(session: Session, grace_s: float) -> list[str]:
    empty = select(LedgerAccount.owner_id).where(
        LedgerAccount.kind == ledger.USER_CASH, LedgerAccount.balance <= 0
    )
    jobs = session.scalars(
        select(Job)
        .join(JobAttempt, (JobAttempt.job_id == Job.id) & (JobAttempt.attempt == Job.attempt))
        .where(
            Job.owner_id.in_(empty),
            Job.state == JobState.RUNNING,  # work not yet running costs nothing: it is stopped if it runs
            Job.cancel_requested_at.is_(None),
            JobAttempt.price_per_hour > 0,
        )
        .with_for_update(of=Job)
    ).all()
    for job in jobs:
        assert job.cpod_id is not None  # active jobs are on a CPod
        job.cancel_requested_at = utcnow()
        job.cancel_reason = BALANCE_EXHAUSTED
        stop_command(
            session,
            job,
            job.cpod_id,
            job.attempt,
            english(BALANCE_EXHAUSTED) or "",
            cancel=True,
            grace_s=grace_s,
        )
        add_event(session, job, "balance_exhausted", Reason.of("job.stopping", seconds=f"{grace_s:g}"))
    return [job.id for job in jobs]
