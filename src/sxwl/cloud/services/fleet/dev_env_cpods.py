"""Whether a CPod runs dev environments (docs/dev-envs.md, "On Kubernetes"): a local CPod does; a
Kubernetes one once its agent says so at its start (it has a dev environment image). What the agent
said last is its CPod's latest ``dev-envs`` event, written only when it changes, so the fact lives in
the database without a column of its own; writing one marks the CPod's capacity, and the scheduler
reads it at its next pass as it reads the other columns."""

from __future__ import annotations

from sqlalchemy import ScalarSelect, select
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import flag_modified

from sxwl.cloud.db.models import CPod, CPodEvent
from sxwl.protocol import IsolationReport
from sxwl.protocol.reasons import Reason

EVENT = "dev-envs"
RUNS = "cpod.dev_envs"


def said() -> ScalarSelect[Reason | None]:
    """The CPod's latest ``dev-envs`` event, as a column of a query over CPods."""
    return (
        select(CPodEvent.detail)
        .where(CPodEvent.cpod_id == CPod.id, CPodEvent.kind == EVENT)
        .order_by(CPodEvent.id.desc())
        .limit(1)
        .correlate(CPod)
        .scalar_subquery()
    )


def runs_dev_envs(latest: Reason | None, runtime: str) -> bool:
    """From the latest event, or with none, from the runtime (only local CPods ran them before)."""
    return latest.code == RUNS if latest is not None else runtime == "local"


def record(session: Session, cpod: CPod, report: IsolationReport) -> None:
    """Keeps what the agent said (an agent from before it said anything: what its runtime did)."""
    now = report.dev_envs if report.dev_envs is not None else cpod.runtime == "local"
    latest = session.scalar(
        select(CPodEvent.detail)
        .where(CPodEvent.cpod_id == cpod.id, CPodEvent.kind == EVENT)
        .order_by(CPodEvent.id.desc())
        .limit(1)
    )
    if now == runs_dev_envs(latest, cpod.runtime):
        return
    session.add(CPodEvent(cpod_id=cpod.id, kind=EVENT, detail=Reason.of(RUNS if now else "cpod.no_dev_envs")))
    # Written again, the column marks the CPod's capacity: the next pass reads the change.
    flag_modified(cpod, "nodes")
