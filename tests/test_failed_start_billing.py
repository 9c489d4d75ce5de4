"""A job whose command is not found costs nothing: a served cloud metering every 0.2 s at 1 CNY per
GPU-second, a real agent of the local runtime, and a command that does not exist; and what the
local runtime tells apart, a command that never ran from one that ran and exited 127
(docs/billing.md)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, select
from sqlalchemy.orm import Session

from sxwl.agent import not_found
from sxwl.agent.runtimes.local import LocalRuntime
from sxwl.cloud.db.models import JobAttempt
from sxwl.cloud.db.money_models import UsageLine
from sxwl.cloud.services.money import ledger
from sxwl.protocol.models import Assignment
from sxwl.protocol.reasons import Reason
from tests.support.agent import eventually
from tests.test_jobs_process import World


def test_a_command_that_is_not_found_costs_nothing(
    tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = World(tmp_path, db_url, SXWL_BILLING_ENABLED="true", SXWL_METERING_INTERVAL_S="0.2")
    try:
        world.price_and_top_up(monkeypatch, "100")
        world.agent()
        world.online()
        job_id = world.submit(["no-such-command-sxwl", "--now"], max_runtime_s=60)
        job = world.wait_state(job_id, "failed", "succeeded", "cancelled", timeout=60)
        assert job["state"] == "failed" and "no-such-command-sxwl" in job["reason"], job
        assert job["exit_code"] == 127

        engine = create_engine(db_url)
        try:

            def settled() -> bool:
                """Never started (the agent saw the failure before it reported ``running``), or
                rated to its end by the metering passes (every 0.2 s) that ran meanwhile."""
                with Session(engine) as session:
                    placed = session.scalars(select(JobAttempt).where(JobAttempt.job_id == job_id)).one()
                    return placed.started_at is None or placed.rated_done

            eventually(settled, timeout=30, what="the attempt rated to its end")
            statement = httpx.get(f"{world.url}/api/v1/billing/statement", headers=world.user).json()
            assert statement["lines"] == [] and statement["total"] == 0
            assert world.job(job_id)["cost"] == 0
            balance = httpx.get(f"{world.url}/api/v1/billing/balance", headers=world.user).json()
            assert balance["balance"] == 100_000_000
            with Session(engine) as session:
                assert session.scalars(select(UsageLine)).all() == []
                report = ledger.check(session)
                assert report.ok, report
        finally:
            engine.dispose()
    finally:
        world.close()


@pytest.mark.parametrize(
    ("command", "never_ran", "said"),
    [
        (
            ["no-such-command-sxwl", "--now"],
            True,
            Reason.of("agent.command_not_found", program="no-such-command-sxwl"),
        ),
        (
            "no-such-command-sxwl --now",
            True,
            Reason.of("agent.command_not_found", program="no-such-command-sxwl"),
        ),
        (
            "python train.py",
            True,
            Reason.of("agent.command_not_found_but", program="python", found="python3"),
        ),
        (["/bin/sh", "-c", "exit 127"], False, None),
        ("echo started; no-such-command-sxwl", False, None),
    ],
)
def test_the_local_runtime_tells_a_command_that_never_ran(
    tmp_path: Path, command: list[str] | str, never_ran: bool, said: Reason | None
) -> None:
    """What the agent reports as ``never_ran``: its sandbox could not run the command at all, or its
    shell could not find it and nothing else ran (agent/not_found.py); not a command that ran and
    exited 127. The job's PATH has python3 but no python."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text("#!/bin/sh\n")
    (bin_dir / "python3").chmod(0o755)
    runtime = LocalRuntime(tmp_path / "state", [])
    runtime.accepted_owners = None  # this test's own job: run it where it cannot be isolated too
    job = runtime.start(
        Assignment(
            job_id="j1",
            attempt=1,
            name="t",
            owner_id="u",
            command=command,
            env={"PATH": f"{bin_dir}:/usr/bin:/bin"},
            gpus_per_node=0,
            nodes=1,
        )
    )
    eventually(lambda: bool(runtime.poll()), timeout=30, what="the job to end")
    assert (job.outcome, job.exit_code, job.never_ran) == ("failed", 127, never_ran)
    got = Reason.read(job.stop_reason)
    if said is not None and "found" in said.params:  # this machine's own python3.x may follow
        assert got is not None and str(got.params["found"]).startswith(str(said.params["found"]))
        got = Reason(got.code, {**got.params, "found": said.params["found"]})
    assert got == said


@pytest.mark.parametrize(
    ("output", "status", "elapsed_s", "program"),
    [
        ("/bin/sh: 1: python: not found\n", 127, 0.1, "python"),  # dash
        ("/bin/sh: line 1: python: command not found\n", 127, 0.1, "python"),  # bash
        ("/bin/sh: python: not found\n", 127, 0.1, "python"),  # busybox
        ("sxwl-wrapper: 9: ./train.sh: not found\n", 127, 2.0, "./train.sh"),  # the Kubernetes wrapper
        ("/bin/sh: 1: python: not found\n", 127, 11.0, None),  # it ran a while first
        ("/bin/sh: 1: python: not found\n", 1, 0.1, None),
        ("loading\n/bin/sh: 1: python: not found\n", 127, 0.1, None),  # something ran first
        ("usage: train.py [-h]\n", 127, 0.1, None),  # a program's own exit 127
    ],
)
def test_a_shells_not_found_is_told_by_its_evidence(
    output: str, status: int, elapsed_s: float, program: str | None
) -> None:
    said = not_found.shell_not_found(output, status, elapsed_s)
    assert (said.program if said else None) == program
