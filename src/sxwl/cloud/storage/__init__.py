"""Where job artifacts live: local files under the data dir (the embedded default) or an
S3-compatible bucket (docs/object-storage.md). Routes talk to the ``ArtifactStore`` interface only."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import BinaryIO, Protocol, runtime_checkable

from starlette.responses import Response

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


class AlreadyStored(Exception):
    """A write-once put or upload target found other bytes at the address: nothing was changed."""


class StoreUnavailable(Exception):
    """The object store did not answer (or answered 5xx): the caller may try again later."""


class NotStored(Exception):
    """The object an uploader says it put is missing, or is not the bytes it claimed."""


async def write_checked(
    chunks: AsyncIterator[bytes], handle: BinaryIO | None, max_bytes: int, expected_sha256: str | None
) -> tuple[int, str]:
    """Writes streamed bytes to ``handle`` (in a thread, off the event loop; with None, only reads
    them); returns their size and sha256. ``TooLarge`` past ``max_bytes``, ``DigestMismatch`` when
    they hash otherwise than expected: the caller then discards what was written."""
    digest = hashlib.sha256()
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > max_bytes:
            raise TooLarge
        digest.update(chunk)
        if handle is not None:
            await asyncio.to_thread(handle.write, chunk)
    if expected_sha256 is not None and digest.hexdigest() != expected_sha256:
        raise DigestMismatch(digest.hexdigest())
    return size, digest.hexdigest()


@dataclass(frozen=True)
class Artifact:
    """One artifact as the store addresses it: the attempt is part of the address, so a late upload
    of a stale attempt can never overwrite what the current one stored, and an attempt's artifacts
    are written once (``once``), so nothing can overwrite what it recorded."""

    job_id: str
    attempt: int
    path: str


@dataclass(frozen=True)
class UploadTarget:
    """Where an uploader puts the bytes itself: a presigned URL and the headers it must send."""

    url: str
    headers: dict[str, str] = field(default_factory=dict)
    expires_in_s: int = 0


class ArtifactStore(Protocol):
    async def put(
        self,
        artifact: Artifact,
        chunks: AsyncIterator[bytes],
        max_bytes: int,
        expected_sha256: str | None = None,
        *,
        once: bool = False,
    ) -> tuple[int, str]:
        """Stores bytes streamed through the cloud; returns (size, sha256 hex). Raises ``TooLarge``
        past ``max_bytes`` and ``DigestMismatch`` when their sha256 is not ``expected_sha256``,
        storing nothing (an earlier upload of the path stays as it was). ``once`` (an attempt's
        artifacts, at most ``artifact_max_bytes``): an address that holds these bytes already is
        left as it is, one that holds others raises ``AlreadyStored``, also when another put races
        this one: nothing replaces what is there."""
        ...

    async def upload_target(
        self, artifact: Artifact, size: int, sha256: str, within_s: int
    ) -> UploadTarget | None:
        """A presigned upload of exactly these bytes, valid at most ``within_s`` seconds, that can
        write the address once: ``AlreadyStored`` if it holds other bytes (``StoreUnavailable`` if
        the store cannot tell). None: stream them through the cloud (``put`` with ``once``)."""
        ...

    async def check_uploaded(self, artifact: Artifact, size: int, sha256: str) -> None:
        """Returns once the store holds exactly these bytes at the artifact's address; raises
        ``NotStored`` or ``StoreUnavailable``. Other bytes there are left alone: they are another
        upload's, which may be recorded."""
        ...

    def download(self, artifact: Artifact, headers: dict[str, str], media_type: str) -> Response:
        """The answer to a user's download, after the route checked that they may have it."""
        ...

    async def read(self, artifact: Artifact, start: int, length: int) -> bytes:
        """Up to ``length`` bytes of the object from ``start`` (fewer at its end), for the cloud's own
        reads (a log's archived segments). Raises ``NotStored`` when it holds no such object and
        ``StoreUnavailable`` when the store cannot be reached."""
        ...

    async def delete(self, artifact: Artifact) -> None:
        """Removes the artifact's bytes; an address that holds none is no error. Raises
        ``StoreUnavailable`` when the store cannot be reached."""
        ...


@dataclass(frozen=True)
class StoredObject:
    """What the store tells of an object the cloud addresses by its key (not a job's artifact)."""

    size: int
    etag: str
    metadata: dict[str, str]


@runtime_checkable
class KeyedObjects(Protocol):
    """Objects named by their key, for the offline artifact an operator put in the bucket
    (docs/artifact.md, "Serving"): the S3 store only. Blocking calls: run them in a thread."""

    def head_key(self, key: str) -> StoredObject | None:
        """None when the store holds no such object; ``StoreUnavailable`` when it cannot tell."""
        ...

    def read_key(self, key: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        """The object's bytes ``start`` to ``end`` (inclusive; None: to its end), in chunks. The
        request is made before this returns (``NotStored``, ``StoreUnavailable``); a failure while
        the chunks stream raises ``StoreUnavailable`` from the iterator."""
        ...

    def put_key(self, key: str, path: Path, metadata: dict[str, str]) -> None:
        """The file at ``path`` as the object ``key``, with ``metadata`` (returned by head_key)."""
        ...

    def keys_under(self, prefix: str) -> list[tuple[str, float]]:
        """The keys starting with ``prefix`` and when each was written (Unix time)."""
        ...

    def delete_key(self, key: str) -> None: ...
