"""The artifact build's reproducibility (docs/artifact.md, "Building"): the same files give the same
archive whoever owns them and whenever they were written; the 3kctl zipapp likewise. The whole
`make artifact` is too slow for the suite (Go builds, the agent's image): bench/artifact.py runs it."""

from __future__ import annotations

import hashlib
import os
import tarfile
from pathlib import Path

from sxwl.artifactbuild.image import qualified
from sxwl.artifactbuild.pack import normalise_tgz, tar_gz
from sxwl.ctl import zipapp
from tests.ctl.conftest import make_artifact


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_same_files_pack_to_the_same_bytes(tmp_path: Path) -> None:
    first = make_artifact(tmp_path / "one" / "artifact")
    second = make_artifact(tmp_path / "two" / "artifact")
    # Other times, modes and creation order: none of it may show in the archive.
    for path in second.rglob("*"):
        os.utime(path, (1_700_000_000, 1_700_000_000))
    (second / "bin" / "helm").chmod(0o700)
    (first / "bin" / "helm").chmod(0o755)
    tar_gz(first, tmp_path / "one.tgz", "artifact")
    tar_gz(second, tmp_path / "two.tgz", "artifact")
    assert digest(tmp_path / "one.tgz") == digest(tmp_path / "two.tgz")
    with tarfile.open(tmp_path / "one.tgz") as tar:
        members = tar.getmembers()
    assert members[0].name == "artifact" and members[1].name == "artifact/manifest.yaml"
    assert {(m.uid, m.gid, m.uname, m.gname, m.mtime) for m in members} == {(0, 0, "", "", 315532800)}
    assert next(m for m in members if m.name == "artifact/bin/helm").mode == 0o755
    assert next(m for m in members if m.name == "artifact/bin").mode == 0o755
    assert next(m for m in members if m.name.endswith(".tgz")).mode == 0o644


def test_another_tools_tgz_is_made_reproducible(tmp_path: Path) -> None:
    """helm package dates its entries now; normalised, two packagings are one file."""
    chart = tmp_path / "chart"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: c\nversion: 0.1.0\n")
    made: list[Path] = []
    for when in (1_600_000_000, 1_700_000_000):
        for path in [chart, *chart.rglob("*")]:
            os.utime(path, (when, when))
        out = tmp_path / f"c-{when}.tgz"
        with tarfile.open(out, "w:gz") as tar:
            tar.add(chart, arcname="c")
        assert len({digest(p) for p in [out, *made]}) == len(made) + 1  # they differ before
        normalise_tgz(out)
        made.append(out)
    assert digest(made[0]) == digest(made[1])


def test_the_3kctl_zipapp_builds_to_the_same_bytes(tmp_path: Path) -> None:
    one = zipapp.build(tmp_path / "a" / "3kctl")
    # A source file touched since: the same bytes all the same.
    os.utime(Path(zipapp.__file__).parent / "artifact.py")
    two = zipapp.build(tmp_path / "b" / "3kctl")
    assert digest(one) == digest(two)


def test_the_agent_images_archive_records_the_name_kubernetes_looks_up() -> None:
    """`ctr images import` records the archive's io.containerd.image.name as it is, and the CRI
    finds an image only by its normalised name (tests/k8s/test_artifact_agent.py imports one)."""
    assert qualified("sxwl/sxwl-agent:0.1.0") == "docker.io/sxwl/sxwl-agent:0.1.0"
    assert qualified("busybox:1.36") == "docker.io/library/busybox:1.36"
    for named in ("dockerhub.kubekey.local/kubesphereio/sxwl-agent:0.1.0", "localhost:5000/a/b:1"):
        assert qualified(named) == named
