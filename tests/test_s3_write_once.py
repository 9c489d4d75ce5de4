"""Writes end when the attempt ends, with the S3 store (docs/object-storage.md), against a real
SeaweedFS and a cloud served on a real socket (SQLite and PostgreSQL): no credential gets a URL for
an ended attempt past the grace or for other bytes at a path the attempt recorded, a URL handed out
earlier cannot replace what was recorded since (the store refuses it: If-None-Match), and a URL
never outlives the window. tests/test_attempt_window.py covers the local store."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from sxwl.cloud.services.jobs.attempt_window import UPLOAD_AFTER_END_S
from sxwl.cloud.storage import AlreadyStored, Artifact
from tests.conftest import MakeSettings
from tests.support.seaweedfs import BUCKET, SeaweedFS
from tests.test_attempt_window import code_of, cpod_put, ended_ago, ft_of, pod_done, pod_input, sha, written
from tests.test_pod_inputs import cloud_on
from tests.test_pod_uploads import Cloud, pod_dir, put, run_uploader
from tests.test_s3_artifacts import announce, done, download, s3_settings, target, upload


@pytest.fixture
def cloud(make_settings: MakeSettings, seaweed: SeaweedFS, tmp_path: Path) -> Iterator[Cloud]:
    with cloud_on(s3_settings(make_settings, seaweed, tmp_path)) as served:
        yield Cloud(served.ft, served.url)


def test_no_url_and_no_put_replaces_a_registered_adapter_and_none_outlives_the_window(
    cloud: Cloud, seaweed: SeaweedFS, tmp_path: Path
) -> None:
    ft = ft_of(cloud)
    fine_tune, assignment = ft.running()
    job_id, token = assignment["job_id"], assignment["upload_token"]
    adapter = os.urandom(100_000)
    forged = os.urandom(len(adapter))
    # A URL for other bytes, handed out before the adapter was recorded: it can only create.
    early = target(cloud, assignment, announce(forged, "adapter.tar")).json()
    assert early["headers"]["If-None-Match"] == "*" and early["expires_in_s"] <= UPLOAD_AFTER_END_S
    upload(cloud, assignment, "adapter.tar", written(tmp_path, adapter, "adapter.tar"))
    assert ft.status(job_id, 1, "succeeded", exit_code=0).status_code == 200
    name = ft.get(fine_tune["id"])["fine_tuned_model"]
    assert code_of(ft.fetch(job_id, "training_file")) == (409, "inputs_closed")  # before any redirect
    assert code_of(pod_input(cloud, assignment, "training_file")) == (409, "inputs_closed")

    late = httpx.put(early["url"], headers=early["headers"], content=forged, timeout=30)
    assert late.status_code == 412 and b"PreconditionFailed" in late.content
    body = announce(forged, "adapter.tar")
    for answer in (
        target(cloud, assignment, body),
        target(cloud, assignment, body, token),
        done(cloud, assignment, body),
        pod_done(cloud, assignment, body),
        cpod_put(cloud, assignment, "adapter.tar", forged),  # an old agent's route through the cloud
    ):
        assert code_of(answer) == (409, "artifact_exists"), answer.text
    # The same bytes again: a URL without the condition, which can write only those bytes.
    again = target(cloud, assignment, announce(adapter, "adapter.tar")).json()
    assert "If-None-Match" not in again["headers"]
    swapped = httpx.put(again["url"], headers=again["headers"], content=forged, timeout=30)
    assert swapped.status_code == 400 and b"BadDigest" in swapped.content
    assert httpx.put(again["url"], headers=again["headers"], content=adapter, timeout=30).status_code == 200
    assert done(cloud, assignment, announce(adapter, "adapter.tar")).status_code == 201

    owners = ft.client.get(f"/api/v1/models/{name}/content", headers=ft.user, follow_redirects=False)
    assert owners.status_code == 307 and httpx.get(owners.headers["location"], timeout=30).content == adapter
    assert (
        httpx.get(download(cloud, job_id, "adapter.tar").headers["location"], timeout=30).content == adapter
    )

    # A final upload within the grace is taken, with a URL that expires when the window closes.
    pod_dir(tmp_path / "pod", token, {"metrics.json": b'{"loss": 0.5}'})
    _, message = run_uploader(tmp_path / "pod", cloud, assignment)
    assert message.startswith("ok: 1 file"), message
    ended_ago(cloud, job_id, UPLOAD_AFTER_END_S - 20)
    near = target(cloud, assignment, announce(b"x", "near.txt"), token).json()
    assert 0 < near["expires_in_s"] <= 20
    ended_ago(cloud, job_id, UPLOAD_AFTER_END_S + 1)
    closed = announce(b"x", "closed.txt")
    for answer in (
        target(cloud, assignment, closed),
        target(cloud, assignment, closed, token),
        put(cloud, assignment, "closed.txt", b"x"),
        done(cloud, assignment, closed),
    ):
        assert code_of(answer) == (409, "upload_closed"), answer.text
    assert cloud.artifacts(job_id).keys() == {"adapter.tar", "metrics.json"}
    keys = seaweed.client().list_objects_v2(Bucket=BUCKET, Prefix=f"{job_id}/")
    assert sorted(o["Key"] for o in keys["Contents"]) == [
        f"{job_id}/1/adapter.tar",
        f"{job_id}/1/metrics.json",
    ]


def test_the_clouds_own_write_once_put_never_replaces_an_object(cloud: Cloud) -> None:
    store = ft_of(cloud).ctx.artifacts
    where = Artifact(os.urandom(16).hex(), 1, "out.bin")  # the server is the session's: a key of its own
    first, other = os.urandom(50_000), os.urandom(50_000)

    def put(data: bytes) -> tuple[int, str]:
        async def chunks() -> AsyncIterator[bytes]:
            yield data

        with ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, store.put(where, chunks(), len(data), once=True)).result()

    assert put(first) == (len(first), sha(first))
    assert put(first) == (len(first), sha(first))  # the same bytes: a repeat
    with pytest.raises(AlreadyStored):
        put(other)
    response = store.download(where, {}, "application/octet-stream")
    assert httpx.get(response.headers["location"], timeout=30).content == first
