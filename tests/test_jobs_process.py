"""Jobs through real processes: `sxwl serve` and `sxwl-agent` on loopback."""

from __future__ import annotations

import random
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.agent import AgentProcess, eventually, simulated_agent
from tests.support.browser import api_token, create_admin
from tests.support.cloud import CloudProcess
from tests.support.net import free_port

PRODUCT = "NVIDIA-A100-SXM4-80GB"
CLOUD_ENV = {
    "SXWL_HEARTBEAT_INTERVAL_MIN_S": "0.1",
    "SXWL_LIVENESS_CHECK_S": "0.1",
    "SXWL_OFFLINE_GRACE_S": "0.5",
    "SXWL_SCHEDULER_INTERVAL_S": "0.2",
}


class World:
    """A cloud, a provider with its accessKey, and a compute user."""

    def __init__(self, root: Path, db_url: str, **env: str) -> None:
        self.root = root
        self.env = {"SXWL_DATABASE_URL": db_url, **CLOUD_ENV, **env}
        self.port = free_port()
        self.cloud = CloudProcess(root / "cloud", self.port, env=self.env)
        self.url = self.cloud.url
        self.provider = self.account("owner@example.com", "provider")
        self.key: str = httpx.get(f"{self.url}/api/v1/me/access-key", headers=self.provider).json()[
            "access_key"
        ]
        self.user = self.account("dev@example.com", "user")
        self.agents: list[AgentProcess] = []

    def account(self, email: str, role: str) -> dict[str, str]:
        httpx.post(
            f"{self.url}/api/v1/auth/register",
            json={"email": email, "password": "correct horse", "role": role},
        ).raise_for_status()
        token = httpx.post(
            f"{self.url}/api/v1/auth/login", json={"email": email, "password": "correct horse"}
        ).json()["access_token"]
        return {"Authorization": f"Bearer {token}"}

    def price_and_top_up(self, monkeypatch: pytest.MonkeyPatch, amount_yuan: str) -> None:
        """An admin prices PRODUCT at 1 CNY a GPU-second (fee 10%) and tops the user up."""
        monkeypatch.setenv("SXWL_DATABASE_URL", self.env["SXWL_DATABASE_URL"])  # for the admin's CLI
        create_admin(self.root / "cloud", "admin@example.com")
        admin = {"Authorization": f"Bearer {api_token(self.url, 'admin@example.com')}"}
        price = {"product": PRODUCT, "price_per_hour_yuan": "3600", "fee_percent": "10"}
        httpx.put(
            f"{self.url}/api/v1/admin/prices", headers=admin, json={"prices": [price]}
        ).raise_for_status()
        me = httpx.get(f"{self.url}/api/v1/me", headers=self.user).json()
        top_up = {"user_id": me["id"], "amount_yuan": amount_yuan, "note": "test"}
        httpx.post(f"{self.url}/api/v1/admin/top-ups", headers=admin, json=top_up).raise_for_status()

    def agent(
        self,
        name: str = "a",
        gpus: int = 4,
        *extra: str,
        state_dir: Path | None = None,
        python: str = sys.executable,
        env: dict[str, str] | None = None,
    ) -> AgentProcess:
        """An agent, its state in ``state_dir`` (default: ``agent-<name>`` here), run by ``python``."""
        state = state_dir or self.root / f"agent-{name}"
        agent = simulated_agent(
            self.url, state, self.key, *extra, name=name, gpus=gpus, product=PRODUCT, python=python, env=env
        )
        self.agents.append(agent)
        return agent

    def online(self, count: int = 1) -> None:
        def ready() -> bool:
            cpods: list[dict[str, Any]] = httpx.get(f"{self.url}/api/v1/cpods", headers=self.provider).json()
            online: bool = sum(c["status"] == "online" for c in cpods) >= count
            return online

        eventually(ready, what=f"{count} CPod(s) online")

    def submit(self, command: str | list[str], gpus: int = 1, **extra: Any) -> str:
        body = {"name": "t", "command": command, "gpu_product": PRODUCT, "gpus_per_node": gpus, **extra}
        response = httpx.post(f"{self.url}/api/v1/jobs", headers=self.user, json=body)
        assert response.status_code == 201, response.text
        job_id: str = response.json()["id"]
        return job_id

    def job(self, job_id: str) -> dict[str, Any]:
        job: dict[str, Any] = httpx.get(f"{self.url}/api/v1/jobs/{job_id}", headers=self.user).json()
        return job

    def wait_state(self, job_id: str, *states: str, timeout: float = 30) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            job = self.job(job_id)
            return job if job["state"] in states else None

        return eventually(reached, timeout=timeout, what=f"job {job_id} to be {'/'.join(states)}")

    def logs(self, job_id: str, attempt: int | None = None) -> str:
        params = {"attempt": attempt} if attempt else {}
        return httpx.get(f"{self.url}/api/v1/jobs/{job_id}/logs", headers=self.user, params=params).text

    def events(self, job_id: str) -> list[str]:
        return [
            e["kind"] for e in httpx.get(f"{self.url}/api/v1/jobs/{job_id}/events", headers=self.user).json()
        ]

    def close(self) -> None:
        for agent in self.agents:
            agent.stop()
        self.cloud.stop()


