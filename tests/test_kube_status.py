"""Which rank a failed multi-node attempt blames: the one that failed on its own, not the ranks the Job
controller stopped after it (their SIGTERM exit came later, and may be the lower rank)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kubernetes_asyncio.client import (
    V1ContainerState,
    V1ContainerStateTerminated,
    V1ContainerStatus,
    V1Job,
    V1JobCondition,
    V1JobStatus,
    V1ObjectMeta,
    V1Pod,
    V1PodStatus,
)

from sxwl.agent.runtimes.kube_objects import COMPLETION_INDEX, CONTAINER, KubeJob
from sxwl.agent.runtimes.kube_status import outcome

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def pod(index: int, code: int, finished: datetime, *, deleted: bool) -> V1Pod:
    ended = V1ContainerStateTerminated(exit_code=code, finished_at=finished, reason="Error")
    status = V1ContainerStatus(
        name=CONTAINER,
        image="i",
        image_id="",
        ready=False,
        restart_count=0,
        state=V1ContainerState(terminated=ended),
    )
    return V1Pod(
        metadata=V1ObjectMeta(
            name=f"p{index}",
            annotations={COMPLETION_INDEX: str(index)},
            deletion_timestamp=finished if deleted else None,
        ),
        status=V1PodStatus(phase="Failed", container_statuses=[status]),
    )


def job() -> tuple[KubeJob, V1Job]:
    record = KubeJob(
        job_id="j1",
        attempt=1,
        name="early",
        owner_id="u1",
        namespace="sxwl-tenant-u1",
        k8s_name="sxwl-j1-1",
        nodes=2,
        gpus_per_node=0,
        max_runtime_s=None,
        started_at=0.0,
    )
    failed = V1JobCondition(type="Failed", status="True", reason="BackoffLimitExceeded")
    return record, V1Job(status=V1JobStatus(conditions=[failed]))


def test_the_rank_that_failed_on_its_own_is_blamed_not_the_one_stopped_after_it() -> None:
    record, item = job()
    # Rank 1 gave up; the Job controller then deleted rank 0, which ended by SIGTERM in the same second.
    pods = [pod(0, 143, T0, deleted=True), pod(1, 5, T0, deleted=False)]
    seen = outcome(record, item, pods)
    assert seen is not None
    assert (seen.outcome, seen.exit_code) == ("failed", 5)
    assert seen.reason == "rank 1 failed: exit code 5; the other ranks were stopped"


def test_of_two_ranks_that_failed_on_their_own_the_first_to_end_is_blamed() -> None:
    record, item = job()
    pods = [pod(0, 3, T0 + timedelta(seconds=2), deleted=False), pod(1, 7, T0, deleted=False)]
    seen = outcome(record, item, pods)
    assert seen is not None and seen.exit_code == 7 and seen.reason is not None
    assert seen.reason.startswith("rank 1 failed: exit code 7")
    # At the same moment, the lower rank.
    pods = [pod(0, 3, T0, deleted=False), pod(1, 7, T0, deleted=False)]
    seen = outcome(record, item, pods)
    assert seen is not None and seen.exit_code == 3


def test_a_pod_deleted_under_a_job_is_the_cause_whether_or_not_it_is_still_seen() -> None:
    record, item = job()
    record.nodes = 1
    # Still in the watch cache, with the SIGTERM exit its deletion caused.
    seen = outcome(record, item, [pod(0, 143, T0, deleted=True)])
    assert seen is not None and seen.exit_code == 143
    assert seen.reason == "a pod of the job was deleted before it finished"
    # Already gone from it.
    seen = outcome(record, item, [])
    assert seen is not None and seen.reason == "a pod of the job was deleted before it finished"
    # A rank that failed on its own is still the cause when the Job controller then deletes the rest.
    record.nodes = 2
    seen = outcome(record, item, [pod(0, 143, T0, deleted=True), pod(1, 5, T0, deleted=False)])
    assert seen is not None and seen.reason == "rank 1 failed: exit code 5; the other ranks were stopped"
