"""How an attempt's Job and pods read as an outcome and a reason a user understands: the exit code is
the ``main`` container's (never the uploader's), a failed rank is named, Kubernetes' own reasons
(OOMKilled, a container that could not start, an image that cannot be pulled, inputs that did not
arrive: kube_inputs.py) are said as codes (protocol/reasons.py), what went wrong with the artifacts
is added (kube_uploads.py), and an attempt whose command never ran (its container never started, or
its shell could not find the command: agent/not_found.py) says so, so that it costs nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sxwl.agent import not_found
from sxwl.agent.runtimes.base import Outcome
from sxwl.agent.runtimes.kube_inputs import input_problem
from sxwl.agent.runtimes.kube_objects import CONTAINER, KubeJob, rank
from sxwl.agent.runtimes.kube_uploads import upload_problem
from sxwl.agent.runtimes.kube_wrapper import WRAPPER_NAME
from sxwl.protocol.reasons import Reason

IMAGE_PULL_REASONS = {"ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull"}
# The container runtime could not start the command (no /bin/sh in the image, a bad mount ...).
START_REASONS = {"StartError", "ContainerCannotRun", "RunContainerError", "CreateContainerError"}
SETTLED = ("Succeeded", "Failed")
# What runc and crun say when the program of a list command is not in the image.
EXEC_NOT_FOUND = "executable file not found"


@dataclass
class Seen:
    """What one refresh read about an attempt, for ``poll`` to turn into an outcome."""

    outcome: Outcome
    exit_code: int | None
    reason: Reason | None
    never_ran: bool = False  # the user's command never ran: the attempt costs nothing


def _main(pod: Any) -> Any:
    return next((s for s in pod.status.container_statuses or [] if s.name == CONTAINER), None)


def _terminated(pod: Any) -> Any:
    status = _main(pod)
    return status.state.terminated if status is not None and status.state else None


def _program(pod: Any) -> str | None:
    """The program the main container was asked to run, when the command names one (a list command,
    under the wrapper or not); None for a shell string, whose shell says what it missed in the log."""
    spec = next((c for c in pod.spec.containers or [] if c.name == CONTAINER), None)
    argv = list(spec.command or []) if spec is not None else []
    if WRAPPER_NAME in argv:
        argv = argv[argv.index(WRAPPER_NAME) + 1 :]
    if not argv or argv[:2] == ["/bin/sh", "-c"]:
        return None
    return str(argv[0])


def exit_code(pods: list[Any]) -> int | None:
    """The main container's first non-zero exit code among the pods, by rank; else 0 if one exited,
    else None."""
    codes = [int(t.exit_code) for t in map(_terminated, sorted(pods, key=rank)) if t is not None]
    nonzero = [c for c in codes if c != 0]
    return nonzero[0] if nonzero else (0 if codes else None)


def settled(pods: list[Any]) -> bool:
    """Every pod has finished, its uploader included (pods already gone are finished)."""
    return all(pod.status.phase in SETTLED for pod in pods)


def start_problem(pods: list[Any]) -> Reason | None:
    """Why the attempt cannot run although its Job lives: an image that cannot be pulled (main or
    uploader), or a main container that could not start (its uploader would wait for it for ever)."""
    for pod in pods:
        for status in (pod.status.container_statuses or []) + (pod.status.init_container_statuses or []):
            waiting = status.state.waiting if status.state else None
            if waiting is not None and waiting.reason in IMAGE_PULL_REASONS:
                image, why = status.image or "the image", waiting.reason
                if waiting.message:
                    return Reason.of("kube.image_pull_said", image=image, why=why, detail=waiting.message)
                return Reason.of("kube.image_pull", image=image, why=why)
            ended = status.state.terminated if status.state else None
            stuck = waiting if waiting is not None and waiting.reason in START_REASONS else None
            what = stuck or (ended if ended is not None and ended.reason in START_REASONS else None)
            if status.name == CONTAINER and what is not None:
                return _not_started(pod, what)
    return None


def _not_started(pod: Any, what: Any) -> Reason:
    """A main container that the container runtime could not start: its program not found in the
    image (a list command without the wrapper), or the runtime's own words."""
    program = _program(pod)
    if program is not None and EXEC_NOT_FOUND in (what.message or ""):
        return not_found.reason(program, [])
    if what.message:
        return Reason.of("kube.not_started_said", why=what.reason, detail=what.message)
    return Reason.of("kube.not_started", why=what.reason)


def main_started(pod: Any) -> bool:
    """The pod's main container has started: it runs, or it ended after running. A pod pulling its
    image or running its init containers (the inputs' fetch) is Pending with the main container
    Waiting (ContainerCreating, PodInitializing); one the container runtime could not start ends
    Terminated with a StartError: neither ran the command."""
    status = _main(pod)
    state = status.state if status is not None else None
    if state is None:
        return False
    if state.running is not None:
        return True
    return state.terminated is not None and state.terminated.reason not in START_REASONS


