"""The offline artifact served at /downloads/3k-artifact.tgz (docs/artifact.md, "Serving"): the
operator's file with the cloud's URL written into its manifest, its sha256 and size, resumable, and
the console's commands naming it."""

from __future__ import annotations

import hashlib
import io
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient

from sxwl.cloud.web.kit import LANG_COOKIE
from tests.ctl.conftest import packed_artifact
from tests.test_console_forms import register_form

URL = "/downloads/3k-artifact.tgz"


@pytest.fixture
def built(tmp_path: Path) -> Path:
    return packed_artifact(tmp_path)


def manifest_of(data: bytes) -> dict[str, object]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        member = tar.extractfile("artifact/manifest.yaml")
        assert member is not None
        loaded: dict[str, object] = yaml.safe_load(member.read())
        return loaded


def test_the_artifact_is_served_with_this_clouds_url_its_sha256_and_size(
    make_client: Callable[..., TestClient], built: Path
) -> None:
    client = make_client(artifact_file=built, public_url="https://cloud.example")
    response = client.get(URL)
    assert response.status_code == 200
    body = response.content
    digest = hashlib.sha256(body).hexdigest()
    assert response.headers["x-checksum-sha256"] == digest
    assert response.headers["etag"] == f'"{digest}"'
    assert int(response.headers["content-length"]) == len(body)
    assert response.headers["x-artifact-version"] == "0.1.0"
    manifest = manifest_of(body)
    assert manifest["cloud"] == "https://cloud.example"
    # Everything but the manifest is the operator's file, byte for byte.
    with tarfile.open(built, "r:gz") as source, tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as served:
        assert source.getnames() == served.getnames()
        for name in source.getnames():
            if name != "artifact/manifest.yaml" and source.getmember(name).isreg():
                original, copy = source.extractfile(name), served.extractfile(name)
                assert original is not None and copy is not None and original.read() == copy.read()
    assert client.get(URL + ".sha256").text == f"{digest}  3k-artifact.tgz\n"
    summary = client.get("/downloads/3k-artifact.json").json()
    assert summary == {
        "name": "3k-artifact.tgz",
        "sha256": digest,
        "size": len(body),
        "version": "0.1.0",
        "cloud": "https://cloud.example",
        "url": "https://cloud.example" + URL,
    }
    # The same file and URL give the same bytes (every replica serves the same sha256).
    again = make_client(artifact_file=built, public_url="https://cloud.example")
    assert hashlib.sha256(again.get(URL).content).hexdigest() == digest


def test_a_download_resumes_and_head_answers_the_size(
    make_client: Callable[..., TestClient], built: Path
) -> None:
    client = make_client(artifact_file=built)
    whole = client.get(URL).content
    head = client.head(URL)
    assert head.status_code == 200 and int(head.headers["content-length"]) == len(whole)
    assert head.content == b""
    part = client.get(URL, headers={"Range": f"bytes=100-{len(whole) - 1}"})
    assert part.status_code == 206
    assert part.headers["content-range"] == f"bytes 100-{len(whole) - 1}/{len(whole)}"
    assert whole[:100] + part.content == whole
    # No public URL: the operator's file as it is, never a URL from the request's Host header.
    assert whole == built.read_bytes()
    assert client.get(URL, headers={"Host": "elsewhere.example"}).content == whole


def test_no_artifact_configured_or_a_broken_one_is_said(
    make_client: Callable[..., TestClient], tmp_path: Path
) -> None:
    none = make_client().get(URL)
    assert none.status_code == 404
    assert "SXWL_ARTIFACT_FILE" in none.json()["error"]["message"]
    missing = make_client(artifact_file=tmp_path / "gone.tgz").get(URL)
    assert missing.status_code == 404 and "gone.tgz" in missing.json()["error"]["message"]
    broken = tmp_path / "broken.tgz"
    broken.write_bytes(b"not a tarball")
    answer = make_client(artifact_file=broken).get(URL + ".sha256")
    assert answer.status_code == 503
    assert answer.json()["error"]["code"] == "bad_artifact"


def test_compute_and_account_pages_show_the_download_and_deploy_commands(
    make_client: Callable[..., TestClient], built: Path
) -> None:
    client = make_client(artifact_file=built)
    register_form(client)
    key = client.get("/api/v1/me/access-key").json()["access_key"]
    compute = client.get("/compute").text
    assert "wget http://testserver/downloads/3k-artifact.tgz" in compute
    # No public URL: the served artifact names no cloud, so the command gives it.
    assert f"sudo ./3kctl deploy all --access-key={key} --cloud http://testserver</pre>" in compute
    account = client.get("/account").text
    assert "wget http://testserver/downloads/3k-artifact.tgz\ntar xf 3k-artifact.tgz" in account
    assert "sudo ./3kctl deploy all --access-key=&lt;accessKey&gt; --cloud http://testserver</pre>" in account
    named = make_client(
        artifact_file=built, public_url="http://cloud.example"
    )  # http: its cookies reach testserver
    register_form(named, email="named@example.com")
    key = named.get("/api/v1/me/access-key").json()["access_key"]
    # The served artifact names this cloud: no --cloud needed.
    assert f"sudo ./3kctl deploy all --access-key={key}</pre>" in named.get("/compute").text
    assert "下载离线安装包并部署" in account
    client.cookies.set(LANG_COOKIE, "en")
    assert "download the offline package and deploy" in client.get("/account").text
    assert "Download and unpack the offline package" in client.get("/compute").text
