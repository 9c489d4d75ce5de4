"""What runs on each CPod, as 算力详情 shows it to the provider (docs/dev-envs.md, "The provider's
view"; docs/endpoints.md): each attempt placed there now, named for what it is (a job, a
fine-tune, replica N of an endpoint, a dev environment), its state, GPUs and start. Only what the
provider needs to know of the work its GPUs do: no command, environment, inputs or owner, and no
names a tenant gave a job or an environment (an endpoint's name is how the replica is called)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from sxwl.cloud.db.models import ACTIVE_STATES, Job
from sxwl.cloud.services.endpoints import endpoints
from sxwl.cloud.services.jobs.job_kinds import kind_of

WORK_SHOWN = 50  # per CPod: the page refreshes every few seconds


@dataclass(frozen=True)
class WorkView:
    job_id: str
    attempt: int
    kind: str  # "job", or its workload kind's name: "fine-tune", "endpoint", "dev-env"
    state: str
    gpus: int  # on all its nodes
    started_at: datetime | None
    endpoint: str | None = None  # an endpoint replica's endpoint
    replica: int | None = None  # and which replica, from 1


def work_on(session: Session, cpod_ids: list[str]) -> dict[str, list[WorkView]]:
    """The attempts placed on each of ``cpod_ids`` now, oldest first, in two queries."""
    if not cpod_ids:
        return {}
    jobs = session.scalars(
        select(Job)
        .where(Job.cpod_id.in_(cpod_ids), Job.state.in_(ACTIVE_STATES))
        .order_by(Job.assigned_at, Job.id)
    ).all()
    replicas = endpoints.replicas_named(session, [job.id for job in jobs])
    found: dict[str, list[WorkView]] = defaultdict(list)
    for job in jobs:
        assert job.cpod_id is not None  # placed: the query asked for it
        if len(found[job.cpod_id]) >= WORK_SHOWN:
            continue
        kind = kind_of(job)
        endpoint, replica = replicas.get(job.id, (None, None))
        found[job.cpod_id].append(
            WorkView(
                job_id=job.id,
                attempt=job.attempt,
                kind=kind.name if kind is not None else "job",
                state=job.state.value,
                gpus=job.gpus_per_node * job.nodes,
                started_at=job.started_at,
                endpoint=endpoint,
                replica=replica,
            )
        )
    return found
