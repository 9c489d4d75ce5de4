"""Jobs through the REST API, with the agent side driven by hand (SQLite and PostgreSQL)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.models import Job
from sxwl.cloud.services.fleet import cpods as cpod_service
from sxwl.cloud.services.jobs.log_chunks import MAX_CHUNKS
from sxwl.cloud.services.scheduling import scheduler
from tests.conftest import login, register
from tests.support.agent import eventually
from tests.support.cpods import A100, access_key, beat, gpu_node, register_cpod
from tests.test_admin_api import make_admin
from tests.test_cpods_api import ctx_of

PRODUCT = A100["product"]


class Setup:
    def __init__(self, client: TestClient, gpus: int = 8) -> None:
        self.client = client
        register(client, "owner@example.com", "provider")
        key = access_key(client, login(client, "owner@example.com"))
        reg = register_cpod(client, key)
        self.cpod_id: str = reg["cpod_id"]
        self.token: str = reg["cpod_token"]
        self.agent = {"Authorization": f"Bearer {self.token}"}
        self.seq = 1
        assert beat(client, self.token, self.seq, [gpu_node("w1", count=gpus)]).status_code == 200
        register(client, "dev@example.com", "user")
        self.user = login(client, "dev@example.com")

    def submit(self, **body: Any) -> dict[str, Any]:
        payload = {
            "name": "t",
            "command": ["python", "train.py"],
            "gpu_product": PRODUCT,
            "gpus_per_node": 1,
        } | body
        response = self.client.post("/api/v1/jobs", headers=self.user, json=payload)
        assert response.status_code == 201, response.text
        job: dict[str, Any] = response.json()
        return job

    def job(self, job_id: str) -> dict[str, Any]:
        job: dict[str, Any] = self.client.get(f"/api/v1/jobs/{job_id}", headers=self.user).json()
        return job

    def poll(self, wait: float = 5) -> dict[str, Any]:
        reply: dict[str, Any] = self.client.get(
            f"/api/v1/agent/assignments?wait={wait}", headers=self.agent
        ).json()
        return reply

    def status(self, job_id: str, attempt: int, state: str, **extra: Any) -> Any:
        return self.client.post(
            f"/api/v1/agent/jobs/{job_id}/status",
            headers=self.agent,
            json={"attempt": attempt, "state": state, **extra},
        )

    def log(self, job_id: str, attempt: int, offset: int, data: bytes) -> Any:
        return self.client.post(
            f"/api/v1/agent/jobs/{job_id}/logs?attempt={attempt}&offset={offset}",
            headers=self.agent,
            content=data,
        )

    def assigned(self, job_id: str) -> dict[str, Any]:
        return eventually(
            lambda: self.job(job_id)["state"] == "assigned" and self.job(job_id),
            timeout=10,
            what="assignment",
        )


@pytest.fixture
def setup(client: TestClient) -> Setup:
    return Setup(client)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"gpus_per_node": -1}, "gpus_per_node"),
        ({"nodes": 0}, "nodes"),
        ({"command": []}, "command"),
        ({"command": "   "}, "command"),
        ({"command": [""]}, "command"),
        ({"cpod_id": "nope"}, "cpod_id"),
        ({"env": {"1BAD": "x"}}, "env"),
        ({"env": {"SXWL_JOB_ID": "x"}}, "env"),
        ({"env": {"CUDA_VISIBLE_DEVICES": "0"}}, "env"),
        ({"max_runtime_s": 0}, "max_runtime_s"),
        ({"priority": 5}, "priority"),
        ({"nodes": "two"}, "nodes"),
        ({"surprise": True}, "surprise"),
    ],
)
def test_invalid_jobs_are_422_naming_the_field(setup: Setup, body: dict[str, Any], field: str) -> None:
    payload = {"name": "t", "command": ["python", "train.py"], "gpus_per_node": 1} | body
    response = setup.client.post("/api/v1/jobs", headers=setup.user, json=payload)
    assert response.status_code == 422, response.text
    assert field in [d["field"].split(".")[0] for d in response.json()["error"]["details"]]
    assert setup.client.get("/api/v1/jobs", headers=setup.user).json()["total"] == 0


def test_providers_do_not_submit_jobs(setup: Setup) -> None:
    provider = login(setup.client, "owner@example.com")
    response = setup.client.post("/api/v1/jobs", headers=provider, json={"command": "true"})
    assert response.status_code == 403


def test_full_path_assign_report_logs_artifacts(setup: Setup) -> None:
    job = setup.submit(gpus_per_node=2, env={"LR": "0.1"}, max_runtime_s=60)
    assert job["state"] in ("queued", "assigned")
    reply = setup.poll()
    (assignment,) = reply["assignments"]
    assert assignment["job_id"] == job["id"] and assignment["attempt"] == 1
    assert assignment["gpus_per_node"] == 2 and assignment["node_names"] == ["w1"]
    assert assignment["env"] == {"LR": "0.1"} and assignment["max_runtime_s"] == 60

    assert setup.status(job["id"], 1, "starting").status_code == 200
    assert setup.poll(wait=0)["assignments"] == []  # acknowledged: not delivered again
    assert setup.status(job["id"], 1, "running").status_code == 200
    assert setup.log(job["id"], 1, 0, b"step 1 loss 4.2\n").json()["next_offset"] == 16
    # Retried and overlapping chunks are stored once; a gap is refused with the expected offset.
    assert setup.log(job["id"], 1, 0, b"step 1 loss 4.2\n").json()["next_offset"] == 16
    assert setup.log(job["id"], 1, 10, b"s 4.2\nstep 2 loss 3.9\n").json()["next_offset"] == 32
    gap = setup.log(job["id"], 1, 100, b"lost?")
    assert gap.status_code == 409 and gap.json()["error"]["details"]["next_offset"] == 32

    logs = setup.client.get(f"/api/v1/jobs/{job['id']}/logs", headers=setup.user)
    assert logs.text == "step 1 loss 4.2\nstep 2 loss 3.9\n"
    assert logs.headers["X-Next-Offset"] == "32" and logs.headers["X-Log-Complete"] == "false"
    tail = setup.client.get(f"/api/v1/jobs/{job['id']}/logs?offset=16", headers=setup.user)
    assert tail.text == "step 2 loss 3.9\n"
    past = setup.client.get(f"/api/v1/jobs/{job['id']}/logs?offset=999", headers=setup.user)
    assert past.status_code == 200 and past.text == "" and past.headers["X-Next-Offset"] == "32"

    put = setup.client.put(
        f"/api/v1/agent/jobs/{job['id']}/artifacts/ckpt/model.npz?attempt=1",
        headers=setup.agent,
        content=b"weights",
    )
    assert put.status_code == 201 and put.json()["size"] == 7
    assert setup.status(job["id"], 1, "succeeded", exit_code=0).status_code == 200

    done = setup.job(job["id"])
    assert done["state"] == "succeeded" and done["exit_code"] == 0 and done["finished_at"]
    listed = setup.client.get(f"/api/v1/jobs/{job['id']}/artifacts", headers=setup.user).json()
    assert [(a["path"], a["size"]) for a in listed] == [("ckpt/model.npz", 7)]
    got = setup.client.get(f"/api/v1/jobs/{job['id']}/artifacts/ckpt/model.npz", headers=setup.user)
    assert got.content == b"weights"
    assert (
        setup.client.get(f"/api/v1/jobs/{job['id']}/logs", headers=setup.user).headers["X-Log-Complete"]
        == "true"
    )
    kinds = [
        e["kind"] for e in setup.client.get(f"/api/v1/jobs/{job['id']}/events", headers=setup.user).json()
    ]
    assert kinds == ["submitted", "assigned", "starting", "running", "succeeded"]

    # Terminal states never change; cancelling a finished job is a conflict.
    assert setup.status(job["id"], 1, "failed", exit_code=1).status_code == 409
    assert setup.client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=setup.user).status_code == 409


def test_a_log_of_many_chunks_is_read_a_bounded_window_at_a_time(setup: Setup) -> None:
    job = setup.submit()
    setup.assigned(job["id"])
    assert setup.status(job["id"], 1, "running").status_code == 200
    lines = [f"line {i:03}\n".encode() for i in range(MAX_CHUNKS + 36)]  # one chunk each
    for offset, line in zip(itertools.accumulate([0, *map(len, lines)]), lines, strict=False):
        assert setup.log(job["id"], 1, offset, line).status_code == 200
    assert setup.status(job["id"], 1, "succeeded", exit_code=0).status_code == 200
    url = f"/api/v1/jobs/{job['id']}/logs"
    first = setup.client.get(url, headers=setup.user)
    assert first.content == b"".join(lines[:MAX_CHUNKS])  # the first window's rows, not the whole log
    assert first.headers["X-Log-Complete"] == "false"
    rest = setup.client.get(url, headers=setup.user, params={"offset": first.headers["X-Next-Offset"]})
    assert rest.content == b"".join(lines[MAX_CHUNKS:]) and rest.headers["X-Log-Complete"] == "true"


@pytest.mark.parametrize("path", ["../escape", "a/../../b", "/etc/passwd", "a//b", "./x", "a\\..\\b"])
def test_artifact_paths_that_escape_are_refused(setup: Setup, path: str) -> None:
    job = setup.submit()
    setup.assigned(job["id"])
    from urllib.parse import quote

    put = setup.client.put(
        f"/api/v1/agent/jobs/{job['id']}/artifacts/{quote(path, safe='')}?attempt=1",
        headers=setup.agent,
        content=b"x",
    )
    assert put.status_code in (404, 422), put.text
    get = setup.client.get(f"/api/v1/jobs/{job['id']}/artifacts/{quote(path, safe='')}", headers=setup.user)
    assert get.status_code in (404, 422)
    assert setup.client.get(f"/api/v1/jobs/{job['id']}/artifacts", headers=setup.user).json() == []


def test_oversized_log_chunk_is_413(make_client: Callable[..., TestClient]) -> None:
    setup = Setup(make_client(log_chunk_max_bytes=64))
    job = setup.submit()
    setup.assigned(job["id"])
    assert setup.log(job["id"], 1, 0, b"x" * 65).status_code == 413
    assert setup.log(job["id"], 1, 0, b"x" * 64).status_code == 200


def test_cancel_queued_and_running(setup: Setup) -> None:
    waiting = setup.submit(gpus_per_node=64)  # no node has 64 GPUs
    eventually(
        lambda: setup.job(waiting["id"])["reason"] == f"no online CPod offers 64 × {PRODUCT}",
        what="the reason",
    )
    assert setup.job(waiting["id"])["queue_position"] == 1
    cancelled = setup.client.post(f"/api/v1/jobs/{waiting['id']}/cancel", headers=setup.user).json()
    assert cancelled["state"] == "cancelled"

    running = setup.submit()
    setup.assigned(running["id"])
    setup.status(running["id"], 1, "running")
    response = setup.client.post(f"/api/v1/jobs/{running['id']}/cancel", headers=setup.user).json()
    assert response["state"] == "running" and response["cancel_requested"] is True
    (command,) = setup.poll()["commands"]
    assert command["job_id"] == running["id"] and command["cancel"] is True and command["attempt"] == 1
    assert (
        setup.client.post(f"/api/v1/agent/commands/{command['id']}/ack", headers=setup.agent).status_code
        == 204
    )
    assert setup.poll(wait=0)["commands"] == []
    setup.status(running["id"], 1, "failed", exit_code=143)  # killed by SIGTERM after a cancel
    assert setup.job(running["id"])["state"] == "cancelled"


def test_lost_cpod_requeues_and_fences_the_old_attempt(setup: Setup) -> None:
    job = setup.submit()
    setup.assigned(job["id"])
    setup.status(job["id"], 1, "running")
    ctx = ctx_of(setup.client)
    from datetime import timedelta

    from sxwl.cloud.db.types import utcnow

    cpod_service.sweep_liveness(ctx, utcnow() + timedelta(seconds=40))  # unknown
    cpod_service.sweep_liveness(ctx, utcnow() + timedelta(seconds=200))  # offline → requeued
    requeued = setup.job(job["id"])
    # The reason says "queued again: …" until the next scheduling pass explains why it still waits.
    assert requeued["state"] == "queued" and requeued["attempt"] == 1
    # The old attempt's reports are refused and its agent is told to stop it.
    stale = setup.status(job["id"], 1, "succeeded", exit_code=0)
    assert stale.status_code == 409 and stale.json()["error"]["details"]["stop"] is True
    assert setup.log(job["id"], 1, 0, b"late").status_code == 409
    setup.seq += 1
    beat(setup.client, setup.token, setup.seq, [gpu_node("w1")])  # the CPod comes back
    reply = setup.poll()
    (command,) = [c for c in reply["commands"] if c["job_id"] == job["id"]]
    assert command["attempt"] == 1 and command["cancel"] is False
    setup.client.post(f"/api/v1/agent/commands/{command['id']}/ack", headers=setup.agent)
    (again,) = eventually(lambda: setup.poll()["assignments"], what="the new attempt")
    assert again["job_id"] == job["id"] and again["attempt"] == 2
    kinds = [
        e["kind"] for e in setup.client.get(f"/api/v1/jobs/{job['id']}/events", headers=setup.user).json()
    ]
    assert kinds[-3:] == ["lost", "requeued", "assigned"]


def test_another_cpod_cannot_report_for_a_job(setup: Setup) -> None:
    job = setup.submit()
    setup.assigned(job["id"])
    register(setup.client, "other@example.com", "provider")
    key = access_key(setup.client, login(setup.client, "other@example.com"))
    other = register_cpod(setup.client, key, "cluster-other")
    response = setup.client.post(
        f"/api/v1/agent/jobs/{job['id']}/status",
        headers={"Authorization": f"Bearer {other['cpod_token']}"},
        json={"attempt": 1, "state": "running"},
    )
    assert response.status_code == 403
    assert setup.job(job["id"])["state"] == "assigned"


def test_users_see_only_their_jobs(setup: Setup) -> None:
    job = setup.submit()
    register(setup.client, "eve@example.com", "user")
    eve = login(setup.client, "eve@example.com")
    assert setup.client.get(f"/api/v1/jobs/{job['id']}", headers=eve).status_code == 403
    assert setup.client.post(f"/api/v1/jobs/{job['id']}/cancel", headers=eve).status_code == 403
    assert setup.client.get(f"/api/v1/jobs/{job['id']}/logs", headers=eve).status_code == 403
    assert setup.client.get("/api/v1/jobs", headers=eve).json()["total"] == 0
    admin = make_admin(setup.client)
    assert setup.client.get("/api/v1/jobs?all=true", headers=admin).json()["total"] == 1


def test_per_user_gpu_limit(setup: Setup) -> None:
    admin = make_admin(setup.client)
    me = setup.client.get("/api/v1/me", headers=setup.user).json()
    limited = setup.client.patch(
        f"/api/v1/admin/users/{me['id']}/limits", headers=admin, json={"max_gpus": 3}
    )
    assert limited.status_code == 200 and limited.json()["max_gpus"] == 3
    first = setup.submit(gpus_per_node=2)
    second = setup.submit(gpus_per_node=2)
    setup.assigned(first["id"])
    eventually(
        lambda: (setup.job(second["id"])["reason"] or "").startswith("your limit of 3 concurrent GPUs"),
        what="the limit reason",
    )
    assert setup.job(second["id"])["state"] == "queued"


def test_fair_share_between_users(setup: Setup) -> None:
    setup.seq += 1
    beat(setup.client, setup.token, setup.seq, [gpu_node("w1", count=2, used=2)])  # busy while jobs queue up
    greedy_jobs = [setup.submit(name=f"g{i}") for i in range(6)]
    register(setup.client, "modest@example.com", "user")
    modest = login(setup.client, "modest@example.com")
    late = setup.client.post(
        "/api/v1/jobs", headers=modest, json={"command": "true", "gpu_product": PRODUCT, "gpus_per_node": 1}
    ).json()
    setup.seq += 1
    beat(setup.client, setup.token, setup.seq, [gpu_node("w1", count=2, used=0)])  # two GPUs free up
    eventually(
        lambda: setup.client.get(f"/api/v1/jobs/{late['id']}", headers=modest).json()["state"] == "assigned",
        what="the modest user's job to be assigned",
    )
    states = [setup.job(j["id"])["state"] for j in greedy_jobs]
    assert states == ["assigned"] + ["queued"] * 5  # the greedy user's oldest job took the other GPU


def test_no_double_assignment_when_passes_race(setup: Setup) -> None:
    import threading

    setup.seq += 1
    beat(setup.client, setup.token, setup.seq, [gpu_node("w1", count=8, used=8)])
    jobs = [setup.submit(name=f"j{i}") for i in range(12)]
    ctx = ctx_of(setup.client)
    # Passes from this process and from two more "replicas" (contexts with their own locks) at once.
    replicas = [ctx, CloudContext.from_settings(ctx.settings), CloudContext.from_settings(ctx.settings)]
    setup.seq += 1
    beat(
        setup.client, setup.token, setup.seq, [gpu_node("w1", count=8, used=0)]
    )  # wakes the background pass too
    threads = [threading.Thread(target=scheduler.schedule_once, args=(r,)) for r in replicas * 2]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    eventually(
        lambda: sum(setup.job(j["id"])["state"] == "assigned" for j in jobs) == 8, what="8 assignments"
    )
    for job in jobs:
        events = setup.client.get(f"/api/v1/jobs/{job['id']}/events", headers=setup.user).json()
        assert [e["kind"] for e in events].count("assigned") <= 1
        assert setup.job(job["id"])["attempt"] <= 1
    assert len(setup.poll(wait=0)["assignments"]) == 8  # 8 GPUs, 8 jobs, none twice
    for replica in replicas[1:]:
        replica.db.dispose()


def test_a_job_stored_under_older_rules_stays_readable(setup: Setup) -> None:
    # Names with a bidirectional override were accepted before; such a job's page must still load.
    job = setup.submit(name="old")
    ctx = ctx_of(setup.client)
    with ctx.db.session() as session:
        session.execute(update(Job).where(Job.id == job["id"]).values(name="ab\u202ecd"))
    response = setup.client.get(f"/api/v1/jobs/{job['id']}", headers=setup.user)
    assert response.status_code == 200, response.text
    assert response.json()["name"] == "ab\u202ecd"
    listed = setup.client.get("/api/v1/jobs", headers=setup.user)
    assert listed.status_code == 200 and listed.json()["items"][0]["name"] == "ab\u202ecd"
