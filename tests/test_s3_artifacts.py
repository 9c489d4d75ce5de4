"""Artifacts in object storage (docs/object-storage.md), against a real SeaweedFS on loopback and a
cloud served on a real socket (SQLite and PostgreSQL): agents and pod uploaders put the bytes straight
to the store with presigned URLs, downloads redirect to it, and the cloud records only what the store
holds."""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import time
from collections.abc import AsyncIterator, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from sxwl.agent import pod_uploader
from sxwl.agent.client import CloudClient, Unreachable
from sxwl.agent.tenant_files import OutputTree
from sxwl.cloud.app import create_app
from sxwl.cloud.config import Settings
from sxwl.cloud.storage import Artifact
from sxwl.cloud.storage.s3 import S3ArtifactStore
from sxwl.cloud.storage.select import StoreSettingsError, artifact_store
from sxwl.protocol import PROTOCOL_HEADER, paths
from tests.conftest import MakeSettings, login, register
from tests.support.cpods import access_key, register_cpod
from tests.support.seaweedfs import BUCKET, SECRET_KEY, SeaweedFS
from tests.support.served import Served
from tests.test_jobs_api import Setup
from tests.test_pod_uploads import PYTHON, UPLOADER, Cloud, pod_dir, run_uploader

LIMIT = 4 * 1024 * 1024
T = TypeVar("T")


def s3_settings(make_settings: MakeSettings, seaweed: SeaweedFS, tmp_path: Path, **extra: Any) -> Settings:
    return make_settings(
        artifact_max_bytes=LIMIT,
        artifact_store="s3",
        s3_endpoint=seaweed.endpoint,
        s3_bucket=BUCKET,
        s3_credentials_file=seaweed.credentials_file(tmp_path / "s3-credentials"),
        **extra,
    )


@pytest.fixture
def cloud(make_settings: MakeSettings, seaweed: SeaweedFS, tmp_path: Path) -> Iterator[Cloud]:
    settings = s3_settings(make_settings, seaweed, tmp_path)
    app = create_app(settings)
    with Served(app, settings) as served:
        yield Cloud(Setup(TestClient(app)), served.url)


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    # On a thread of its own: the browser tests' Playwright holds the main thread's event loop.
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def upload(cloud: Cloud, assignment: dict[str, Any], path: str, file: Path) -> None:
    async def go() -> None:
        client = CloudClient(cloud.url)
        try:
            with OutputTree(file.parent, os.geteuid()).open(file.name) as opened:
                await client.upload_artifact(
                    cloud.setup.token, assignment["job_id"], assignment["attempt"], path, opened
                )
        finally:
            await client.close()

    run(go())


def download(cloud: Cloud, job_id: str, path: str) -> httpx.Response:
    """The cloud's answer: a redirect to the store, never the bytes themselves."""
    answer: httpx.Response = cloud.setup.client.get(
        f"/api/v1/jobs/{job_id}/artifacts/{path}", headers=cloud.setup.user, follow_redirects=False
    )
    assert answer.status_code == 307, answer.text
    return answer


