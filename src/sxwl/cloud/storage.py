"""Where job artifacts live. Local files under the data dir today; an S3-compatible store can
implement the same interface."""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Protocol

MAX_PATH = 1024


def clean_artifact_path(raw: str) -> str:
    """A relative POSIX path inside the job's artifact space; ``..``, absolute paths and the like
    are refused."""
    if not raw or len(raw) > MAX_PATH or "\0" in raw or "\\" in raw:
        raise ValueError("must be a relative path of at most 1024 characters")
    path = PurePosixPath(raw)
    if path.is_absolute() or any(part in ("..", ".", "") for part in raw.split("/")):
        raise ValueError("must be relative and must not contain '..' or '.' segments")
    return str(path)


class TooLarge(Exception):
    pass


class ArtifactStore(Protocol):
    async def put(
        self, job_id: str, path: str, chunks: AsyncIterator[bytes], max_bytes: int
    ) -> tuple[int, str]:
        """Stores the bytes; returns (size, sha256 hex). Raises ``TooLarge`` past ``max_bytes``."""
        ...

    def local_path(self, job_id: str, path: str) -> Path: ...


class LocalArtifactStore:
    def __init__(self, root: Path) -> None:
        self.root = root

    def local_path(self, job_id: str, path: str) -> Path:
        return self.root / job_id / clean_artifact_path(path)

    async def put(
        self, job_id: str, path: str, chunks: AsyncIterator[bytes], max_bytes: int
    ) -> tuple[int, str]:
        target = self.local_path(job_id, path)
        handle, temp = await asyncio.to_thread(_open_temp, target)
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
            await asyncio.to_thread(os.replace, temp, target)  # never a half-written file
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
