"""Each user's storage quota (docs/operations.md, "Storage quotas"): files, base models and job
artifacts count, a declared size over it is refused before the body is read and actual bytes while
they stream in, with one 413 that names the quota, the use and the limit; the use is shown in the API
and on the console's account page; a job whose artifact the quota refuses says so in its result."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from sxwl.cloud.db.finetune_models import DataFile
from sxwl.cloud.db.models import Artifact
from sxwl.cloud.web.i18n.storage import STORAGE_MESSAGES
from tests.conftest import login, register
from tests.support.agent import AgentProcess, eventually
from tests.support.cloud import CloudProcess, Provider
from tests.support.net import free_port
from tests.test_console_finetune import signed_in
from tests.test_console_finetune import upload as console_upload
from tests.test_cpods_api import ctx_of
from tests.test_files_api import CHAT, _jsonl, _upload
from tests.test_jobs_api import Setup
from tests.test_models_api import archive, model_files

QUOTA = 4096
LINE = _jsonl(CHAT)  # 93 bytes


def storage(client: TestClient, headers: dict[str, str]) -> dict[str, Any]:
    answer = client.get("/api/v1/me/storage", headers=headers)
    assert answer.status_code == 200, answer.text
    out: dict[str, Any] = answer.json()
    return out


def stored_objects(client: TestClient) -> list[Path]:
    root = ctx_of(client).settings.data_dir / "artifacts"
    return sorted(p for p in root.rglob("*") if p.is_file()) if root.exists() else []


def refused_by_quota(answer: httpx.Response, used: int) -> dict[str, Any]:
    assert answer.status_code == 413, answer.text
    error: dict[str, Any] = answer.json()["error"]
    assert error["code"] == "storage_quota_exceeded" and "storage quota exceeded" in error["message"]
    assert error["details"]["quota"] == "storage"
    assert error["details"]["used_bytes"] == used and error["details"]["limit_bytes"] == QUOTA
    return error


@pytest.fixture
def setup(make_client: Callable[..., TestClient]) -> Setup:
    return Setup(make_client(storage_quota_bytes=QUOTA))


def put(setup: Setup, job_id: str, path: str, data: bytes) -> httpx.Response:
    answer: httpx.Response = setup.client.put(
        f"/api/v1/agent/jobs/{job_id}/artifacts/{path}?attempt=1", headers=setup.agent, content=data
    )
    return answer


def test_files_models_and_artifacts_count_and_the_use_is_shown(setup: Setup) -> None:
    client, user = setup.client, setup.user
    assert storage(client, user) == {
        "used_bytes": 0,
        "limit_bytes": QUOTA,
        "available_bytes": QUOTA,
        "files_bytes": 0,
        "models_bytes": 0,
        "artifacts_bytes": 0,
    }
    assert _upload(client, user, LINE * 10).status_code == 200
    model = archive(model_files(), gzip=True)
    assert len(model) < 1500
    made = client.post(
        "/api/v1/models", headers=user, data={"name": "mine"}, files={"file": ("m.tgz", model)}
    )
    assert made.status_code == 201, made.text
    job = setup.submit()
    setup.assigned(job["id"])
    assert put(setup, job["id"], "out/a.bin", b"a" * 300).status_code == 201
    # Written once (docs/object-storage.md): other bytes at the path are refused and count nothing.
    assert put(setup, job["id"], "out/a.bin", b"a" * 500).status_code == 409
    shown = storage(client, user)
    assert shown["files_bytes"] == len(LINE) * 10 and shown["models_bytes"] == len(model)
    assert shown["artifacts_bytes"] == 300
    assert shown["used_bytes"] == len(LINE) * 10 + len(model) + 300
    assert shown["available_bytes"] == QUOTA - shown["used_bytes"]
    # Someone else's use is theirs.
    register(client, "other@example.com", "user")
    assert storage(client, login(client, "other@example.com"))["used_bytes"] == 0


def test_a_file_past_the_quota_is_refused_by_its_size_or_its_bytes_and_nothing_is_kept(setup: Setup) -> None:
    client, user = setup.client, setup.user
    assert _upload(client, user, LINE * 30).status_code == 200  # 2,730 of 4,096
    used = len(LINE) * 30
    before = stored_objects(client)
    # Within what the multipart envelope may add, a declared size is judged by the bytes that come
    # (a 200 MiB one is refused before a byte is read: tests/test_upload_auth.py).
    refused_by_quota(_upload(client, user, LINE * 20), used)

    # Not declared (chunked): refused while the bytes stream in.
    boundary = "b0undary"
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nfine-tune\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="t.jsonl"\r\n\r\n'
        ).encode()
        + LINE * 20
        + f"\r\n--{boundary}--\r\n".encode()
    )

    def chunks() -> Iterator[bytes]:
        for at in range(0, len(body), 500):
            yield body[at : at + 500]

    streamed = client.post(
        "/v1/files",
        headers={**user, "Content-Type": f"multipart/form-data; boundary={boundary}"},
        content=chunks(),
    )
    error = refused_by_quota(streamed, used)
    assert "at least" in error["message"]
    assert stored_objects(client) == before
    with ctx_of(client).db.session() as session:
        assert session.scalar(select(func.count()).select_from(DataFile)) == 1
    # What fits still fits, to the byte.
    rest = QUOTA - used
    exact = LINE * (rest // len(LINE))
    assert _upload(client, user, exact).status_code == 200


def test_a_model_past_the_quota_is_refused(setup: Setup) -> None:
    client, user = setup.client, setup.user
    assert _upload(client, user, LINE * 42).status_code == 200
    model = archive(model_files(), gzip=True)
    made = client.post(
        "/api/v1/models", headers=user, data={"name": "mine"}, files={"file": ("m.tgz", model)}
    )
    refused_by_quota(made, len(LINE) * 42)
    assert client.get("/v1/models/mine", headers=user).status_code == 404


def test_an_artifact_past_the_quota_is_refused_by_its_announced_size_and_by_its_bytes(setup: Setup) -> None:
    job = setup.submit()
    setup.assigned(job["id"])
    assert put(setup, job["id"], "one.bin", b"1" * 3000).status_code == 201
    big = b"2" * 2000
    announce = {"path": "two.bin", "size": len(big), "sha256": hashlib.sha256(big).hexdigest()}
    target = setup.client.post(
        f"/api/v1/agent/jobs/{job['id']}/upload-targets?attempt=1", headers=setup.agent, json=announce
    )
    refused_by_quota(target, 3000)
    refused_by_quota(put(setup, job["id"], "two.bin", big), 3000)
    # Neither refusal stored or recorded anything; one.bin, written once, is as it was.
    assert put(setup, job["id"], "one.bin", b"3" * 4000).status_code == 409
    listed = setup.client.get(f"/api/v1/jobs/{job['id']}/artifacts", headers=setup.user).json()
    assert [(a["path"], a["size"]) for a in listed] == [("one.bin", 3000)]
    with ctx_of(setup.client).db.session() as session:
        assert session.scalar(select(func.count()).select_from(Artifact)) == 1
    objects = stored_objects(setup.client)
    assert [p.name for p in objects] == ["one.bin"]


def test_the_account_page_shows_the_use_and_an_upload_past_it_says_why(setup: Setup) -> None:
    client = setup.client
    assert _upload(client, setup.user, LINE * 30).status_code == 200
    browser = signed_in(client, "dev@example.com")
    page = browser.get("/account").text
    assert 'id="storage-card"' in page and "存储空间" in page
    assert "已用 2.7 KiB，共 4 KiB" in page and f'value="{len(LINE) * 30}"' in page
    refused = console_upload(browser, LINE * 20)
    assert refused.status_code == 413
    assert "存储空间不足：已用 2.7 KiB，共 4 KiB" in refused.text
    browser.get("/lang/en?next=/account")
    english = browser.get("/account").text
    assert "2.7 KiB of 4 KiB used" in english and "Job artifacts" in english
    # Providers keep no files: their page has no such card.
    provider = signed_in(client, "owner@example.com")
    assert 'id="storage-card"' not in provider.get("/account").text


def test_storage_texts_exist_in_both_languages() -> None:
    assert set(STORAGE_MESSAGES["zh"]) == set(STORAGE_MESSAGES["en"])


def test_a_jobs_artifact_refused_by_the_quota_is_named_in_its_result(tmp_path: Path) -> None:
    cloud = CloudProcess(tmp_path / "cloud", free_port(), env={"SXWL_STORAGE_QUOTA_BYTES": str(QUOTA)})
    agent: AgentProcess | None = None
    try:
        provider = Provider(cloud)
        httpx.post(
            f"{cloud.url}/api/v1/auth/register",
            json={"email": "dev@example.com", "password": "correct horse", "role": "user"},
        ).raise_for_status()
        token = httpx.post(
            f"{cloud.url}/api/v1/auth/login", json={"email": "dev@example.com", "password": "correct horse"}
        ).json()["access_token"]
        user = {"Authorization": f"Bearer {token}"}
        # Trusted, so that the job runs where this machine cannot isolate jobs too.
        args = ("--heartbeat-interval", "0.3", "--trust-account", "dev@example.com")
        agent = AgentProcess(cloud.url, tmp_path / "agent", provider.key, *args)
        eventually(lambda: provider.only_cpod("online"), what="the CPod online")
        script = (
            'head -c 10000 /dev/zero > "$SXWL_OUTPUT_DIR/big.bin"; echo fits > "$SXWL_OUTPUT_DIR/small.txt"'
        )
        body = {"name": "quota", "command": script, "gpus_per_node": 0}
        response = httpx.post(f"{cloud.url}/api/v1/jobs", headers=user, json=body)
        assert response.status_code == 201, response.text
        job_id = response.json()["id"]
        done = eventually(
            lambda: (
                (job := httpx.get(f"{cloud.url}/api/v1/jobs/{job_id}", headers=user).json())["state"]
                in ("succeeded", "failed")
                and job
            ),
            timeout=60,
            what="the job to end",
        )
        assert done["state"] == "failed", done
        assert "artifact big.bin refused: storage quota exceeded" in done["reason"], done["reason"]
        listed = httpx.get(f"{cloud.url}/api/v1/jobs/{job_id}/artifacts", headers=user).json()
        assert [a["path"] for a in listed] == ["small.txt"]
    finally:
        if agent is not None:
            agent.stop()
        cloud.stop()