@pytest.fixture
def world(tmp_path: Path, db_url: str) -> Iterator[World]:
    w = World(tmp_path, db_url)
    yield w
    w.close()


def test_success_with_logs_and_artifacts(world: World) -> None:
    world.agent()
    world.online()
    script = (
        'echo "gpus=$CUDA_VISIBLE_DEVICES lr=$LR job=$SXWL_JOB_ID key=${SXWL_ACCESS_KEY:-none}"; '
        'for i in 1 2 3; do echo "step $i loss 0.$i"; done; '
        "mkdir -p $SXWL_OUTPUT_DIR/ckpt; echo weights > $SXWL_OUTPUT_DIR/ckpt/model.bin; "
        "echo '{\"loss\": 0.3}' > $SXWL_OUTPUT_DIR/metrics.json"
    )
    job_id = world.submit(script, gpus=2, env={"LR": "0.01"})
    job = world.wait_state(job_id, "succeeded")
    assert job["exit_code"] == 0 and job["attempt"] == 1
    logs = world.logs(job_id)
    assert f"gpus=0,1 lr=0.01 job={job_id} key=none" in logs  # the accessKey never reaches a job
    assert logs.count("step 3 loss 0.3") == 1
    artifacts = httpx.get(f"{world.url}/api/v1/jobs/{job_id}/artifacts", headers=world.user).json()
    assert sorted(a["path"] for a in artifacts) == ["ckpt/model.bin", "metrics.json"]
    got = httpx.get(f"{world.url}/api/v1/jobs/{job_id}/artifacts/ckpt/model.bin", headers=world.user)
    assert got.text == "weights\n"


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_an_artifact_over_the_limit_fails_the_job_with_that_reason_and_the_rest_is_kept(
    tmp_path: Path, db_url: str
) -> None:
    world = World(tmp_path, db_url, SXWL_ARTIFACT_MAX_BYTES="1000")
    try:
        world.agent()
        world.online()
        script = "head -c 2000 /dev/zero > $SXWL_OUTPUT_DIR/model.bin; echo ok > $SXWL_OUTPUT_DIR/small.txt"
        job = world.wait_state(world.submit(script), "failed")
        assert job["exit_code"] == 0
        # Refused by the agent from the open file's size, with the limit the assignment carried: not a
        # byte read (the cloud would refuse it when announced too: docs/object-storage.md).
        assert job["reason"] == "artifact model.bin refused: 2000 bytes, over the limit of 1000 bytes"
        artifacts = httpx.get(f"{world.url}/api/v1/jobs/{job['id']}/artifacts", headers=world.user).json()
        assert [a["path"] for a in artifacts] == ["small.txt"]
    finally:
        world.close()


def test_failure_reports_the_exit_code(world: World) -> None:
    world.agent()
    world.online()
    job = world.wait_state(world.submit("echo bad input >&2; exit 3"), "failed")
    assert job["exit_code"] == 3 and job["reason"] == "exit code 3"
    assert "bad input" in world.logs(job["id"])


