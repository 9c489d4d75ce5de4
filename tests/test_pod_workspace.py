"""A dev environment's workspace on Kubernetes, saved and restored in its pod (sxwl/agent/
pod_workspace.py): the program run as a real process of the machine's own python3, without the
project on its path, under the real wrapper of kube_wrapper.py, on real directories. What each
attempt is given, links and what is over the cap stay out of the tar; a restore goes only into a
claim without the user's files, and one cut short is neither saved nor taken for the user's work."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from sxwl.agent import pod_fetcher, pod_workspace
from sxwl.agent.pod_workspace import (
    KEPT,
    PARTIAL,
    RESTORED,
    STAGING,
    UNFINISHED,
    Session,
    Stopped,
    restore,
    save,
)
from sxwl.agent.runtimes import jupyter
from sxwl.agent.runtimes.kube_wrapper import wrapped
from sxwl.protocol.devenvs import WORKSPACE_ARTIFACT

PROGRAM = Path(pod_workspace.__file__)
PYTHON = shutil.which("python3", path="/usr/bin:/bin") or sys.executable


def test_it_names_what_the_agent_and_the_cloud_name() -> None:
    assert pod_workspace.WORKSPACE_TAR == WORKSPACE_ARTIFACT
    assert pod_workspace.GIVEN == jupyter.GIVEN


def _claim(root: Path) -> Path:
    """A claim as a pod sees it: the user's files, a link out, what the attempt is given, the file
    system's lost+found."""
    work = root / "work"
    (work / "notes").mkdir(parents=True)
    (work / "notes" / "keep.txt").write_text("kept\n")
    (work / "top.py").write_text("print(1)\n")
    (work / "inputs" / "model-0").mkdir(parents=True)
    (work / "inputs" / "model-0" / "weights").write_text("given afresh\n")
    (work / ".sxwl-dev").mkdir()
    (work / "lost+found").mkdir()
    secret = root / "secret"
    secret.write_text("not the user's\n")
    (work / "notes" / "link").symlink_to(secret)
    (work / "linked-dir").symlink_to(root)
    return work


def _names(tar: Path) -> dict[str, bytes | None]:
    with tarfile.open(tar) as archive:
        found: dict[str, bytes | None] = {}
        for member in archive:
            assert member.isdir() or member.isreg(), member.name
            data = archive.extractfile(member) if member.isreg() else None
            found[member.name] = data.read() if data is not None else None
        return found


def test_the_saved_tar_holds_the_users_files_only(tmp_path: Path) -> None:
    work, output = _claim(tmp_path), tmp_path / "output"
    output.mkdir()
    line = save(work, output, tmp_path, limit=100_000)
    assert line.startswith("workspace saved: 3 entries"), line
    assert _names(output / WORKSPACE_ARTIFACT) == {
        "notes": None,
        "notes/keep.txt": b"kept\n",
        "top.py": b"print(1)\n",
    }
    assert not list(tmp_path.glob(".*.partial"))  # written beside the output, renamed in whole


def test_a_workspace_over_the_cap_stays_on_the_cpod_only(tmp_path: Path) -> None:
    work, output = _claim(tmp_path), tmp_path / "output"
    output.mkdir()
    (work / "big.bin").write_bytes(b"x" * 5000)
    line = save(work, output, tmp_path, limit=4000)
    assert "over the 4000" in line and "kept on this CPod only" in line
    assert not (output / WORKSPACE_ARTIFACT).exists()
    # Its files fit, its tar (headers, padding) does not: nothing either.
    (work / "big.bin").write_bytes(b"x" * 3000)
    line = save(work, output, tmp_path, limit=3020)
    assert "its tar is" in line and not (output / WORKSPACE_ARTIFACT).exists()
    assert not list(tmp_path.glob(".*.partial"))


def _saved_tree(root: Path) -> Path:
    """The saved workspace as the ``inputs`` init container leaves it: unpacked, read-only."""
    saved = root / "inputs-volume" / "workspace"
    (saved / "notes").mkdir(parents=True)
    (saved / "notes" / "keep.txt").write_text("from the other CPod\n")
    (saved / "notes" / "keep.txt").chmod(0o444)
    (saved / "notes").chmod(0o555)
    return saved


def test_a_new_claim_gets_the_saved_workspace_and_one_in_use_keeps_its_own(tmp_path: Path) -> None:
    saved = _saved_tree(tmp_path)
    work = tmp_path / "work"
    (work / "inputs").mkdir(parents=True)  # the inputs' mount point, and a file system's own dir
    (work / "lost+found").mkdir()
    assert restore(work, saved, Session()) == RESTORED
    assert (work / "notes" / "keep.txt").read_text() == "from the other CPod\n"
    assert (work / "notes" / "keep.txt").stat().st_mode & 0o777 == 0o600  # the user's to change
    assert (work / "notes").stat().st_mode & 0o777 == 0o700
    assert not (work / STAGING).exists() and not (work / PARTIAL).exists()
    # The same claim again (a resume on the same CPod): its files are the user's, left as they are.
    (work / "notes" / "keep.txt").write_text("changed since\n")
    assert restore(work, saved, Session()) == KEPT
    assert (work / "notes" / "keep.txt").read_text() == "changed since\n"
    assert restore(tmp_path / "work", None, Session()) == KEPT


