"""The local runtime as the agent's flags make it (docs/agent.md, "Isolation (local runtime)" and
"Bounds (local runtime)"): how jobs are kept apart, what bounds each one, the dirs shared with
jobs, and the start-up check that a sandboxed job can run here at all."""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from sxwl.agent.runtimes import cgroups
from sxwl.agent.runtimes.bounds import JobBounds, JobNetwork, machine_memory, size
from sxwl.agent.runtimes.local import LocalRuntime
from sxwl.agent.runtimes.local_check import check
from sxwl.agent.runtimes.sandbox import Isolation, IsolationSetting, SandboxSetup, detect

log = logging.getLogger("sxwl.agent")

# slirp4netns's DNS forwarder in the namespace it configures (its default 10.0.2.0/24).
SLIRP_DNS = "nameserver 10.0.2.3\n"
# Dirs of the machine a job never gets as a shared dir: they are the sandbox's own.
NOT_SHARED = (Path("/proc"), Path("/dev"), Path("/sys"))

FLAG_HELP = {
    "memory": "local runtime: each job's memory, its /tmp and /dev/shm included (e.g. 64Gi, or 80% of "
    "this machine's); 0: no bound. Through cgroups, so the agent must be root.",
    "pids": "local runtime: processes and threads of each job; 0: no bound.",
    "tmpfs": "local runtime: the size of each job's /tmp and of its /dev/shm (e.g. 8Gi or 25%); 0: no bound.",
    "network": "local runtime with isolation: each job has a network of its own with loopback only, or "
    "outbound connections too (through slirp4netns; never to this machine's loopback).",
    "share": "local runtime: a directory every job may read, at its own path; repeatable.",
}


@dataclass(frozen=True)
class JobFlags:
    """The agent's flags for local jobs, as given."""

    memory: str
    pids: int
    tmpfs: str
    network: JobNetwork
    share_dirs: tuple[Path, ...] = ()


def local_isolation(setting: IsolationSetting, trusted: list[str]) -> Isolation:
    """The mode this agent runs jobs in, said once at start-up (a warning when tenants are not apart).
    Raises RuntimeError for ``required`` where jobs cannot be isolated."""
    mode = detect(setting)
    if mode.isolated:
        log.info("jobs are isolated: %s", mode.why)
    else:
        log.warning(
            "JOBS ARE NOT ISOLATED (%s): they run as this agent's user and could read its state and "
            "each other's files, so this CPod takes only the jobs of its provider%s",
            mode.why,
            f" and of {', '.join(trusted)}" if trusted else "",
        )
    return mode


def sandbox_setup(flags: JobFlags, state_dir: Path, isolation: Isolation) -> SandboxSetup:
    """The setup every attempt's sandbox gets; ValueError names the flag that cannot be used."""
    total = machine_memory()
    bounds = JobBounds(
        memory_bytes=_size("--job-memory-limit", flags.memory, total),
        pids=flags.pids or None,
        tmpfs_bytes=_size("--job-tmpfs-size", flags.tmpfs, total),
        network=flags.network,
    )
    shared = tuple(_shared(path, state_dir) for path in flags.share_dirs)
    if flags.network == "loopback" or not isolation.isolated:
        return SandboxSetup(bounds=bounds, shared=shared)
    slirp = shutil.which("slirp4netns")
    if slirp is None:
        raise ValueError("--job-network outbound needs slirp4netns (Debian package slirp4netns)")
    resolv = state_dir / "resolv.conf"
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    resolv.write_text(SLIRP_DNS)
    resolv.chmod(0o644)
    return SandboxSetup(bounds=bounds, shared=shared, slirp4netns=slirp, resolv_conf=resolv)


def _size(flag: str, text: str, total: int) -> int | None:
    try:
        return size(text, total)
    except ValueError as exc:
        raise ValueError(f"{flag} {text}: {exc}") from None


def _shared(path: Path, state_dir: Path) -> Path:
    resolved = path.resolve()
    if not resolved.is_dir():
        raise ValueError(f"--share-dir {path}: not a directory")
    if resolved == Path("/") or resolved in (Path("/tmp"), Path("/dev/shm")):  # noqa: S108
        raise ValueError(f"--share-dir {path}: share a directory below it, not it")
    if resolved.is_relative_to(state_dir):
        raise ValueError(f"--share-dir {path}: inside the agent's state dir, which jobs must not see")
    if any(resolved.is_relative_to(p) for p in NOT_SHARED):
        raise ValueError(f"--share-dir {path}: the sandbox makes /proc, /dev and /sys itself")
    return resolved


def local_runtime(
    state_dir: Path, gpu_indexes: list[int], stop_grace_s: float, isolation: Isolation, setup: SandboxSetup
) -> LocalRuntime:
    """The runtime, with a cgroup per attempt where this machine allows it, after the start-up
    check (whose failure leaves it refusing every job, and saying why)."""
    bounds = setup.bounds
    found = cgroups.find() if bounds.memory_bytes or bounds.pids else cgroups.NONE
    log.info("each job's bounds: %s", bounds.describe())
    if found.why:
        rlimit = "; processes are, by RLIMIT_NPROC on each job's uid" if isolation.own_uids else ""
        log.warning("jobs' memory and processes are not bounded: %s%s", found.why, rlimit)
    runtime = LocalRuntime(state_dir, gpu_indexes, stop_grace_s, isolation, setup=setup, cgroups=found)
    check(runtime)
    return runtime
