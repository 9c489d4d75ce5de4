"""Workload kinds (services/jobs/job_kinds.py): a kind registered by the test hears every event of its
jobs' attempts, driven through the agent's real routes, and the jobs modules name no kind."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.orm import Session

from sxwl.cloud.db.models import AttemptLog, Job, JobState, User
from sxwl.cloud.services.jobs import job_kinds, jobs
from sxwl.cloud.services.jobs.job_kinds import Kind, Workload
from sxwl.protocol.jobs import JobIn
from sxwl.protocol.reasons import Reason, english
from tests.support.agent import eventually
from tests.test_cpods_api import ctx_of
from tests.test_jobs_api import PRODUCT, Setup, setup  # noqa: F401 (the fixture)

SERVICES = Path(__file__).parents[1] / "src" / "sxwl" / "cloud" / "services"


class Probe(Kind):
    """Owns the jobs named ``probe-*`` and writes down what it is told, in order."""

    name = "probe"

    def __init__(self) -> None:
        self.heard: list[tuple[object, ...]] = []

    def owns(self, job: Job) -> bool:
        return job.name.startswith("probe-")

    def attempt_started(self, session: Session, job: Job) -> None:
        self.heard.append(("started", job.attempt))

    def attempt_ended(
        self, session: Session, job: Job, state: JobState, reason: Reason | None
    ) -> tuple[JobState, Reason | None]:
        self.heard.append(("ended", job.attempt, state.value))
        return state, reason

    def requeued(self, session: Session, job: Job, lost_attempt: int, why: Reason) -> None:
        self.heard.append(("requeued", lost_attempt, english(why)))

    def artifact_recorded(
        self, session: Session, job: Job, attempt: int, path: str, size: int, sha256: str
    ) -> None:
        self.heard.append(("artifact", attempt, path, size))

    def log_appended(
        self, session: Session, job: Job, attempt: int, log: AttemptLog, fresh_at: int, fresh: bytes
    ) -> None:
        self.heard.append(("log", attempt, fresh_at, fresh, log.received))


class Serving(Probe):
    """A kind whose work serves until it is stopped (an endpoint, say)."""

    ends_by_exiting = False


@pytest.fixture
def probe() -> Iterator[Probe]:
    kind = Probe()
    job_kinds.register(kind)
    yield kind
    job_kinds.unregister(kind)


def submit_probe(setup: Setup, kind: Kind) -> str:  # noqa: F811 (setup is the fixture's type)
    ctx = ctx_of(setup.client)
    with ctx.db.session() as session:
        owner = session.query(User).filter_by(email="dev@example.com").one()
        spec = JobIn(name="probe-1", command=["serve"], gpu_product=str(PRODUCT), gpus_per_node=1)
        return jobs.submit(ctx, session, owner, spec, Workload(kind)).id


def test_a_registered_kind_hears_each_event_of_its_attempts(setup: Setup, probe: Probe) -> None:  # noqa: F811
    job_id = submit_probe(setup, probe)
    setup.assigned(job_id)
    assert setup.status(job_id, 1, "running").status_code == 200
    assert setup.log(job_id, 1, 0, b"ready\n").status_code == 200
    put = setup.client.put(
        f"/api/v1/agent/jobs/{job_id}/artifacts/out.txt?attempt=1", headers=setup.agent, content=b"1"
    )
    assert put.status_code == 201
    assert setup.status(job_id, 1, "lost", reason="the node rebooted").status_code == 200
    eventually(
        lambda: setup.job(job_id)["attempt"] == 2 and setup.job(job_id)["state"] == "assigned",
        what="attempt 2",
    )
    assert setup.status(job_id, 2, "running").status_code == 200
    assert setup.status(job_id, 2, "succeeded", exit_code=0).status_code == 200
    assert probe.heard == [
        ("started", 1),
        ("log", 1, 0, b"ready\n", 6),
        ("artifact", 1, "out.txt", 1),
        ("requeued", 1, "the node rebooted"),
        ("started", 2),
        ("ended", 2, "succeeded"),
    ]
    # A plain job beside it is no kind's: the probe hears nothing of it.
    plain = setup.submit()
    setup.assigned(plain["id"])
    assert setup.status(plain["id"], 1, "running").status_code == 200
    assert setup.status(plain["id"], 1, "succeeded", exit_code=0).status_code == 200
    assert len(probe.heard) == 6


def test_a_kind_that_serves_until_stopped_fails_when_its_attempt_exits(setup: Setup) -> None:  # noqa: F811
    kind = Serving()
    job_kinds.register(kind)
    try:
        job_id = submit_probe(setup, kind)
        setup.assigned(job_id)
        assert setup.status(job_id, 1, "running").status_code == 200
        assert setup.status(job_id, 1, "succeeded", exit_code=0).status_code == 200
    finally:
        job_kinds.unregister(kind)
    job = setup.job(job_id)
    assert job["state"] == "failed"
    assert job["reason"] == "it exited (status 0), but a probe serves until it is stopped"
    assert kind.heard[-1] == ("ended", 1, "failed")


def test_a_workload_of_a_kind_that_is_not_registered_is_refused(setup: Setup) -> None:  # noqa: F811
    with pytest.raises(RuntimeError, match="not the registered kind"):
        submit_probe(setup, Probe())


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return found


def _module_path(module: str) -> Path | None:
    relative = module.removeprefix("sxwl.cloud.services.").replace(".", "/")
    for path in (SERVICES / f"{relative}.py", SERVICES / relative / "__init__.py"):
        if path.is_file():
            return path
    return None


def test_the_jobs_modules_import_no_kind() -> None:
    """Statically, through every module of ours they import: a kind is installed from outside
    (services/__init__.py), so adding one touches no jobs module."""
    kinds = {
        "sxwl.cloud.services." + ".".join(path.relative_to(SERVICES).with_suffix("").parts)
        for path in SERVICES.rglob("*.py")
        if any(
            isinstance(node, ast.ClassDef) and any(getattr(b, "id", None) == "Kind" for b in node.bases)
            for node in ast.walk(ast.parse(path.read_text()))
        )
    }
    assert "sxwl.cloud.services.finetune.fine_tune_kind" in kinds
    seen: set[str] = set()
    todo = [f"sxwl.cloud.services.jobs.{path.stem}" for path in (SERVICES / "jobs").glob("*.py")]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        path = _module_path(module)
        if path is not None and module.startswith("sxwl.cloud.services."):
            todo += [name for name in _imports(path) if name.startswith("sxwl.cloud.services.")]
    reached = {module for module in seen if _module_path(module) is not None}
    assert not reached & kinds, sorted(reached & kinds)
    assert not {m for m in reached if m.startswith("sxwl.cloud.services.finetune")}
    assert "sxwl.cloud.services.jobs.attempts" in reached and "sxwl.cloud.services.jobs.job_kinds" in reached