def test_a_restore_cut_short_is_redone_and_one_left_whole_is_finished(tmp_path: Path) -> None:
    saved = _saved_tree(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    stopped = Session()
    stopped.stopping = True  # SIGTERM came as it began
    with pytest.raises(Stopped):
        restore(work, saved, stopped)
    assert (work / PARTIAL).is_dir() and pod_workspace.user_entries(work) == []
    # Started again without the copy (a resume on the same CPod): marked, so never saved.
    assert restore(work, None, Session()) == UNFINISHED and (work / PARTIAL).is_dir()
    assert restore(work, saved, Session()) == RESTORED  # with it: made again
    assert (work / "notes" / "keep.txt").read_text() == "from the other CPod\n"
    assert not (work / PARTIAL).exists()
    # Killed between the copy's rename and its moves: the next start moves the rest.
    other = tmp_path / "other"
    (other / STAGING / "later").mkdir(parents=True)
    (other / "early.txt").write_text("moved before the kill\n")
    assert restore(other, None, Session()) == RESTORED
    assert sorted(os.listdir(other)) == ["early.txt", "later"]


def _run(tmp_path: Path, *command: str, saved: Path | None = None) -> subprocess.Popen[bytes]:
    """The program as the pod's main container runs it: under the wrapper, with its environment."""
    env = {
        "PATH": "/usr/bin:/bin",
        "SXWL_WORKSPACE": str(tmp_path / "work"),
        "SXWL_OUTPUT_DIR": str(tmp_path / "shared" / "output"),
        "SXWL_SHARED_DIR": str(tmp_path / "shared"),
        "SXWL_WORKSPACE_MAX_BYTES": "100000",
    }
    if saved is not None:
        env["SXWL_WORKSPACE_SAVED"] = str(saved)
    (tmp_path / "shared").mkdir(exist_ok=True)
    argv = wrapped([PYTHON, "-I", str(PROGRAM), *command])
    return subprocess.Popen(argv, env=env, cwd=tmp_path, stderr=subprocess.PIPE)


def test_sigterm_ends_the_command_and_the_workspace_is_saved_before_the_exit_status(tmp_path: Path) -> None:
    saved = _saved_tree(tmp_path)
    (tmp_path / "work" / "inputs").mkdir(parents=True)
    script = "cat notes/keep.txt > seen.txt; touch started; exec sleep 60"
    process = _run(tmp_path, "/bin/sh", "-c", f"cd {tmp_path / 'work'} && {script}", saved=saved)
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "work" / "started").exists():
            assert process.poll() is None and time.monotonic() < deadline, "the command never started"
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)  # as the kubelet does to the container's first process
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 143  # the command's: killed by SIGTERM
    assert b"workspace restored" in err and b"workspace saved" in err, err
    shared = tmp_path / "shared"
    assert (shared / "exit-code").read_text() == "143\n"  # what the uploader waits for, written after
    names = _names(shared / "output" / WORKSPACE_ARTIFACT)
    assert (
        names["seen.txt"] == b"from the other CPod\n" and names["notes/keep.txt"] == b"from the other CPod\n"
    )
    assert "inputs" not in names


def test_a_claim_whose_restore_did_not_finish_is_not_saved(tmp_path: Path) -> None:
    (tmp_path / "work" / PARTIAL / "notes").mkdir(parents=True)
    process = _run(tmp_path, "/bin/sh", "-c", "exit 0")
    _, err = process.communicate(timeout=60)
    assert process.returncode == 0 and b"did not finish" in err, err
    assert (tmp_path / "shared" / "exit-code").read_text() == "0\n"
    assert not (tmp_path / "shared" / "output" / WORKSPACE_ARTIFACT).exists()


def test_what_one_pod_saves_the_fetcher_unpacks_and_another_pod_restores(tmp_path: Path) -> None:
    """The tar as the uploader sends it, unpacked by the ``inputs`` init container's own code
    (its members checked), copied into a new claim: the same files."""
    work, output = _claim(tmp_path / "first"), tmp_path / "output"
    output.mkdir()
    assert save(work, output, tmp_path, limit=None).startswith("workspace saved")
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    pod_fetcher.unpack(output / WORKSPACE_ARTIFACT, inputs / "workspace")
    pod_fetcher.read_only(inputs / "workspace")
    new = tmp_path / "second" / "work"
    (new / "inputs").mkdir(parents=True)
    assert restore(new, inputs / "workspace", Session()) == RESTORED
    assert pod_workspace.user_entries(new) == ["notes", "top.py"]
    assert (new / "notes" / "keep.txt").read_text() == "kept\n" and not (new / "notes" / "link").exists()
