"""The file system a job sees on a local CPod (docs/agent.md, "Isolation"), as bubblewrap arguments.

The sandbox's root is a tmpfs holding each of the machine's top-level entries read-only (a link as a
link), a fresh ``/dev``, ``/proc``, a private ``/tmp`` and ``/dev/shm``, and ``/sxwl``: the
attempt's work dir at ``/sxwl/work`` and its output dir at ``/sxwl/output``, the only writable
places. A job is given these fixed paths, so it runs the same whether the agent's state dir is
below a dir no other uid may search (root's home, any ``mktemp -d``), below ``/tmp`` (which the
sandbox replaces), or on a path with spaces.

What the agent runs in the sandbox itself (its Python, its ``sxwl`` for the trainer) and the dirs a
provider shares with jobs (``--share-dir``) are bound read-only at their own paths, wherever they
live: below ``/tmp`` too, and below a dir others cannot search, which becomes an empty tmpfs with
only those paths in it (the job's uid could not look inside it anyway)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

JOB_ROOT = Path("/sxwl")
JOB_WORK = JOB_ROOT / "work"
JOB_OUTPUT = JOB_ROOT / "output"
# Made fresh inside: never the machine's. /sxwl is the attempt's own.
REPLACED = frozenset({"proc", "dev", "tmp", JOB_ROOT.name})
PRIVATE_TMPFS = (Path("/tmp"), Path("/dev/shm"))  # noqa: S108 - the sandbox's own, not the machine's
# The agent's own package's dir (``src`` of a checkout, or site-packages): the trainer imports it.
CODE_ROOT = Path(__file__).resolve().parents[3]


@dataclass(frozen=True)
class SandboxPaths:
    """An attempt's dirs on the machine; the job sees ``work`` at JOB_WORK and ``output`` at
    JOB_OUTPUT."""

    hidden: tuple[Path, ...]  # invisible inside: the agent's state dir (every attempt's files)
    work: Path
    output: Path
    # Read-only inside, below ``work``: the attempt's inputs, hard links of the agent's cache.
    readonly: tuple[Path, ...] = ()
    # Files of the agent's bound read-only over the machine's (a dev environment's /etc/passwd,
    # which names the attempt's uid for its sshd): (on the machine, inside).
    files: tuple[tuple[Path, Path], ...] = ()

    def inside(self, path: Path) -> Path:
        """Where the job sees ``path``, one of these dirs or below them."""
        for host, seen in ((self.output, JOB_OUTPUT), (self.work, JOB_WORK)):
            if path.is_relative_to(host):
                return seen / path.relative_to(host)
        raise ValueError(f"{path} is not inside the attempt's dirs")


def agent_paths() -> tuple[Path, ...]:
    """What the agent itself runs in a sandbox: this Python's installation (a venv and the one it
    was made from), the ``sxwl`` it imports and the other dirs it imports from, as given and as
    resolved (a venv's ``bin/python`` finds its ``pyvenv.cfg`` by the path it was started with)."""
    found = {Path(sys.prefix), Path(sys.base_prefix), CODE_ROOT, *_import_dirs()}
    return tuple(sorted(found | {p.resolve() for p in found}))


def _import_dirs() -> set[Path]:
    """The dirs on this Python's import path but its first (the script's dir, or the working dir
    with ``-m``, which is nothing a job should see): site-packages and what their ``.pth`` files add,
    which may lie outside the venv, below /tmp too (a venv that borrows another's packages)."""
    entries = sys.path if sys.flags.safe_path else sys.path[1:]
    return {Path(entry) for entry in entries if entry and os.path.isdir(entry)}


def root_entries(root: Path = Path("/")) -> list[str]:
    """The machine's top-level entries, read-only, as the sandbox root's content."""
    args: list[str] = []
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if entry.name in REPLACED:
            continue
        path = str(Path("/") / entry.name)
        if entry.is_symlink():
            args += ["--symlink", os.readlink(entry.path), path]
        elif entry.is_dir() or entry.is_file():
            args += ["--ro-bind", entry.path, path]
    return args


def _outermost(paths: Iterable[Path]) -> list[Path]:
    """The paths none of the others contains, sorted."""
    kept: list[Path] = []
    for path in sorted(set(paths)):
        if not any(path.is_relative_to(k) for k in kept):
            kept.append(path)
    return kept


def _unsearchable_top(path: Path) -> Path | None:
    """The outermost dir above ``path`` that other uids cannot search (mode without o+x)."""
    for parent in reversed(path.parents):
        try:
            if not parent.stat().st_mode & 0o001:
                return parent
        except OSError:
            return None
    return None


def exposed_binds(paths: Iterable[Path], own_uids: bool) -> list[str]:
    """``paths`` read-only at their own place. Below a dir other uids cannot search (``own_uids``:
    jobs run as one), that dir becomes an empty tmpfs first: the job's uid could read nothing of
    it, and now passes through to what is bound; the dirs on the way are made 0755."""
    wanted = [p for p in _outermost(paths) if p != Path("/") and p.exists()]
    masks = _outermost(top for p in wanted if own_uids and (top := _unsearchable_top(p)) is not None)
    fresh = [*masks, *PRIVATE_TMPFS]  # dirs whose content the sandbox makes
    args: list[str] = []
    for mask in masks:
        args += ["--tmpfs", str(mask)]
    made: set[Path] = set()
    for path in wanted:
        under = max((f for f in fresh if path.is_relative_to(f)), key=lambda f: len(f.parts), default=None)
        if under is not None:
            for parent in reversed(path.parents):
                if parent.is_relative_to(under) and parent != under and parent not in made:
                    made.add(parent)
                    args += ["--perms", "0755", "--dir", str(parent)]
        args += ["--ro-bind", str(path), str(path)]
    return args


def attempt_binds(paths: SandboxPaths) -> list[str]:
    """The attempt's own dirs at JOB_WORK and JOB_OUTPUT (its inputs read-only below JOB_WORK)."""
    args = ["--perms", "0755", "--dir", str(JOB_ROOT)]
    args += ["--bind", str(paths.work), str(JOB_WORK), "--bind", str(paths.output), str(JOB_OUTPUT)]
    for path in paths.readonly:
        args += ["--ro-bind", str(path), str(paths.inside(path))]
    for host, inside in paths.files:
        args += ["--ro-bind", str(host), str(inside)]
    return args