def test_cancel_stops_the_process_group(world: World, tmp_path: Path) -> None:
    world.agent()
    world.online()
    marker = tmp_path / "child-still-alive"
    # A child that ignores SIGTERM must still go: SIGKILL follows after the grace.
    job_id = world.submit(f"(trap '' TERM; sleep 30; touch {marker}) & echo started; wait")
    world.wait_state(job_id, "running")
    eventually(lambda: "started" in world.logs(job_id), what="output")
    cancel = httpx.post(f"{world.url}/api/v1/jobs/{job_id}/cancel", headers=world.user)
    assert cancel.json()["cancel_requested"] is True
    job = world.wait_state(job_id, "cancelled", timeout=20)
    assert job["finished_at"]
    assert "cancel_requested" in world.events(job_id)
    assert not marker.exists()


def test_max_runtime_is_enforced(world: World) -> None:
    world.agent()
    world.online()
    job = world.wait_state(world.submit("sleep 30", max_runtime_s=1), "failed", timeout=20)
    assert "max runtime of 1 s exceeded" in job["reason"]


def test_gpus_are_never_shared(world: World) -> None:
    world.agent(gpus=2)
    world.online()
    jobs = [world.submit("echo dev=$CUDA_VISIBLE_DEVICES; sleep 1.5") for _ in range(3)]
    samples: list[set[str]] = []

    def running() -> bool:
        states = [world.job(j)["state"] for j in jobs]
        samples.append({j for j, s in zip(jobs, states, strict=True) if s == "running"})
        return all(s == "succeeded" for s in states)

    eventually(running, timeout=40, what="all three jobs to finish")
    assert max(len(s) for s in samples) <= 2
    devices = [world.logs(j).strip() for j in jobs]
    assert sorted(set(devices)) <= ["dev=0", "dev=1"] and all(d in ("dev=0", "dev=1") for d in devices)


@pytest.fixture
def patient_world(tmp_path: Path, db_url: str) -> Iterator[World]:
    """A cloud that waits long enough for an agent restart before calling its CPod offline."""
    w = World(tmp_path, db_url, SXWL_OFFLINE_GRACE_S="60")
    yield w
    w.close()


def test_agent_restart_mid_job_adopts_it(patient_world: World) -> None:
    world = patient_world
    agent = world.agent()
    world.online()
    job_id = world.submit("for i in $(seq 1 12); do echo tick $i; sleep 0.25; done")
    world.wait_state(job_id, "running")
    eventually(lambda: "tick 2" in world.logs(job_id), what="first ticks")
    agent.signal(signal.SIGKILL)
    agent.wait()
    world.agent()  # same state dir: same CPod, re-adopts the running job
    job = world.wait_state(job_id, "succeeded", timeout=40)
    assert job["attempt"] == 1
    logs = world.logs(job_id)
    assert [line for line in logs.splitlines()] == [
        f"tick {i}" for i in range(1, 13)
    ]  # no loss, no duplicates


def test_cloud_restart_mid_job_loses_nothing(world: World) -> None:
    world.agent()
    world.online()
    job_id = world.submit("for i in $(seq 1 10); do echo tick $i; sleep 0.3; done")
    world.wait_state(job_id, "running")
    world.cloud.stop()
    world.cloud = CloudProcess(world.root / "cloud", world.port, env=world.env)
    job = world.wait_state(job_id, "succeeded", timeout=60)
    assert job["attempt"] == 1
    assert world.logs(job_id).splitlines() == [f"tick {i}" for i in range(1, 11)]


