"""The offline artifact served from an object of the S3 artifact store (SXWL_ARTIFACT_KEY,
docs/artifact.md "Serving"), against the real SeaweedFS of tests/support/seaweedfs.py: its sha256 and
size, resumable, streamed from the store (never held whole in memory), the copy naming this cloud made
once and shared by every replica through the bucket, and the operator's mistakes said clearly."""

from __future__ import annotations

import hashlib
import io
import os
import secrets
import tarfile
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from sxwl.artifactbuild.pack import tar_gz
from sxwl.cloud.app import create_app
from sxwl.cloud.config import Settings
from tests.ctl.conftest import make_artifact, packed_artifact
from tests.support.cloud import test_settings as settings_for  # not collected as a test
from tests.support.net import free_port
from tests.support.seaweedfs import BUCKET, SeaweedFS
from tests.support.served import Served
from tests.test_console_forms import register_form
from tests.test_downloads import manifest_of

URL = "/downloads/3k-artifact.tgz"
MakeClient = Callable[..., TestClient]


@pytest.fixture
def key() -> str:
    """A key of this test's own in the session's bucket."""
    return f"downloads-{secrets.token_hex(4)}/3k-artifact.tgz"


@pytest.fixture
def built(tmp_path: Path) -> Path:
    return packed_artifact(tmp_path)


def s3_settings(seaweed: SeaweedFS, data_dir: Path, **extra: Any) -> Settings:
    """A cloud on the store (SQLite: nothing here touches the database)."""
    return settings_for(
        data_dir,
        f"sqlite:///{data_dir / 'sxwl.db'}",
        artifact_store="s3",
        s3_endpoint=seaweed.endpoint,
        s3_bucket=BUCKET,
        s3_credentials_file=seaweed.credentials_file(data_dir.parent / f"{data_dir.name}.credentials"),
        **extra,
    )


@pytest.fixture
def make_client(seaweed: SeaweedFS, tmp_path: Path) -> Iterator[MakeClient]:
    """A cloud on the store per call, each with a data dir of its own (as replicas on two machines)."""
    clients: list[TestClient] = []

    def make(**extra: Any) -> TestClient:
        data_dir = tmp_path / f"replica-{len(clients)}"
        data_dir.mkdir()
        client = TestClient(create_app(s3_settings(seaweed, data_dir, **extra)))
        client.__enter__()
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture
def remove_keys(seaweed: SeaweedFS, key: str) -> Iterator[None]:
    """The test's object and the copies made of it go with the test."""
    yield
    client = seaweed.client()
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=key):
        for item in page.get("Contents", []):
            client.delete_object(Bucket=BUCKET, Key=item["Key"])


def copies(seaweed: SeaweedFS, key: str) -> dict[str, dict[str, str]]:
    """The served copies beside the operator's object: {key: its metadata}."""
    client = seaweed.client()
    listed = client.list_objects_v2(Bucket=BUCKET, Prefix=f"{key}.served/").get("Contents", [])
    return {o["Key"]: client.head_object(Bucket=BUCKET, Key=o["Key"])["Metadata"] for o in listed}


