"""The local runtime's flags for jobs' bounds and shared dirs (docs/agent.md): sizes as people write
them, and a value the agent cannot use stops it at start (status 2) with the flag and value named,
before it registers or touches anything."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sxwl.agent.runtimes.bounds import size

GIB = 2**30


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("512Mi", 512 * 2**20),
        ("16Gi", 16 * GIB),
        ("2G", 2 * 10**9),
        ("1.5Gi", 3 * GIB // 2),
        ("25%", 16 * GIB),
    ],
)
def test_sizes_as_people_write_them(text: str, expected: int) -> None:
    assert size(text, total=64 * GIB) == expected


def test_zero_is_no_bound_and_nonsense_is_refused() -> None:
    assert size("0", total=GIB) is None and size("0%", total=GIB) is None
    for bad in ("lots", "-1Gi", "150%", "1Xi", "0.1"):
        with pytest.raises(ValueError, match=r"512Mi|at most 100%|less than a byte"):
            size(bad, total=GIB)


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--job-memory-limit", "lots"], "error: --job-memory-limit lots: expected a size such as 512Mi"),
        (["--job-tmpfs-size", "200%"], "error: --job-tmpfs-size 200%: a percentage of the machine's memory"),
        (["--share-dir", "{state}/cache"], "error: --share-dir {state}/cache: inside the agent's state dir"),
        (["--share-dir", "/proc/self"], "error: --share-dir /proc/self: the sandbox makes /proc"),
        (["--share-dir", "{root}/missing"], "error: --share-dir {root}/missing: not a directory"),
        (["--job-network", "host"], "Invalid value for '--job-network'"),
    ],
    ids=["memory", "tmpfs", "share-state", "share-proc", "share-missing", "network"],
)
def test_a_flag_the_agent_cannot_use_stops_it_naming_the_flag(
    tmp_path: Path, flags: list[str], said: str
) -> None:
    state = tmp_path / "state"
    (state / "cache").mkdir(parents=True)
    given = [f.format(state=state, root=tmp_path) for f in flags]
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "sxwl.agent",
            "--api-url",
            "http://127.0.0.1:9",
            "--state-dir",
            str(state),
            *given,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 2, run.stderr
    assert said.format(state=state, root=tmp_path) in run.stderr, run.stderr
    assert not (state / "cpod.json").exists() and not (state / "jobs").exists()
