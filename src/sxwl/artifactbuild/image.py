"""The agent's image as an OCI archive, built offline as the test images are (docs/k8s-testing.md,
"Images"): the cached Debian base with python3 (scripts/k8s-test-images.sh) plus one layer holding the
project's package and the installed distributions it runs on, copied from this virtualenv (its
CPython must be the base's, 3.11) into Debian's dist-packages, and an ``sxwl-agent`` launcher.
deploy/docker/agent.Dockerfile is the image for a registry; this one holds the same packages."""

from __future__ import annotations

import gzip
import hashlib
import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

from packaging.requirements import Requirement

from sxwl.artifactbuild.pack import plain_tar, write_tree
from sxwl.artifactbuild.parts import Missing

IMAGES_SCRIPT = Path("scripts/k8s-test-images.sh")
BASE_REF = "sxwl.test/python:1"
BASE_PYTHON = (3, 11)
DIST_PACKAGES = "usr/local/lib/python3.11/dist-packages"
LAUNCHER = "#!/usr/bin/python3\nimport sys\n\nfrom sxwl.agent.main import main\n\nsys.exit(main())\n"
REF_NAME = "org.opencontainers.image.ref.name"
IMAGE_NAME = "io.containerd.image.name"
CREATED = "1980-01-01T00:00:00Z"


def qualified(image: str) -> str:
    """The full name `ctr images import` must record: Kubernetes' CRI looks an image up by its
    normalised name (``sxwl/sxwl-agent:0.1.0`` is ``docker.io/sxwl/sxwl-agent:0.1.0``), and an image
    imported under the short one fails every pod that asks for it ("image not found"), even under
    another tag."""
    first, _, rest = image.partition("/")
    if not rest:
        return f"docker.io/library/{image}"
    if "." in first or ":" in first or first == "localhost":
        return image
    return f"docker.io/{image}"


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def distributions() -> list[importlib.metadata.Distribution]:
    """sxwl and the installed distributions it needs at run time (no extras)."""
    found: dict[str, importlib.metadata.Distribution] = {}
    todo = [Requirement(r) for r in importlib.metadata.requires("sxwl") or []]
    todo = [r for r in todo if r.marker is None or r.marker.evaluate({"extra": ""})]
    while todo:
        requirement = todo.pop()
        if _key(requirement.name) in found:
            continue
        dist = importlib.metadata.distribution(requirement.name)
        found[_key(requirement.name)] = dist
        needs = [Requirement(r) for r in dist.requires or []]
        todo += [r for r in needs if r.marker is None or r.marker.evaluate({"extra": ""})]
    return [found[k] for k in sorted(found)]


def _stage(repo: Path, stage: Path) -> None:
    site = Path(sysconfig.get_paths()["purelib"])
    target = stage / DIST_PACKAGES
    target.mkdir(parents=True)
    shutil.copytree(repo / "src" / "sxwl", target / "sxwl", ignore=shutil.ignore_patterns("__pycache__"))
    for dist in distributions():
        for entry in {
            f.parts[0] for f in dist.files or [] if f.parts and f.parts[0] not in ("..", "__pycache__")
        }:
            source = site / entry
            if source.is_dir():
                shutil.copytree(source, target / entry, ignore=shutil.ignore_patterns("__pycache__"))
            elif source.is_file():
                shutil.copyfile(source, target / entry)
    launcher = stage / "usr" / "local" / "bin" / "sxwl-agent"
    launcher.parent.mkdir(parents=True)
    launcher.write_text(LAUNCHER)
    launcher.chmod(0o755)


def _blob(blobs: Path, data: bytes) -> tuple[str, int]:
    digest = hashlib.sha256(data).hexdigest()
    (blobs / digest).write_bytes(data)
    return f"sha256:{digest}", len(data)


