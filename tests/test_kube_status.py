"""How a Kubernetes attempt's pods read as its start and its end: it runs (and is billed) only once
every rank's main container has started, not while a pod pulls its image or fetches its inputs;
which rank a failed multi-node attempt blames (the one that failed on its own, not the ranks the Job
controller stopped after it: their SIGTERM exit came later, and may be the lower rank), its reasons
as codes in both languages, and whether the user's command never ran (a container that never
started, a shell that could not find the command), which costs nothing."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from kubernetes_asyncio.client import (
    ApiClient,
    Configuration,
    V1Container,
    V1ContainerState,
    V1ContainerStateRunning,
    V1ContainerStateTerminated,
    V1ContainerStateWaiting,
    V1ContainerStatus,
    V1Job,
    V1JobCondition,
    V1JobStatus,
    V1ObjectMeta,
    V1Pod,
    V1PodCondition,
    V1PodSpec,
    V1PodStatus,
)

from sxwl.agent.client import CloudClient
from sxwl.agent.jobsync import JobSync
from sxwl.agent.runtimes.kube_objects import COMPLETION_INDEX, CONTAINER, KubeJob
from sxwl.agent.runtimes.kube_status import began, never_started, outcome, start_problem
from sxwl.agent.runtimes.kubernetes import KubernetesRuntime
from sxwl.agent.status_report import status
from sxwl.cloud.web.i18n.reasons import reason_text
from sxwl.protocol.models import Assignment, JobStatus
from sxwl.protocol.reasons import Reason, english
from tests.support.input_server import Served, servers
from tests.support.threads import run_on_thread

__all__ = ["servers"]  # the fixture

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def pod(
    index: int,
    code: int,
    finished: datetime,
    *,
    deleted: bool,
    reason: str = "Error",
    message: str | None = None,
    ran_s: float = 60.0,
) -> V1Pod:
    """A pod whose main container ran ``ran_s`` and ended with ``code``; ``message``: its status's
    termination message (the tail of its log, FallbackToLogsOnError)."""
    began = finished - timedelta(seconds=ran_s)
    ended = V1ContainerStateTerminated(
        exit_code=code, started_at=began, finished_at=finished, reason=reason, message=message
    )
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
    assert english(seen.reason) == "rank 1 failed: exit code 5; the other ranks were stopped"
    assert reason_text("zh", seen.reason) == "第 1 号节点（rank）失败：退出码 5；其余节点已停止"
    assert not seen.never_ran


def test_of_two_ranks_that_failed_on_their_own_the_first_to_end_is_blamed() -> None:
    record, item = job()
    pods = [pod(0, 3, T0 + timedelta(seconds=2), deleted=False), pod(1, 7, T0, deleted=False)]
    seen = outcome(record, item, pods)
    assert seen is not None and seen.exit_code == 7
    assert str(english(seen.reason)).startswith("rank 1 failed: exit code 7")
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
    assert seen.reason == Reason.of("agent.pod_deleted") and not seen.never_ran
    # Already gone from it.
    seen = outcome(record, item, [])
    assert seen is not None and seen.reason == Reason.of("agent.pod_deleted") and not seen.never_ran
    # A rank that failed on its own is still the cause when the Job controller then deletes the rest.
    record.nodes = 2
    seen = outcome(record, item, [pod(0, 143, T0, deleted=True), pod(1, 5, T0, deleted=False)])
    assert (
        english(seen.reason if seen else None) == "rank 1 failed: exit code 5; the other ranks were stopped"
    )


NOT_FOUND = "/bin/sh: 1: python: not found"  # dash, as /bin/sh -c says it


def test_a_shell_that_could_not_find_the_command_is_a_start_that_never_ran() -> None:
    record, item = job()
    record.nodes = 1
    seen = outcome(record, item, [pod(0, 127, T0, deleted=False, message=NOT_FOUND + "\n", ran_s=0.0)])
    assert seen is not None and (seen.exit_code, seen.never_ran) == (127, True)
    assert seen.reason == Reason.of("agent.command_not_found", program="python")
    assert reason_text("zh", seen.reason) == "找不到命令：python"
    # The same exit after output of its own, or after running a minute: the user's program ran.
    for ran in (
        pod(0, 127, T0, deleted=False, message="step 1\n" + NOT_FOUND, ran_s=1.0),
        pod(0, 127, T0, deleted=False, message=NOT_FOUND, ran_s=60.0),
        pod(0, 127, T0, deleted=False, message="exiting 127 on purpose", ran_s=0.0),
    ):
        seen = outcome(record, item, [ran])
        assert seen is not None and seen.reason == Reason.of("job.exit_code", code=127), ran
        assert not seen.never_ran


def test_a_rank_whose_shell_could_not_find_the_command_names_it_in_both_languages() -> None:
    record, item = job()
    bash = "/bin/sh: line 1: torchrun: command not found"
    seen = outcome(
        record, item, [pod(0, 143, T0, deleted=True), pod(1, 127, T0, deleted=False, message=bash, ran_s=2)]
    )
    assert seen is not None and seen.never_ran
    said = "rank 1 failed: command not found: torchrun; the other ranks were stopped"
    assert english(seen.reason) == said
    assert reason_text("zh", seen.reason) == "第 1 号节点（rank）失败：找不到命令：torchrun；其余节点已停止"
    # On the wire: the nested cause travels as its code, so the cloud words it in each language.
    report = JobStatus.model_validate_json(
        status(1, "failed", 127, seen.reason.stored if seen.reason else None).model_dump_json()
    )
    assert report.reason == said and report.said() == seen.reason
    # An older cloud ignores reason_parts: without them the report is its English words.
    assert report.model_copy(update={"reason_parts": None}).said() == Reason.text(said)


def waiting(name: str, reason: str, message: str | None, image: str = "i") -> V1ContainerStatus:
    state = V1ContainerState(waiting=V1ContainerStateWaiting(reason=reason, message=message))
    return V1ContainerStatus(name=name, image=image, image_id="", ready=False, restart_count=0, state=state)


def running(name: str) -> V1ContainerStatus:
    state = V1ContainerState(running=V1ContainerStateRunning(started_at=T0))
    return V1ContainerStatus(name=name, image="i", image_id="", ready=True, restart_count=0, state=state)


def pending(*statuses: V1ContainerStatus, command: list[str] | None = None) -> V1Pod:
    spec = V1PodSpec(containers=[V1Container(name=CONTAINER, command=command or ["/bin/sh", "-c", "x"])])
    return V1Pod(
        metadata=V1ObjectMeta(name="p0"),
        spec=spec,
        status=V1PodStatus(phase="Pending", container_statuses=list(statuses)),
    )


def test_a_start_that_fails_before_the_command_says_why_and_never_ran() -> None:
    pull = pending(waiting(CONTAINER, "ErrImagePull", "not found", image="nosuch:1"))
    assert start_problem([pull]) == Reason.of(
        "kube.image_pull_said", image="nosuch:1", why="ErrImagePull", detail="not found"
    )
    assert reason_text("zh", start_problem([pull])) == "无法拉取镜像 nosuch:1（ErrImagePull）：not found"
    assert never_started([pull])
    invalid = pending(waiting(CONTAINER, "InvalidImageName", None, image="Bad//Name"))
    assert english(start_problem([invalid])) == "could not pull Bad//Name (InvalidImageName)"
    # A list command whose program is not in the image: the container runtime's StartError.
    exec_failed = 'exec: "pythn": executable file not found in $PATH: unknown'
    missing = pending(waiting(CONTAINER, "StartError", exec_failed), command=["pythn", "train.py"])
    assert start_problem([missing]) == Reason.of("agent.command_not_found", program="pythn")
    no_shell = pending(waiting(CONTAINER, "RunContainerError", 'exec: "/bin/sh": no such file or directory'))
    assert english(start_problem([no_shell])) == (
        'the container could not start (RunContainerError): exec: "/bin/sh": no such file or directory'
    )
    assert never_started([missing, no_shell])
    # The main container runs while the uploader's image cannot be pulled: its command did run.
    half = pending(running(CONTAINER), waiting("uploader", "ImagePullBackOff", None, image="up:1"))
    assert english(start_problem([half])) == "could not pull up:1 (ImagePullBackOff)"
    assert not never_started([half])
    assert not never_started([])  # no pod seen: nothing says it never ran


def test_an_attempt_stopped_before_its_job_was_made_never_ran(tmp_path: Path) -> None:
    async def stopped() -> KubeJob:
        async with ApiClient() as api:  # never called: nothing is made before a refresh
            runtime = KubernetesRuntime(api, state_dir=tmp_path)
            a = Assignment(
                job_id="j1",
                attempt=1,
                name="t",
                owner_id="u",
                command="x",
                image="i:1",
                gpus_per_node=0,
                nodes=1,
            )
            job = runtime.start(a)
            runtime.stop(job.job_id, job.attempt, "cancelled", cancel=True)
            (ended,) = runtime.poll()
            return ended

    job = run_on_thread(stopped())
    assert (job.outcome, job.never_ran) == ("cancelled", True)


def _as_kubelet_writes(
    index: int,
    phase: str,
    main: V1ContainerStatus,
    *,
    init: V1ContainerStatus | None = None,
    uploader: V1ContainerStatus | None = None,
) -> V1Pod:
    """A pod of rank ``index`` as the kubelet reports it: scheduled, its containers' statuses."""
    conditions = [V1PodCondition(type="PodScheduled", status="True")]
    conditions.append(V1PodCondition(type="Initialized", status="False" if init is not None else "True"))
    return V1Pod(
        metadata=V1ObjectMeta(name=f"p{index}", annotations={COMPLETION_INDEX: str(index)}),
        spec=V1PodSpec(containers=[V1Container(name=CONTAINER, command=["/bin/sh", "-c", "x"])]),
        status=V1PodStatus(
            phase=phase,
            conditions=conditions,
            container_statuses=[main, uploader or waiting("uploader", "ContainerCreating", None)],
            init_container_statuses=[init] if init is not None else None,
        ),
    )


