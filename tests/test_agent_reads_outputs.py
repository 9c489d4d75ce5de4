"""What a root agent reads of a job's outputs stays inside the attempt's tree (docs/agent.md, "What
the agent reads of a job"): links (to the agent's state, to the host's keys), links swapped in
between a listing and an open, FIFOs and other owners' files never become artifacts. Real files,
real uids; the end-to-end tests run real agents and sandboxed jobs against a real cloud."""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sxwl.agent.inputs import writable_tree
from sxwl.agent.tenant_files import NotTheJobs, OutputTree
from tests.support.agent import eventually
from tests.test_jobs_process import World

needs_root_bwrap = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None, reason="needs root and bubblewrap"
)
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="files of another uid need root")
JOB_UID = 2_000_065_000  # in the sandbox range, above what the agents of these tests hand out


@pytest.fixture
def world(tmp_path: Path, db_url: str) -> Iterator[World]:
    w = World(tmp_path, db_url)
    yield w
    w.close()


def a_tree(tmp_path: Path) -> tuple[OutputTree, Path]:
    """An output dir with a secret beside it, as the agent's state is beside an attempt's dir."""
    secret = tmp_path / "cpod.json"
    secret.write_text("the CPod token")
    output = tmp_path / "output"
    (output / "checkpoints").mkdir(parents=True)
    (output / "checkpoints" / "step-1.tar").write_text("mine")
    (output / "result.txt").write_text("result")
    return OutputTree(output, os.geteuid()), secret


def test_links_are_neither_listed_nor_followed(tmp_path: Path) -> None:
    tree, secret = a_tree(tmp_path)
    (tree.path / "stolen").symlink_to(secret)
    (tree.path / "sub").mkdir()
    (tree.path / "sub" / "etc").symlink_to(tmp_path)  # a link to a dir is not entered
    assert tree.files() == ["checkpoints/step-1.tar", "result.txt"]
    with pytest.raises(NotTheJobs):
        tree.open("stolen")
    with pytest.raises(NotTheJobs):
        tree.open("sub/etc/cpod.json")
    for outside in ("../cpod.json", "/etc/passwd", "sub/../../cpod.json", ""):
        with pytest.raises(NotTheJobs):
            tree.open(outside)


def test_a_checkpoint_dir_made_a_link_gives_nothing(tmp_path: Path) -> None:
    tree, secret = a_tree(tmp_path)
    shutil.rmtree(tree.path / "checkpoints")
    (tree.path / "checkpoints").symlink_to(secret.parent)
    assert tree.files("checkpoints", recursive=False) == []
    with pytest.raises(NotTheJobs):
        tree.open("checkpoints/cpod.json")


def test_a_link_swapped_in_after_the_listing_is_refused_at_the_open(tmp_path: Path) -> None:
    tree, secret = a_tree(tmp_path)
    listed = tree.files("checkpoints", recursive=False)
    assert listed == ["checkpoints/step-1.tar"]
    (tree.path / "checkpoints" / "step-1.tar").unlink()
    (tree.path / "checkpoints" / "step-1.tar").symlink_to(secret)
    with pytest.raises(NotTheJobs):
        tree.open(listed[0])
    # A dir on the way swapped for a link: the same.
    shutil.rmtree(tree.path / "checkpoints")
    (tree.path / "checkpoints").symlink_to(tmp_path)
    with pytest.raises(NotTheJobs):
        tree.open("checkpoints/cpod.json")


def test_an_open_file_is_read_as_it_was_opened_whatever_its_name_becomes(tmp_path: Path) -> None:
    tree, secret = a_tree(tmp_path)
    with tree.open("result.txt") as opened:
        (tree.path / "result.txt").unlink()
        (tree.path / "result.txt").symlink_to(secret)
        assert b"".join(opened.chunks()) == b"result" and opened.size == 6


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    tree, _ = a_tree(tmp_path)
    os.mkfifo(tree.path / "pipe")
    assert "pipe" not in tree.files()
    with pytest.raises(NotTheJobs):
        tree.open("pipe")  # O_NONBLOCK: opening a FIFO with no writer returns at once


@needs_root
def test_only_files_of_the_attempts_uid_are_read(tmp_path: Path) -> None:
    output = tmp_path / "output"
    output.mkdir()
    (output / "own").write_text("the job's")
    os.chown(output / "own", JOB_UID, JOB_UID)
    (output / "roots").write_text("root's, hard-linked or left by someone else")
    tree = OutputTree(output, JOB_UID)
    assert tree.files() == ["own"]
    with pytest.raises(NotTheJobs):
        tree.open("roots")
    with tree.open("own") as opened:
        assert b"".join(opened.chunks()) == b"the job's"