@pytest.mark.usefixtures("remove_keys")
def test_served_from_the_store_naming_this_cloud_resumable_and_made_once_for_every_replica(
    seaweed: SeaweedFS, make_client: MakeClient, built: Path, key: str
) -> None:
    seaweed.client().upload_file(str(built), BUCKET, key)
    client = make_client(artifact_key=key, public_url="https://cloud.example")
    response = client.get(URL)
    assert response.status_code == 200, response.text
    body = response.content
    digest = hashlib.sha256(body).hexdigest()
    assert response.headers["x-checksum-sha256"] == digest
    assert response.headers["etag"] == f'"{digest}"'
    assert int(response.headers["content-length"]) == len(body)
    assert response.headers["x-artifact-version"] == "0.1.0"
    assert manifest_of(body)["cloud"] == "https://cloud.example"
    # The copy lies beside the operator's object, its sha256 and version in its metadata.
    [(copy, metadata)] = copies(seaweed, key).items()
    assert metadata == {"sha256": digest, "artifact-version": "0.1.0"}
    assert copy.startswith(f"{key}.served/") and copy.endswith(".tgz")

    # Resumable: a HEAD gives the size, a Range the rest, a suffix the end; past the end is 416.
    head = client.head(URL)
    assert head.status_code == 200 and int(head.headers["content-length"]) == len(body)
    assert head.headers["accept-ranges"] == "bytes" and head.content == b""
    part = client.get(URL, headers={"Range": "bytes=100-"})
    assert part.status_code == 206
    assert part.headers["content-range"] == f"bytes 100-{len(body) - 1}/{len(body)}"
    assert body[:100] + part.content == body
    middle = client.get(URL, headers={"Range": "bytes=10-19"})
    assert (middle.status_code, middle.content) == (206, body[10:20])
    tail = client.get(URL, headers={"Range": "bytes=-7"})
    assert (tail.status_code, tail.content) == (206, body[-7:])
    past = client.get(URL, headers={"Range": f"bytes={len(body)}-"})
    assert past.status_code == 416 and past.headers["content-range"] == f"bytes */{len(body)}"
    # An If-Range of other bytes (the artifact changed since the first part): the whole file again.
    stale = client.get(URL, headers={"Range": "bytes=100-", "If-Range": '"' + "0" * 64 + '"'})
    assert (stale.status_code, stale.content) == (200, body)
    again = client.get(URL, headers={"Range": "bytes=100-", "If-Range": f'"{digest}"'})
    assert (again.status_code, again.content) == (206, body[100:])

    assert client.get(URL + ".sha256").text == f"{digest}  3k-artifact.tgz\n"
    assert client.get("/downloads/3k-artifact.json").json() == {
        "name": "3k-artifact.tgz",
        "sha256": digest,
        "size": len(body),
        "version": "0.1.0",
        "cloud": "https://cloud.example",
        "url": "https://cloud.example" + URL,
    }
    # Another replica (its own data dir) finds the copy in the bucket and makes none of its own.
    written = seaweed.client().head_object(Bucket=BUCKET, Key=copy)["LastModified"]
    other = make_client(artifact_key=key, public_url="https://cloud.example")
    assert other.get(URL + ".sha256").text == f"{digest}  3k-artifact.tgz\n"
    assert hashlib.sha256(other.get(URL).content).hexdigest() == digest
    assert list(copies(seaweed, key)) == [copy]
    assert seaweed.client().head_object(Bucket=BUCKET, Key=copy)["LastModified"] == written

    # A new artifact under the same key: a new copy, served at once.
    newer = make_artifact(built.parent / "newer" / "artifact")
    (newer / "conf").mkdir(exist_ok=True)
    (newer / "conf" / "extra.txt").write_text("a later build\n")
    tar_gz(newer, built.parent / "newer.tgz", "artifact")
    seaweed.client().upload_file(str(built.parent / "newer.tgz"), BUCKET, key)
    renewed = client.get(URL)
    assert renewed.headers["x-checksum-sha256"] != digest
    with tarfile.open(fileobj=io.BytesIO(renewed.content), mode="r:gz") as tar:
        assert "artifact/conf/extra.txt" in tar.getnames()
    assert len(copies(seaweed, key)) == 2


@pytest.mark.usefixtures("remove_keys")
def test_without_a_public_url_the_operators_object_is_served_as_it_is(
    seaweed: SeaweedFS, make_client: MakeClient, built: Path, key: str
) -> None:
    seaweed.client().upload_file(str(built), BUCKET, key)
    client = make_client(artifact_key=key)
    whole = client.get(URL)
    assert whole.status_code == 200
    assert whole.content == built.read_bytes()
    assert whole.headers["x-checksum-sha256"] == hashlib.sha256(built.read_bytes()).hexdigest()
    part = client.get(URL, headers={"Range": "bytes=5-"})
    assert (part.status_code, part.content) == (206, built.read_bytes()[5:])
    assert copies(seaweed, key) == {}  # nothing written to the bucket
    # The console shows the download, and the command gives --cloud (the object names no cloud).
    register_form(client)
    key_of_provider = client.get("/api/v1/me/access-key").json()["access_key"]
    compute = client.get("/compute").text
    assert "wget http://testserver/downloads/3k-artifact.tgz" in compute
    assert f"deploy all --access-key={key_of_provider} --cloud http://testserver</pre>" in compute


