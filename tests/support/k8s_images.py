"""Container images for the tests' real nodes, built without any registry (docs/k8s-testing.md,
"Images"): `scripts/k8s-test-images.sh` caches the slow bases (pause; Debian with python3 and numpy)
as OCI layouts; `image_with_files` puts repository files on top of a base as one small layer at test
time (an uncompressed tar written here), so changing a file never rebuilds a base. Layouts are
imported into a node's containerd with `ctr images import`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import Any

from tests.support.k8s import REPO

IMAGES_SCRIPT = REPO / "scripts" / "k8s-test-images.sh"
PAUSE_IMAGE = "sxwl.test/pause:1"
PYTHON_IMAGE = "sxwl.test/python:1"
REF_NAME = "org.opencontainers.image.ref.name"
IMAGE_NAME = "io.containerd.image.name"
LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"


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


def _files_key(base: Path, ref: str, entries: list[tuple[str, Path]]) -> str:
    """A key of what the layer would hold, from names, sizes and mtimes: the cache lives in the test
    session's own dir, so nothing but the tests' own checkout can change under it."""
    key = hashlib.sha256(f"{base}|{ref}".encode())
    for dest, path in entries:
        info = path.lstat()
        key.update(f"{dest}\0{info.st_mode}\0{info.st_size}\0{info.st_mtime_ns}\0".encode())
    return key.hexdigest()[:16]


def _entries(files: dict[str, Path]) -> list[tuple[str, Path]]:
    """(path in the image, path here) of every file and folder of ``files``, parents first."""
    entries: list[tuple[str, Path]] = []
    for dest, src in sorted(files.items()):
        top = dest.strip("/")
        entries.append((top, src))
        if src.is_dir():
            for path in sorted(src.rglob("*")):
                if "__pycache__" not in path.relative_to(src).parts:
                    entries.append((f"{top}/{path.relative_to(src).as_posix()}", path))
    return entries


def _parents(entries: list[tuple[str, Path]]) -> list[str]:
    """The folders above the entries that the entries do not name: the layer holds them too, so it
    unpacks onto any base."""
    named = {dest for dest, _ in entries}
    parents = {str(parent) for dest, _ in entries for parent in PurePosixPath(dest).parents}
    return sorted(parents - named - {"."})


def _write_layer(entries: list[tuple[str, Path]], blobs: Path) -> tuple[str, int]:
    """``entries`` as an uncompressed layer tar among ``blobs``: (its digest, its size). Uncompressed,
    because the nodes unpack it at once on the same disk: gzip would cost both ends CPU for nothing."""
    partial = blobs / ".layer.partial"
    with tarfile.open(partial, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in _parents(entries):
            folder = tarfile.TarInfo(name)
            folder.type, folder.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(folder)
        for dest, path in entries:
            info = tar.gettarinfo(str(path), arcname=dest)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            if info.isreg():
                with path.open("rb") as content:
                    tar.addfile(info, content)
            else:
                tar.addfile(info)
    with partial.open("rb") as written:
        digest = hashlib.file_digest(written, "sha256").hexdigest()
    size = partial.stat().st_size
    partial.rename(blobs / digest)
    return f"sha256:{digest}", size


def _put_json(blobs: Path, document: dict[str, Any]) -> tuple[str, int]:
    data = json.dumps(document, separators=(",", ":")).encode()
    digest = hashlib.sha256(data).hexdigest()
    (blobs / digest).write_bytes(data)
    return f"sha256:{digest}", len(data)


def layout_with_files(base: Path, base_ref: str, ref: str, files: dict[str, Path], work: Path) -> Path:
    """A copy of the layout `base` (tag of `base_ref`) whose image `ref` has `files` added as one layer:
    `{destination path in the image: file or folder on the host}`. Cached in `work` by what `files`
    hold (names, sizes, mtimes)."""
    entries = _entries(files)  # one walk of the sources, for the key and for the layer
    layout = work / f"layout-{_files_key(base, ref, entries)}"
    if (layout / "index.json").is_file():
        return layout
    partial = work / f".{layout.name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    # Blobs are content-addressed and never rewritten: link them.
    shutil.copytree(base / "blobs", partial / "blobs", copy_function=os.link)
    blobs = partial / "blobs" / "sha256"
    base_tag, tag = _split(base_ref)[1], _split(ref)[1]
    index = json.loads((base / "index.json").read_text())
    [entry] = [m for m in index["manifests"] if m.get("annotations", {}).get(REF_NAME) == base_tag]
    manifest = json.loads((blobs / _hex(entry["digest"])).read_text())
    config = json.loads((blobs / _hex(manifest["config"]["digest"])).read_text())
    layer, size = _write_layer(entries, blobs)
    # Uncompressed, the layer's digest is also its diff id.
    config["rootfs"]["diff_ids"].append(layer)
    created = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    config.setdefault("history", []).append({"created": created, "created_by": "tests/support/k8s_images.py"})
    config_digest, config_size = _put_json(blobs, config)
    manifest["config"] = {**manifest["config"], "digest": config_digest, "size": config_size}
    manifest["layers"].append({"mediaType": LAYER_TAR, "digest": layer, "size": size})
    manifest_digest, manifest_size = _put_json(blobs, manifest)
    index["manifests"] = [
        {**entry, "digest": manifest_digest, "size": manifest_size, "annotations": {REF_NAME: tag}}
    ]
    (partial / "index.json").write_text(json.dumps(index))
    shutil.copy2(base / "oci-layout", partial / "oci-layout")
    partial.rename(layout)
    return layout


def _hex(digest: str) -> str:
    algorithm, _, value = digest.partition(":")
    if algorithm != "sha256":
        raise ValueError(f"unexpected digest {digest!r}")
    return value


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


def archive_image(archive: Path) -> tuple[str, str]:
    """(the name, the manifest digest) of the one image of an OCI archive, from its index.json."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json") or tar.extractfile("./index.json")
        assert member is not None, f"{archive} has no index.json"
        [entry] = json.loads(member.read())["manifests"]
    annotations = entry.get("annotations", {})
    return annotations.get(IMAGE_NAME) or annotations.get(REF_NAME, ""), str(entry["digest"])


def import_archive(archive: Path, ref: str, containerd_socket: Path) -> str:
    """`ctr images import` of an OCI archive (the artifact's images/*.oci.tar) into the CRI namespace
    of one containerd, then tagged ``ref`` (the name pods ask for); returns the digest containerd
    holds for ``ref``."""
    name, _ = archive_image(archive)
    ctr = ["ctr", f"--address={containerd_socket}", "-n", "k8s.io"]
    for args in (["images", "import", str(archive)], ["images", "tag", "--force", name, ref]):
        if args[1] == "tag" and name == ref:
            continue
        done = subprocess.run([*ctr, *args], capture_output=True, text=True, check=False, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"ctr {' '.join(args)} failed: {done.stderr}{done.stdout}")
    listed = subprocess.run(
        [*ctr, "images", "ls", f"name=={ref}"], capture_output=True, text=True, check=True, timeout=60
    )
    rows = [line.split() for line in listed.stdout.splitlines()[1:] if line.strip()]
    [row] = [r for r in rows if r[0] == ref]
    return row[2]
