"""Tenants apart on a local CPod: a root agent with bubblewrap runs each attempt in a sandbox of its
own (docs/agent.md, "Isolation"). Real agent, real jobs, real bwrap; the probing job reports what
it could do in its log."""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sxwl.agent.runtimes.sandbox import SandboxPaths, detect, device_binds, job_argv
from tests.support.agent import eventually
from tests.test_jobs_process import World

needs_root_bwrap = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None, reason="needs root and bubblewrap"
)

# Each check prints "<name>=ok" or "<name>=denied"; the test asserts on the words.
PROBE = r"""
try() { name=$1; shift; if "$@" >/dev/null 2>&1; then echo "$name=ok"; else echo "$name=denied"; fi; }
try cpod_json cat "$STATE/cpod.json"
try state_dir ls "$STATE/jobs/$VICTIM"
try victim_log cat "$STATE/jobs/$VICTIM/output.log"
try victim_work ls "$STATE/jobs/$VICTIM/work"
try write_etc touch /etc/sxwl-probe
try write_root touch /sxwl-probe
try write_state touch "$STATE/probe"
try write_work touch "$HOME/probe"
try write_output sh -c 'echo result > "$SXWL_OUTPUT_DIR/result.txt"'
echo "uid=$(id -u)"
echo "pids=$(ls /proc | grep -c '^[0-9]')"
printf %s "$SECRET_REVERSED" | rev > "$HOME/pattern"  # the value itself is in no env or argv here
seen() { if "$@"; then echo seen; else echo unseen; fi; }
echo "secret=$(seen grep -qsF -f "$HOME/pattern" /proc/[0-9]*/environ /proc/[0-9]*/cmdline)"
echo "victim_process=$(seen grep -qs '[s]leep 300' /proc/[0-9]*/cmdline)"
"""


@pytest.fixture
def world(tmp_path: Path, db_url: str) -> Iterator[World]:
    w = World(tmp_path, db_url)
    yield w
    w.close()


def files_under(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


@needs_root_bwrap
def test_an_attempt_sees_nothing_of_the_agent_or_other_attempts(world: World, tmp_path: Path) -> None:
    agent = world.agent()
    world.online()
    assert "jobs are isolated: bubblewrap as root" in agent.log
    secret = f"s3cr3t-{secrets.token_hex(8)}"
    victim = world.submit(
        'echo "victim output $TOKEN"; echo private > "$HOME/notes"; sleep 300', env={"TOKEN": secret}
    )
    world.wait_state(victim, "running")
    state = tmp_path / "agent-a"
    # Nowhere on disk: the spec went to the launcher on a pipe (no launch.json any more).
    assert not any(secret.encode() in p.read_bytes() for p in files_under(state) if p.name != "output.log")
    probe_env = {"STATE": str(state), "VICTIM": f"{victim}-1", "SECRET_REVERSED": secret[::-1]}
    prober = world.submit(PROBE, env=probe_env)
    job = world.wait_state(prober, "succeeded", "failed")
    logs = world.logs(prober)
    assert job["state"] == "succeeded", logs
    for denied in ("cpod_json", "state_dir", "victim_log", "victim_work", "write_etc", "write_root"):
        assert f"{denied}=denied" in logs, logs
    assert "write_state=denied" in logs and "write_work=ok" in logs and "write_output=ok" in logs, logs
    assert "secret=unseen" in logs and "victim_process=unseen" in logs, logs
    uid = int(logs.split("uid=")[1].split()[0])
    assert uid >= 2_000_000_000  # an unprivileged uid of its own, not the agent's root
    # Its own pid namespace: init, sh, a subshell, ls, grep.
    assert int(logs.split("pids=")[1].split()[0]) <= 5
    artifacts = httpx.get(f"{world.url}/api/v1/jobs/{prober}/artifacts", headers=world.user).json()
    assert [a["path"] for a in artifacts] == ["result.txt"]
    # Once the cloud has the final state, only the record that the attempt was run is left.
    prober_dir = state / "jobs" / f"{prober}-1"
    eventually(lambda: sorted(p.name for p in prober_dir.iterdir()) == ["job.json"], what="cleanup")
    assert secret.encode() not in (prober_dir / "job.json").read_bytes()
    # The running victim's own dirs belong to its uid alone, and its log to the agent.
    victim_dir = state / "jobs" / f"{victim}-1"
    assert (victim_dir / "work").stat().st_uid != uid and (victim_dir / "work").stat().st_mode & 0o077 == 0
    assert (victim_dir / "output.log").stat().st_uid == 0
    assert (victim_dir / "output.log").stat().st_mode & 0o077 == 0
    httpx.post(f"{world.url}/api/v1/jobs/{victim}/cancel", headers=world.user).raise_for_status()
    world.wait_state(victim, "cancelled")
    eventually(lambda: sorted(p.name for p in victim_dir.iterdir()) == ["job.json"], what="victim cleanup")


@needs_root_bwrap
def test_command_not_found_says_so_and_an_image_is_refused_on_a_local_cpod(world: World) -> None:
    world.agent()
    world.online()
    body = {"name": "t", "command": ["no-such-command-sxwl"], "gpus_per_node": 0}
    missing = httpx.post(f"{world.url}/api/v1/jobs", headers=world.user, json=body).json()["id"]
    job = world.wait_state(missing, "failed")
    assert job["exit_code"] == 127
    assert job["reason"] == "command not found: no-such-command-sxwl"
    assert "command not found: no-such-command-sxwl" in world.logs(missing)
    boxed = world.submit("true", image="pytorch/pytorch:2.3")

    def refused() -> bool:
        return "cannot run a container image" in (world.job(boxed)["reason"] or "")

    eventually(refused, what="the queue reason for an image on a local CPod")
    assert world.job(boxed)["state"] == "queued"


def test_device_nodes_are_limited_to_the_allotted_gpus(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidia2", "nvidiactl", "nvidia-uvm", "nvidia-modeset"):
        (dev / name).write_text("")
    args = device_binds([2, 0], dev)
    exposed = [args[i + 2] for i in range(0, len(args), 3)]
    assert exposed == ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidia2"]
    assert device_binds([5], dev) == device_binds([], dev)  # a GPU without a node adds nothing


@needs_root_bwrap
def test_inside_the_sandbox_only_the_allotted_device_nodes_exist(tmp_path: Path) -> None:
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm"):
        (dev / name).write_text("")
    state = tmp_path / "state"
    work, output = state / "jobs" / "j-1" / "work", state / "jobs" / "j-1" / "output"
    work.mkdir(parents=True)
    output.mkdir()
    isolation = detect("required")
    read, write = os.pipe()  # the reason pipe the launcher would hold
    argv = job_argv(isolation, ["ls", "/dev"], SandboxPaths((state,), work, output), None, [1], dev, write)
    run = subprocess.run(argv, capture_output=True, text=True, check=True, pass_fds=(write,))
    os.close(write)
    assert os.read(read, 100) == b""  # the command ran: no reason reported
    listing = run.stdout.split()
    assert {"nvidia1", "nvidiactl", "nvidia-uvm"} <= set(listing) and "nvidia0" not in listing
