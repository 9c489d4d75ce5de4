"""Keeping tenants apart on a local CPod (docs/agent.md, "Isolation"): each attempt runs under
bubblewrap in its own pid, ipc, uts, cgroup, network and mount namespaces, sees the machine's files
read-only and its own dirs at fixed paths (sandbox_mounts.py), cannot see the agent's state dir or
other attempts at all, and, when the agent is root, runs as a uid of its own.

Which mode a CPod runs in is decided once at start-up by running bubblewrap for real."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from sxwl.agent.runtimes.bounds import JobBounds
from sxwl.agent.runtimes.sandbox_mounts import (
    JOB_WORK,
    PRIVATE_TMPFS,
    SandboxPaths,
    agent_paths,
    attempt_binds,
    exposed_binds,
    root_entries,
)

__all__ = ["EXEC_SHIM", "Isolation", "IsolationSetting", "SandboxPaths", "SandboxSetup", "detect", "job_argv"]

IsolationSetting = Literal["auto", "none", "required"]

# A uid (and gid of the same number) per running attempt, far above ordinary users and above the
# ranges systemd hands to containers (up to 1,879,048,191); no account on the machine owns them.
UID_BASE = 2_000_000_000
UID_COUNT = 65_536

# Device nodes every CUDA process needs besides its GPUs' own /dev/nvidia<N>.
NVIDIA_SHARED_DEVICES = ("nvidiactl", "nvidia-uvm")

# Runs first inside the sandbox (as root when the agent is root), in the job's environment: sends its
# stderr where its stdout goes (the job's log; what came before, bubblewrap's words, went to the
# launcher apart), waits for the launcher to give the sandbox's network namespace its outbound link
# (after bubblewrap set up its loopback: the two would race), bounds the processes of the attempt's
# uid, drops to that uid, gives SIGTERM its default action back (the launcher and bubblewrap ignore
# it, so that a stop reaches only the job), and says so when the command cannot be run at all, on
# stderr and on the reason fd that the launcher reads (as a code, protocol/reasons.py, where it has
# one), naming what is on PATH in its stead (python3 for python). ``python -I`` ignores the job's
# PYTHON* variables and user site.
EXEC_SHIM = """
import json, os, re, resource, signal, sys
import warnings  # os.execvp imports it: before the drop, as this Python may be unreadable to the job
fd, uid, nproc, net = (int(a) for a in sys.argv[1:5])
argv = sys.argv[5:]
os.dup2(1, 2)
os.set_inheritable(fd, False)
if net >= 0:  # the sandbox is set up: the launcher links its network now and says when done
    os.write(net, b"r")
    if os.read(net, 1) != b"g":
        sys.exit(125)  # no network: the launcher ends the sandbox and says why
    os.close(net)
signal.signal(signal.SIGTERM, signal.SIG_DFL)
if nproc > 0:
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
if uid >= 0:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
try:
    os.execvp(argv[0], argv)
except OSError as exc:
    # As shells do: "not found" unless a file of that name exists where it was looked for (a PATH
    # entry this uid cannot search gives EACCES without meaning anything).
    dirs = [""] if "/" in argv[0] else os.get_exec_path()
    found = any(os.path.exists(os.path.join(d, argv[0])) for d in dirs)
    if found:
        message = said = f"cannot run {argv[0]}: {exc.strerror}"
        status = 126
    else:
        versioned = re.compile(re.escape(argv[0]) + "[0-9][0-9.]*")
        others = set()
        for d in dirs if "/" not in argv[0] else []:
            try:
                names = os.listdir(d or ".")
            except OSError:
                continue
            others |= {n for n in names if versioned.fullmatch(n) and os.access(os.path.join(d, n), os.X_OK)}
        shown = ", ".join(sorted(others, key=len)[:4])
        message = f"command not found: {argv[0]}" + (f" (on PATH: {shown})" if shown else "")
        code = "agent.command_not_found_but" if shown else "agent.command_not_found"
        params = {"program": argv[0], "found": shown} if shown else {"program": argv[0]}
        said = json.dumps({"code": code, "params": params}, separators=(",", ":"))
        status = 127
print(message, file=sys.stderr, flush=True)
os.write(fd, said.encode())
sys.exit(status)
"""


@dataclass(frozen=True)
class Isolation:
    """How this agent runs jobs. ``isolated``: under bubblewrap; ``own_uids``: each attempt under a
    uid of its own (the agent is root), otherwise under the agent's uid in a user namespace."""

    isolated: bool
    own_uids: bool
    why: str  # for the start-up log: what was found

    @property
    def wire(self) -> Literal["isolated", "none"]:
        return "isolated" if self.isolated else "none"


NONE_FORCED = Isolation(False, False, "isolation turned off (--isolation none)")


