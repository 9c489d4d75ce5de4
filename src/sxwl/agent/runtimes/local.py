"""The ``local`` runtime: each job attempt is a process group in its own directory under the
state dir, with its own GPUs (``CUDA_VISIBLE_DEVICES``); no two jobs share a GPU. Where the agent can
isolate (``sandbox.detect``), each attempt runs in a sandbox of its own; where it cannot, it takes
only the jobs of the accounts the cloud says it may (its provider and the ones it trusts)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sxwl.agent.engine_probe import engine_job
from sxwl.agent.forward_targets import SocketTarget
from sxwl.agent.inputs import writable_tree
from sxwl.agent.runtimes.base import RECORD_FILE, AttemptDirs, AttemptRecord, Outcome
from sxwl.agent.runtimes.bounds import JobBounds
from sxwl.agent.runtimes.cgroups import NONE, Cgroups
from sxwl.agent.runtimes.engine_local import engine_command
from sxwl.agent.runtimes.jupyter import (
    RUN_DIR,
    SOCKET,
    SSH_SOCKET,
    forget_workspace,
    jupyter_command,
    save_workspace,
    workspace,
)
from sxwl.agent.runtimes.launcher import EXIT_FILE, NET_FDS, REASON_FD, REASON_FILE
from sxwl.agent.runtimes.local_files import place_inputs, process_start_time
from sxwl.agent.runtimes.sandbox import (
    UID_BASE,
    UID_COUNT,
    Isolation,
    SandboxPaths,
    SandboxSetup,
    job_argv,
)
from sxwl.agent.runtimes.sandbox_mounts import CODE_ROOT, JOB_OUTPUT, JOB_WORK
from sxwl.agent.runtimes.trainer_run import trainer_command
from sxwl.agent.tenant_files import OutputTree
from sxwl.protocol import Assignment, Node, attempt_key
from sxwl.protocol.devenvs import WORKSPACE_INPUT, parse_target
from sxwl.protocol.reasons import Reason

log = logging.getLogger("sxwl.agent.local")

__all__ = ["INHERITED_ENV", "LocalJob", "LocalRuntime", "Outcome", "process_start_time"]
# Variables a job inherits from the agent's environment; everything else (the accessKey, say) stays out.
INHERITED_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "LD_LIBRARY_PATH", "CUDA_HOME", "NVIDIA_DRIVER_CAPABILITIES")


@dataclass(kw_only=True)
class LocalJob(AttemptRecord):
    """A local attempt: its process group, its GPUs, and its own uid when it runs isolated as root.
    Once the cloud has its final state only this record is kept, so that the agent knows the
    attempt and never starts it twice; nothing of the job's env, output or files."""

    gpus: list[int]
    pid: int
    pid_start: str
    uid: int | None = None
    # A dev environment's workspace, its work dir kept across attempts (runtimes/jupyter.py).
    work: str | None = None


NOT_ISOLATED = (
    "this CPod runs jobs without isolation and takes only the jobs of its provider and of the "
    "accounts it trusts"
)


