"""Input at and past the bounds (issue 10, points 3-7), on SQLite and PostgreSQL: integers past what
the columns hold, strict JSON types, control characters in names, NUL in text, artifact paths the file
system cannot hold, and the headers artifacts are served with. Each is a 4xx naming the field, and
changes nothing."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient

from sxwl.cloud.kit.groupcommit import GroupCommit
from sxwl.cloud.services.fleet import heartbeats
from sxwl.cloud.services.fleet.beat import Beat
from sxwl.cloud.web.i18n import MESSAGES
from sxwl.protocol import Heartbeat, HeartbeatReply
from tests.support.cpods import gpu_node, register_cpod
from tests.test_console_forms import csrf
from tests.test_console_jobs import api_jobs, browser_user, field_error, submit_form
from tests.test_cpods_api import ctx_of
from tests.test_heartbeat_batches import Recorder, run_in_own_loop
from tests.test_jobs_api import Setup

HUGE = 2**64  # past every column: SQLite's INTEGER and PostgreSQL's BIGINT alike


@pytest.fixture
def setup(client: TestClient) -> Setup:
    return Setup(client)


def fields(response: Any) -> list[str]:
    assert response.status_code == 422, response.text
    return [d["field"] for d in response.json()["error"]["details"]]


def running_job(setup: Setup) -> str:
    job_id: str = setup.submit()["id"]
    setup.assigned(job_id)
    return job_id


# ---- 4: every integer bounded -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "field"),
    [
        (f"/api/v1/jobs?page={HUGE}", "page"),
        (f"/api/v1/jobs?page=-{HUGE}", "page"),
        (f"/api/v1/jobs/JOB/logs?offset={HUGE}", "offset"),
        (f"/api/v1/jobs/JOB/logs?attempt={HUGE}", "attempt"),
    ],
)
def test_user_side_integers_past_64_bits_are_422(setup: Setup, url: str, field: str) -> None:
    job_id = setup.submit()["id"]
    assert fields(setup.client.get(url.replace("JOB", job_id), headers=setup.user)) == [field]


def test_agent_side_integers_past_64_bits_are_422(setup: Setup) -> None:
    job_id = running_job(setup)
    client, agent = setup.client, setup.agent
    for body, field in (
        ({"attempt": HUGE, "state": "running"}, "attempt"),
        ({"attempt": 1, "state": "failed", "exit_code": HUGE}, "exit_code"),
        ({"attempt": 1, "state": "failed", "exit_code": -HUGE}, "exit_code"),
    ):
        response = client.post(f"/api/v1/agent/jobs/{job_id}/status", headers=agent, json=body)
        assert fields(response) == [field]
    logs = f"/api/v1/agent/jobs/{job_id}/logs"
    assert fields(client.post(f"{logs}?attempt=1&offset={HUGE}", headers=agent, content=b"x")) == ["offset"]
    assert fields(client.post(f"{logs}?attempt={HUGE}&offset=0", headers=agent, content=b"x")) == ["attempt"]
    artifact = f"/api/v1/agent/jobs/{job_id}/artifacts/a.txt?attempt={HUGE}"
    assert fields(client.put(artifact, headers=agent, content=b"x")) == ["attempt"]
    assert fields(client.post(f"/api/v1/agent/commands/{HUGE}/ack", headers=agent)) == ["command_id"]
    beat = client.post("/api/v1/agent/heartbeat", headers=agent, json={"seq": HUGE, "nodes": []})
    assert fields(beat) == ["seq"]
    # Nothing changed: the job still runs its first attempt, with no log.
    assert setup.job(job_id)["state"] == "assigned" and setup.job(job_id)["exit_code"] is None
    assert client.get(f"/api/v1/jobs/{job_id}/logs", headers=setup.user).content == b""


@pytest.mark.parametrize("value", [str(HUGE), "²", "9" * 5000, "-1"])
def test_protocol_header_out_of_range_is_4xx_naming_it(setup: Setup, value: str) -> None:
    header: dict[str, str | bytes] = {"X-SXWL-Protocol": value.encode()}
    for method, path in (("POST", "/api/v1/agent/heartbeat"), ("GET", "/api/v1/agent/assignments")):
        response = setup.client.request(
            method, path, headers={**setup.agent, **header}, json={"seq": 9, "nodes": []}
        )
        if value == "-1":  # a number, just not a version this cloud speaks
            assert response.status_code == 400 and response.json()["error"]["code"] == "unsupported_protocol"
        else:
            assert fields(response) == ["X-SXWL-Protocol"], (method, path)


def test_console_numbers_past_the_bounds(client: TestClient) -> None:
    browser = browser_user(client)
    assert browser.get(f"/jobs?page={HUGE}").status_code == 200  # shown as the first page
    assert browser.get(f"/jobs?page={'9' * 5000}").status_code == 200
    for name, value in (("gpus_per_node", str(HUGE)), ("nodes", str(HUGE)), ("max_runtime_min", str(HUGE))):
        response = submit_form(browser, **{name: value})
        assert response.status_code == 422 and field_error(response.text, name)
    assert api_jobs(browser)["total"] == 0


# ---- 3: one bad heartbeat fails only itself ----------------------------------------------------


def test_a_beat_that_breaks_the_batch_fails_alone(client: TestClient) -> None:
    """Validation keeps out-of-range seqs out of batches; if a write fails anyway (here a beat built
    past validation, whose seq the database cannot hold), its batch is written again one beat at a
    time, and only that beat fails."""
    from tests.test_cpods_api import provider

    _, key = provider(client)
    tokens = [register_cpod(client, key, f"cluster-{i:04d}")["cpod_token"] for i in range(4)]
    ctx = ctx_of(client)
    good = [Beat.of(t, Heartbeat(seq=1, nodes=[])) for t in tokens]
    bad = Beat(token=tokens[0], seq=HUGE, nodes=good[0].nodes, node_count=0, reported_jobs=[])
    outcomes: list[object] = []

    async def go() -> None:
        writer = heartbeats.writer(ctx)
        # The first is written at once, alone; the rest queue behind it and share the next batch.
        outcomes.extend(
            await asyncio.gather(
                *(writer.submit(b) for b in [good[0], bad, *good[1:]]), return_exceptions=True
            )
        )

    run_in_own_loop(go())
    assert isinstance(outcomes[1], Exception)
    replies = [outcomes[0], *outcomes[2:]]
    assert all(isinstance(r, HeartbeatReply) and r.accepted and r.last_seq == 1 for r in replies), outcomes


def test_group_commit_retries_a_failed_batch_one_by_one() -> None:
    run_in_own_loop(_group_commit_retries_a_failed_batch_one_by_one())


async def _group_commit_retries_a_failed_batch_one_by_one() -> None:
    write = Recorder()  # fails the whole write when -1 is in it
    write.release.clear()
    commit: GroupCommit[int, int] = GroupCommit(write)
    first = asyncio.create_task(commit.submit(1))
    assert await asyncio.to_thread(write.entered.wait, 5)
    rest = [asyncio.create_task(commit.submit(i)) for i in (2, -1, 3)]
    await asyncio.sleep(0.05)
    write.release.set()
    assert await first == 10
    results = await asyncio.gather(*rest, return_exceptions=True)
    assert results[0] == 20 and results[2] == 30 and isinstance(results[1], RuntimeError)
    assert write.batches == [[1], [2], [3]]  # [2, -1, 3] failed whole, then each went alone


def test_out_of_range_heartbeat_is_422_and_others_are_answered(client: TestClient) -> None:
    from tests.test_cpods_api import provider

    _, key = provider(client)
    a, b = (register_cpod(client, key, f"cluster-{i:04d}") for i in range(2))
    node = gpu_node("n1")
    bad = [
        ({"seq": HUGE, "nodes": [node]}, "seq"),
        ({"seq": 1, "nodes": [node | {"memory_mib": HUGE}]}, "nodes.0.memory_mib"),
        ({"seq": 1, "nodes": [node | {"cpu_cores": HUGE}]}, "nodes.0.cpu_cores"),
        (
            {"seq": 1, "nodes": [], "jobs": [{"job_id": "j", "attempt": HUGE, "state": "running"}]},
            "jobs.0.attempt",
        ),
        ({"seq": "1", "nodes": []}, "seq"),
        ({"seq": True, "nodes": []}, "seq"),
    ]
    for body, field in bad:
        response = client.post(
            "/api/v1/agent/heartbeat", headers={"Authorization": f"Bearer {a['cpod_token']}"}, json=body
        )
        assert fields(response) == [field]
    ok = client.post(
        "/api/v1/agent/heartbeat",
        headers={"Authorization": f"Bearer {b['cpod_token']}"},
        json={"seq": 1, "nodes": [node]},
    )
    assert ok.status_code == 200 and ok.json()["accepted"] is True


# ---- 5: artifact paths the file system cannot hold ----------------------------------------------


def put_artifact(setup: Setup, job_id: str, path: str) -> Any:
    return setup.client.put(
        f"/api/v1/agent/jobs/{job_id}/artifacts/{quote(path)}?attempt=1", headers=setup.agent, content=b"x"
    )


@pytest.mark.parametrize("path", ["a" * 256, "d/" + "é" * 128, "/".join(["x" * 200] * 6)])
def test_artifact_paths_too_long_for_the_file_system_are_422(setup: Setup, path: str) -> None:
    job_id = running_job(setup)
    assert fields(put_artifact(setup, job_id, path)) == ["path"]
    assert setup.client.get(f"/api/v1/jobs/{job_id}/artifacts", headers=setup.user).json() == []


def test_a_file_where_a_directory_is_needed_and_the_reverse_are_409(setup: Setup) -> None:
    job_id = running_job(setup)
    assert put_artifact(setup, job_id, "out/model").status_code == 201
    under_file = put_artifact(setup, job_id, "out/model/weights.bin")
    assert under_file.status_code == 409 and under_file.json()["error"]["code"] == "artifact_path_conflict"
    over_dir = put_artifact(setup, job_id, "out")
    assert over_dir.status_code == 409 and "directory" in over_dir.json()["error"]["message"]
    listed = setup.client.get(f"/api/v1/jobs/{job_id}/artifacts", headers=setup.user).json()
    assert [a["path"] for a in listed] == ["out/model"]


# ---- 6: served artifacts cannot script the console ----------------------------------------------


@pytest.mark.parametrize("name", ["report.html", "plot.svg", "notes.txt"])
def test_artifacts_are_downloads_that_cannot_script_the_console(setup: Setup, name: str) -> None:
    job_id = running_job(setup)
    body = b"<script>alert(document.cookie)</script>"
    put = setup.client.put(
        f"/api/v1/agent/jobs/{job_id}/artifacts/{name}?attempt=1", headers=setup.agent, content=body
    )
    assert put.status_code == 201
    got = setup.client.get(f"/api/v1/jobs/{job_id}/artifacts/{name}", headers=setup.user)
    assert got.status_code == 200 and got.content == body
    assert got.headers["content-type"] == "application/octet-stream"
    assert (
        got.headers["content-disposition"].startswith("attachment;")
        and name in got.headers["content-disposition"]
    )
    assert got.headers["x-content-type-options"] == "nosniff"
    assert got.headers["content-security-policy"] == "default-src 'none'; sandbox"


# ---- 7: names without control characters; strict JSON types; no NUL in text --------------------

REFUSED_IN_NAMES = ["\u202e", "\u2066", "\u200b", "\x07", "\n", "\u2028", "\ufeff"]


@pytest.mark.parametrize("char", REFUSED_IN_NAMES)
def test_names_with_control_characters_are_422(setup: Setup, char: str) -> None:
    client = setup.client
    name = f"evil{char}gpj.exe"
    job = client.post("/api/v1/jobs", headers=setup.user, json={"name": name, "command": "true"})
    assert fields(job) == ["name"]
    owner = setup.client.post(
        "/api/v1/auth/login", json={"email": "owner@example.com", "password": "correct horse"}
    )
    provider_headers = {"Authorization": f"Bearer {owner.json()['access_token']}"}
    rename = client.patch(f"/api/v1/cpods/{setup.cpod_id}", headers=provider_headers, json={"name": name})
    assert fields(rename) == ["name"]
    account = client.post(
        "/api/v1/auth/register",
        json={"email": "new@example.com", "password": "correct horse", "role": "user", "name": name},
    )
    assert fields(account) == ["name"]
    key = client.get("/api/v1/me/access-key", headers=provider_headers).json()["access_key"]
    register = client.post(
        "/api/v1/agent/register",
        headers={"Authorization": f"Bearer {key}"},
        json={"cluster_uid": "cluster-evil", "runtime": "local", "agent_version": "t", "name": name},
    )
    assert fields(register) == ["name"]
    # Nothing was created or renamed.
    assert client.get("/api/v1/jobs", headers=setup.user).json()["total"] == 0
    cpods = client.get("/api/v1/cpods", headers=provider_headers).json()
    assert [c["id"] for c in cpods] == [setup.cpod_id] and char not in cpods[0]["name"]


def test_console_forms_refuse_control_characters_in_names(client: TestClient) -> None:
    browser = browser_user(client)
    response = submit_form(browser, name="report\u202egpj.exe")
    assert response.status_code == 422
    assert field_error(response.text, "name") == MESSAGES["zh"]["error.control_chars"]
    assert api_jobs(browser)["total"] == 0
    signup = TestClient(client.app)
    token = csrf(signup, "/register")
    form = {"csrf_token": token, "email": "p@example.com", "password": "correct horse", "role": "user"}
    refused = signup.post("/register", data=form | {"name": "Eve\u2066"}, follow_redirects=False)
    assert refused.status_code == 422 and MESSAGES["zh"]["error.control_chars"] in refused.text


def test_names_keep_ordinary_unicode(setup: Setup) -> None:
    job = setup.client.post(
        "/api/v1/jobs", headers=setup.user, json={"name": "训练 α-β résumé 🚀", "command": "true"}
    )
    assert job.status_code == 201 and job.json()["name"] == "训练 α-β résumé 🚀"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"gpus_per_node": "2"}, "gpus_per_node"),
        ({"gpus_per_node": True}, "gpus_per_node"),
        ({"nodes": 1.0}, "nodes"),
        ({"priority": "0"}, "priority"),
        ({"name": 5}, "name"),
    ],
)
def test_json_types_are_strict(setup: Setup, body: dict[str, Any], field: str) -> None:
    response = setup.client.post("/api/v1/jobs", headers=setup.user, json={"command": "true"} | body)
    assert fields(response) == [field]
    assert setup.client.get("/api/v1/jobs", headers=setup.user).json()["total"] == 0


def test_strict_types_on_the_agent_side(setup: Setup) -> None:
    job_id = running_job(setup)
    status = setup.client.post(
        f"/api/v1/agent/jobs/{job_id}/status", headers=setup.agent, json={"attempt": "1", "state": "running"}
    )
    assert fields(status) == ["attempt"]
    assert setup.job(job_id)["state"] == "assigned"


def test_nul_in_text_is_422_naming_the_field(setup: Setup) -> None:
    client = setup.client
    for body, field in (
        ({"command": "echo \x00"}, "command"),
        ({"command": ["echo", "a\x00"]}, "command"),
        ({"command": "true", "env": {"A": "\x00"}}, "env.A"),
        ({"command": "true", "image": "img\x00"}, "image"),
    ):
        response = client.post("/api/v1/jobs", headers=setup.user, json=body)
        assert field in fields(response), response.text
    assert fields(client.get("/api/v1/jobs?q=%00", headers=setup.user)) == ["q"]
    assert fields(client.get("/api/v1/jobs/a%00b", headers=setup.user)) == ["job_id"]
    assert fields(client.post("/api/v1/auth/login", json={"email": "a\x00@b.c", "password": "x"})) == [
        "email"
    ]
    assert client.get("/api/v1/jobs", headers=setup.user).json()["total"] == 0
