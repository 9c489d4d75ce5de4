"""Reproducible archives: the same files give the same bytes, whoever builds them and whenever.
Entries are sorted, owned by 0:0 with no names, dated ``EPOCH``, and modes reduced to 0755/0644; the
gzip header carries no name and no time."""

from __future__ import annotations

import gzip
import io
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

# Zip (the 3kctl zipapp) cannot date before 1980, so every archive uses its first second.
EPOCH = 315532800  # 1980-01-01T00:00:00Z
CHUNK = 1 << 20


def _normal(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = EPOCH
    if info.isdir() or info.mode & 0o111:
        info.mode = 0o755
    else:
        info.mode = 0o644
    return info


def walk(root: Path) -> Iterator[Path]:
    """Every folder and file under root, parents first, in byte order of their paths; but a top-level
    manifest.yaml first, so that a cut download still unpacks it whole and 3kctl names what is missing."""

    def order(path: Path) -> tuple[bool, bytes]:
        relative = path.relative_to(root).as_posix()
        return relative != "manifest.yaml", relative.encode()

    yield from sorted(root.rglob("*"), key=order)


def write_tree(tar: tarfile.TarFile, root: Path, prefix: str) -> None:
    """root's folders and files into tar under ``prefix/`` (no prefix when empty)."""

    def name(path: Path) -> str:
        relative = path.relative_to(root).as_posix()
        return f"{prefix}/{relative}" if prefix else relative

    if prefix:
        tar.addfile(_normal(tar.gettarinfo(str(root), arcname=prefix)))
    for path in walk(root):
        if path.is_symlink():
            raise ValueError(f"{path}: an artifact holds no links")
        info = _normal(tar.gettarinfo(str(path), arcname=name(path)))
        if info.isreg():
            with path.open("rb") as content:
                tar.addfile(info, content)
        else:
            tar.addfile(info)


def gzip_writer(path: Path, level: int = 6) -> tuple[BinaryIO, gzip.GzipFile]:
    raw = path.open("wb")
    return raw, gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=level, mtime=0)


def tar_gz(root: Path, output: Path, prefix: str, level: int = 6) -> None:
    """root as a reproducible .tar.gz, its entries under ``prefix/``."""
    raw, zipped = gzip_writer(output, level)
    with raw, zipped, tarfile.open(fileobj=zipped, mode="w", format=tarfile.GNU_FORMAT) as tar:
        write_tree(tar, root, prefix)


def plain_tar(root: Path, output: Path) -> None:
    with tarfile.open(output, mode="w", format=tarfile.GNU_FORMAT) as tar:
        write_tree(tar, root, "")


def normalise_tgz(path: Path) -> None:
    """Rewrites a .tgz another tool made (``helm package`` dates entries now) reproducibly: the same
    members and contents, sorted, with normal owners, modes and dates."""
    members: list[tuple[tarfile.TarInfo, bytes | None]] = []
    with tarfile.open(path, mode="r:gz") as source:
        for info in source.getmembers():
            handle = source.extractfile(info) if info.isreg() else None
            members.append((info, handle.read() if handle else None))
    members.sort(key=lambda m: m[0].name.encode())
    partial = path.with_name(path.name + ".partial")
    raw, zipped = gzip_writer(partial, 9)
    with raw, zipped, tarfile.open(fileobj=zipped, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for info, data in members:
            info = _normal(info)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    partial.replace(path)
