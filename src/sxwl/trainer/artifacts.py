"""Tars the trainer writes (checkpoints, the adapter) and the checkpoint tar it resumes from."""

from __future__ import annotations

import os
import tarfile
from pathlib import Path

from sxwl.trainer import TrainerError


def write_tar(source: Path, dest: Path) -> None:
    """``source``'s files at the tar's top level, written under a dot-name beside ``dest`` and
    renamed: whoever watches ``dest``'s directory (the agent uploads checkpoints as they appear)
    only ever sees a complete tar."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(f".{dest.name}.partial")
    with tarfile.open(partial, "w") as tar:
        for path in sorted(source.rglob("*")):
            if path.is_file():
                tar.add(path, arcname=path.relative_to(source).as_posix(), recursive=False)
    with partial.open("rb") as f:
        os.fsync(f.fileno())
    partial.replace(dest)


def unpack(tar_path: Path, dest: Path) -> None:
    """Refuses links, devices and paths outside ``dest`` (the "data" filter)."""
    try:
        with tarfile.open(tar_path) as tar:
            tar.extractall(dest, filter="data")
    except (OSError, tarfile.TarError) as e:
        raise TrainerError(f"resume_from: cannot unpack {tar_path}: {e}") from e