def _layer(stage: Path, blobs: Path) -> tuple[str, str, int]:
    """stage as a gzip layer: (diff id, digest, size)."""
    tar_path = blobs.parent / "layer.tar"
    with tarfile.open(tar_path, mode="w", format=tarfile.GNU_FORMAT) as tar:
        write_tree(tar, stage, "")
    with tar_path.open("rb") as handle:
        diff_id = hashlib.file_digest(handle, "sha256").hexdigest()
    gz_path = blobs.parent / "layer.tar.gz"
    with (
        tar_path.open("rb") as source,
        gz_path.open("wb") as raw,
        gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=6, mtime=0) as zipped,
    ):
        shutil.copyfileobj(source, zipped, 1 << 20)
    tar_path.unlink()
    with gz_path.open("rb") as handle:
        digest = hashlib.file_digest(handle, "sha256").hexdigest()
    size = gz_path.stat().st_size
    gz_path.replace(blobs / digest)
    return f"sha256:{diff_id}", f"sha256:{digest}", size


def base_layout(repo: Path) -> Path | str:
    """The cached Debian base's OCI layout, or why there is none."""
    out = subprocess.run(
        ["bash", str(repo / IMAGES_SCRIPT), "--print-layouts"], capture_output=True, text=True, check=False
    )
    layouts = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    layout = Path(layouts.get(BASE_REF, "/nonexistent"))
    if not (layout / "index.json").is_file():
        return f"the Debian base {BASE_REF} is not built: run `make k8s-bins` (scripts/k8s-test-images.sh)"
    return layout


def agent_archive(repo: Path, image: str, root: Path, name: str, arch: str) -> tuple[Path, str] | Missing:
    """``image`` (e.g. sxwl/sxwl-agent:0.1.0) as the OCI archive root/name: (its path, manifest digest)."""
    if arch != "amd64":
        return Missing(name, f"the offline base image is built for amd64 only; no {arch} agent image here")
    if sys.version_info[:2] != BASE_PYTHON:
        return Missing(name, f"the agent image copies this venv's packages into Debian's Python 3.11; "
                       f"this is Python {sys.version_info[0]}.{sys.version_info[1]}")  # fmt: skip
    base = base_layout(repo)
    if isinstance(base, str):
        return Missing(name, base)
    work = root.parent / ".image"
    shutil.rmtree(work, ignore_errors=True)
    layout, stage = work / "layout", work / "stage"
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    try:
        index = json.loads((base / "index.json").read_text())
        entry = index["manifests"][0]
        manifest = json.loads((base / "blobs" / "sha256" / entry["digest"][7:]).read_text())
        config = json.loads((base / "blobs" / "sha256" / manifest["config"]["digest"][7:]).read_text())
        for layer in manifest["layers"]:
            shutil.copyfile(base / "blobs" / "sha256" / layer["digest"][7:], blobs / layer["digest"][7:])
        _stage(repo, stage)
        diff_id, digest, size = _layer(stage, blobs)
        config["created"] = CREATED
        config["rootfs"]["diff_ids"].append(diff_id)
        config["config"].update(
            Entrypoint=["sxwl-agent"], Cmd=["--runtime", "kubernetes"], User="10001:10001"
        )
        config["history"] = [
            {"created": CREATED, "created_by": f"{IMAGES_SCRIPT}: {BASE_REF}"},
            {"created": CREATED, "created_by": "sxwl.artifactbuild.image: sxwl and its packages"},
        ]
        config_digest, config_size = _blob(blobs, json.dumps(config, sort_keys=True).encode())
        manifest["config"] = {**manifest["config"], "digest": config_digest, "size": config_size}
        manifest["layers"].append(
            {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": digest, "size": size}
        )
        manifest_digest, manifest_size = _blob(blobs, json.dumps(manifest, sort_keys=True).encode())
        tag = image.rpartition(":")[2]
        annotations = {REF_NAME: tag, IMAGE_NAME: qualified(image)}
        index["manifests"] = [
            {**entry, "digest": manifest_digest, "size": manifest_size, "annotations": annotations}
        ]
        (layout / "index.json").write_text(json.dumps(index, sort_keys=True))
        (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        plain_tar(layout, target)
        return target, manifest_digest
    finally:
        shutil.rmtree(work, ignore_errors=True)
