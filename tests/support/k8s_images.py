"""Container images for the tests' real nodes, built without any registry (docs/k8s-testing.md,
"Images"): `scripts/k8s-test-images.sh` caches the slow bases (pause; Debian with python3 and numpy)
as OCI layouts; `image_with_files` puts repository files on top of a base as one small layer at test
time, so changing a file never rebuilds a base. Layouts are imported into a node's containerd with
`ctr images import`.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from tests.support.k8s import REPO

IMAGES_SCRIPT = REPO / "scripts" / "k8s-test-images.sh"
PAUSE_IMAGE = "sxwl.test/pause:1"
PYTHON_IMAGE = "sxwl.test/python:1"


class MissingImagesError(RuntimeError):
    pass


def base_layouts() -> dict[str, Path]:
    """The cached base images, `{ref: OCI layout dir}`; fails clearly when one is not built."""
    out = subprocess.run(
        ["bash", str(IMAGES_SCRIPT), "--print-layouts"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    layouts = {ref: Path(path) for ref, path in (line.split(" ", 1) for line in out.stdout.splitlines())}
    missing = [ref for ref, path in layouts.items() if not (path / "index.json").is_file()]
    if missing:
        raise MissingImagesError(
            f"test images not built: {', '.join(missing)}. Run `make k8s-bins` "
            "(scripts/k8s-test-bins.sh, then scripts/k8s-test-images.sh; see docs/k8s-testing.md)."
        )
    return layouts


def _split(ref: str) -> tuple[str, str]:
    repository, _, tag = ref.rpartition(":")
    if not repository or "/" in tag:
        raise ValueError(f"image ref {ref!r} needs a tag (repository:tag)")
    return repository, tag


def _umoci(*args: str) -> None:
    result = subprocess.run(["umoci", *args], capture_output=True, text=True, check=False, timeout=300)
    if result.returncode != 0:
        raise RuntimeError(f"umoci {' '.join(args)} failed: {result.stderr}")


def layout_with_files(base: Path, base_ref: str, ref: str, files: dict[str, Path], work: Path) -> Path:
    """A copy of the layout `base` (tag of `base_ref`) whose image `ref` has `files` added as one layer:
    `{destination path in the image: file or folder on the host}`. Cached in `work` by the content."""
    digest = hashlib.sha256(f"{base}|{ref}".encode())
    for dest, src in sorted(files.items()):
        digest.update(f"{dest}\0".encode())
        for path in sorted([src, *src.rglob("*")] if src.is_dir() else [src]):
            if "__pycache__" in path.parts:
                continue
            digest.update(f"{path.relative_to(src) if src.is_dir() else ''}\0".encode())
            if path.is_file():
                digest.update(path.read_bytes())
    layout = work / f"layout-{digest.hexdigest()[:16]}"
    if (layout / "index.json").is_file():
        return layout
    partial = work / f".{layout.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    # Blobs are content-addressed and never rewritten: link them; umoci rewrites index.json, so copy it.
    shutil.copytree(base, partial, copy_function=os.link)
    for name in ("index.json", "oci-layout"):
        (partial / name).unlink()
        shutil.copy2(base / name, partial / name)
    staging = work / f".{layout.name}.files"
    shutil.rmtree(staging, ignore_errors=True)
    for dest, src in files.items():
        target = staging / dest.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, target)
    base_tag, tag = _split(base_ref)[1], _split(ref)[1]
    for top in sorted(staging.iterdir()):
        _umoci("insert", "--image", f"{partial}:{base_tag}", str(top), "/" + top.name)
    if tag != base_tag:
        _umoci("tag", "--image", f"{partial}:{base_tag}", tag)
        _umoci("rm", "--image", f"{partial}:{base_tag}")
    shutil.rmtree(staging)
    partial.rename(layout)
    return layout


def import_layout(layout: Path, ref: str, containerd_socket: Path) -> None:
    """`ctr images import` of an OCI layout as `ref` into the CRI namespace of one containerd."""
    repository, _ = _split(ref)
    tar = subprocess.Popen(["tar", "-C", str(layout), "-cf", "-", "."], stdout=subprocess.PIPE)
    try:
        result = subprocess.run(
            [
                "ctr",
                f"--address={containerd_socket}",
                "-n",
                "k8s.io",
                "images",
                "import",
                f"--base-name={repository}",
                "-",
            ],
            stdin=tar.stdout,
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )
    finally:
        if tar.stdout is not None:
            tar.stdout.close()
        tar.wait(timeout=60)
    if result.returncode != 0:
        raise RuntimeError(f"ctr images import of {ref} failed: {result.stderr}{result.stdout}")
