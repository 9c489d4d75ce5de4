"""The grace of a stop: the cloud's ``grace_s`` (a stop on an exhausted balance leaves time to save a
checkpoint) wins over the agent's --stop-grace, on real processes of the local runtime, and from a
served cloud through a real agent."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from sxwl.agent.runtimes.local import LocalJob, LocalRuntime
from sxwl.protocol.models import Assignment
from tests.support.agent import eventually
from tests.test_jobs_process import World

AGENT_GRACE_S = 0.5
# Saves a checkpoint on SIGTERM, then keeps running until it is killed.
SAVES_ON_TERM = (
    "trap 'echo saved > \"$SXWL_OUTPUT_DIR/checkpoint\"; while :; do sleep 0.05; done' TERM; "
    'echo up > "$SXWL_OUTPUT_DIR/ready"; while :; do sleep 0.05; done'
)


def stop_and_time(tmp_path: Path, grace_s: float | None) -> tuple[LocalJob, float, Path]:
    runtime = LocalRuntime(tmp_path / "state", [], stop_grace_s=AGENT_GRACE_S)
    runtime.accepted_owners = None  # this test's own job: run it where it cannot be isolated too
    job = runtime.start(
        Assignment(
            job_id="j1", attempt=1, name="t", owner_id="u", command=SAVES_ON_TERM, gpus_per_node=0, nodes=1
        )
    )
    output = runtime.outputs(job).path
    eventually(lambda: (output / "ready").exists(), what="the job to start")
    stopped_at = time.monotonic()
    runtime.stop("j1", 1, "balance exhausted", cancel=True, grace_s=grace_s)

    def ended() -> bool:
        return bool(runtime.poll())

    eventually(ended, timeout=30, what="the job to end")
    return job, time.monotonic() - stopped_at, output


def test_the_clouds_grace_delays_sigkill(tmp_path: Path) -> None:
    job, elapsed, output = stop_and_time(tmp_path, grace_s=2.5)
    # SIGTERM reached the job at once (it saved), SIGKILL only after the cloud's grace, not the agent's.
    assert (output / "checkpoint").read_text() == "saved\n"
    assert elapsed >= 2.5
    assert job.outcome == "cancelled" and job.stop_reason == "balance exhausted"
    assert job.stop_grace_s == 2.5


def test_without_a_grace_from_the_cloud_the_agents_applies(tmp_path: Path) -> None:
    job, elapsed, output = stop_and_time(tmp_path, None)
    assert (output / "checkpoint").read_text() == "saved\n"
    assert elapsed >= AGENT_GRACE_S  # never killed before a grace: a bound, not a speed
    assert job.outcome == "cancelled" and job.stop_grace_s is None


TICKS_ON_TERM = (
    "trap 'echo saved; while :; do echo tick; sleep 0.2; done' TERM; echo up; while :; do sleep 0.05; done"
)


def test_an_exhausted_balance_stops_a_job_with_the_clouds_grace(
    tmp_path: Path, db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two jobs at 1 CNY per GPU-second each, funded for 20 s of one: the balance is empty after about
    # 10 s, well before their max runtime of 20 s.
    world = World(
        tmp_path,
        db_url,
        SXWL_BILLING_ENABLED="true",
        SXWL_METERING_INTERVAL_S="0.3",
        SXWL_BALANCE_STOP_GRACE_S="4",
    )
    try:
        world.price_and_top_up(monkeypatch, "20")
        # Both submitted before any CPod is up: a first job already metered would leave too little
        # for the second's first 20 s (a race that a busy machine lost).
        jobs = [world.submit(TICKS_ON_TERM, max_runtime_s=20) for _ in range(2)]
        world.agent()  # --stop-grace 1
        world.online()
        for job_id in jobs:
            job = world.wait_state(job_id, "cancelled", "failed", "succeeded", timeout=60)
            assert (job["state"], job["reason"]) == ("cancelled", "balance exhausted")
            output = world.logs(job_id)
            assert "saved" in output
            # Each tick takes at least 0.2 s, so the agent's 1 s would allow at most 6: more proves
            # SIGKILL waited for the cloud's longer grace (a bound that load cannot break).
            assert output.count("tick") > 6, output
    finally:
        world.close()
