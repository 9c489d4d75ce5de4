"""One scheduling pass: order the queue (priority, fair share, FIFO), place what fits, assign each
job with one conditional update (DESIGN invariant 3), and say why the rest waits."""

from __future__ import annotations

import contextlib
import fcntl
import itertools
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass

from sqlalchemy import select, text, update
from sqlalchemy.orm import Session

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import ACTIVE_STATES, CPod, CPodStatus, Job, JobAttempt, JobState, User
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.services import jobs as job_service
from sxwl.cloud.services.placement import CPodCapacity, Need, NodeCapacity, place, take, why_not


@dataclass(frozen=True)
class Assigned:
    job_id: str
    cpod_id: str
    attempt: int


def capacity(session: Session) -> list[CPodCapacity]:
    """Free GPUs per node of every online CPod: what the CPod last reported, minus the assignments
    it has not reported yet."""
    cpods = session.execute(
        select(CPod.id, CPod.nodes, CPod.reported_jobs).where(
            CPod.status == CPodStatus.ONLINE, CPod.revoked_at.is_(None)
        )
    ).all()
    active = session.execute(
        select(Job.id, Job.attempt, Job.cpod_id, Job.node_names, Job.gpus_per_node).where(
            Job.state.in_(ACTIVE_STATES)
        )
    ).all()
    unreported: dict[tuple[str, str], int] = defaultdict(int)
    reported = {cpod_id: set(jobs) for cpod_id, _, jobs in cpods}
    for job_id, attempt, cpod_id, node_names, gpus in active:
        if cpod_id is not None and f"{job_id}:{attempt}" not in reported.get(cpod_id, set()):
            for node in node_names:
                unreported[(cpod_id, node)] += gpus
    result = []
    for cpod_id, nodes, _ in cpods:
        entry = CPodCapacity(cpod_id)
        for node in nodes:
            gpu = node.get("gpu") or {}
            allocatable = int(gpu.get("allocatable", 0))
            free = allocatable - int(gpu.get("used", 0)) - unreported[(cpod_id, node["name"])]
            entry.nodes.append(
                NodeCapacity(
                    node["name"], gpu.get("product"), allocatable, max(free, 0), node.get("status") == "ready"
                )
            )
        result.append(entry)
    return result


def fair_order(queued: list[Job], usage: dict[str, int]) -> list[Job]:
    """Priority first; within a priority, users take turns (least GPUs in use first), each user's
    jobs in submission order. A user with 1,000 queued jobs does not starve one with a single job."""
    ordered: list[Job] = []
    by_priority = itertools.groupby(sorted(queued, key=lambda j: -j.priority), key=lambda j: j.priority)
    for _, group in by_priority:
        per_user: dict[str, list[Job]] = defaultdict(list)
        for job in sorted(group, key=lambda j: (j.created_at, j.id)):
            per_user[job.owner_id].append(job)
        users = sorted(per_user, key=lambda u: (usage.get(u, 0), per_user[u][0].created_at))
        for round_ in itertools.zip_longest(*(per_user[u] for u in users)):
            ordered.extend(job for job in round_ if job is not None)
    return ordered


SCHEDULER_LOCK_ID = 0x5857_4C53  # "SXWL": the PostgreSQL advisory lock that one pass holds


def schedule_once(ctx: CloudContext) -> list[Assigned]:
    """Passes run one at a time, across threads and replicas: a pass that read capacity before
    another pass committed would hand out the same free GPUs twice."""
    with _one_pass_at_a_time(ctx):
        assigned = _pass(ctx)
    for item in assigned:
        ctx.notifier.wake_cpod(item.cpod_id)
    return assigned


@contextlib.contextmanager
def _one_pass_at_a_time(ctx: CloudContext) -> Iterator[None]:
    """A file lock beside a SQLite database; on PostgreSQL the pass's transaction takes an advisory
    lock instead (see ``_pass``)."""
    database = ctx.db.engine.url.database if ctx.db.engine.dialect.name == "sqlite" else None
    if not database:
        yield
        return
    with open(f"{database}.scheduler-lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _pass(ctx: CloudContext) -> list[Assigned]:
    assigned: list[Assigned] = []
    with ctx.db.session() as session:
        if session.get_bind().dialect.name == "postgresql":
            session.execute(text("SELECT pg_advisory_xact_lock(:id)"), {"id": SCHEDULER_LOCK_ID})
        queued = list(
            session.scalars(
                select(Job)
                .where(Job.state == JobState.QUEUED)
                .order_by(Job.priority.desc(), Job.created_at)
                .limit(ctx.settings.scheduler_batch)
            )
        )
        if not queued:
            return []
        pool = capacity(session)
        online = {c.id for c in pool}
        usage = job_service.active_gpus_by_owner(session)
        unplaceable: dict[Need, str] = {}
        limits = dict(
            session.execute(
                select(User.id, User.max_gpus).where(User.id.in_({j.owner_id for j in queued}))
            ).all()
        )
        for job in fair_order(queued, usage):
            need = Need(job.gpu_product, job.gpus_per_node, job.nodes, job.pinned_cpod_id)
            total = job.gpus_per_node * job.nodes
            limit = limits.get(job.owner_id) or ctx.settings.default_user_max_gpus
            if limit and usage.get(job.owner_id, 0) + total > limit:
                _explain(
                    session,
                    job,
                    f"your limit of {limit} concurrent GPUs is reached ({usage.get(job.owner_id, 0)} in use)",
                )
                continue
            # Capacity only shrinks during a pass: a need that did not fit once will not fit again.
            placement = None if need in unplaceable else place(need, pool)
            if placement is None:
                if need not in unplaceable:
                    pinned_online = job.pinned_cpod_id in online if job.pinned_cpod_id else None
                    unplaceable[need] = why_not(need, pool, pinned_online)
                _explain(session, job, unplaceable[need])
                continue
            attempt = job.attempt + 1
            won = session.execute(
                update(Job)
                .where(Job.id == job.id, Job.state == JobState.QUEUED, Job.attempt == job.attempt)
                .values(
                    state=JobState.ASSIGNED,
                    attempt=attempt,
                    cpod_id=placement.cpod_id,
                    node_names=placement.node_names,
                    assigned_at=utcnow(),
                    reason=None,
                )
                .execution_options(synchronize_session=False)
            ).rowcount  # type: ignore[attr-defined]
            if won != 1:
                continue  # another replica (or a cancel) got there first
            session.add(
                JobAttempt(
                    job_id=job.id,
                    attempt=attempt,
                    cpod_id=placement.cpod_id,
                    node_names=placement.node_names,
                    gpus=total,
                )
            )
            job_service.event_for(
                session,
                job.id,
                attempt,
                "assigned",
                f"CPod {placement.cpod_id}, nodes {', '.join(placement.node_names)}",
            )
            take(pool, placement, job.gpus_per_node)
            usage[job.owner_id] = usage.get(job.owner_id, 0) + total
            assigned.append(Assigned(job.id, placement.cpod_id, attempt))
    return assigned


def _explain(session: Session, job: Job, reason: str) -> None:
    if job.reason != reason:  # write only changes: most passes leave waiting jobs as they are
        session.execute(
            update(Job)
            .where(Job.id == job.id, Job.state == JobState.QUEUED)
            .values(reason=reason)
            .execution_options(synchronize_session=False)
        )
