"""The offline artifact served from an object of the S3 artifact store (``SXWL_ARTIFACT_KEY``,
docs/artifact.md "Serving"), for clouds whose replicas share no disk: the operator uploads the built
file once and every replica streams it from the bucket, never holding it in memory.

With ``SXWL_PUBLIC_URL`` the served object is a copy whose manifest names this cloud, made once per
source object and URL by the first replica that needs it and put beside the source
(``<key>.served/<tag>.tgz``) with its sha256 and version as the object's metadata, so the other
replicas read them with a HEAD. Without it the operator's object is served as it is; each replica
reads it through once for its sha256 and keeps that under its data dir, as for a file."""

from __future__ import annotations

import hashlib
import io
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

from sxwl.cloud.config import Settings
from sxwl.cloud.services.fleet.downloads import (
    KEEP,
    NoArtifact,
    Served,
    evict,
    making,
    rewrite,
    version_of,
)
from sxwl.cloud.storage import KeyedObjects, StoredObject, StoreUnavailable

SHA256, VERSION = "sha256", "artifact-version"


class _ChunkStream(io.RawIOBase):
    """An iterator of chunks read as a file, for tarfile's stream mode."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks, self._rest = chunks, b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while not self._rest:
            self._rest = next(self._chunks, b"")
            if not self._rest:
                return 0
        count = min(len(buffer), len(self._rest))
        buffer[:count] = self._rest[:count]
        self._rest = self._rest[count:]
        return count


def _hashed(chunks: Iterator[bytes], digest: hashlib._Hash) -> Iterator[bytes]:
    for chunk in chunks:
        digest.update(chunk)
        yield chunk


def missing_key(settings: Settings) -> str:
    key, bucket = settings.artifact_key, settings.s3_bucket
    return (
        f"SXWL_ARTIFACT_KEY names {key}, which the bucket {bucket} does not hold: upload the built "
        f"artifact there (e.g. `aws s3 cp dist/3k-artifact.tgz s3://{bucket}/{key}`) or correct the setting"
    )


def served(settings: Settings, store: object) -> Served:
    """The artifact as served from the store (its copy naming this cloud made on first use)."""
    if not isinstance(store, KeyedObjects):  # the settings allow a key only with the S3 store
        raise NoArtifact("SXWL_ARTIFACT_KEY needs SXWL_ARTIFACT_STORE=s3")
    key, cloud = settings.artifact_key, settings.public_url.rstrip("/")
    source = store.head_key(key)
    if source is None:
        raise NoArtifact(missing_key(settings))
    tag = hashlib.sha256(f"{key}|{source.etag}|{source.size}|{cloud}".encode()).hexdigest()[:20]
    if not cloud:
        return _as_it_is(settings, store, source, tag)
    copy = f"{key}.served/{tag}.tgz"
    held = store.head_key(copy)
    if held is None or SHA256 not in held.metadata:
        with making:
            held = store.head_key(copy)
            if held is None or SHA256 not in held.metadata:
                held = _make_copy(settings, store, copy, cloud)
    meta = held.metadata
    return Served(meta[SHA256], held.size, meta.get(VERSION, "?"), cloud, key=copy)


def _as_it_is(settings: Settings, store: KeyedObjects, source: StoredObject, tag: str) -> Served:
    key = settings.artifact_key
    folder = settings.data_dir / "downloads"
    meta = folder / f"3k-artifact-{tag}.json"
    with making:
        if not meta.is_file():
            folder.mkdir(parents=True, exist_ok=True)
            digest = hashlib.sha256()
            # One read: tarfile takes the manifest from the start, the rest is read on for the hash.
            stream = io.BufferedReader(_ChunkStream(_hashed(store.read_key(key), digest)), 1 << 20)
            version = version_of(stream, key)
            while stream.read(1 << 20):
                pass
            recorded = {"sha256": digest.hexdigest(), "size": source.size, "version": version, "cloud": ""}
            meta.write_text(json.dumps(recorded))
            evict(folder)
        data = json.loads(meta.read_text())
    return Served(str(data["sha256"]), source.size, str(data["version"]), "", key=key)


def _make_copy(settings: Settings, store: KeyedObjects, copy: str, cloud: str) -> StoredObject:
    """The source with ``cloud`` in its manifest, put as ``copy``: spooled under the data dir (an
    artifact is too big for memory), hashed, put with its sha256; older copies removed."""
    key = settings.artifact_key
    folder = settings.data_dir / "downloads"
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".copy-") as work:
        spool = Path(work) / "3k-artifact.tgz"
        stream = io.BufferedReader(_ChunkStream(store.read_key(key)), 1 << 20)
        version = rewrite(stream, key, spool, cloud)
        with spool.open("rb") as handle:
            digest = hashlib.file_digest(handle, "sha256").hexdigest()
        store.put_key(copy, spool, {SHA256: digest, VERSION: version})
    held = store.head_key(copy)
    if held is None or held.metadata.get(SHA256) != digest:
        raise StoreUnavailable(f"the object store did not keep {copy} with its metadata (sha256)")
    prefix = f"{key}.served/"
    older = sorted(store.keys_under(prefix), key=lambda item: item[1], reverse=True)
    for name, _ in older[KEEP:]:
        if name != copy:
            store.delete_key(name)
    return held