def test_lost_cpod_job_finishes_on_another_and_the_old_attempt_is_fenced(
    world: World, tmp_path: Path
) -> None:
    # The job marks its end in a file outside its own dirs, which only an agent without isolation
    # lets it write (tests/test_local_isolation.py covers the sandbox).
    unisolated = ("--isolation", "none", "--trust-account", "dev@example.com")
    first = world.agent("first", 1, *unisolated)
    world.online()
    job_id = world.submit(
        f"echo attempt $SXWL_ATTEMPT; [ $SXWL_ATTEMPT = 1 ] && sleep 30; "
        f"echo done-$SXWL_ATTEMPT >> {tmp_path}/finished"
    )
    job = world.wait_state(job_id, "running")
    first.signal(signal.SIGKILL)  # the machine "disappears"; its job process is an orphan now
    first.wait()
    world.agent("second", 1, *unisolated)
    job = world.wait_state(job_id, "succeeded", timeout=60)
    assert job["attempt"] == 2
    assert "lost" in world.events(job_id) and "requeued" in world.events(job_id)
    assert world.logs(job_id, attempt=2).startswith("attempt 2")
    # The first agent returns: it is told to stop attempt 1, which therefore never finishes.
    returned = world.agent("first", 1, *unisolated)
    eventually(
        lambda: f"job {job_id} attempt 1 ended" in returned.log,
        timeout=30,
        what="the returning agent to stop the stale attempt",
    )
    assert (tmp_path / "finished").read_text().split() == ["done-2"]
    assert world.job(job_id)["state"] == "succeeded" and world.job(job_id)["attempt"] == 2


def test_no_double_assignment_with_twenty_pollers(world: World) -> None:
    """Property: whatever the sizes, every job is delivered to exactly one CPod, once, and no CPod
    ever gets more GPUs than it has."""
    rng = random.Random(20261130)
    pollers = []
    for i in range(20):
        reg = httpx.post(
            f"{world.url}/api/v1/agent/register",
            headers={"Authorization": f"Bearer {world.key}"},
            json={
                "cluster_uid": f"poller-{i:04d}",
                "runtime": "local",
                "agent_version": "t",
                "heartbeat_interval_s": 60,
            },
        ).json()
        gpus = rng.choice([1, 2, 4, 8])
        node = {
            "name": "n",
            "status": "ready",
            "cpu_cores": 8,
            "memory_mib": 1024,
            "gpu": {
                "vendor": "nvidia",
                "product": PRODUCT,
                "memory_mib": 81920,
                "count": gpus,
                "allocatable": gpus,
            },
        }
        headers = {"Authorization": f"Bearer {reg['cpod_token']}"}
        httpx.post(f"{world.url}/api/v1/agent/heartbeat", headers=headers, json={"seq": 1, "nodes": [node]})
        pollers.append((reg["cpod_id"], headers, gpus))
    total = sum(g for _, _, g in pollers)
    sizes = [rng.choice([1, 1, 2, 4]) for _ in range(60)]
    jobs = [world.submit("true", gpus=size) for size in sizes]
    received: dict[str, list[tuple[str, int]]] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def poll(cpod_id: str, headers: dict[str, str]) -> None:
        with httpx.Client(base_url=world.url, headers=headers, timeout=30) as http:
            while not stop.is_set():
                reply = http.get("/api/v1/agent/assignments", params={"wait": 1}).json()
                for a in reply["assignments"]:
                    with lock:
                        received.setdefault(a["job_id"], []).append((cpod_id, a["gpus_per_node"]))
                    http.post(
                        f"/api/v1/agent/jobs/{a['job_id']}/status",
                        json={"attempt": a["attempt"], "state": "running"},
                    )

    threads = [threading.Thread(target=poll, args=(c, h)) for c, h, _ in pollers]
    for t in threads:
        t.start()

    def settled() -> bool:
        states = [world.job(j)["state"] for j in jobs]
        return "assigned" not in states and states.count("running") == len(received) > 0

    try:
        eventually(settled, timeout=30, what="every assignment to be delivered")
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert sum(size for job_id, size in zip(jobs, sizes, strict=True) if job_id in received) <= total
    assert all(len(deliveries) == 1 for deliveries in received.values()), received
    used: dict[str, int] = {}
    for deliveries in received.values():
        for cpod_id, gpus in deliveries:
            used[cpod_id] = used.get(cpod_id, 0) + gpus
    capacity = {c: g for c, _, g in pollers}
    assert all(used[c] <= capacity[c] for c in used), (used, capacity)
