"""The grace of a stop: the cloud's ``grace_s`` (a stop on an exhausted balance leaves time to save a
checkpoint) wins over the agent's --stop-grace, on real processes of the local runtime."""

from __future__ import annotations

import time
from pathlib import Path

from sxwl.agent.runtimes.local import LocalJob, LocalRuntime
from sxwl.protocol.models import Assignment
from tests.support.agent import eventually

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
    output = runtime.output_dir(job)
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
    assert AGENT_GRACE_S <= elapsed < 2.5
    assert job.outcome == "cancelled" and job.stop_grace_s is None
