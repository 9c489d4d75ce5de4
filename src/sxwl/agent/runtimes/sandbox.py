"""Keeping tenants apart on a local CPod (docs/agent.md, "Isolation"): each attempt runs under
bubblewrap in its own pid, ipc, uts and mount namespaces, sees the machine's files read-only, has
its working and output dirs as its only writable places besides a private /tmp, cannot see the
agent's state dir or other attempts at all, and, when the agent is root, runs as a uid of its own.

Which mode a CPod runs in is decided once at start-up by running bubblewrap for real."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

IsolationSetting = Literal["auto", "none", "required"]

# A uid (and gid of the same number) per running attempt, far above ordinary users and above the
# ranges systemd hands to containers (up to 1,879,048,191); no account on the machine owns them.
UID_BASE = 2_000_000_000
UID_COUNT = 65_536

# Device nodes every CUDA process needs besides its GPUs' own /dev/nvidia<N>.
NVIDIA_SHARED_DEVICES = ("nvidiactl", "nvidia-uvm")

# Runs first inside the sandbox (as root when the agent is root), in the job's environment: drops to
# the attempt's uid, gives SIGTERM its default action back (the launcher and bubblewrap ignore it,
# so that a stop reaches only the job), and says so when the command cannot be run at all, on
# stderr (the job's log) and on the reason fd that the launcher reads. ``python -I`` ignores the
# job's PYTHON* variables and user site.
EXEC_SHIM = """
import os, signal, sys
import warnings  # os.execvp imports it: before the drop, as this Python may be unreadable to the job
fd, uid = int(sys.argv[1]), int(sys.argv[2])
argv = sys.argv[3:]
os.set_inheritable(fd, False)
signal.signal(signal.SIGTERM, signal.SIG_DFL)
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
    message, status = f"command not found: {argv[0]}", 127
    if found:
        message, status = f"cannot run {argv[0]}: {exc.strerror}", 126
print(message, file=sys.stderr, flush=True)
os.write(fd, message.encode())
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
    # The network stays shared: jobs download data and talk to each other across nodes.
    common = ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
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
class SandboxPaths:
    hidden: tuple[Path, ...]  # invisible inside: the agent's state dir (every attempt's files)
    work: Path
    output: Path
    # Read-only inside, though below ``work``: the attempt's inputs, hard links of the agent's cache.
    readonly: tuple[Path, ...] = ()


def interpreter_binds() -> list[str]:
    """This Python for a job of another uid where it lives below a dir others cannot search (root's
    home, say): that dir becomes an empty tmpfs with only the installation in it, read-only. Jobs
    (and the demo of ``sxwl up``) run the agent's interpreter; nothing else of that dir shows."""
    args: list[str] = []
    hidden: set[Path] = set()
    for prefix in sorted({Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve()}):
        top = next((d for d in reversed(prefix.parents) if not d.stat().st_mode & 0o001), None)
        if top is None:
            continue
        if top not in hidden:
            hidden.add(top)
            args += ["--tmpfs", str(top)]
        for parent in _parents_inside((top,), (prefix,)):
            args += ["--perms", "0755", "--dir", str(parent)]
        args += ["--ro-bind", str(prefix), str(prefix)]
    return args


def _parents_inside(hidden: tuple[Path, ...], targets: tuple[Path, ...]) -> list[Path]:
    """The dirs strictly between a hidden dir and each target below it, outermost first."""
    found: list[Path] = []
    for target in targets:
        for root in hidden:
            if target.is_relative_to(root):
                chain = [p for p in target.parents if p.is_relative_to(root) and p != root]
                found += [p for p in reversed(chain) if p not in found]
    return found


def job_argv(
    isolation: Isolation,
    command: list[str],
    paths: SandboxPaths,
    uid: int | None,
    gpus: list[int],
    dev_dir: Path,
    reason_fd: int,
    bwrap: str = "bwrap",
) -> list[str]:
    """What the launcher runs: the shim (and the command after it), inside bubblewrap when isolated."""
    shim = [sys.executable, "-I", "-c", EXEC_SHIM, str(reason_fd), str(uid if uid is not None else -1)]
    if not isolation.isolated:
        return [*shim, *command]
    box = [bwrap, *_namespaces(isolation.own_uids), "--die-with-parent", "--hostname", "sxwl-job"]
    box += ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    # A private /tmp and /dev/shm: in the sandbox's memory only, gone with it.
    box += ["--perms", "1777", "--tmpfs", "/tmp", "--perms", "1777", "--tmpfs", "/dev/shm"]  # noqa: S108
    if isolation.own_uids:
        box += interpreter_binds()
    for hidden in paths.hidden:
        box += ["--tmpfs", str(hidden)]
    # bwrap would create the dirs leading to a bind under a hidden dir with the modes of the real
    # ones (0700, the agent's): made here first, empty and traversable.
    for parent in _parents_inside(paths.hidden, (paths.work, paths.output)):
        box += ["--perms", "0755", "--dir", str(parent)]
    box += ["--bind", str(paths.work), str(paths.work), "--bind", str(paths.output), str(paths.output)]
    for path in paths.readonly:
        box += ["--ro-bind", str(path), str(path)]
    box += device_binds(gpus, dev_dir)
    return [*box, "--chdir", str(paths.work), "--", *shim, *command]
