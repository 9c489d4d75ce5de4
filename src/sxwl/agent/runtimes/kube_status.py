"""How an attempt's Job and pods read as an outcome and a reason a user understands: the exit code is
the ``main`` container's (never the uploader's), a failed rank is named, Kubernetes' own reasons
(OOMKilled, a container that could not start, an image that cannot be pulled, inputs that did not
arrive: kube_inputs.py) are said in words, and what went wrong with the artifacts is added
(kube_uploads.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sxwl.agent.runtimes.base import Outcome
from sxwl.agent.runtimes.kube_inputs import input_problem
from sxwl.agent.runtimes.kube_objects import CONTAINER, KubeJob, rank
from sxwl.agent.runtimes.kube_uploads import upload_problem
from sxwl.agent.runtimes.kube_wrapper import WRAPPER_NAME

IMAGE_PULL_REASONS = {"ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull"}
# The container runtime could not start the command (no /bin/sh in the image, a bad mount ...).
START_REASONS = {"StartError", "ContainerCannotRun", "RunContainerError", "CreateContainerError"}
SETTLED = ("Succeeded", "Failed")


@dataclass
class Seen:
    """What one refresh read about an attempt, for ``poll`` to turn into an outcome."""

    outcome: Outcome
    exit_code: int | None
    reason: str | None


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


def start_problem(pods: list[Any]) -> str | None:
    """Why the attempt cannot run although its Job lives: an image that cannot be pulled (main or
    uploader), or a main container that could not start (its uploader would wait for it for ever)."""
    for pod in pods:
        for status in (pod.status.container_statuses or []) + (pod.status.init_container_statuses or []):
            waiting = status.state.waiting if status.state else None
            if waiting is not None and waiting.reason in IMAGE_PULL_REASONS:
                detail = f": {waiting.message}" if waiting.message else ""
                return f"could not pull {status.image or 'the image'} ({waiting.reason}){detail}"
            ended = status.state.terminated if status.state else None
            stuck = waiting if waiting is not None and waiting.reason in START_REASONS else None
            what = stuck or (ended if ended is not None and ended.reason in START_REASONS else None)
            if status.name == CONTAINER and what is not None:
                return f"the container could not start ({what.reason}): {what.message or 'no message'}"
    return None


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


def _rank_failure(job: KubeJob, pods: list[Any]) -> tuple[int | None, str | None]:
    """The exit code and reason of the rank whose failure ended the attempt."""
    for pod in sorted(pods, key=_failure_order):
        ended = _terminated(pod)
        if ended is None or not ended.exit_code:
            continue
        code = int(ended.exit_code)
        if ended.reason == "OOMKilled":
            what = f"out of memory (OOMKilled, exit code {code})"
        elif code == 127:
            program = _program(pod)
            what = (
                f"command not found: {program} (exit code 127)"
                if program
                else "command not found (exit code 127)"
            )
        elif ended.reason in START_REASONS:
            what = f"the container could not start ({ended.reason}): {ended.message or 'no message'}"
        else:
            what = f"exit code {code}"
        if job.nodes > 1:
            what = f"rank {rank(pod)} failed: {what}; the other ranks were stopped"
        return code, what
    return None, None


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
    code, reason = _rank_failure(job, pods)
    reason = reason or input_problem(pods)
    deleted = len(pods) < job.nodes or any(p.metadata.deletion_timestamp for p in pods)
    if failed.reason == "DeadlineExceeded":
        code, reason = exit_code(pods), f"max runtime of {job.max_runtime_s} s exceeded"
    elif deleted and not any(_failed_on_its_own(p) for p in pods):
        # Whether the deleted pod is still seen (its SIGTERM exit) or already gone depends only on
        # how fast the watch delivered its removal: the cause is the deletion either way.
        reason = "a pod of the job was deleted before it finished"
    elif reason is None:
        reason = f"{failed.reason}: {failed.message}" if failed.message else failed.reason
    return Seen("failed", code, "; ".join(r for r in (reason, problem) if r))