@pytest.mark.usefixtures("remove_keys")
def test_a_download_streams_from_the_store_never_held_whole(
    seaweed: SeaweedFS, tmp_path: Path, built: Path, key: str
) -> None:
    """An artifact of 48 MiB (random bytes: gzip cannot shrink them) through a real server, with every
    Python allocation traced: far less than the artifact is ever held at once."""
    root = make_artifact(tmp_path / "big" / "artifact")
    (root / "images" / "big.bin").write_bytes(os.urandom(48 * 1024 * 1024))
    big = tmp_path / "big.tgz"
    tar_gz(root, big, "artifact")
    seaweed.client().upload_file(str(big), BUCKET, key)
    data_dir = tmp_path / "server"
    data_dir.mkdir()
    settings = s3_settings(seaweed, data_dir, artifact_key=key)
    digest = hashlib.sha256()
    with Served(create_app(settings), settings) as served:
        # The first answer reads the object through once for its sha256: also streamed.
        tracemalloc.start()
        try:
            sums = httpx.get(f"{served.url}{URL}.sha256", timeout=60)
            with httpx.stream("GET", f"{served.url}{URL}", timeout=60) as response:
                assert response.status_code == 200
                for chunk in response.iter_bytes():
                    digest.update(chunk)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    assert digest.hexdigest() == hashlib.sha256(big.read_bytes()).hexdigest()
    assert sums.text.split()[0] == digest.hexdigest()
    assert peak < 16 * 1024 * 1024, f"{peak} bytes held at once for a {big.stat().st_size}-byte artifact"


@pytest.mark.usefixtures("remove_keys")
def test_a_missing_key_a_non_artifact_and_an_unreachable_store_are_said(
    seaweed: SeaweedFS, make_client: MakeClient, key: str, tmp_path: Path
) -> None:
    client = make_client(artifact_key=key)
    for path in (URL, URL + ".sha256", "/downloads/3k-artifact.json"):
        missing = client.get(path)
        assert missing.status_code == 404, path
        error = missing.json()["error"]
        assert error["code"] == "no_artifact"
        assert f"SXWL_ARTIFACT_KEY names {key}, which the bucket {BUCKET} does not hold" in error["message"]
        assert f"aws s3 cp dist/3k-artifact.tgz s3://{BUCKET}/{key}" in error["message"]
    assert client.head(URL).status_code == 404
    seaweed.client().put_object(Bucket=BUCKET, Key=key, Body=b"not a tarball")
    broken = client.get(URL)
    assert broken.status_code == 503 and broken.json()["error"]["code"] == "bad_artifact"
    assert key in broken.json()["error"]["message"]

    data_dir = tmp_path / "nowhere"
    data_dir.mkdir()
    nowhere = s3_settings(seaweed, data_dir, artifact_key=key)
    nowhere = nowhere.model_copy(update={"s3_endpoint": f"http://127.0.0.1:{free_port()}"})
    with TestClient(create_app(nowhere)) as unreachable:
        answer = unreachable.get(URL)
    assert answer.status_code == 503
    assert answer.json()["error"]["code"] == "artifact_store_unavailable"


def test_artifact_key_settings_fail_at_start_naming_the_setting(tmp_path: Path) -> None:
    s3: dict[str, Any] = {"data_dir": tmp_path, "artifact_store": "s3", "s3_bucket": "b"}
    with pytest.raises(ValidationError, match="SXWL_ARTIFACT_KEY names an object in the S3 artifact store"):
        Settings.model_validate({"data_dir": tmp_path, "artifact_key": "downloads/3k-artifact.tgz"})
    with pytest.raises(ValidationError, match="set SXWL_ARTIFACT_FILE or SXWL_ARTIFACT_KEY, not both"):
        Settings.model_validate({**s3, "artifact_key": "a.tgz", "artifact_file": tmp_path / "a.tgz"})
    for bad in ("/downloads/a.tgz", "downloads/", "a//b.tgz", "a\nb.tgz", "k" * 901):
        with pytest.raises(ValidationError, match="SXWL_ARTIFACT_KEY must be an object key"):
            Settings.model_validate({**s3, "artifact_key": bad})
    settings = Settings.model_validate({**s3, "artifact_key": "downloads/3k-artifact.tgz"})
    assert settings.artifact_served