def test_making_a_tree_writable_for_removal_changes_nothing_a_link_points_to(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir(mode=0o500)
    tree = tmp_path / "work"
    (tree / "inputs").mkdir(parents=True)
    (tree / "escape").symlink_to(outside)
    os.chmod(tree / "inputs", 0o500)
    writable_tree(tree)
    assert (tree / "inputs").stat().st_mode & 0o700 == 0o700
    assert outside.stat().st_mode & 0o777 == 0o500


# A job that tries every way of getting the agent's files back as its own artifacts: checkpoints as
# a link to the state dir, links to the token and the host's keys, and a checkpoint it keeps swapping
# for a link to the token while the agent lists and uploads.
THIEF = r"""
cd "$SXWL_OUTPUT_DIR"
ln -s "$STATE" checkpoints
ln -s "$STATE/cpod.json" token.json
ln -s /etc/ssh ssh
mkfifo pipe
echo honest > result.txt
sleep 4
rm checkpoints; mkdir checkpoints
end=$(( $(date +%s) + 6 ))
i=0
while [ "$(date +%s)" -lt "$end" ]; do
  i=$((i+1))
  echo "checkpoint $i" > "checkpoints/.step-$i"; mv "checkpoints/.step-$i" "checkpoints/step-$i"
  rm -f "checkpoints/step-$i"; ln -s "$STATE/cpod.json" "checkpoints/step-$i"
done
echo done
"""


@needs_root_bwrap
def test_a_job_gets_none_of_the_agents_files_as_artifacts(world: World, tmp_path: Path) -> None:
    world.agent()
    world.online()
    state = tmp_path / "agent-a"
    token = (state / "cpod.json").read_bytes()
    job_id = world.submit(THIEF, env={"STATE": str(state)})
    job = world.wait_state(job_id, "succeeded", "failed", timeout=60)
    artifacts = httpx.get(f"{world.url}/api/v1/jobs/{job_id}/artifacts", headers=world.user).json()
    paths = {a["path"] for a in artifacts}
    assert "result.txt" in paths, artifacts
    assert not paths & {"token.json", "pipe"} and not any(p.startswith("ssh/") for p in paths), paths
    stolen = hashlib.sha256(token).hexdigest()
    for artifact in artifacts:
        assert artifact["sha256"] != stolen, artifact
        got = httpx.get(f"{world.url}/api/v1/jobs/{job_id}/artifacts/{artifact['path']}", headers=world.user)
        assert b"token" not in got.content and got.content.startswith((b"checkpoint ", b"honest")), (
            got.content
        )
    # A checkpoint swapped for a link while it was being read is refused, and the result says so.
    if job["state"] == "failed":
        assert "not read" in job["reason"], job


@needs_root_bwrap
def test_an_output_over_the_cloud_limit_is_refused_by_its_size_unread(tmp_path: Path, db_url: str) -> None:
    world = World(tmp_path, db_url, SXWL_ARTIFACT_MAX_BYTES=str(1024 * 1024))
    try:
        world.agent()
        world.online()
        # 12 GiB of holes: hashing them would take minutes; refusing them by size takes nothing.
        big = world.submit('truncate -s 12G "$SXWL_OUTPUT_DIR/big.bin"; echo ok > "$SXWL_OUTPUT_DIR/ok.txt"')
        other = world.submit("echo quick")
        job = world.wait_state(big, "failed", "succeeded", timeout=60)
        assert job["state"] == "failed", job
        assert (
            f"big.bin refused: {12 * 1024**3} bytes, over the limit of {1024 * 1024} bytes" in job["reason"]
        )
        artifacts = httpx.get(f"{world.url}/api/v1/jobs/{big}/artifacts", headers=world.user).json()
        assert [a["path"] for a in artifacts] == ["ok.txt"]
        assert world.wait_state(other, "succeeded", "failed")["state"] == "succeeded"
        eventually(
            lambda: (
                sorted(p.name for p in (tmp_path / "agent-a" / "jobs" / f"{big}-1").iterdir()) == ["job.json"]
            ),
            what="the big output removed",
        )
    finally:
        world.close()
