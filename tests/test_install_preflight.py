"""`make run` / `make test` before pip starts (scripts/install-preflight.py): what is installed and how
big is said first, and a disk too short for it stops the install at once with the fix named. The short
disk is real: a 64 MiB tmpfs mounted in a user and mount namespace of the test's own."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "install-preflight.py"


def on_a_short_disk(tmp_path: Path, command: str) -> subprocess.CompletedProcess[str]:
    """``command`` (a shell line) with TMPDIR on a 64 MiB tmpfs at ``tmp_path/short``."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare (util-linux) for a tmpfs of the test's own")
    short = tmp_path / "short"
    short.mkdir()
    line = f"mount -t tmpfs -o size=64m tmpfs {short} && export TMPDIR={short} && {command}"
    done = subprocess.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", line],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if "mount" in done.stderr and "ermission" in done.stderr:
        pytest.skip(f"this machine allows no tmpfs in a user namespace: {done.stderr}")
    return done


def test_a_short_tmpdir_stops_the_install_at_once_naming_the_fix(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    done = on_a_short_disk(tmp_path, f"{sys.executable} {SCRIPT} --venv {venv} --extras dev,examples,train")
    assert done.returncode == 1, done
    assert "the training stack (torch" in done.stdout and "GB of downloads" in done.stdout
    (problem,) = done.stderr.strip().splitlines()
    assert problem.startswith("Not enough room to install: TMPDIR")
    assert "set TMPDIR to a directory on a disk with room" in problem
    assert "make run EXTRAS=dev,examples,devenv" in problem
    assert not venv.exists()


def test_make_stops_before_creating_the_venv(tmp_path: Path) -> None:
    """The Makefile's install rule runs the check first: nothing is created, pip never starts."""
    if shutil.which("make") is None:
        pytest.skip("needs make")
    venv = tmp_path / "venv"
    done = on_a_short_disk(tmp_path, f"make -C {ROOT} PYTHON={sys.executable} VENV={venv} {venv}/.installed")
    assert done.returncode != 0
    assert "Not enough room to install: TMPDIR" in done.stderr
    assert "pip install" not in done.stdout
    assert not venv.exists()


def test_with_room_it_says_what_and_how_big_and_goes_on(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--venv", str(tmp_path / "venv"), "--extras", "dev,examples"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    said = done.stdout
    assert "the cloud, the agent and the CLI; test and lint tools" in said and "torch" not in said
    assert "GB on disk" in said and done.stderr == ""


def test_an_unknown_extra_is_named(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--venv", str(tmp_path / "venv"), "--extras", "dev,trian"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1 and "unknown extra(s) trian" in done.stderr