class LocalRuntime(AttemptDirs[LocalJob]):
    takes_fine_tunes = takes_endpoints = takes_dev_envs = True  # its cache, trainer, supervisor, JupyterLab

    def __init__(
        self,
        state_dir: Path,
        gpu_indexes: list[int],
        stop_grace_s: float = 10.0,
        isolation: Isolation | None = None,
        dev_dir: Path = Path("/dev"),
        setup: SandboxSetup | None = None,
        cgroups: Cgroups = NONE,
    ) -> None:
        self.state_dir = state_dir.resolve()
        super().__init__(self.state_dir / "jobs")
        self.gpu_indexes = gpu_indexes
        self.stop_grace_s = stop_grace_s
        self.isolation = isolation or Isolation(False, False, "not detected")
        self.dev_dir = dev_dir
        self.setup = setup or SandboxSetup()
        self.cgroups = cgroups
        # Names this agent's attempts' cgroups apart from another agent's on the same machine.
        self.tag = hashlib.sha256(str(self.state_dir).encode()).hexdigest()[:12]
        # Why this CPod cannot run jobs (its start-up check failed); None: it can.
        self.problem: str | None = None
        # Ended attempts' cgroups still counting a dying process when last tried: each poll retries.
        self.cgroups_left: set[str] = set()
        # Owners whose jobs this runtime starts; None: anyone's (it isolates them). Without
        # isolation nobody's until the cloud has said whose (``Agent`` sets it at start).
        self.accepted_owners: frozenset[str] | None = None if self.isolation.isolated else frozenset()
        self.jobs: dict[str, LocalJob] = {}

    # ---- state on disk ---------------------------------------------------------------------------

    def adopt(self) -> list[LocalJob]:
        """After a restart: jobs still running are taken back; jobs whose process vanished without an
        exit status (the machine rebooted, say) are returned as lost."""
        lost: list[LocalJob] = []
        if not self.root.exists():
            return lost
        for path in sorted(self.root.glob(f"*/{RECORD_FILE}")):
            job = LocalJob(**json.loads(path.read_text()))
            if job.reported:
                continue
            finished = (path.parent / EXIT_FILE).exists() or job.outcome is not None
            if finished or process_start_time(job.pid) == job.pid_start:
                self.jobs[job.key] = job
                log.info("re-adopted job %s attempt %d", job.job_id, job.attempt)
            else:
                job.reported = True
                self.save(job)
                lost.append(job)
                log.warning("job %s attempt %d vanished while the agent was away", job.job_id, job.attempt)
        running = {self.cgroup_name(j.job_id, j.attempt) for j in self.jobs.values() if j.outcome is None}
        self.cgroups_left = self.cgroups.names(f"{self.tag}-") - running  # ended while it was away
        return lost

    # ---- GPUs ------------------------------------------------------------------------------------

    def used_gpus(self) -> set[int]:
        return {g for job in self.jobs.values() if job.outcome is None for g in job.gpus}

    def used_gpu_count(self) -> int:
        return len(self.used_gpus())

    def nodes_to_report(self, nodes: list[Node]) -> list[Node]:
        """The GPUs our own jobs hold are in use even when NVML shows them idle; a CPod that cannot
        run jobs (its start-up check failed) is not ready, and says why."""
        used = self.used_gpu_count()
        refused = {"status": "not_ready", "reason": self.problem} if self.problem else {}
        return [
            n.model_copy(
                update={**refused, **({"gpu": n.gpu.model_copy(update={"used": used})} if n.gpu else {})}
            )
            for n in nodes
        ]

    def accept_owners(self, owner_ids: frozenset[str] | None) -> None:
        # An isolating runtime takes anyone's jobs, whatever the cloud last said.
        if not self.isolation.isolated:
            self.accepted_owners = owner_ids

    def free_gpus(self) -> list[int]:
        used = self.used_gpus()
        return [g for g in self.gpu_indexes if g not in used]

    # ---- lifecycle -------------------------------------------------------------------------------

    def forget_workspace(self, workspace: str) -> bool:
        return forget_workspace(self.state_dir, workspace)

    def knows(self, job_id: str, attempt: int) -> bool:
        return self.workdir(job_id, attempt).exists()

    def start(self, assignment: Assignment, inputs: Mapping[str, Path] | None = None) -> LocalJob:
        """Starts the attempt once: a second delivery of the same assignment does nothing. Its
        ``inputs`` (cached paths by name) appear in its work dir as ``inputs/<name>``; a fine-tune
        (``assignment.trainer``) runs the agent's trainer on them instead of ``command``."""
        key = attempt_key(assignment.job_id, assignment.attempt)
        if key in self.jobs:
            return self.jobs[key]
        if self.problem is not None:
            raise RuntimeError(self.problem)
        missing = sorted({i.name for i in assignment.inputs} - set(inputs or {}))
        if missing:
            raise RuntimeError(f"input {missing[0]} was not fetched")
        if self.accepted_owners is not None and assignment.owner_id not in self.accepted_owners:
            raise RuntimeError(NOT_ISOLATED)
        free = self.free_gpus()
        if len(free) < assignment.gpus_per_node:
            raise RuntimeError(f"needs {assignment.gpus_per_node} GPUs, {len(free)} free")
        gpus = free[: assignment.gpus_per_node]
        uid = self._free_uid() if self.isolation.own_uids else None
        workdir = self.workdir(assignment.job_id, assignment.attempt)
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        saved = (inputs or {}).get(WORKSPACE_INPUT)
        work = workspace(self.state_dir, assignment.jupyter, uid, saved) if assignment.jupyter else None
        paths = self.make_dirs(workdir, uid, with_inputs=bool(inputs), work=work)
        placed = paths.work / "inputs"
        if inputs:
            place_inputs(inputs, placed)
        command = (
            ["/bin/sh", "-c", assignment.command]
            if isinstance(assignment.command, str)
            else assignment.command
        )
        env = {k: os.environ[k] for k in INHERITED_ENV if k in os.environ}
        env.update(assignment.env)
        if assignment.trainer is not None:
            command = trainer_command(assignment.trainer, placed, paths, self.isolation.isolated)
            env["PYTHONPATH"] = str(CODE_ROOT)  # the agent's own sxwl
        engine_socket = None
        if assignment.jupyter is not None:  # a dev environment: its JupyterLab instead
            command, added, paths = jupyter_command(assignment.jupyter, paths, self.isolation.isolated, uid)
            env.update(added)
        elif assignment.engine is not None:
            isolated = self.isolation.isolated
            command, engine_socket = engine_command(assignment.engine, placed, paths, isolated, len(gpus))
            env["PYTHONPATH"] = str(CODE_ROOT)
        env.update(
            self.job_env(paths),
            CUDA_VISIBLE_DEVICES=",".join(map(str, gpus)),
            SXWL_JOB_ID=assignment.job_id,
            SXWL_JOB_NAME=assignment.name,
            SXWL_ATTEMPT=str(assignment.attempt),
        )
        cgroup = self.cgroup_name(assignment.job_id, assignment.attempt)
        bounds = self.setup.bounds.for_attempt(assignment.cpus, assignment.memory_mib)
        proc = self.launch(workdir, paths, command, env, uid, gpus, cgroup, bounds)
        job = LocalJob(
            job_id=assignment.job_id,
            attempt=assignment.attempt,
            name=assignment.name,
            gpus=gpus,
            max_runtime_s=assignment.max_runtime_s,
            started_at=time.time(),
            pid=proc.pid,
            pid_start=process_start_time(proc.pid) or "",
            uid=uid,
            work=str(work) if work else None,
            engine_socket=str(engine_socket) if engine_socket else None,
        )
        self.jobs[job.key] = job
        self.save(job)
        log.info(
            "started job %s attempt %d (pid %d, GPUs %s%s)",
            job.job_id,
            job.attempt,
            proc.pid,
            gpus or "none",
            f", uid {uid}" if uid is not None else "",
        )
        return job

    def make_dirs(
        self, workdir: Path, uid: int | None, with_inputs: bool = False, work: Path | None = None
    ) -> SandboxPaths:
        """The attempt's dir (the agent's, 0700) with its work and output dirs (its uid's, 0700);
        ``work``: a work dir made already (a dev environment's workspace)."""
        paths = SandboxPaths(
            hidden=(self.state_dir,),
            work=work or workdir / "work",
            output=workdir / "output",
            readonly=((work or workdir / "work") / "inputs",) if with_inputs else (),
        )
        workdir.mkdir(mode=0o700)
        for own in (paths.output,) if work else (paths.work, paths.output):
            own.mkdir(mode=0o700)
            if uid is not None:
                os.chown(own, uid, uid)
        return paths

    def job_env(self, paths: SandboxPaths) -> dict[str, str]:
        """The variables naming the attempt's dirs, as the job sees them (fixed paths in a sandbox)."""
        isolated = self.isolation.isolated
        return {
            "HOME": str(JOB_WORK if isolated else paths.work),
            "SXWL_OUTPUT_DIR": str(JOB_OUTPUT if isolated else paths.output),
            "PYTHONUNBUFFERED": "1",
        }

    def cgroup_name(self, job_id: str, attempt: int) -> str:
        return f"{self.tag}-{job_id}-{attempt}"

    def launch(
        self,
        workdir: Path,
        paths: SandboxPaths,
        command: list[str],
        env: dict[str, str],
        uid: int | None,
        gpus: list[int],
        cgroup: str,
        bounds: JobBounds | None = None,
    ) -> subprocess.Popen[bytes]:
        """Starts the launcher of one attempt (or of the start-up check), in a session of its own;
        ``bounds``: the attempt's own (the CPod's, narrowed to what it asked for)."""
        procs: list[str] = []
        if self.cgroups.usable:
            try:
                procs = [str(p) for p in self.cgroups.create(cgroup, bounds or self.setup.bounds)]
            except OSError as exc:
                raise RuntimeError(f"cannot make the job's cgroup: {exc.strerror or exc}") from None
        slirp = self.setup.slirp4netns if self.isolation.isolated else None
        net_fds = NET_FDS if slirp else None
        argv = job_argv(
            self.isolation, command, paths, uid, gpus, self.dev_dir, REASON_FD, self.setup, net_fds
        )
        spec = {"argv": argv, "env": env, "cwd": str(paths.work), "cgroups": procs, "slirp": slirp}
        # The launcher gets the spec (with the job's secrets) on a pipe and only the variables it needs
        # itself: not the agent's (its accessKey, say), which a job of the same uid could read in /proc.
        launcher_env = {k: os.environ[k] for k in (*INHERITED_ENV, "PYTHONPATH") if k in os.environ}
        with (workdir / "launcher.log").open("ab") as launcher_log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "sxwl.agent.runtimes.launcher", str(workdir)],
                start_new_session=True,
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=launcher_log,
                env=launcher_env,
            )
        assert proc.stdin is not None
        with proc.stdin:
            proc.stdin.write(json.dumps(spec).encode())
        return proc

    def _free_uid(self) -> int:
        """The lowest uid of the reserved range that no attempt still holds files or processes with:
        an attempt's uid is free again once ``done`` removed its files (its processes died with its
        pid namespace)."""
        taken = {job.uid for job in self.jobs.values()}
        for uid in range(UID_BASE, UID_BASE + UID_COUNT):
            if uid not in taken:
                return uid
        raise RuntimeError(f"all {UID_COUNT} sandbox uids are in use")

    def begin_stop(self, job: LocalJob) -> None:
        """SIGTERM to the job's process group now, SIGKILL after the grace (see ``poll``)."""
        self._signal(job, signal.SIGTERM)

    def _signal(self, job: LocalJob, sig: signal.Signals) -> None:
        if process_start_time(job.pid) == job.pid_start:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job.pid, sig)

    async def refresh(self) -> list[LocalJob]:
        """Nothing to do: ``poll`` reads the processes directly."""
        return []

    def poll(self) -> list[LocalJob]:
        """Advances every job: records exits, enforces max runtime and the stop grace. Returns the
        jobs that finished in this call."""
        self.cgroups_left = {name for name in self.cgroups_left if not self.cgroups.remove(name)}
        finished = []
        now = time.time()
        for job in list(self.jobs.values()):
            if job.outcome is not None:
                continue
            workdir = self.workdir(job.job_id, job.attempt)
            exit_file = workdir / EXIT_FILE
            alive = process_start_time(job.pid) == job.pid_start
            if exit_file.exists() or not alive:
                code = int(exit_file.read_text()) if exit_file.exists() else None
                self._finish(job, code)
                finished.append(job)
                continue
            if job.max_runtime_s and job.stop_at is None and now - job.started_at > job.max_runtime_s:
                exceeded = Reason.of("agent.max_runtime", seconds=job.max_runtime_s)
                self.stop(job.job_id, job.attempt, exceeded.stored, cancel=False)
            elif job.stop_at is not None and now - job.stop_at > job.grace(self.stop_grace_s):
                self._signal(job, signal.SIGKILL)
        return finished

    def _finish(self, job: LocalJob, code: int | None) -> None:
        job.exit_code = code
        if job.work is not None:  # a dev environment's: its workspace saved for a resume elsewhere
            output = self.workdir(job.job_id, job.attempt) / "output"
            owner = job.uid if job.uid is not None else os.geteuid()
            if not save_workspace(Path(job.work), output, job.artifact_max_bytes, owner):
                log.warning("job %s: its workspace is over the artifact limit; kept here only", job.job_id)
        reason_file = self.workdir(job.job_id, job.attempt) / REASON_FILE
        if reason_file.exists():
            # The command could not run (the exec shim's code, or the launcher's words).
            job.never_ran = True
            job.stop_reason = job.stop_reason or reason_file.read_text()
        cgroup = self.cgroup_name(job.job_id, job.attempt)
        if job.stop_reason is None and code != 0 and self.cgroups.oom_kills(cgroup):
            limit = self.setup.bounds.memory_bytes or 0
            job.stop_reason = Reason.of("agent.out_of_memory", mib=round(limit / 2**20)).stored
        if not self.cgroups.remove(cgroup):
            self.cgroups_left.add(cgroup)
        if job.stop_reason is not None:
            job.outcome = "cancelled" if job.stop_cancel else "failed"
        else:
            job.outcome = "succeeded" if code == 0 else "failed"
        self.save(job)
        log.info("job %s attempt %d ended: %s (exit %s)", job.job_id, job.attempt, job.outcome, code)

    def done(self, job: LocalJob) -> None:
        """The cloud has the final state (output and artifacts were shipped before): forget the job
        and remove everything of it but its record."""
        job.reported = True
        self.save(job)
        self.jobs.pop(job.key, None)
        for entry in self.workdir(job.job_id, job.attempt).iterdir():
            if entry.name == RECORD_FILE:
                continue
            if entry.is_dir() and not entry.is_symlink():
                writable_tree(entry)  # the read-only inputs' dirs (their files are the cache's: kept)
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)

    def engine_target(self, job: LocalJob) -> SocketTarget | None:
        """Its engine's supervisor's socket, whose server must run as the attempt's uid."""
        if job.engine_socket is None:
            return None
        return SocketTarget.at(job.engine_socket, job.uid if job.uid is not None else os.geteuid())

    def attempt_target(self, target: str) -> SocketTarget | None:
        """The socket of a running replica's engine, or of a dev environment's JupyterLab or sshd."""
        engine = engine_job(self.jobs, target)
        if engine is not None:
            return self.engine_target(engine)
        named = parse_target(target)
        job = self.jobs.get(attempt_key(*named[1:])) if named else None
        if named is None or job is None or job.outcome is not None or job.work is None:
            return None
        uid = job.uid if job.uid is not None else os.geteuid()
        ssh = named[0] == "dev-ssh"  # its sshd: raw bytes, no HTTP
        return SocketTarget(Path(job.work) / RUN_DIR, SSH_SOCKET if ssh else SOCKET, uid, raw=ssh)

    def log_path(self, job: LocalJob) -> Path:
        return self.workdir(job.job_id, job.attempt) / "output.log"

    def outputs(self, job: LocalJob) -> OutputTree:
        """The attempt's output dir, whose files are its uid's (the agent's own where the attempt
        runs under the agent's uid: unisolated, or in a user namespace)."""
        owner = job.uid if job.uid is not None else os.geteuid()
        return OutputTree(self.workdir(job.job_id, job.attempt) / "output", owner)