def began(nodes: int, pods: list[Any]) -> bool:
    """Every rank's main container has started, so the attempt runs and is reported ``running``, which
    billing starts from (docs/billing.md). All ranks, not the first: a multi-node job's ranks wait
    for each other (torchrun's rendezvous), so nothing of its work runs while one is still pulling."""
    return len({rank(pod) for pod in pods if main_started(pod)}) >= nodes


def never_started(pods: list[Any]) -> bool:
    """No pod's main container ever ran: the user's command never did (docs/billing.md). False when
    no pod is seen: nothing says so."""
    return bool(pods) and not any(main_started(pod) for pod in pods)


def _elapsed_s(ended: Any) -> float:
    began, finished = ended.started_at, ended.finished_at
    return (finished - began).total_seconds() if began is not None and finished is not None else float("inf")


def _failure_order(pod: Any) -> tuple[bool, float, int]:
    """Ranks that failed on their own first (the Job controller deletes the others once one fails,
    so theirs is a SIGTERM exit, not the cause), then the earliest to end, then the lowest rank."""
    ended = _terminated(pod)
    finished = ended.finished_at if ended is not None else None
    return (
        pod.metadata.deletion_timestamp is not None,
        finished.timestamp() if finished is not None else float("inf"),
        rank(pod),
    )


def _failed_on_its_own(pod: Any) -> bool:
    """The pod's container ended with an error while nothing was deleting the pod."""
    ended = _terminated(pod)
    return pod.metadata.deletion_timestamp is None and ended is not None and bool(ended.exit_code)


def _rank_failure(job: KubeJob, pods: list[Any]) -> tuple[int | None, Reason | None, bool]:
    """The exit code and reason of the rank whose failure ended the attempt, and whether its command
    never ran: a shell that could not find it, by the evidence of agent/not_found.py (the main
    container's termination message is the tail of its log: FallbackToLogsOnError)."""
    for pod in sorted(pods, key=_failure_order):
        ended = _terminated(pod)
        if ended is None or not ended.exit_code:
            continue
        code = int(ended.exit_code)
        missing = not_found.shell_not_found(ended.message or "", code, _elapsed_s(ended))
        what: Reason
        if ended.reason == "OOMKilled":
            what = Reason.of("kube.oom_killed", code=code)
        elif missing is not None:
            what = not_found.reason(missing.program, missing.found)
        elif ended.reason in START_REASONS:
            what = _not_started(pod, ended)
        else:
            what = Reason.of("job.exit_code", code=code)
        if job.nodes > 1:
            what = Reason.of("kube.rank_failed", rank=rank(pod), what=what)
        return code, what, missing is not None or ended.reason in START_REASONS
    return None, None, False


def _job_failed(failed: Any) -> Reason:
    if failed.message:
        return Reason.of("kube.job_failed_said", why=failed.reason, detail=failed.message)
    return Reason.of("kube.job_failed", why=failed.reason)


def outcome(job: KubeJob, item: Any, pods: list[Any]) -> Seen | None:
    """The attempt's end, once its Job has a final condition; None while it has none."""
    conditions = {c.type: c for c in (item.status.conditions or []) if c.status == "True"}
    problem = upload_problem(pods)
    if "Complete" in conditions:
        # Outputs that did not all come back leave the user without the result: the attempt failed.
        return Seen("failed", 0, problem) if problem else Seen("succeeded", 0, None)
    if "Failed" not in conditions:
        return None
    failed = conditions["Failed"]
    code, reason, never_ran = _rank_failure(job, pods)
    if reason is None:
        reason = input_problem(pods)
        never_ran = reason is not None  # the main container waits for its inputs: it never ran
    deleted = len(pods) < job.nodes or any(p.metadata.deletion_timestamp for p in pods)
    if failed.reason == "DeadlineExceeded":
        code, reason = exit_code(pods), Reason.of("agent.max_runtime", seconds=job.max_runtime_s)
        never_ran = never_started(pods)
    elif deleted and not any(_failed_on_its_own(p) for p in pods):
        # Whether the deleted pod is still seen (its SIGTERM exit) or already gone depends only on
        # how fast the watch delivered its removal: the cause is the deletion either way.
        reason, never_ran = Reason.of("agent.pod_deleted"), False
    elif reason is None:
        reason, never_ran = _job_failed(failed), never_started(pods)
    if problem is not None:
        reason = Reason.of("agent.and", first=reason, then=problem)
    return Seen("failed", code, reason, never_ran)


def unschedulable(pods: list[Any], since: dict[str, float], now: float, limit_s: float) -> Reason | None:
    """The scheduler's words once a pod has been unschedulable for more than ``limit_s``. ``since``
    holds when each pod (by uid) was first seen so, and forgets those scheduled since."""
    for pod in pods:
        scheduled = next((c for c in (pod.status.conditions or []) if c.type == "PodScheduled"), None)
        uid = pod.metadata.uid
        if scheduled is not None and scheduled.status == "False" and scheduled.reason == "Unschedulable":
            if now - since.setdefault(uid, now) > limit_s:
                return Reason.of("kube.unschedulable", seconds=f"{limit_s:g}", detail=scheduled.message or "")
        else:
            since.pop(uid, None)
    return None
