"""Carries jobs between the cloud and the runtime: takes assignments and stop commands from the
long-poll, reports each attempt's state, and ships its output and artifacts.

Nothing here deletes work because an answer was empty or failed (invariant 5, docs/architecture.md):
a job stops only on an explicit, acknowledged command, its max runtime, or a 409 saying its attempt
is stale."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from pathlib import Path
from typing import Generic

from sxwl.agent import engine_probe
from sxwl.agent.client import CloudClient, LogGap, Rejected, Stale, Unreachable
from sxwl.agent.input_grants import InputGrants
from sxwl.agent.inputs import InputCache, InputError
from sxwl.agent.runtimes.base import J, KeepsWorkspaces, Runtime
from sxwl.agent.status_report import could_not_start, status
from sxwl.agent.tenant_files import OutputTree
from sxwl.protocol import AgentJobState, Assignment, AssignmentsReply, Command, JobReport
from sxwl.protocol.finetune import CHECKPOINT_DIR, CachedInput, JobInput
from sxwl.protocol.models import attempt_key
from sxwl.protocol.reasons import Reason, english

log = logging.getLogger("sxwl.agent.jobs")
LOG_CHUNK = 256 * 1024
# Seconds between the tries of an input's fetch; after the last the attempt fails naming the input.
FETCH_RETRY_S = (2.0, 10.0, 30.0)
CACHE_REPORT_MAX = 10_000  # what a heartbeat may carry (protocol.Heartbeat.cache)


class JobSync(Generic[J]):
    def __init__(
        self,
        client: CloudClient,
        runtime: Runtime[J],
        token: str,
        cache: InputCache | None = None,
        grants: InputGrants | None = None,
    ) -> None:
        """``cache``: where the attempts' inputs are fetched to before they start; None where the
        runtime's pods fetch their own (Kubernetes without --serve-inputs). ``grants``: which
        started attempt's pods may read which cached input (cache_server.py)."""
        self.client = client
        self.runtime = runtime
        self.token = token
        self.cache = cache
        self.grants = grants
        self.fetch_retry_s: tuple[float, ...] = FETCH_RETRY_S
        # Attempts found dead at start-up, to report as lost (the runtime's own record type).
        self.lost: list[J] = []
        # Attempts whose inputs are being fetched, by key: not started yet, reported ``starting``.
        self.preparing: dict[str, asyncio.Task[None]] = {}
        self._uploads: dict[str, asyncio.Task[None]] = {}  # a running attempt's checkpoint upload
        self._cache_sent: list[CachedInput] | None = None

    def reports(self) -> list[JobReport]:
        """What the heartbeat says this CPod holds. Attempts still fetching their inputs are left
        out: the cloud then keeps counting their GPUs as assigned and not yet reported (invariant 3,
        docs/architecture.md), where a listed attempt's GPUs would have to show in ``used``."""
        return [
            JobReport(job_id=j.job_id, attempt=j.attempt, state=j.outcome or "running")
            for j in self.runtime.jobs.values()
        ]

    def cache_report(self) -> list[CachedInput] | None:
        """The cache's entries when they changed since the last accepted heartbeat, else None."""
        if self.cache is None:
            return None
        entries = self.cache.entries()[:CACHE_REPORT_MAX]
        return None if entries == self._cache_sent else entries

    def cache_reported(self, entries: list[CachedInput] | None) -> None:
        if entries is not None:
            self._cache_sent = entries

    async def _report(
        self,
        job: J,
        state: AgentJobState,
        exit_code: int | None = None,
        reason: str | None = None,
    ) -> bool:
        """True when the cloud took the report; a stale attempt is stopped and forgotten."""
        try:
            said = status(job.attempt, state, exit_code, reason)
            said.never_ran = (
                job.never_ran or None
            )  # set by the runtime once the attempt ended before its command
            reply = await self.client.report(self.token, job.job_id, said)
        except Stale as exc:
            log.warning(
                "job %s attempt %d is stale on the cloud (%s); stopping it", job.job_id, job.attempt, exc
            )
            self.runtime.stop(job.job_id, job.attempt, "stale attempt", cancel=False)
            job.fenced = True
            self.runtime.save(job)
            return False
        if reply.stop and job.outcome is None:
            self.runtime.stop(job.job_id, job.attempt, "cancelled", cancel=True)
        return True

    async def handle(self, reply: AssignmentsReply) -> None:
        for assignment in reply.assignments:
            key = attempt_key(assignment.job_id, assignment.attempt)
            if key not in self.runtime.jobs and self.runtime.knows(assignment.job_id, assignment.attempt):
                continue  # handled before a restart; never start an attempt twice
            if key in self.preparing:
                continue
            if assignment.inputs and self.cache is not None and key not in self.runtime.jobs:
                await self._begin_fetching(assignment)
                continue
            try:
                job = self.runtime.start(assignment)
            except (RuntimeError, OSError) as exc:
                log.error("cannot start job %s: %s", assignment.job_id, exc)
                await self.client.report(
                    self.token,
                    assignment.job_id,
                    status(
                        assignment.attempt,
                        "failed",
                        None,
                        could_not_start(exc),
                    ),
                )
                continue
            job.artifact_max_bytes = assignment.artifact_max_bytes
            if await self._report(job, "starting"):
                job.reported_state = "starting"
            self.runtime.save(job)
        for command in reply.commands:
            if command.kind == "forget_workspace":
                await self._forget_workspace(command)
                continue
            fetching = self.preparing.pop(attempt_key(command.job_id, command.attempt), None)
            if fetching is not None:
                # Never started: end the fetch, and say so instead of starting the job.
                fetching.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await fetching
                await self._report_unstarted(
                    command.job_id,
                    command.attempt,
                    "cancelled" if command.cancel else "failed",
                    command.reason or "stopped by the cloud",
                )
            self.runtime.stop(
                command.job_id,
                command.attempt,
                command.reason or "stopped by the cloud",
                cancel=command.cancel,
                grace_s=command.grace_s,
            )
            await self.client.ack(self.token, command.id)

    async def _forget_workspace(self, command: Command) -> None:
        """A stopped dev environment's workspace, removed from this CPod (docs/dev-envs.md)."""
        runtime, workspace = self.runtime, command.workspace
        if (
            workspace is not None
            and isinstance(runtime, KeepsWorkspaces)
            and await asyncio.to_thread(runtime.forget_workspace, workspace)
        ):
            log.info("removed the workspace of stopped dev environment %s", workspace)
        await self.client.ack(self.token, command.id)

    # ---- attempts with inputs ------------------------------------------------------------------

    async def _begin_fetching(self, assignment: Assignment) -> None:
        """Reports the attempt starting (so the cloud stops handing it out) and fetches its inputs
        in a task of its own: a big model never holds up other jobs' assignments or reports."""
        assert self.cache is not None
        await asyncio.to_thread(self.cache.mark_pending, assignment.job_id, assignment.attempt)
        if not await self._report_unstarted(assignment.job_id, assignment.attempt, "starting", None):
            return
        key = attempt_key(assignment.job_id, assignment.attempt)
        self.preparing[key] = asyncio.create_task(self._prepare(assignment), name=f"inputs {key}")

    async def _report_unstarted(
        self, job_id: str, attempt: int, state: AgentJobState, reason: str | None
    ) -> bool:
        """A report for an attempt that has no runtime record (yet). True only for a ``starting``
        the cloud took without asking for a stop: then the attempt is to be prepared."""
        try:
            reply = await self.client.report(self.token, job_id, status(attempt, state, None, reason))
        except Stale as exc:
            log.warning("job %s attempt %d is stale on the cloud (%s); not starting it", job_id, attempt, exc)
            reply = None
        except Rejected as exc:  # the job ended meanwhile (cancelled, say): nothing to start
            log.warning("cloud refused a report for job %s: %s", job_id, exc)
            reply = None
        if reply is not None and state == "starting" and not reply.stop:
            return True
        if self.cache is not None:
            self.cache.clear_pending(job_id, attempt)
        if reply is not None and state == "starting":  # cancelled before it started
            await self._report_unstarted(job_id, attempt, "cancelled", "cancelled")
        return False

    async def _prepare(self, assignment: Assignment) -> None:
        key = attempt_key(assignment.job_id, assignment.attempt)
        try:
            try:
                inputs: dict[str, Path] = {
                    i.name: await self._fetch(assignment, i) for i in assignment.inputs
                }
            except InputError as exc:
                await self._end_preparing(assignment, "failed", str(exc))
                return
            except Stale:
                await self._end_preparing(assignment, None, None)
                return
            try:
                job = self.runtime.start(assignment, inputs)
            except (RuntimeError, OSError) as exc:
                log.error("cannot start job %s: %s", assignment.job_id, exc)
                await self._end_preparing(assignment, "failed", could_not_start(exc))
                return
            job.reported_state = "starting"
            job.artifact_max_bytes = assignment.artifact_max_bytes
            self.runtime.save(job)
            if self.grants is not None and assignment.upload_token is not None:
                shas = frozenset(item.sha256 for item in assignment.inputs)
                self.grants.allow(assignment.job_id, assignment.attempt, assignment.upload_token, shas)
            assert self.cache is not None
            self.cache.clear_pending(assignment.job_id, assignment.attempt)
        except (Unreachable, Rejected) as exc:
            # The failure report itself did not arrive: the cloud keeps the attempt until it is
            # requeued; a restarted agent reports it lost (its pending marker stays).
            log.warning("job %s: the cloud did not take the report (%s)", assignment.job_id, exc)
        finally:
            self.preparing.pop(key, None)

    async def _end_preparing(
        self, assignment: Assignment, state: AgentJobState | None, reason: str | None
    ) -> None:
        told = state is None
        for tries in range(8):
            if told:
                break
            assert state is not None
            try:
                await self._report_unstarted(assignment.job_id, assignment.attempt, state, reason)
                told = True
            except Unreachable as exc:  # the cloud is away: it must still learn, or the attempt waits
                log.warning("job %s: the cloud did not take the report (%s)", assignment.job_id, exc)
                await asyncio.sleep(min(60.0, 2.0**tries))
        self.preparing.pop(attempt_key(assignment.job_id, assignment.attempt), None)
        assert self.cache is not None
        if told:  # otherwise the marker stays: a restarted agent reports the attempt lost
            self.cache.clear_pending(assignment.job_id, assignment.attempt)

    async def _fetch(self, assignment: Assignment, item: JobInput) -> Path:
        """The input in the cache, tried again after ``fetch_retry_s`` on any failure but a stale
        attempt; the last failure names the input."""
        assert self.cache is not None
        for delay in (*self.fetch_retry_s, None):
            try:
                return await self.cache.fetch(
                    self.token, assignment.job_id, assignment.attempt, item, assignment.archive_max_bytes
                )
            except (InputError, Unreachable, Rejected, OSError) as exc:
                problem = str(exc) if isinstance(exc, InputError) else f"input {item.name}: {exc}"
                if delay is None:
                    raise InputError(f"could not fetch {problem}") from None
                log.warning("job %s: %s; trying again in %.0f s", assignment.job_id, problem, delay)
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")

    async def report_left_pending(self) -> None:
        """Attempts an earlier run of the agent was fetching inputs for were never started: lost."""
        if self.cache is None:
            return
        for pending in await asyncio.to_thread(self.cache.left_pending):
            if not self.runtime.knows(pending.job_id, pending.attempt):
                reason = Reason.of("agent.restarted_fetching").stored
                with contextlib.suppress(Stale, Rejected):
                    await self.client.report(
                        self.token, pending.job_id, status(pending.attempt, "lost", None, reason)
                    )
            self.cache.clear_pending(pending.job_id, pending.attempt)

    # ---- supervision ---------------------------------------------------------------------------

    async def supervise_once(self) -> None:
        """One pass: report lost and running attempts, ship output, finalise what ended."""
        while self.lost:
            job = self.lost[0]
            try:
                reason = job.lost_reason or Reason.of("agent.processes_gone").stored
                await self._report(job, "lost", reason=reason)
            except Rejected as exc:
                log.warning("lost report for %s refused: %s", job.job_id, exc)
            self.lost.pop(0)
        self.lost.extend(await self.runtime.refresh())
        self.runtime.poll()
        for key in [k for k, task in self._uploads.items() if task.done()]:
            self._uploads.pop(key)
        for job in list(self.runtime.jobs.values()):
            uploading = self._uploads.get(job.key)
            try:
                if uploading is None or job.outcome is None:  # an ending attempt's task ships its log
                    await self._ship_log(job)
                # While a checkpoint or final upload is on its way nothing more starts: none twice.
                if uploading is None and job.outcome is not None:
                    if job.fenced:
                        self._done(job)
                    else:
                        self._in_background(job, self._finalise(job), "final upload")
                elif uploading is None and not job.fenced:
                    self._upload_checkpoints(job)
                if (
                    job.outcome is None
                    and job.reported_state != "running"
                    and not job.fenced
                    and job.command_started  # not while a pod pulls its image: billing starts here
                    # An endpoint's replica runs once its engine serves (docs/endpoints.md).
                    and (not job.serves_engine or await engine_probe.serving(self.runtime.engine_target(job)))
                    and await self._report(job, "running")
                ):
                    job.reported_state = "running"
                    self.runtime.save(job)
            except Rejected as exc:
                log.warning("cloud refused a report for job %s: %s", job.job_id, exc)

    def _in_background(self, job: J, work: Coroutine[None, None, None], what: str) -> None:
        """Runs an attempt's uploads (and, at its end, its final report) in a task of its own, so
        that hashing and sending one attempt's big outputs never delays another attempt's reports
        or end (which would bill its user for the wait). One task per attempt at a time; what did
        not get through is tried again by a later pass."""

        async def guarded() -> None:
            try:
                await work
            except (Unreachable, Rejected) as exc:
                log.warning("job %s: %s not finished (%s); trying again", job.job_id, what, exc)
            except Exception:  # a task's error is otherwise seen by no one; the next pass retries
                log.exception("job %s: %s failed; trying again", job.job_id, what)

        self._uploads[job.key] = asyncio.create_task(guarded(), name=f"{what} {job.key}")

    def _upload_checkpoints(self, job: J) -> None:
        """Starts uploading the checkpoints that appeared in ``<output>/checkpoints`` (one listing per
        pass): the trainer renames each in complete, so a name there is a finished file. Each is
        recorded once it is sent."""
        tree = self.runtime.outputs(job)
        if tree is None:
            return
        new = [r for r in tree.files(CHECKPOINT_DIR, recursive=False) if r not in job.artifacts_uploaded]
        if new:
            self._in_background(job, self._send(job, tree, new, final=False), "checkpoint upload")

    async def _send(self, job: J, tree: OutputTree, relatives: list[str], *, final: bool) -> None:
        """Uploads each file, read through tenant_files.py (never by its name, never through a
        link). A file the cloud would refuse as too large is refused here by its size, unread. Not
        ``final``: a file that cannot be sent now is tried again by the next pass."""
        for relative in relatives:
            try:
                file = await asyncio.to_thread(tree.open, relative)
            except FileNotFoundError:
                continue  # gone since the listing (the job's to remove); nothing to send
            except OSError as exc:  # a link swapped in, say: refused, and the result says so
                self._problem(job, relative, f"artifact {relative} not read: {exc}")
                continue
            with file:
                limit = job.artifact_max_bytes
                if limit is not None and file.size > limit:
                    message = (
                        f"artifact {relative} refused: {file.size} bytes, over the limit of {limit} bytes"
                    )
                    self._problem(job, relative, message)
                    continue
                try:
                    await self.client.upload_artifact(self.token, job.job_id, job.attempt, relative, file)
                except Rejected as exc:
                    self._problem(job, relative, f"artifact {relative} refused: {exc}")
                    continue
                except (Unreachable, Stale, OSError) as exc:
                    if final:
                        raise
                    log.warning("checkpoint %s of job %s not uploaded yet: %s", relative, job.job_id, exc)
                    return
            job.artifacts_uploaded.append(relative)
            self.runtime.save(job)

    def _problem(self, job: J, relative: str, problem: str) -> None:
        """An artifact that will not be uploaded: never tried again, and the result says why."""
        job.artifact_problems.append(problem)
        job.artifacts_uploaded.append(relative)
        self.runtime.save(job)

    async def _ship_log(self, job: J) -> None:
        path = self.runtime.log_path(job)
        if not path.exists():
            return
        with path.open("rb") as handle:
            while True:
                handle.seek(job.log_offset)
                chunk = handle.read(LOG_CHUNK)
                if not chunk:
                    return
                try:
                    job.log_offset = await self.client.append_log(
                        self.token, job.job_id, job.attempt, job.log_offset, chunk
                    )
                except LogGap as gap:
                    job.log_offset = gap.next_offset
                except Stale:
                    return
                self.runtime.save(job)

    async def _finalise(self, job: J) -> None:
        tree = self.runtime.outputs(job)
        if tree is not None:
            listed = await asyncio.to_thread(tree.files)
            try:
                await self._send(
                    job, tree, [r for r in listed if r not in job.artifacts_uploaded], final=True
                )
            except (Stale, OSError) as exc:
                if isinstance(exc, Stale):  # a newer attempt holds the job: report nothing more
                    job.fenced = True
                    self.runtime.save(job)
                    return
                raise Unreachable(f"an artifact could not be sent: {exc}") from None
        await self._ship_log(job)
        assert job.outcome is not None
        reason = job.stop_reason or engine_probe.failure(job)
        if reason is None and job.exit_code:
            reason = Reason.of("job.exit_code", code=job.exit_code).stored
        if job.exit_code is None and job.stop_reason is None:
            reason = Reason.of("agent.no_exit_status").stored
        outcome = job.outcome
        if job.artifact_problems:
            # Its outputs did not all come back: the user's result is incomplete (as on Kubernetes).
            outcome = "failed" if outcome == "succeeded" else outcome
            reason = "; ".join(r for r in (english(Reason.read(reason)), *job.artifact_problems) if r)
        await self._report(job, outcome, job.exit_code, reason)
        self._done(job)

    def _done(self, job: J) -> None:
        """The cloud has the attempt's end: the runtime forgets it, and its pods' grant goes."""
        self.runtime.done(job)
        if self.grants is not None:
            self.grants.revoke(job.job_id, job.attempt)