def test_an_attempt_runs_once_its_main_container_has_started_not_while_its_pod_pulls_or_fetches() -> None:
    # The image being pulled: Pending, the containers Waiting in ContainerCreating.
    pulling = _as_kubelet_writes(0, "Pending", waiting(CONTAINER, "ContainerCreating", None))
    # The inputs' init container fetching: the main container waits in PodInitializing.
    fetching = _as_kubelet_writes(
        0,
        "Pending",
        waiting(CONTAINER, "PodInitializing", None),
        init=running("inputs"),
        uploader=waiting("uploader", "PodInitializing", None),
    )
    for waits in (pulling, fetching):
        assert not began(1, [waits]) and never_started([waits]) and start_problem([waits]) is None
    # Running, with the startedAt the kubelet writes; the uploader may still be starting.
    started = _as_kubelet_writes(0, "Running", running(CONTAINER))
    assert began(1, [started]) and not never_started([started])
    # Ended after running (a quick command): it ran. One the runtime could not start did not.
    done = pod(0, 0, T0, deleted=False, reason="Completed", ran_s=1.0)
    assert began(1, [done])
    failed_start = pod(0, 128, T0, deleted=False, reason="StartError", ran_s=0.0)
    assert not began(1, [failed_start])
    # A pull that cannot succeed is not running either: it fails with its reason, never having run.
    pull_failed = waiting(CONTAINER, "ImagePullBackOff", "back-off", image="x:1")
    backoff = _as_kubelet_writes(0, "Pending", pull_failed)
    assert not began(1, [backoff]) and never_started([backoff])
    assert start_problem([backoff]) == Reason.of(
        "kube.image_pull_said", image="x:1", why="ImagePullBackOff", detail="back-off"
    )
    assert not began(1, [])  # no pod yet


