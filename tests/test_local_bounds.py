"""What bounds a job on a local CPod (docs/agent.md, "Bounds"): a network namespace of its own (no
job reaches another's or the host's loopback, each may bind any port; outbound connections only
where the provider allows them, never to the host's loopback), and a bounded /tmp, /dev/shm, memory
and number of processes. Real agents, real bubblewrap, real cgroups and slirp4netns."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sxwl.agent.runtimes import cgroups
from sxwl.agent.runtimes.local import LocalRuntime
from tests.support.agent import eventually
from tests.test_jobs_process import World

needs_root_bwrap = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None, reason="needs root and bubblewrap"
)
pytestmark = [needs_root_bwrap, pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)]

# Serves a secret on 127.0.0.1:29500 until the job is cancelled.
LISTENER = """
import socket
server = socket.create_server(("127.0.0.1", 29500))
print("listening", flush=True)
while True:
    conn, _ = server.accept()
    conn.sendall(b"secret of the first job")
    conn.close()
"""

# Prints "<name>=<what it got>" for each address, then whether it could bind 29500 itself.
PROBE = """
import os, socket
for name, address in [a.split("=") for a in os.environ["TARGETS"].split()]:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=5) as conn:
            print(f"{name}=" + conn.recv(100).decode(), flush=True)
    except OSError as exc:
        print(f"{name}=refused ({exc.strerror or exc})", flush=True)
server = socket.create_server(("127.0.0.1", 29500))
print("bound 29500", flush=True)
"""


@pytest.fixture
def world(tmp_path: Path, db_url: str) -> Iterator[World]:
    w = World(tmp_path, db_url)
    yield w
    w.close()


class Server:
    """A TCP server of the host that answers every connection with ``text``."""

    def __init__(self, host: str, text: bytes) -> None:
        self.socket = socket.create_server((host, 0))
        self.port = self.socket.getsockname()[1]
        self.text = text
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.socket.accept()
            except OSError:
                return
            conn.sendall(self.text)
            conn.close()

    def close(self) -> None:
        self.socket.close()


def host_address() -> str:
    """This machine's first address that is not loopback."""
    found = subprocess.run(["hostname", "-I"], capture_output=True, text=True, check=False).stdout.split()
    v4 = [a for a in found if "." in a and not a.startswith("127.")]
    if not v4:
        pytest.skip("this machine has no IPv4 address besides loopback")
    return v4[0]


def python_job(world: World, script: str, **env: str) -> str:
    return world.submit('exec "$PY" -c "$SCRIPT"', env={"PY": sys.executable, "SCRIPT": script, **env})


def test_a_job_reaches_neither_another_jobs_loopback_nor_the_hosts_and_both_bind_29500(world: World) -> None:
    world.agent("a", 2)
    world.online()
    on_loopback = Server("127.0.0.1", b"host loopback")
    on_network = Server("0.0.0.0", b"host network")  # noqa: S104 - what a job must not reach here
    try:
        first = python_job(world, LISTENER)
        eventually(lambda: "listening" in world.logs(first), timeout=30, what="the first job to listen")
        targets = {
            "first_job": "127.0.0.1:29500",
            "host_loopback": f"127.0.0.1:{on_loopback.port}",
            "host_network": f"{host_address()}:{on_network.port}",
        }
        second = python_job(world, PROBE, TARGETS=" ".join(f"{k}={v}" for k, v in targets.items()))
        job = world.wait_state(second, "succeeded", "failed")
        logs = world.logs(second)
        assert job["state"] == "succeeded", logs
        assert "first_job=refused (Connection refused)" in logs, logs
        assert "host_loopback=refused (Connection refused)" in logs, logs
        assert "host_network=refused (Network is unreachable)" in logs, logs  # no outbound by default
        assert "bound 29500" in logs
        assert world.job(first)["state"] == "running"  # and the first job still holds its 29500
    finally:
        on_loopback.close()
        on_network.close()
    httpx.post(f"{world.url}/api/v1/jobs/{first}/cancel", headers=world.user).raise_for_status()
    world.wait_state(first, "cancelled")


@pytest.mark.skipif(shutil.which("slirp4netns") is None, reason="needs slirp4netns")
def test_with_outbound_network_a_job_reaches_other_hosts_but_not_this_ones_loopback(world: World) -> None:
    agent = world.agent("a", 1, "--job-network", "outbound")
    world.online()
    assert "start-up check passed" in agent.log
    on_loopback = Server("127.0.0.1", b"host loopback")
    on_network = Server("0.0.0.0", b"host network")  # noqa: S104 - a server as another host's
    try:
        targets = {
            "network": f"{host_address()}:{on_network.port}",
            "host_loopback_by_gateway": f"10.0.2.2:{on_loopback.port}",  # slirp4netns's host alias
            "own_loopback": f"127.0.0.1:{on_loopback.port}",
        }
        job_id = python_job(world, PROBE, TARGETS=" ".join(f"{k}={v}" for k, v in targets.items()))
        job = world.wait_state(job_id, "succeeded", "failed")
        logs = world.logs(job_id)
        assert job["state"] == "succeeded", logs
        assert "network=host network" in logs, logs
        assert "host_loopback_by_gateway=refused" in logs, logs
        assert "own_loopback=refused (Connection refused)" in logs, logs
    finally:
        on_loopback.close()
        on_network.close()


FORKS = """
import os, time
forked = 0
try:
    for _ in range(500):
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        forked += 1
except OSError as exc:
    print(f"refused after {forked}: {exc.strerror}", flush=True)
"""

HOG = """
chunks = []
for n in range(1, 65):
    chunks.append(bytearray(16 * 2**20))  # touched: zeroed pages of its own
    print(f"{n * 16} MiB", flush=True)
"""


def test_a_jobs_tmp_shm_memory_and_processes_are_bounded(world: World) -> None:
    found = cgroups.find()
    if not found.usable:
        pytest.skip(f"no cgroups for jobs here: {found.why}")
    agent = world.agent(
        "a", 1, "--job-tmpfs-size", "16Mi", "--job-memory-limit", "256Mi", "--job-pids-limit", "64"
    )
    world.online()
    assert "start-up check passed" in agent.log, agent.log
    filling = (
        'for d in /tmp /dev/shm; do head -c 32M /dev/zero > "$d/fill" 2>/dev/null; '
        'echo "$d holds $(du -k "$d/fill" | cut -f1) KiB"; done'
    )
    filled = world.wait_state(world.submit(filling), "succeeded", "failed")
    logs = world.logs(filled["id"])
    assert (
        filled["state"] == "succeeded"
        and "/tmp holds 16384 KiB" in logs
        and "/dev/shm holds 16384 KiB" in logs
    ), logs

    forks = world.wait_state(python_job(world, FORKS), "succeeded", "failed")
    logs = world.logs(forks["id"])
    refused = int(logs.split("refused after ")[1].split(":")[0])
    assert refused < 64 and "Resource temporarily unavailable" in logs, logs

    hog = world.wait_state(python_job(world, HOG), "succeeded", "failed")
    logs = world.logs(hog["id"])
    assert hog["state"] == "failed" and hog["exit_code"] == 137, (hog, logs)
    assert hog["reason"] == "out of memory: the job reached its memory limit of 256 MiB"
    assert "1024 MiB" not in logs
    # Each attempt's cgroups are gone with it (the agent's, by its tag).
    tag = LocalRuntime(world.root / "agent-a", []).tag
    eventually(
        lambda: not [leaf for base in found.bases for leaf in base.glob(f"{tag}-*")],
        what="the jobs' cgroups removed",
    )
