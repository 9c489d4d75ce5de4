"""Artifacts as files under the cloud's data dir: the embedded default, for one cloud process (or
replicas sharing that directory); the bytes stream through the cloud both ways.

A job's first attempt (and the cloud's own files and models, attempt 0) keeps the layout stores have
always had, ``<job>/<path>``; a later attempt has a tree of its own, ``<job>.<attempt>/<path>`` (no
job id has a dot: they are 32 hex, or the reserved ``files`` and ``models``), so that no attempt's
write lands on another's file. A write-once put (an attempt's artifact) links its finished file into
place, which fails when the name is taken: nothing already there is ever replaced."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import tempfile
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO

from starlette.responses import FileResponse, Response

from sxwl.cloud.storage import (
    AlreadyStored,
    Artifact,
    NotStored,
    PathConflict,
    UploadTarget,
    clean_artifact_path,
    write_checked,
)


class LocalArtifactStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def _private_root(self) -> None:
        """The store's root is the cloud's own (0700): a job on a CPod that shares this machine (the
        demo of `sxwl up`) must not even list other tenants' jobs and file names."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.root.stat().st_mode & 0o077:
            self.root.chmod(0o700)

    def _file(self, artifact: Artifact) -> Path:
        top = artifact.job_id if artifact.attempt <= 1 else f"{artifact.job_id}.{artifact.attempt}"
        return self.root / top / clean_artifact_path(artifact.path)

    def _stored(self, artifact: Artifact) -> Path:
        """Where a download finds the artifact: a later attempt's, stored before attempts had trees
        of their own, lies in ``<job>/<path>``."""
        own = self._file(artifact)
        if artifact.attempt > 1 and not own.exists():
            return self._file(replace(artifact, attempt=1))
        return own

    async def upload_target(
        self, artifact: Artifact, size: int, sha256: str, within_s: int
    ) -> UploadTarget | None:
        return None

    async def check_uploaded(self, artifact: Artifact, size: int, sha256: str) -> None:
        stored = await asyncio.to_thread(_size_and_sha256, self._file(artifact))
        if stored != (size, sha256):
            raise NotStored(f"{artifact.path} is not stored with size {size} and that sha256")

    def download(self, artifact: Artifact, headers: dict[str, str], media_type: str) -> Response:
        return FileResponse(
            self._stored(artifact),
            media_type=media_type,
            filename=artifact.path.rsplit("/", 1)[-1],
            headers=headers,
        )

    async def read(self, artifact: Artifact, start: int, length: int) -> bytes:
        return await asyncio.to_thread(_read, self._file(artifact), start, length)

    async def delete(self, artifact: Artifact) -> None:
        await asyncio.to_thread(_remove, str(self._file(artifact)))

    async def put(
        self,
        artifact: Artifact,
        chunks: AsyncIterator[bytes],
        max_bytes: int,
        expected_sha256: str | None = None,
        *,
        once: bool = False,
    ) -> tuple[int, str]:
        target = self._file(artifact)
        path = artifact.path
        await asyncio.to_thread(self._private_root)
        try:
            handle, temp = await asyncio.to_thread(_open_temp, target)
        except (FileExistsError, NotADirectoryError):
            raise PathConflict(f"a part of {path} is already an artifact file, not a directory") from None
        placed = False  # renamed into place: no temporary file is left to remove
        try:
            size, digest = await write_checked(chunks, handle, max_bytes, expected_sha256)
            await asyncio.to_thread(handle.close)
            try:
                # Never a half-written file: the finished one is renamed, or linked, into place.
                if once:
                    await asyncio.to_thread(os.link, temp, target)  # never replaces, races included
                else:
                    await asyncio.to_thread(os.replace, temp, target)
                    placed = True
            except OSError as exc:
                if exc.errno not in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST):
                    raise
                if not once or target.is_dir():
                    raise PathConflict(f"{path} is already a directory of artifacts, not a file") from None
                if await asyncio.to_thread(_size_and_sha256, target) != (size, digest):
                    raise AlreadyStored(f"{path} is already stored with other bytes") from None
        finally:
            handle.close()
            if not placed:
                await asyncio.to_thread(_remove, temp)
        return size, digest


def _open_temp(target: Path) -> tuple[BinaryIO, str]:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=".upload-")
    return os.fdopen(fd, "wb"), name


def _remove(name: str) -> None:
    Path(name).unlink(missing_ok=True)


def _read(path: Path, start: int, length: int) -> bytes:
    try:
        with path.open("rb") as handle:
            handle.seek(start)
            return handle.read(length)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        raise NotStored(f"the store holds no {path.name}") from None


def _size_and_sha256(path: Path) -> tuple[int, str] | None:
    digest, size = hashlib.sha256(), 0
    try:
        with path.open("rb") as handle:
            while chunk := handle.read(1024 * 1024):
                digest.update(chunk)
                size += len(chunk)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    return size, digest.hexdigest()