def test_a_multi_node_attempt_runs_once_every_rank_s_main_container_has_started() -> None:
    rank0 = _as_kubelet_writes(0, "Running", running(CONTAINER))
    rank1_pulling = _as_kubelet_writes(1, "Pending", waiting(CONTAINER, "ContainerCreating", None))
    assert not began(2, [rank0, rank1_pulling])
    assert not began(2, [rank0])  # rank 1's pod not made yet
    assert not never_started([rank0, rank1_pulling])  # rank 0's command did run
    rank1 = _as_kubelet_writes(1, "Running", running(CONTAINER))
    assert began(2, [rank0, rank1]) and began(2, [rank1, rank0])
    # Rank 0 already ended (it ran) while rank 1 runs: every rank has started.
    assert began(2, [pod(0, 0, T0, deleted=False, reason="Completed"), rank1])


def test_job_sync_reports_a_kubernetes_attempt_running_only_once_its_main_containers_started(
    servers: tuple[Served, Served], tmp_path: Path
) -> None:
    """The real JobSync and KubernetesRuntime against a stand-in for the cloud's status route; the API
    server is unreachable (each refresh fails and is retried), so what a refresh records on seeing
    every rank's main container run is set by hand."""
    cloud, _ = servers

    async def main() -> list[str]:
        configuration = Configuration()
        configuration.host = "https://127.0.0.1:1"
        async with ApiClient(configuration) as api:
            client = CloudClient(cloud.url)
            runtime = KubernetesRuntime(api, state_dir=tmp_path)
            sync = JobSync(client, runtime, "sxcp_test-token")
            a = Assignment(
                job_id="j1",
                attempt=1,
                name="t",
                owner_id="u",
                command="x",
                image="i:1",
                gpus_per_node=0,
                nodes=1,
            )
            job = runtime.start(a)
            for _ in range(3):  # its pods scheduled, pulling: passes go by
                await sync.supervise_once()
            before = [report["state"] for report in cloud.reports]
            job.main_started = True
            await sync.supervise_once()
            await sync.supervise_once()
            await client.close()
            return before

    assert run_on_thread(main()) == []  # nothing billed while the image is pulled
    assert [report["state"] for report in cloud.reports] == ["running"]
