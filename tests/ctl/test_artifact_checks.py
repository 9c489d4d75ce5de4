"""What `3kctl artifact verify` and `deploy all` say of an artifact that cannot deploy, before any
host is changed (docs/artifact.md): PARTIAL, damaged, truncated, for another architecture or Python,
a manifest naming a file that is not there, a version the cloud does not accept; and deploy all's
default cloud, the one the artifact came from."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from sxwl.artifactbuild.pack import tar_gz
from sxwl.ctl.artifact import write_checksums
from sxwl.ctl.sample import SAMPLE_CONFIG
from tests.ctl.conftest import Result, run_ctl
from tests.ctl.test_deploy import provider_key
from tests.support.cloud import CloudProcess
from tests.support.net import free_port


def edit_manifest(root: Path, **fields: object) -> None:
    path = root / "manifest.yaml"
    data = yaml.safe_load(path.read_text())
    data.update(fields)
    data["checksums"] = data.pop("checksums")  # last, where write_checksums rewrites them
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def make_partial(root: Path) -> None:
    """What the build leaves when it cannot make bin/kk: no file, no checksum, the reason recorded."""
    (root / "bin" / "kk").unlink()
    reason = "KubeKey v3.1.7 could not be built here: 403 Forbidden"
    edit_manifest(root, build={"partial": True, "missing": [{"path": "bin/kk", "reason": reason}]})
    (root / "PARTIAL.txt").write_text(f"PARTIAL ARTIFACT\n- bin/kk: {reason}\n")
    write_checksums(root)


def deploy(root: Path, tmp_path: Path, key: Path, *extra: str) -> Result:
    config = tmp_path / "conf" / "config-sample.conf"
    config.parent.mkdir(exist_ok=True)
    # The sample's hosts do not exist: a step that dialled them would fail otherwise.
    config.write_text(SAMPLE_CONFIG.replace("/root/.ssh/id_rsa", str(key)))
    return run_ctl("deploy", "all", "-f", str(config), "--artifact", str(root), *extra)


def test_a_partial_artifact_is_reported_partial_never_ok(
    artifact: Path, tmp_path: Path, ssh_key: Path
) -> None:
    make_partial(artifact)
    result = run_ctl("artifact", "verify", str(artifact))
    assert result.rc == 3, result.text
    assert "✗ bin/kk: not in this PARTIAL artifact: KubeKey v3.1.7 could not be built here" in result.out
    assert "PARTIAL artifact 0.1.0: 1 part missing" in result.err and " OK —" not in result.out
    unreachable = f"http://127.0.0.1:{free_port()}"
    refused = deploy(artifact, tmp_path, ssh_key, "--access-key=k", "--cloud", unreachable)
    assert refused.rc == 3, refused.text
    assert "is a PARTIAL artifact (its build could not make bin/kk" in refused.err
    assert "cannot reach" not in refused.err  # stopped before the cloud and any host
    assert not (tmp_path / "conf" / ".3kctl" / "state.json").exists()


def test_an_artifact_for_another_architecture_or_python_is_named(
    artifact: Path, tmp_path: Path, ssh_key: Path
) -> None:
    edit_manifest(artifact, platform="linux/arm64")
    result = run_ctl("artifact", "verify", str(artifact))
    assert result.rc == 1
    assert "this artifact was built for linux/arm64; this host is linux/amd64" in result.out
    refused = deploy(
        artifact, tmp_path, ssh_key, "--access-key=k", "--cloud", f"http://127.0.0.1:{free_port()}"
    )
    assert refused.rc == 1 and "download the artifact for linux/amd64" in refused.err
    edit_manifest(artifact, platform="linux/amd64", python="3.9")
    result = run_ctl("artifact", "verify", str(artifact))
    assert result.rc == 1 and "3kctl was built for CPython 3.9; this is Python 3." in result.out


def test_a_manifest_naming_a_file_that_is_not_there(artifact: Path) -> None:
    manifest = yaml.safe_load((artifact / "manifest.yaml").read_text())
    del manifest["checksums"]["charts/sxwl-agent-0.1.0.tgz"]
    (artifact / "manifest.yaml").write_text(yaml.safe_dump(manifest))
    (artifact / "charts" / "sxwl-agent-0.1.0.tgz").unlink()
    result = run_ctl("artifact", "verify", str(artifact))
    assert result.rc == 1
    assert (
        "✗ charts/sxwl-agent-0.1.0.tgz: named by the manifest but has no checksum and is missing"
        in result.out
    )
    assert "download it again" in result.out


@pytest.mark.parametrize("damage", ["byte", "truncated"])
def test_a_damaged_or_truncated_download_is_named_after_unpacking(
    artifact: Path, tmp_path: Path, ssh_key: Path, damage: str
) -> None:
    # Incompressible, so that half the archive ends inside it (the manifest is packed first).
    (artifact / "bin" / "kubectl").write_bytes(b"kkkkkkkk" + os.urandom(200_000))
    write_checksums(artifact)
    archive = tmp_path / "3k-artifact.tgz"
    tar_gz(artifact, archive, "artifact")
    data = bytearray(archive.read_bytes())
    if damage == "byte":
        # A changed byte in a member's content: gzip's CRC notices only at the end, tar has written it.
        unpacked = tmp_path / "plain.tar"
        subprocess.run(["gzip", "-dc", str(archive)], stdout=unpacked.open("wb"), check=True)
        plain = bytearray(unpacked.read_bytes())
        plain[plain.index(b"kkkkkkkk") + 1000] ^= 0xFF
        unpacked.write_bytes(bytes(plain))
        command = ["tar", "xf", str(unpacked)]
    else:
        archive.write_bytes(bytes(data[: len(data) // 2]))
        command = ["tar", "xzf", str(archive)]
    target = tmp_path / "unpacked"
    target.mkdir()
    subprocess.run(command, cwd=target, check=False, capture_output=True)
    result = run_ctl("artifact", "verify", str(target / "artifact"))
    assert result.rc in (1, 3), result.text
    if damage == "byte":
        assert "✗ bin/kubectl: sha256" in result.out and "download the artifact again" in result.out
    else:
        assert "missing: the artifact is incomplete, download it again" in result.out
        assert "✗ bin/kubectl: sha256" in result.out  # cut inside it


@pytest.fixture(scope="module")
def strict_cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CloudProcess]:
    process = CloudProcess(
        tmp_path_factory.mktemp("cloud"), free_port(), env={"SXWL_ARTIFACT_MIN_VERSION": "0.2.0"}
    )
    yield process
    process.stop()


def test_a_version_the_cloud_does_not_accept_stops_before_any_host(
    artifact: Path, tmp_path: Path, ssh_key: Path, strict_cloud: CloudProcess
) -> None:
    key = provider_key(strict_cloud)
    refused = deploy(artifact, tmp_path, ssh_key, f"--access-key={key}", "--cloud", strict_cloud.url)
    assert refused.rc == 1, refused.text
    assert (
        f"this artifact is version 0.1.0; the cloud at {strict_cloud.url} accepts 0.2.0 or newer"
        in refused.err
    )
    assert f"wget {strict_cloud.url}/downloads/3k-artifact.tgz" in refused.err
    assert not (tmp_path / "conf" / ".3kctl" / "state.json").exists()


def test_deploy_all_dials_the_cloud_the_artifact_came_from(
    artifact: Path, tmp_path: Path, ssh_key: Path, strict_cloud: CloudProcess
) -> None:
    edit_manifest(artifact, version="0.2.0", cloud=strict_cloud.url)
    write_checksums(artifact)
    result = deploy(artifact, tmp_path, ssh_key, f"--access-key={provider_key(strict_cloud)}", "--dry-run")
    assert f"accessKey accepted by {strict_cloud.url}" in result.out, result.text
