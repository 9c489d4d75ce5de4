"""What the local runtime reads and lays out on the machine for an attempt, apart from the runtime
itself: a process's start time (a reused pid does not match it) and the attempt's read-only view of
its cached inputs."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from sxwl.agent.inputs import READ_ONLY_DIR, materialise


def process_start_time(pid: int) -> str | None:
    """The kernel's start time of a process: a pid reused by another process does not match it."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[19] if fields[0] != "Z" else None


def place_inputs(inputs: Mapping[str, Path], placed: Path) -> None:
    """``placed/<name>`` for each cached input: the job sees these, never the cache (the sandbox
    hides the state dir), and cannot change them (read-only files, dir and mount)."""
    placed.mkdir(mode=0o755)
    for name, source in sorted(inputs.items()):
        materialise(source, placed / name)
    os.chmod(placed, READ_ONLY_DIR)
