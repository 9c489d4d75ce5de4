"""A cgroup per attempt on a local CPod, bounding its memory (its private /tmp and /dev/shm count:
tmpfs pages are charged to the job that wrote them), its processes and, for an attempt that asked
for cores, its CPU time (docs/agent.md, "Bounds (local runtime)").

Each hierarchy gets a dir ``sxwl-jobs`` at its root, shared by every agent of the machine, and each
attempt a cgroup below it named by the agent's tag (from its state dir) and the attempt. On cgroup
v2 that dir enables the memory and pids controllers for its children (a cgroup with processes of
its own could not, so it is not the agent's own cgroup); on v1 (the memory and pids hierarchies)
it is the same layout in each. The launcher moves the job's sandbox in before it starts."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from sxwl.agent.runtimes.bounds import JobBounds

log = logging.getLogger("sxwl.agent.cgroups")

ROOT = Path("/sys/fs/cgroup")
BASE = "sxwl-jobs"
CONTROLLERS = ("memory", "pids")
# Taken where the kernel lets the agent have it: without it the asked cores go unenforced (a
# warning says so), which is no reason to run jobs without their memory and process bounds.
OPTIONAL = ("cpu",)
CPU_PERIOD_US = 100_000  # the kernel's default period; the quota is the cores times it


@dataclass(frozen=True)
class Cgroups:
    """Where attempts' cgroups are made: ``bases`` (one per hierarchy; none where cgroups cannot
    bound jobs here, and ``why`` says why), for cgroup ``version`` 1 or 2."""

    bases: tuple[Path, ...]
    version: int
    why: str

    @property
    def usable(self) -> bool:
        return bool(self.bases)

    def leaves(self, name: str) -> tuple[Path, ...]:
        return tuple(base / name for base in self.bases)

    def create(self, name: str, bounds: JobBounds) -> tuple[Path, ...]:
        """The attempt's cgroups with its bounds; returns their ``cgroup.procs`` files (what the
        launcher writes the sandbox's pid to). Raises OSError when the kernel refuses."""
        procs = []
        for leaf in self.leaves(name):
            leaf.mkdir(exist_ok=True)
            for file, value in self._limits(leaf, bounds):
                (leaf / file).write_text(value)
            procs.append(leaf / "cgroup.procs")
        return tuple(procs)

    def _limits(self, leaf: Path, bounds: JobBounds) -> list[tuple[str, str]]:
        memory, pids, cpus = bounds.memory_bytes, bounds.pids, bounds.cpus
        limits: list[tuple[str, str]] = []
        if cpus is not None and (leaf / "cpu.max").exists():  # v2
            limits.append(("cpu.max", f"{cpus * CPU_PERIOD_US} {CPU_PERIOD_US}"))
        if cpus is not None and (leaf / "cpu.cfs_quota_us").exists():  # v1
            limits += [
                ("cpu.cfs_period_us", str(CPU_PERIOD_US)),
                ("cpu.cfs_quota_us", str(cpus * CPU_PERIOD_US)),
            ]
        if self.version == 2:
            if memory is not None:
                limits.append(("memory.max", str(memory)))
                # No swap beyond the bound either, where the machine has swap.
                if (leaf / "memory.swap.max").exists():
                    limits.append(("memory.swap.max", "0"))
            if pids is not None:
                limits.append(("pids.max", str(pids)))
            return limits
        if memory is not None and (leaf / "memory.limit_in_bytes").exists():
            limits.append(("memory.limit_in_bytes", str(memory)))
            if (leaf / "memory.memsw.limit_in_bytes").exists():  # memory and swap together
                limits.append(("memory.memsw.limit_in_bytes", str(memory)))
        if pids is not None and (leaf / "pids.max").exists():
            limits.append(("pids.max", str(pids)))
        return limits

    def oom_kills(self, name: str) -> int:
        """How many of the attempt's processes the kernel killed for its memory bound."""
        kills = 0
        for leaf in self.leaves(name):
            for file in ("memory.events", "memory.oom_control"):  # v2, v1
                with contextlib.suppress(OSError):
                    for line in (leaf / file).read_text().splitlines():
                        key, _, value = line.partition(" ")
                        if key == "oom_kill":
                            kills += int(value)
        return kills

    def names(self, prefix: str) -> set[str]:
        """The attempts' cgroups whose names start with ``prefix`` (an agent's tag)."""
        return {leaf.name for base in self.bases for leaf in base.glob(f"{prefix}*") if leaf.is_dir()}

    def remove(self, name: str, wait_s: float = 0.0) -> bool:
        """Removes the attempt's cgroups once its processes are gone, waiting up to ``wait_s`` for
        them; False while some are still there (the kernel counts a task out a moment after its
        pid namespace ended)."""
        deadline = time.monotonic() + wait_s
        while True:
            busy = False
            for leaf in self.leaves(name):
                try:
                    leaf.rmdir()
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        log.warning("cannot remove the cgroup %s: %s", leaf, exc)
                    busy = True
            if not busy or time.monotonic() >= deadline:
                return not busy
            time.sleep(0.05)


NONE = Cgroups((), 0, "")


def find(root: Path = ROOT) -> Cgroups:
    """This machine's cgroups as jobs can be bounded with them, with their ``sxwl-jobs`` dirs made."""
    try:
        if (root / "cgroup.controllers").exists():
            return _unified(root)
        if (root / "memory" / "memory.limit_in_bytes").exists() or (root / "pids").is_dir():
            return _legacy(root)
    except OSError as exc:
        return Cgroups((), 0, f"cannot make cgroups for jobs under {root}: {exc.strerror or exc}")
    return Cgroups((), 0, f"no cgroup memory or pids controller under {root}")


def _enable(cgroup: Path, wanted: tuple[str, ...]) -> None:
    enabled = (cgroup / "cgroup.subtree_control").read_text().split()
    missing = [c for c in wanted if c not in enabled]
    if missing:
        (cgroup / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in missing))


def _unified(root: Path) -> Cgroups:
    available = (root / "cgroup.controllers").read_text().split()
    wanted = tuple(c for c in CONTROLLERS if c in available)
    if not wanted:
        return Cgroups((), 2, f"cgroup v2 at {root} offers neither the memory nor the pids controller")
    _enable(root, wanted)
    base = root / BASE
    base.mkdir(mode=0o755, exist_ok=True)
    _enable(base, wanted)
    for controller in (c for c in OPTIONAL if c in available):
        try:
            _enable(root, (controller,))
            _enable(base, (controller,))
        except OSError as exc:
            log.warning(
                "cannot enable the cgroup %s controller for jobs: %s", controller, exc.strerror or exc
            )
    return Cgroups((base,), 2, "")


def _legacy(root: Path) -> Cgroups:
    bases = []
    for controller in (*CONTROLLERS, *OPTIONAL):
        if (root / controller).is_dir() and os.access(root / controller, os.W_OK):
            base = root / controller / BASE
            base.mkdir(mode=0o755, exist_ok=True)
            bases.append(base)
    if not any(base.parent.name in CONTROLLERS for base in bases):
        return Cgroups((), 1, f"cannot write the cgroup v1 memory or pids hierarchy under {root}")
    return Cgroups(tuple(bases), 1, "")
