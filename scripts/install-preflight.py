"""Before `make run` / `make test` install the project: says what pip is about to install and how
big it is, and stops at once, naming the fix, when a disk it writes to is too short (pip would
otherwise fail with ENOSPC minutes later). Standard library only: it runs before the venv exists,
with whatever python3 the Makefile was given.

    python3 scripts/install-preflight.py --venv .venv --extras dev,examples,devenv,train
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

GB = 1024**3
# What each part installs into the venv: a full venv measured 6.1 GB on Linux x86_64 (CPython 3.11,
# the pins of pyproject.toml), 5.3 GB of it the training stack (torch 1.2, its CUDA libraries
# nvidia-* 3.0, triton 1.0). What pip downloads (kept in its cache, and under TMPDIR while it
# installs) is what the wheels weigh compressed, about 60 % of that.
INSTALLED_GB = {"base": 0.5, "dev": 0.3, "examples": 0.1, "devenv": 0.2, "train": 5.4}
DOWNLOAD_GB = {"base": 0.15, "dev": 0.1, "examples": 0.02, "devenv": 0.05, "train": 3.3}
WHAT = {
    "base": "the cloud, the agent and the CLI",
    "dev": "test and lint tools",
    "examples": "numpy for the example job",
    "devenv": "JupyterLab for dev environments",
    "train": "the training stack (torch, CUDA libraries, triton, transformers, peft)",
}
MIN_PYTHON = (3, 11)


def pip_cache_dir() -> Path | None:
    """Where pip keeps what it downloads; None when its cache is off."""
    if os.environ.get("PIP_NO_CACHE_DIR", "").lower() in ("1", "true", "yes", "on"):
        return None
    if os.environ.get("PIP_CACHE_DIR"):
        return Path(os.environ["PIP_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "pip"


def existing(path: Path) -> Path:
    """``path``, or its nearest parent that exists (what it will be created on)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def already_installed(venv: Path, extras: list[str]) -> set[str]:
    """The parts a venv from an earlier install already holds: pip adds only what changed."""
    found = {"base"} if any(venv.glob("lib/python3*/site-packages/sxwl*")) else set()
    markers = {"dev": "mypy", "examples": "numpy", "devenv": "jupyterlab", "train": "torch"}
    for extra in extras:
        if extra in markers and any(venv.glob(f"lib/python3*/site-packages/{markers[extra]}")):
            found.add(extra)
    return found


def check(venv: Path, extras: list[str]) -> list[str]:
    """The problems that stop the install, each with its fix; prints what is installed first."""
    if sys.version_info < MIN_PYTHON:
        wanted = ".".join(map(str, MIN_PYTHON))
        return [
            f"{sys.executable} is Python {sys.version.split()[0]}; sxwl needs {wanted} or newer: "
            f"run make with PYTHON=python{wanted} (or a newer one)"
        ]
    unknown = [e for e in extras if e not in WHAT]
    if unknown:
        return [
            f"unknown extra(s) {', '.join(unknown)}: choose from {', '.join(e for e in WHAT if e != 'base')}"
        ]
    parts = ["base", *extras]
    have = already_installed(venv, extras)
    new = [p for p in parts if p not in have]
    installed = sum(INSTALLED_GB[p] for p in new)
    download = sum(DOWNLOAD_GB[p] for p in new)
    print(f"Installing into {venv}: " + "; ".join(WHAT[p] for p in parts) + ".", flush=True)
    if not new:
        print("Already installed: pip only checks the pins.", flush=True)
        return []
    print(
        f"About {installed:.1f} GB on disk and {download:.1f} GB of downloads"
        + (" (most of it the training stack)" if "train" in new else "")
        + "; pip shows its progress below.",
        flush=True,
    )
    cache = pip_cache_dir()
    tmp = Path(tempfile.gettempdir())
    # What each place pip writes to needs, added up where places share a file system.
    needs = [(existing(venv), installed, f"the venv ({venv})"), (existing(tmp), download, f"TMPDIR ({tmp})")]
    if cache is not None:
        needs.append((existing(cache), download, f"pip's cache ({cache})"))
    by_device: dict[int, tuple[Path, float, list[str]]] = {}
    for path, gb, what in needs:
        device = os.stat(path).st_dev
        where, total, whats = by_device.get(device, (path, 0.0, []))
        by_device[device] = (where, total + gb, [*whats, what])
    problems = []
    for where, need, whats in by_device.values():
        free = shutil.disk_usage(where).free / GB
        if free >= need:
            continue
        fixes = [f"free {need - free:.1f} GB there"]
        if any(w.startswith("TMPDIR") for w in whats):
            fixes.append("set TMPDIR to a directory on a disk with room")
        if any(w.startswith("pip's cache") for w in whats):
            fixes.append("set PIP_CACHE_DIR to a disk with room (or PIP_NO_CACHE_DIR=1)")
        if "train" in new:
            fixes.append(
                f"leave out the training stack ({INSTALLED_GB['train']:.1f} GB; no fine-tuning demo): "
                "make run EXTRAS=dev,examples,devenv"
            )
        problems.append(
            f"Not enough room to install: {', '.join(whats)} need about {need:.1f} GB on the disk of "
            f"{where}, which has {free:.1f} GB free. Fix: " + "; or ".join(fixes) + "."
        )
    return problems


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--venv", type=Path, default=Path(".venv"))
    parser.add_argument("--extras", default="dev,examples,devenv,train", help="comma-separated; may be empty")
    args = parser.parse_args(argv)
    extras = [e for e in args.extras.split(",") if e]
    problems = check(args.venv, extras)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
