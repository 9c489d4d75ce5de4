"""`sxwl serve --workers N` on PostgreSQL, migrations run once under a lock, and SQLite refusing
more than one server process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, text

from sxwl.cloud.config import Settings
from sxwl.cloud.db import migrate
from tests.support.agent import eventually
from tests.support.cloud import CloudProcess, Provider
from tests.support.net import free_port
from tests.support.postgres import TempPostgres

CLOUD_ENV = {
    "SXWL_ARGON2_TIME_COST": "1",
    "SXWL_ARGON2_MEMORY_KIB": "1024",
    "SXWL_BILLING_ENABLED": "false",
}


class Workers(CloudProcess):
    """``sxwl serve --workers 2`` on PostgreSQL: each worker imports and starts the cloud on its own,
    which takes a loaded test machine longer than one process does."""

    def __init__(self, database_url: str, data_dir: Path) -> None:
        super().__init__(data_dir, free_port(), env={"SXWL_DATABASE_URL": database_url, "SXWL_WORKERS": "2"})

    def wait_ready(self) -> None:
        self.wait_for(self.url, self.proc, self.log_path, timeout=120)


def worker_pids(supervisor: int) -> set[int]:
    """The supervisor's worker processes (its other child is multiprocessing's resource tracker)."""
    children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
    pids = set()
    for child in map(int, children):
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes()
        except FileNotFoundError:
            continue  # exited since
        if b"spawn_main" in command:
            pids.add(child)
    return pids


def two_workers(supervisor: int, without: int | None = None) -> set[int] | None:
    pids = worker_pids(supervisor)
    return pids if len(pids) == 2 and without not in pids else None


def workers_answering(url: str, tries: int = 15) -> set[str]:
    """The workers seen answering. Requests go eight at a time, each on a new connection: the
    kernel wakes the worker that waited last, so one at a time can all reach the same worker."""

    def one(_: int) -> str:
        return httpx.get(f"{url}/healthz", headers={"Connection": "close"}).headers["x-sxwl-worker"]

    seen: set[str] = set()
    with ThreadPoolExecutor(8) as pool:
        for _ in range(tries):
            seen.update(pool.map(one, range(8)))
            if len(seen) == 2:
                break
    return seen


def alive(pid: int) -> bool:
    """Running: neither gone nor a zombie waiting to be reaped."""
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


def register_cpod(cloud: CloudProcess) -> str:
    key = Provider(cloud).key
    reply = httpx.post(
        f"{cloud.url}/api/v1/agent/register",
        headers={"Authorization": f"Bearer {key}"},
        json={"cluster_uid": "cluster-0001", "runtime": "local", "agent_version": "test"},
    )
    assert reply.status_code == 200, reply.text
    token: str = reply.json()["cpod_token"]
    return token


def long_poll(url: str, token: str) -> int:
    reply = httpx.get(
        f"{url}/api/v1/agent/assignments?wait=30",
        headers={"Authorization": f"Bearer {token}", "Connection": "close"},
        timeout=40,
    )
    return reply.status_code


def test_two_workers_serve_restart_and_stop(postgres: TempPostgres, tmp_path: Path) -> None:
    cloud = Workers(postgres.create_database(), tmp_path / "data")
    try:
        eventually(lambda: workers_answering(cloud.url) == {"0", "1"}, what="both workers", timeout=60)
        pids = eventually(lambda: two_workers(cloud.proc.pid), what="two workers")

        killed = min(pids)
        os.kill(killed, signal.SIGKILL)
        replaced = eventually(
            lambda: two_workers(cloud.proc.pid, without=killed), what="a worker in place of the killed one"
        )
        assert len(replaced & pids) == 1
        eventually(lambda: workers_answering(cloud.url) == {"0", "1"}, what="both workers again", timeout=120)
        assert cloud.proc.poll() is None

        # Long-polls held by the workers answer at once when the server is told to stop.
        token = register_cpod(cloud)
        with ThreadPoolExecutor(4) as pool:
            polls = [pool.submit(long_poll, cloud.url, token) for _ in range(4)]
            time.sleep(3)  # all four are being held
            assert not any(poll.done() for poll in polls)
            started = time.monotonic()
            os.kill(cloud.proc.pid, signal.SIGTERM)
            # Well before the 30 s they would be held (the margin is for a loaded test machine).
            assert [poll.result(timeout=15) for poll in polls] == [200] * 4
            assert time.monotonic() - started < 15
        assert cloud.proc.wait(30) == 0
        assert not any(alive(pid) for pid in replaced)
        assert "starting another" in cloud.log_path.read_text()
    finally:
        cloud.stop()


def test_workers_stop_when_the_supervisor_is_killed(postgres: TempPostgres, tmp_path: Path) -> None:
    cloud = Workers(postgres.create_database(), tmp_path / "data")
    try:
        pids = eventually(lambda: two_workers(cloud.proc.pid), what="two workers")
        cloud.proc.kill()  # SIGKILL: the supervisor cannot pass anything on
        cloud.proc.wait()
        eventually(lambda: not any(alive(pid) for pid in pids), what="the workers to stop", timeout=60)
    finally:
        cloud.stop()


def serve(data_dir: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "sxwl.cli", "serve", "--port", str(free_port())]
    command += ["--data-dir", str(data_dir)]
    return subprocess.run(
        [*command, *args],
        env={**os.environ, **CLOUD_ENV, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_workers_on_sqlite_are_refused_with_the_reason(tmp_path: Path) -> None:
    for refused in (serve(tmp_path, "--workers", "2"), serve(tmp_path, env={"SXWL_WORKERS": "3"})):
        assert refused.returncode == 2, refused.stderr
        message = " ".join(refused.stderr.split())
        assert "needs PostgreSQL" in message and "docs/operations.md" in message
    assert not (tmp_path / "sxwl.db").exists()  # refused before it touched anything


def test_a_second_server_on_one_sqlite_file_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    cloud = CloudProcess(data, free_port())
    try:
        second = serve(data)
        assert second.returncode == 2, second.stderr
        message = " ".join(second.stderr.split())
        assert "another sxwl server is running" in message and "PostgreSQL" in message
        # The admin commands still work beside the running server.
        admin = subprocess.run(
            [
                sys.executable,
                "-m",
                "sxwl.cli",
                "admin",
                "create-user",
                "--email",
                "ops@example.com",
                "--data-dir",
                str(data),
                "--password-stdin",
            ],
            input="correct horse\n",
            env={**os.environ, **CLOUD_ENV},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert admin.returncode == 0, admin.stderr
        login = httpx.post(
            f"{cloud.url}/api/v1/auth/login", json={"email": "ops@example.com", "password": "correct horse"}
        )
        assert login.status_code == 200, login.text
    finally:
        cloud.stop()
    # Once it stopped, the lock is free again.
    again = CloudProcess(data, free_port())
    again.stop()


UPGRADE = """
import sys
from sqlalchemy import create_engine
from sxwl.cloud.db import migrate
print(migrate.upgrade(create_engine(sys.argv[1])))
"""


def test_replicas_starting_at_once_migrate_once(db_url: str, tmp_path: Path) -> None:
    url = Settings(database_url=db_url, data_dir=tmp_path).resolved_database_url()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", UPGRADE, url], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    results = [proc.communicate(timeout=120) for proc in procs]
    assert [proc.returncode for proc in procs] == [0] * 4, [err for _, err in results]
    # Exactly one applied the migrations; the others waited for the lock and found them applied.
    assert sorted(out.strip() for out, _ in results) == ["False", "False", "False", "True"]
    engine = create_engine(url)
    with engine.connect() as connection:
        versions = connection.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    head = ScriptDirectory.from_config(migrate.alembic_config(url)).get_current_head()
    assert versions == [head]
    assert migrate.upgrade(engine) is False
    engine.dispose()


@pytest.mark.parametrize("workers", ["0", "x"])
def test_a_bad_worker_count_is_refused_naming_it(tmp_path: Path, workers: str) -> None:
    refused = serve(tmp_path, "--workers", workers)
    assert refused.returncode == 2 and "--workers" in refused.stderr
    env_refused = serve(tmp_path, env={"SXWL_WORKERS": workers})
    assert env_refused.returncode != 0 and "workers" in env_refused.stderr
