"""Carries jobs between the cloud and the runtime: takes assignments and stop commands from the
long-poll, reports each attempt's state, and ships its output and artifacts.

Nothing here deletes work because an answer was empty or failed (invariant 5, docs/architecture.md):
a job stops only on an explicit, acknowledged command, its max runtime, or a 409 saying its attempt
is stale."""

from __future__ import annotations

import logging
from typing import Generic

from sxwl.agent.client import CloudClient, LogGap, Rejected, Stale
from sxwl.agent.runtimes.base import J, Runtime
from sxwl.protocol import AgentJobState, AssignmentsReply, JobReport, JobStatus
from sxwl.protocol.models import REASON_MAX_CHARS

log = logging.getLogger("sxwl.agent.jobs")
LOG_CHUNK = 256 * 1024


class JobSync(Generic[J]):
    def __init__(self, client: CloudClient, runtime: Runtime[J], token: str) -> None:
        self.client = client
        self.runtime = runtime
        self.token = token
        # Attempts found dead at start-up, to report as lost (the runtime's own record type).
        self.lost: list[J] = []

    def reports(self) -> list[JobReport]:
        """What the heartbeat says this CPod holds."""
        return [
            JobReport(job_id=j.job_id, attempt=j.attempt, state=j.outcome or "running")
            for j in self.runtime.jobs.values()
        ]

    async def _report(
        self,
        job: J,
        state: AgentJobState,
        exit_code: int | None = None,
        reason: str | None = None,
    ) -> bool:
        """True when the cloud took the report; a stale attempt is stopped and forgotten."""
        if reason is not None and len(reason) > REASON_MAX_CHARS:  # several ranks' upload errors, say
            reason = reason[: REASON_MAX_CHARS - 1] + "…"
        try:
            reply = await self.client.report(
                self.token,
                job.job_id,
                JobStatus(attempt=job.attempt, state=state, exit_code=exit_code, reason=reason),
            )
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
            key = f"{assignment.job_id}:{assignment.attempt}"
            if key not in self.runtime.jobs and self.runtime.knows(assignment.job_id, assignment.attempt):
                continue  # handled before a restart; never start an attempt twice
            try:
                job = self.runtime.start(assignment)
            except (RuntimeError, OSError) as exc:
                log.error("cannot start job %s: %s", assignment.job_id, exc)
                await self.client.report(
                    self.token,
                    assignment.job_id,
                    JobStatus(attempt=assignment.attempt, state="failed", reason=f"could not start: {exc}"),
                )
                continue
            if await self._report(job, "starting"):
                job.reported_state = "starting"
                self.runtime.save(job)
        for command in reply.commands:
            self.runtime.stop(
                command.job_id,
                command.attempt,
                command.reason or "stopped by the cloud",
                cancel=command.cancel,
                grace_s=command.grace_s,
            )
            await self.client.ack(self.token, command.id)

    async def supervise_once(self) -> None:
        """One pass: report lost and running attempts, ship output, finalise what ended."""
        while self.lost:
            job = self.lost[0]
            try:
                reason = job.lost_reason or "the job's processes were gone when the agent restarted"
                await self._report(job, "lost", reason=reason)
            except Rejected as exc:
                log.warning("lost report for %s refused: %s", job.job_id, exc)
            self.lost.pop(0)
        self.lost.extend(await self.runtime.refresh())
        self.runtime.poll()
        for job in list(self.runtime.jobs.values()):
            try:
                await self._ship_log(job)
                if job.fenced and job.outcome is not None:
                    self.runtime.done(job)
                elif job.outcome is not None:
                    await self._finalise(job)
                elif (
                    job.reported_state != "running" and not job.fenced and await self._report(job, "running")
                ):
                    job.reported_state = "running"
                    self.runtime.save(job)
            except Rejected as exc:
                log.warning("cloud refused a report for job %s: %s", job.job_id, exc)

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
        output = self.runtime.output_dir(job)
        files = [] if output is None else output.rglob("*")
        for file in sorted(p for p in files if p.is_file() and not p.is_symlink()):
            assert output is not None
            relative = file.relative_to(output).as_posix()
            if relative in job.artifacts_uploaded:
                continue
            try:
                await self.client.upload_artifact(self.token, job.job_id, job.attempt, relative, file)
            except Rejected as exc:  # too large, say: retrying cannot help, and the job must still end
                job.artifact_problems.append(f"artifact {relative} refused: {exc}")
            job.artifacts_uploaded.append(relative)
            self.runtime.save(job)
        await self._ship_log(job)
        assert job.outcome is not None
        reason = job.stop_reason or (f"exit code {job.exit_code}" if job.exit_code else None)
        if job.exit_code is None and job.stop_reason is None:
            reason = "the job's process ended without an exit status"
        outcome = job.outcome
        if job.artifact_problems:
            # Its outputs did not all come back: the user's result is incomplete (as on Kubernetes).
            outcome = "failed" if outcome == "succeeded" else outcome
            reason = "; ".join(r for r in (reason, *job.artifact_problems) if r)
        await self._report(job, outcome, job.exit_code, reason)
        self.runtime.done(job)
