"""Several ``sxwl serve`` replicas on one throwaway PostgreSQL that logs every statement with the
name of the replica that sent it (its connections' application_name), so tests can count the
queries one replica makes."""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import threading
from pathlib import Path
from typing import Any

import httpx
import psycopg

from tests.support.agent import AgentProcess, eventually, simulated_agent
from tests.support.cloud import CloudProcess
from tests.support.net import free_port
from tests.support.postgres import TempPostgres

PRODUCT = "NVIDIA-A100-SXM4-80GB"
# Long enough that only a notification can explain a wake-up that a test waits for.
BACKSTOP_S = 60.0
REPLICA_ENV = {
    "SXWL_HEARTBEAT_INTERVAL_MIN_S": "0.1",
    # The background loops stay quiet, so that what a replica queries is its requests' doing.
    "SXWL_LIVENESS_CHECK_S": "30",
    "SXWL_OFFLINE_GRACE_S": "30",
    "SXWL_SCHEDULER_INTERVAL_S": "30",
    "SXWL_LONGPOLL_BACKSTOP_S": str(BACKSTOP_S),
}


def logging_postgres() -> TempPostgres:
    cluster = TempPostgres().start()
    with psycopg.connect(cluster.url(), autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET log_statement = 'all'")
        conn.execute("ALTER SYSTEM SET log_line_prefix = '%a|'")
        conn.execute("SELECT pg_reload_conf()")
    return cluster


class Replica:
    def __init__(self, root: Path, name: str, database_url: str, env: dict[str, str]) -> None:
        self.name, self.root, self.port = name, root, free_port()
        self._env = {
            # Every connection of this process, the listener's included, carries its name.
            "SXWL_DATABASE_URL": f"{database_url}?application_name={name}",
            **REPLICA_ENV,
            **env,
        }
        self.cloud = self._start()
        self.url = self.cloud.url

    def _start(self) -> CloudProcess:
        return CloudProcess(self.root / self.name, self.port, env=self._env)

    def kill(self) -> None:
        """SIGKILL: no shutdown, no answer to the requests in flight."""
        os.killpg(self.cloud.proc.pid, signal.SIGKILL)
        self.cloud.proc.wait()
        self.cloud.stop()

    def stop(self) -> None:
        self.cloud.stop()


class Fleet:
    """Replicas named r1, r2 ... on one database, a provider and a compute user (made on r1)."""

    def __init__(self, root: Path, postgres: TempPostgres, count: int, **env: str) -> None:
        self.root, self.postgres = root, postgres
        self.database_url = postgres.create_database()
        self.replicas: list[Replica] = []
        # One key for all: replicas refuse to start on another's database with a key of their own.
        env = {"SXWL_SECRET_KEY": secrets.token_urlsafe(48), **env}
        self.agents: list[AgentProcess] = []
        try:
            for index in range(count):
                self.replicas.append(Replica(root, f"r{index + 1}", self.database_url, env))
            self.provider = self.account("owner@example.com", "provider")
            reply = httpx.get(self.api(0, "/me/access-key"), headers=self.provider)
            self.key: str = reply.json()["access_key"]
            self.user = self.account("dev@example.com", "user")
        except BaseException:
            self.close()  # the replicas already started would outlive the test otherwise
            raise

    def api(self, replica: int, path: str) -> str:
        return f"{self.replicas[replica].url}/api/v1{path}"

    def account(self, email: str, role: str) -> dict[str, str]:
        body = {"email": email, "password": "correct horse", "role": role}
        httpx.post(self.api(0, "/auth/register"), json=body).raise_for_status()
        login = httpx.post(self.api(0, "/auth/login"), json={"email": email, "password": "correct horse"})
        return {"Authorization": f"Bearer {login.json()['access_token']}"}

    def agent(self, url: str, name: str = "a", gpus: int = 4) -> AgentProcess:
        """A simulated-GPU agent whose one cloud URL is ``url``."""
        state = self.root / f"agent-{name}"
        agent = simulated_agent(url, state, self.key, name=name, gpus=gpus, product=PRODUCT)
        self.agents.append(agent)
        return agent

    def online(self, count: int = 1) -> bool:
        cpods: list[dict[str, Any]] = httpx.get(self.api(0, "/cpods"), headers=self.provider).json()
        online: bool = sum(c["status"] == "online" for c in cpods) >= count
        return online

    def submit(self, replica: int, command: str, gpus: int = 1) -> str:
        body = {"name": "t", "command": command, "gpu_product": PRODUCT, "gpus_per_node": gpus}
        response = httpx.post(self.api(replica, "/jobs"), headers=self.user, json=body)
        assert response.status_code == 201, response.text
        job_id: str = response.json()["id"]
        return job_id

    def job(self, replica: int, job_id: str) -> dict[str, Any]:
        job: dict[str, Any] = httpx.get(self.api(replica, f"/jobs/{job_id}"), headers=self.user).json()
        return job

    def wait_state(self, replica: int, job_id: str, *states: str, timeout: float) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            job = self.job(replica, job_id)
            return job if job["state"] in states else None

        return eventually(reached, timeout=timeout, what=f"job {job_id} to be {'/'.join(states)}")

    def events(self, replica: int, job_id: str) -> list[str]:
        events = httpx.get(self.api(replica, f"/jobs/{job_id}/events"), headers=self.user).json()
        return [e["kind"] for e in events]

    def log_size(self) -> int:
        return (self.postgres.root / "log").stat().st_size

    def statements(self, replica: str, since: int) -> list[str]:
        """The statements replica ``replica`` sent since log offset ``since``."""
        with (self.postgres.root / "log").open("rb") as log:
            log.seek(since)
            lines = log.read().decode(errors="replace").splitlines()
        prefix = f"{replica}|LOG:  "
        return [
            line[len(prefix) :]
            for line in lines
            if line.startswith(prefix) and line[len(prefix) :].startswith(("statement: ", "execute "))
        ]

    def close(self) -> None:
        for agent in self.agents:
            agent.stop()
        for replica in self.replicas:
            replica.stop()


class RawCPod:
    """A CPod spoken for with plain HTTP (no agent), to hold one long-poll exactly."""

    def __init__(self, url: str, key: str, uid: str) -> None:
        self.url = url
        reply = httpx.post(
            f"{url}/api/v1/agent/register",
            headers={"Authorization": f"Bearer {key}"},
            json={"cluster_uid": uid, "runtime": "local", "agent_version": "test"},
        )
        reply.raise_for_status()
        self.id: str = reply.json()["cpod_id"]
        self.headers = {"Authorization": f"Bearer {reply.json()['cpod_token']}"}
        self.seq = 0

    def beat(self, gpus: int = 4) -> None:
        self.seq += 1
        node = {
            "name": "n1",
            "status": "ready",
            "cpu_cores": 8,
            "memory_mib": 65536,
            "gpu": {
                "vendor": "nvidia",
                "product": PRODUCT,
                "memory_mib": 81920,
                "count": gpus,
                "allocatable": gpus,
                "used": 0,
            },
        }
        reply = httpx.post(
            f"{self.url}/api/v1/agent/heartbeat",
            headers=self.headers,
            json={"seq": self.seq, "nodes": [node]},
        )
        reply.raise_for_status()

    def long_poll(self, url: str, wait: float) -> dict[str, Any]:
        reply = httpx.get(
            f"{url}/api/v1/agent/assignments", headers=self.headers, params={"wait": wait}, timeout=wait + 10
        )
        reply.raise_for_status()
        body: dict[str, Any] = reply.json()
        return body


class Balancer:
    """A TCP load balancer on loopback: each new connection goes to the replica it points at now, so
    an agent with one URL moves to another replica as it would behind a real one. While ``stalled``,
    it drops whatever passes, both ways, and closes nothing: a network that went silent."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.stalled = False
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # closed
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                client.close()  # the replica is down: the agent sees a refused connection and retries
                continue
            upstream.settimeout(None)
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    def close(self) -> None:
        self._server.close()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if not self.stalled:
                    sink.sendall(data)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
