"""On SQLite the one server hears what other processes commit to its file (background/sqlite_watch.py,
docs/replicas.md "SQLite"): a held long-poll is still answered when the admin CLI or another
process changes what its CPod is to be told. The server re-reads a waiting long-poll on its own only
at the backstop and runs a scheduling pass on its own only every SCHEDULER_S, both far past the
hold, so a poll answered with work within the hold was woken through the watch."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from sxwl.cloud.db.engine import Database
from sxwl.cloud.services.accounts import accounts
from sxwl.cloud.services.jobs import jobs
from tests.support.agent import eventually
from tests.support.cloud import CloudProcess, Provider
from tests.support.net import free_port
from tests.support.replicas import PRODUCT, RawCPod
from tests.test_replicas import Poll

HOLD_S = 120.0
SCHEDULER_S = 900.0
PASSWORD = "correct horse"
USER = "dev@example.com"


@dataclass
class Server:
    cloud: CloudProcess
    data_dir: Path
    cpod: RawCPod
    user: dict[str, str]

    @property
    def database_url(self) -> str:
        return f"sqlite:///{self.data_dir / 'sxwl.db'}"

    def api(self, path: str) -> str:
        return f"{self.cloud.url}/api/v1{path}"

    def submit(self) -> str:
        body = {"name": "t", "command": "sleep 600", "gpu_product": PRODUCT, "gpus_per_node": 1}
        reply = httpx.post(self.api("/jobs"), headers=self.user, json=body)
        assert reply.status_code == 201, reply.text
        job_id: str = reply.json()["id"]
        return job_id

    def job(self, job_id: str) -> dict[str, object]:
        job: dict[str, object] = httpx.get(self.api(f"/jobs/{job_id}"), headers=self.user).json()
        return job

    def run(self, job_id: str) -> None:
        """Takes the job's assignment off the CPod's long-poll and reports it running."""
        reply = self.cpod.long_poll(self.cloud.url, wait=0)
        [assignment] = [a for a in reply["assignments"] if a["job_id"] == job_id]
        status = {"attempt": assignment["attempt"], "state": "running"}
        httpx.post(
            self.api(f"/agent/jobs/{job_id}/status"), headers=self.cpod.headers, json=status
        ).raise_for_status()

    def admin(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "sxwl.cli", "admin", *args, "--data-dir", str(self.data_dir)],
            env={**os.environ, "SXWL_ARGON2_TIME_COST": "1", "SXWL_ARGON2_MEMORY_KIB": "1024"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    data_dir = tmp_path / "cloud"
    env = {
        "SXWL_SCHEDULER_INTERVAL_S": str(SCHEDULER_S),
        "SXWL_LONGPOLL_BACKSTOP_S": "3600",
        "SXWL_LONGPOLL_MAX_S": str(HOLD_S),
        "SXWL_LIVENESS_CHECK_S": "30",
        "SXWL_OFFLINE_GRACE_S": "600",
    }
    cloud = CloudProcess(data_dir, free_port(), env=env)
    try:
        provider = Provider(cloud)
        body = {"email": USER, "password": PASSWORD, "role": "user"}
        httpx.post(f"{cloud.url}/api/v1/auth/register", json=body).raise_for_status()
        login = httpx.post(f"{cloud.url}/api/v1/auth/login", json={"email": USER, "password": PASSWORD})
        user = {"Authorization": f"Bearer {login.json()['access_token']}"}
        cpod = RawCPod(cloud.url, provider.key, "cluster-sqlite-watch")
        cpod.beat()
        yield Server(cloud, data_dir, cpod, user)
    finally:
        cloud.stop()


def test_a_gpu_limit_raised_by_the_admin_cli_places_the_job_on_a_held_long_poll(server: Server) -> None:
    server.admin("set-gpu-limit", "--email", USER, "--max-gpus", "1")
    first = server.submit()
    eventually(lambda: server.job(first)["state"] == "assigned", what="the first job placed")
    server.run(first)
    waiting = server.submit()
    eventually(lambda: "limit" in str(server.job(waiting).get("reason") or ""), what="the limit explained")
    assert server.job(waiting)["state"] == "queued"

    poll = Poll(server.cpod, server.cloud.url, wait=HOLD_S)
    server.admin("set-gpu-limit", "--email", USER, "--max-gpus", "2")
    reply = poll.result(HOLD_S + 10)
    assert [a["job_id"] for a in reply["assignments"]] == [waiting]


def test_a_cancel_committed_by_another_process_reaches_a_held_long_poll(server: Server) -> None:
    job_id = server.submit()
    eventually(lambda: server.job(job_id)["state"] == "assigned", what="the job placed")
    server.run(job_id)
    poll = Poll(server.cpod, server.cloud.url, wait=HOLD_S)

    # This test's process is not the server: it opens the file and cancels the job as a user would.
    database = Database(server.database_url)
    try:
        with database.session() as session:
            owner = accounts.find_by_email(session, USER)
            assert owner is not None
            jobs.cancel(session, owner, job_id)
    finally:
        database.dispose()
    reply = poll.result(HOLD_S + 10)
    assert reply["assignments"] == []
    assert [(c["job_id"], c["cancel"]) for c in reply["commands"]] == [(job_id, True)]