def announce(data: bytes, path: str = "out.bin") -> dict[str, object]:
    return {"path": path, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def target(
    cloud: Cloud, assignment: dict[str, Any], body: dict[str, object], token: str | None = None
) -> Any:
    job_id, attempt = assignment["job_id"], assignment["attempt"]
    if token is None:
        url = paths.url(paths.UPLOAD_TARGET, job_id=job_id) + f"?attempt={attempt}"
        return cloud.setup.client.post(url, headers=cloud.setup.agent, json=body)
    url = paths.url(paths.POD_UPLOAD_TARGET, job_id=job_id, attempt=attempt)
    return cloud.setup.client.post(
        url, headers={"Authorization": f"Bearer {token}", PROTOCOL_HEADER: "1"}, json=body
    )


def done(cloud: Cloud, assignment: dict[str, Any], body: dict[str, object]) -> Any:
    url = paths.url(paths.UPLOAD_DONE, job_id=assignment["job_id"]) + f"?attempt={assignment['attempt']}"
    return cloud.setup.client.post(url, headers=cloud.setup.agent, json=body)


def test_the_agent_puts_straight_to_the_store_and_downloads_redirect_there(
    cloud: Cloud, seaweed: SeaweedFS, tmp_path: Path
) -> None:
    assignment = cloud.running_attempt()
    job_id = assignment["job_id"]
    model = os.urandom(2 * 1024 * 1024 + 777)  # several of the client's 1 MiB chunks
    (tmp_path / "model.bin").write_bytes(model)
    upload(cloud, assignment, "ckpt/model é.bin", tmp_path / "model.bin")

    assert cloud.artifacts(job_id) == {"ckpt/model é.bin": (len(model), hashlib.sha256(model).hexdigest())}
    key = f"{job_id}/{assignment['attempt']}/ckpt/model é.bin"
    assert seaweed.client().head_object(Bucket=BUCKET, Key=key)["ContentLength"] == len(model)

    redirect = download(cloud, job_id, "ckpt/model%20%C3%A9.bin")
    location = redirect.headers["location"]
    assert location.startswith(seaweed.endpoint + "/") and "X-Amz-Signature=" in location
    got = httpx.get(location, timeout=30)
    assert got.status_code == 200 and got.content == model
    assert got.headers["content-type"] == "application/octet-stream"
    assert got.headers["content-disposition"] == "attachment; filename*=utf-8''model%20%C3%A9.bin"
    # The route checks before it signs: no URL for what the job does not have.
    assert (
        cloud.setup.client.get(f"/api/v1/jobs/{job_id}/artifacts/x", headers=cloud.setup.user).status_code
        == 404
    )


def test_the_pod_uploader_puts_straight_to_the_store(cloud: Cloud, tmp_path: Path) -> None:
    assignment = cloud.running_attempt()
    files = {"ckpt/model.bin": os.urandom(3 * 1024 * 1024 + 5), "metrics.json": b'{"loss": 1.5}'}
    pod_dir(tmp_path, assignment["upload_token"], files)
    finished, message = run_uploader(tmp_path, cloud, assignment)
    assert finished.returncode == 0, finished.stderr
    assert message == f"ok: 2 files ({sum(map(len, files.values()))} bytes) uploaded", finished.stderr
    recorded = {name: (len(data), hashlib.sha256(data).hexdigest()) for name, data in files.items()}
    assert cloud.artifacts(assignment["job_id"]) == recorded
    location = download(cloud, assignment["job_id"], "ckpt/model.bin").headers["location"]
    assert httpx.get(location, timeout=30).content == files["ckpt/model.bin"]


def test_bytes_other_than_announced_are_refused_by_the_store_and_never_recorded(cloud: Cloud) -> None:
    assignment = cloud.running_attempt()
    answer = target(cloud, assignment, announce(b"the announced bytes"))
    assert answer.status_code == 200, answer.text
    other = b"X" * len(b"the announced bytes")  # the signed length, other bytes
    put = httpx.put(answer.json()["url"], headers=answer.json()["headers"], content=other, timeout=30)
    assert put.status_code == 400 and b"BadDigest" in put.content  # the store checks the signed sha256
    refused = done(cloud, assignment, announce(b"the announced bytes"))
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "artifact_not_uploaded"
    assert cloud.artifacts(assignment["job_id"]) == {}


def test_bad_announcements_are_refused_naming_the_field(cloud: Cloud) -> None:
    assignment = cloud.running_attempt()
    too_large = target(cloud, assignment, {"path": "big", "size": LIMIT + 1, "sha256": "0" * 64})
    assert too_large.status_code == 413 and too_large.json()["error"]["details"]["max_bytes"] == LIMIT
    escaping = target(cloud, assignment, {"path": "../x", "size": 1, "sha256": "0" * 64})
    assert escaping.status_code == 422 and escaping.json()["error"]["details"][0]["field"] == "path"
    not_hex = target(cloud, assignment, {"path": "x", "size": 1, "sha256": "xyz"})
    assert not_hex.status_code == 422 and "sha256" in not_hex.text
    assert cloud.artifacts(assignment["job_id"]) == {}


def test_a_wrong_attempt_gets_no_url(cloud: Cloud) -> None:
    assignment = cloud.running_attempt()
    body = announce(b"weights")
    never = target(cloud, {**assignment, "attempt": assignment["attempt"] + 1}, body)
    assert never.status_code == 403 and never.json()["error"]["code"] == "not_your_job"
    # Another CPod's token, and a pod's upload token for another attempt or forged: no URL either.
    register(cloud.setup.client, "other@example.com", "provider")
    key = access_key(cloud.setup.client, login(cloud.setup.client, "other@example.com"))
    other = register_cpod(cloud.setup.client, key, "cluster-other")["cpod_token"]
    job_id, attempt = assignment["job_id"], assignment["attempt"]
    url = paths.url(paths.UPLOAD_TARGET, job_id=job_id) + f"?attempt={attempt}"
    foreign = cloud.setup.client.post(url, headers={"Authorization": f"Bearer {other}"}, json=body)
    assert foreign.status_code == 403 and "url" not in foreign.json()
    wrong = target(cloud, {**assignment, "attempt": attempt + 1}, body, assignment["upload_token"])
    assert wrong.status_code == 403 and wrong.json()["error"]["code"] == "not_your_upload"
    assert target(cloud, assignment, body, "sxup_forged").status_code == 403
    assert target(cloud, assignment, body, assignment["upload_token"]).json()["via"] == "url"
    # Lost and requeued: the old attempt is stale for both credentials.
    assert cloud.setup.status(job_id, attempt, "lost", reason="node died").status_code == 200
    for token in (None, assignment["upload_token"]):
        stale = target(cloud, assignment, body, token)
        assert stale.status_code == 409 and stale.json()["error"]["code"] == "stale_attempt"
    assert done(cloud, assignment, body).status_code == 409
    assert cloud.artifacts(job_id) == {}


# Long enough for an upload "in time" on a loaded machine (1 s was not, once), short enough to wait out.
EXPIRY_S = 3


def test_presigned_urls_expire(make_settings: MakeSettings, seaweed: SeaweedFS, tmp_path: Path) -> None:
    settings = s3_settings(make_settings, seaweed, tmp_path, s3_presign_expiry_s=EXPIRY_S)
    with TestClient(create_app(settings)) as client:
        cloud = Cloud(Setup(client), "")
        assignment = cloud.running_attempt()
        data = b"late bytes"
        answer = target(cloud, assignment, announce(data)).json()
        assert answer["expires_in_s"] == EXPIRY_S
        time.sleep(EXPIRY_S + 1.5)
        late = httpx.put(answer["url"], headers=answer["headers"], content=data, timeout=30)
        assert late.status_code == 403 and b"expired" in late.content.lower()
        assert done(cloud, assignment, announce(data)).status_code == 409
        assert cloud.artifacts(assignment["job_id"]) == {}
        # An upload in time is recorded; the download URL it gets expires as well.
        fresh = target(cloud, assignment, announce(data)).json()
        assert httpx.put(fresh["url"], headers=fresh["headers"], content=data, timeout=30).status_code == 200
        assert done(cloud, assignment, announce(data)).status_code == 201
        location = download(cloud, assignment["job_id"], "out.bin").headers["location"]
        time.sleep(EXPIRY_S + 1.5)
        assert httpx.get(location, timeout=30).status_code == 403


def test_an_unreachable_store_fails_uploads_which_are_retried_and_recorded_once(
    cloud: Cloud, seaweed: SeaweedFS, tmp_path: Path
) -> None:
    assignment = cloud.running_attempt()
    job_id = assignment["job_id"]
    data = os.urandom(100_000)
    (tmp_path / "a.bin").write_bytes(data)
    pod = tmp_path / "pod"
    pod_dir(pod, assignment["upload_token"], {"b.bin": data})
    seaweed.stop()
    try:
        # The upload target asks the store what the key holds (an artifact is written once): 503.
        with pytest.raises(Unreachable, match="HTTP 503"):
            upload(cloud, assignment, "a.bin", tmp_path / "a.bin")
        for refused in (
            target(cloud, assignment, announce(data, "a.bin")),
            done(cloud, assignment, announce(data, "a.bin")),
        ):
            assert (
                refused.status_code == 503 and refused.json()["error"]["code"] == "artifact_store_unavailable"
            )
        assert cloud.artifacts(job_id) == {}
        # The pod's uploader, started while the store is down, retries until it is back.
        (pod / "termination-log").write_text("")
        uploader = subprocess.Popen(
            [PYTHON, "-I", str(UPLOADER)],
            env={
                "PATH": "/usr/bin:/bin",
                "SXWL_UPLOAD_URL": cloud.url,
                "SXWL_JOB_ID": job_id,
                "SXWL_ATTEMPT": str(assignment["attempt"]),
                "SXWL_UPLOAD_TOKEN_FILE": str(pod / "token"),
                "SXWL_SHARED_DIR": str(pod / "sxwl"),
                "SXWL_TERMINATION_LOG": str(pod / "termination-log"),
            },
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(1.5)
        assert uploader.poll() is None and cloud.artifacts(job_id) == {}
    finally:
        seaweed.start()
    _, stderr = uploader.communicate(timeout=60)
    assert (pod / "termination-log").read_text() == f"ok: 1 file ({len(data)} bytes) uploaded", stderr
    upload(cloud, assignment, "a.bin", tmp_path / "a.bin")  # the agent's retry, on its next pass
    upload(cloud, assignment, "a.bin", tmp_path / "a.bin")  # and one more: still one record
    digest = hashlib.sha256(data).hexdigest()
    assert cloud.artifacts(job_id) == {"a.bin": (len(data), digest), "b.bin": (len(data), digest)}


def test_s3_settings_fail_at_start_naming_the_setting(tmp_path: Path) -> None:
    base: dict[str, Any] = {"data_dir": tmp_path, "artifact_store": "s3"}
    with pytest.raises(ValidationError, match="SXWL_S3_BUCKET"):
        Settings.model_validate(base)
    with pytest.raises(ValidationError, match="SXWL_S3_ENDPOINT must be an http"):
        Settings.model_validate({**base, "s3_bucket": "b", "s3_endpoint": "seaweed:8333"})
    settings = Settings.model_validate({**base, "s3_bucket": "b", "s3_endpoint": "http://127.0.0.1:9"})
    with pytest.raises(StoreSettingsError, match="AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"):
        artifact_store(settings, env={})
    broken = tmp_path / "credentials"
    broken.write_text(f"aws_secret_access_key = {SECRET_KEY}\n")  # no [default] section
    with_file = settings.model_copy(update={"s3_credentials_file": broken})
    with pytest.raises(StoreSettingsError, match="SXWL_S3_CREDENTIALS_FILE") as error:
        artifact_store(with_file, env={})
    assert SECRET_KEY not in str(error.value)
    store = artifact_store(settings, env={"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": SECRET_KEY})
    assert SECRET_KEY not in repr(vars(store)) and SECRET_KEY not in repr(settings)


def test_the_uploader_names_the_upload_target_routes_it_cannot_import() -> None:
    target_path = paths.url(paths.POD_UPLOAD_TARGET, job_id="j", attempt=2)
    assert pod_uploader.TARGET_PATH.format(job_id="j", attempt=2) == target_path
    assert pod_uploader.DONE_PATH.format(job_id="j", attempt=2) == paths.url(
        paths.POD_UPLOAD_DONE, job_id="j", attempt=2
    )


def test_what_the_cloud_puts_past_the_threshold_goes_in_parts_each_checked(
    make_settings: MakeSettings, seaweed: SeaweedFS, tmp_path: Path
) -> None:
    store = artifact_store(s3_settings(make_settings, seaweed, tmp_path))
    assert isinstance(store, S3ArtifactStore)
    store.multipart_threshold = store.part_bytes = 5 * 1024 * 1024  # S3's smallest part
    data = os.urandom(12 * 1024 * 1024 + 7)

    async def chunks() -> AsyncIterator[bytes]:
        for start in range(0, len(data), 1024 * 1024):
            yield data[start : start + 1024 * 1024]

    where = Artifact("models", 0, "big/model.tar")
    size, digest = run(store.put(where, chunks(), len(data)))
    assert (size, digest) == (len(data), hashlib.sha256(data).hexdigest())
    client = store._client
    got = client.get_object(Bucket=BUCKET, Key="models/0/big/model.tar")
    assert got["Body"].read() == data
    assert str(got["ETag"]).strip('"').endswith("-3")  # three parts: 5 + 5 + 2 MiB