def detect(setting: IsolationSetting, bwrap: str | None = None) -> Isolation:
    """Runs bubblewrap once with the namespaces a job gets; ``required`` raises when that fails."""
    if setting == "none":
        return NONE_FORCED
    found = _probe(bwrap or shutil.which("bwrap"))
    if setting == "required" and not found.isolated:
        raise RuntimeError(f"--isolation required, but jobs cannot be isolated: {found.why}")
    return found


def _probe(bwrap: str | None) -> Isolation:
    if bwrap is None:
        return Isolation(False, False, "bwrap is not installed (Debian package bubblewrap)")
    root = os.geteuid() == 0
    argv = [bwrap, *_namespaces(root), "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "true"]
    try:
        probe = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Isolation(False, False, f"bwrap cannot run: {exc}")
    if probe.returncode != 0:
        return Isolation(False, False, f"bwrap cannot create namespaces: {probe.stderr.strip()[:300]}")
    if root:
        return Isolation(True, True, "bubblewrap as root: each attempt under its own uid")
    return Isolation(True, False, "bubblewrap in a user namespace: attempts under the agent's uid")


def _namespaces(root: bool) -> list[str]:
    # A network namespace of its own: no job reaches another's (or the host's) loopback; outbound
    # access, where the provider allows it, is the launcher's slirp4netns.
    common = ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--unshare-net"]
    # Not root: a user namespace makes the others possible; nested ones could undo nothing, but
    # there is no reason to allow them.
    return common if root else [*common, "--unshare-user", "--disable-userns"]


def device_binds(gpus: Iterable[int], dev_dir: Path) -> list[str]:
    """bwrap arguments exposing the allotted GPUs' device nodes (``<dev_dir>/nvidia<N>``) and the
    shared NVIDIA nodes, as far as they exist; every other device is absent from the sandbox."""
    names = [*NVIDIA_SHARED_DEVICES, *(f"nvidia{g}" for g in sorted(gpus))]
    args: list[str] = []
    for name in names:
        if (dev_dir / name).exists():
            args += ["--dev-bind", str(dev_dir / name), f"/dev/{name}"]
    return args


@dataclass(frozen=True)
class SandboxSetup:
    """What every attempt's sandbox gets from the agent's flags: its bounds, the dirs a provider
    shares with jobs (read-only, at their own paths), and for outbound network (``bounds.network``)
    the slirp4netns that gives it and the resolv.conf that names slirp4netns's DNS forwarder."""

    bounds: JobBounds = field(default_factory=JobBounds)
    shared: tuple[Path, ...] = ()
    slirp4netns: str | None = None
    resolv_conf: Path | None = None


def job_argv(
    isolation: Isolation,
    command: list[str],
    paths: SandboxPaths,
    uid: int | None,
    gpus: list[int],
    dev_dir: Path,
    reason_fd: int,
    setup: SandboxSetup | None = None,
    net_fds: tuple[int, int] | None = None,
    bwrap: str = "bwrap",
) -> list[str]:
    """What the launcher runs: the shim (and the command after it), inside bubblewrap when isolated.
    ``net_fds``: where bubblewrap writes its info (the sandbox's pid), and the shim's end of the
    socket on which it waits until the launcher has given the network namespace its outbound link."""
    setup = setup or SandboxSetup()
    bounds = setup.bounds
    nproc = bounds.pids if uid is not None and bounds.pids is not None else -1
    shim = [
        sys.executable,
        "-I",
        "-c",
        EXEC_SHIM,
        str(reason_fd),
        str(uid if uid is not None else -1),
        str(nproc),
        str(net_fds[1] if net_fds is not None and isolation.isolated else -1),
    ]
    if not isolation.isolated:
        return [*shim, *command]
    box = [bwrap, *_namespaces(isolation.own_uids), "--die-with-parent", "--hostname", "sxwl-job"]
    box += [*root_entries(), "--dev", "/dev", "--proc", "/proc"]
    # A private /tmp and /dev/shm: in the sandbox's memory only (its cgroup's), bounded, gone with it.
    for tmpfs in PRIVATE_TMPFS:
        size = ["--size", str(bounds.tmpfs_bytes)] if bounds.tmpfs_bytes is not None else []
        box += ["--perms", "1777", *size, "--tmpfs", str(tmpfs)]
    box += exposed_binds((*agent_paths(), *setup.shared), isolation.own_uids)
    # After what is exposed: a shared dir above the state dir does not show it.
    for hidden in paths.hidden:
        box += ["--tmpfs", str(hidden)]
    box += attempt_binds(paths)
    if net_fds is not None:
        box += ["--info-fd", str(net_fds[0])]
        if setup.resolv_conf is not None:
            box += ["--ro-bind", str(setup.resolv_conf), "/etc/resolv.conf"]
    box += device_binds(gpus, dev_dir)
    box += ["--remount-ro", "/"]  # the sandbox's root itself: nobody adds top-level entries
    return [*box, "--chdir", str(JOB_WORK), "--", *shim, *command]
