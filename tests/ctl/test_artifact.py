"""The offline artifact's manifest and checksums, and the self-contained 3kctl zipapp."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sxwl.ctl.artifact import load_manifest
from tests.ctl.conftest import REPO, run_ctl


def test_repository_manifest_is_complete() -> None:
    manifest = load_manifest(REPO / "deploy" / "artifact")
    assert manifest.kubernetes_version.startswith("v1.")
    assert [c.name for c in manifest.charts] == ["node-feature-discovery", "gpu-operator", "sxwl-agent"]
    assert [c.name for c in manifest.ceph] == ["rook-ceph", "rook-ceph-cluster"]
    assert {"3kctl", "kk", "helm", "kubectl"} <= set(manifest.tools)
    assert any(image.startswith("sxwl/sxwl-agent:") for image in manifest.images)
    assert manifest.checksums == {}  # filled by the artifact build, not in the repository


def test_verify_accepts_a_complete_artifact(artifact: Path) -> None:
    result = run_ctl("artifact", "verify", str(artifact))
    assert result.rc == 0, result.text
    assert "artifact 0.1.0 OK — 11 files match manifest.yaml (Kubernetes v1.27.16, 3 charts" in result.out


def test_verify_names_damaged_missing_and_unlisted_files(artifact: Path) -> None:
    (artifact / "charts" / "gpu-operator-v24.9.0.tgz").write_bytes(b"truncated")
    (artifact / "bin" / "helm").unlink()
    (artifact / "notes.txt").write_text("left over\n")
    manifest = yaml.safe_load((artifact / "manifest.yaml").read_text())
    del manifest["checksums"]["bin/kubectl"]
    (artifact / "manifest.yaml").write_text(yaml.safe_dump(manifest))
    result = run_ctl("artifact", "verify", str(artifact))
    assert result.rc == 1
    assert (
        "✗ charts/gpu-operator-v24.9.0.tgz: sha256" in result.out and "damaged or was changed" in result.out
    )
    assert "✗ bin/helm: missing: the artifact is incomplete" in result.out
    assert "✗ bin/kubectl: named by the manifest but has no checksum" in result.out
    assert "⚠ notes.txt: not in the manifest (ignored)" in result.out
    assert "3 problems" in result.err


def test_verify_defaults_to_the_current_folder(artifact: Path, tmp_path: Path) -> None:
    assert run_ctl("artifact", "verify", cwd=artifact).rc == 0
    result = run_ctl("artifact", "verify", cwd=tmp_path)
    assert result.rc == 1 and "is not an unpacked artifact" in result.err


@pytest.fixture(scope="module")
def zipapp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    output = tmp_path_factory.mktemp("dist") / "3kctl"
    subprocess.run(
        [sys.executable, "-m", "sxwl.ctl.zipapp", "-o", str(output)], check=True, capture_output=True
    )
    return output


def stock_python() -> str:
    """A Python of the same minor version outside the venv (Debian's, as on an artifact host)."""
    for candidate in (f"/usr/bin/python{sys.version_info[0]}.{sys.version_info[1]}", "/usr/bin/python3"):
        if os.path.exists(candidate):
            version = subprocess.run(
                [candidate, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True
            ).stdout.strip()
            if version == str(sys.version_info[:2]):
                return candidate
    pytest.skip(f"no system python{sys.version_info[0]}.{sys.version_info[1]} to run the zipapp in isolation")


def test_zipapp_runs_in_a_clean_environment(zipapp: Path, tmp_path: Path) -> None:
    python = stock_python()
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"), "LANG": "C.UTF-8"}
    # -I: no user site, no PYTHON* variables, no current dir on sys.path; nothing of the venv is visible.
    probe = subprocess.run([python, "-I", "-c", "import asyncssh"], env=env, capture_output=True)
    assert probe.returncode != 0, "the stock python must not have asyncssh, or the test proves nothing"
    shutil.copy(zipapp, tmp_path / "3kctl")
    help_ = subprocess.run(
        [python, "-I", "./3kctl", "--help"], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert help_.returncode == 0, help_.stderr
    for command in ("init", "preflight", "deploy", "artifact"):
        assert command in help_.stdout
    init = subprocess.run(
        [python, "-I", "./3kctl", "init"], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert init.returncode == 0, init.stderr
    check = subprocess.run(
        [python, "-I", "./3kctl", "check", "config"], env=env, cwd=tmp_path, capture_output=True, text=True
    )
    assert check.returncode == 2  # the sample names /root/.ssh/id_rsa, which this test does not create
    assert "conf/config-sample.conf:11:" in check.stderr and "run `3kctl ssh setup`" in check.stderr
    assert (tmp_path / "home" / ".cache" / "3kctl").is_dir()  # the compiled parts were unpacked there
    direct = subprocess.run(["./3kctl", "--help"], env=env, cwd=tmp_path, capture_output=True, text=True)
    assert direct.returncode == 0  # executable through its #!/usr/bin/env python3 line
