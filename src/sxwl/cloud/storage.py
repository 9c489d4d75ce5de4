"""Where job artifacts live. Local files under the data dir today; an S3-compatible store can
implement the same interface."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Protocol

MAX_PATH = 1024  # bytes of UTF-8, well inside PATH_MAX (4096) with the store's root in front
MAX_SEGMENT = 255  # NAME_MAX of the file systems the store runs on


def clean_artifact_path(raw: str) -> str:
    """A relative POSIX path inside the job's artifact space; ``..``, absolute paths and the like
    are refused, and so are names the file system could not hold."""
    encoded = raw.encode("utf-8", "replace")
    if not raw or len(encoded) > MAX_PATH or "\0" in raw or "\\" in raw:
        raise ValueError(f"must be a relative path of at most {MAX_PATH} bytes")
    path = PurePosixPath(raw)
    if path.is_absolute() or any(part in ("..", ".", "") for part in raw.split("/")):
        raise ValueError("must be relative and must not contain '..' or '.' segments")
    if any(len(part) > MAX_SEGMENT for part in encoded.split(b"/")):
        raise ValueError(f"each part of the path must be at most {MAX_SEGMENT} bytes")
    return str(path)


class TooLarge(Exception):
    pass


class DigestMismatch(Exception):
    """The bytes received are not those the uploader hashed: nothing was stored."""

    def __init__(self, received: str) -> None:
        super().__init__(received)
        self.received = received


class PathConflict(Exception):
    """The path needs a directory where the job already stored a file, or the reverse."""


class ArtifactStore(Protocol):
    async def put(
        self,
        job_id: str,
        path: str,
        chunks: AsyncIterator[bytes],
        max_bytes: int,
        expected_sha256: str | None = None,
    ) -> tuple[int, str]:
        """Stores the bytes; returns (size, sha256 hex). Raises ``TooLarge`` past ``max_bytes`` and
        ``DigestMismatch`` when their sha256 is not ``expected_sha256``, storing nothing (an earlier
        upload of the path stays as it was)."""
        ...

    def local_path(self, job_id: str, path: str) -> Path: ...


class LocalArtifactStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def _private_root(self) -> None:
        """The store's root is the cloud's own (0700): a job on a CPod that shares this machine (the
        demo of `sxwl up`) must not even list other tenants' jobs and file names."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.root.stat().st_mode & 0o077:
            self.root.chmod(0o700)

    def local_path(self, job_id: str, path: str) -> Path:
        return self.root / job_id / clean_artifact_path(path)

    async def put(
        self,
        job_id: str,
        path: str,
        chunks: AsyncIterator[bytes],
        max_bytes: int,
        expected_sha256: str | None = None,
    ) -> tuple[int, str]:
        target = self.local_path(job_id, path)
        await asyncio.to_thread(self._private_root)
        try:
            handle, temp = await asyncio.to_thread(_open_temp, target)
        except (FileExistsError, NotADirectoryError):
            raise PathConflict(f"a part of {path} is already an artifact file, not a directory") from None
        digest = hashlib.sha256()
        size = 0
        try:
            async for chunk in chunks:
                size += len(chunk)
                if size > max_bytes:
                    raise TooLarge
                digest.update(chunk)
                await asyncio.to_thread(handle.write, chunk)
            await asyncio.to_thread(handle.close)
            if expected_sha256 is not None and digest.hexdigest() != expected_sha256:
                raise DigestMismatch(digest.hexdigest())
            try:
                await asyncio.to_thread(os.replace, temp, target)  # never a half-written file
            except OSError as exc:
                if exc.errno not in (errno.EISDIR, errno.ENOTEMPTY, errno.EEXIST):
                    raise
                raise PathConflict(f"{path} is already a directory of artifacts, not a file") from None
        except BaseException:
            handle.close()
            await asyncio.to_thread(_remove, temp)
            raise
        return size, digest.hexdigest()


def _open_temp(target: Path) -> tuple[BinaryIO, str]:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=".upload-")
    return os.fdopen(fd, "wb"), name


def _remove(name: str) -> None:
    Path(name).unlink(missing_ok=True)
