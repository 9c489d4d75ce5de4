"""Artifacts in an S3-compatible bucket (docs/object-storage.md). Uploaders and browsers move the
bytes themselves, with URLs presigned for one object and a few minutes; the cloud only signs, and
checks what the store holds before an upload is recorded.

The sha256 an uploader announces is signed into its URL as ``x-amz-checksum-sha256``: the store
refuses a body that hashes otherwise and keeps the checksum, which ``check_uploaded`` reads back with
the size. So the cloud never reads the bytes, and nothing is recorded that the store does not hold.

An attempt's artifact is written once: its URL, and the cloud's own put of it, carry
``If-None-Match: *`` (signed, so an uploader cannot drop it), and the store refuses (412) to write a
key that holds an object. Only when the key holds these very bytes already (a repeat after a lost
answer) is the URL unconditional: its signed length and checksum let it write nothing else."""

from __future__ import annotations

import asyncio
import base64
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import quote

import boto3
from boto3.exceptions import S3UploadFailedError
from boto3.s3.transfer import TransferConfig
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from starlette.responses import RedirectResponse, Response

from sxwl.cloud.storage import (
    AlreadyStored,
    Artifact,
    NotStored,
    StoredObject,
    StoreUnavailable,
    UploadTarget,
    write_checked,
)

if TYPE_CHECKING:
    from types_boto3_s3 import S3Client
    from types_boto3_s3.type_defs import HeadObjectOutputTypeDef

# What the cloud puts itself (a base model's archive, a file, an agent's upload through the cloud)
# goes as one PUT up to this size and in parts past it: one PUT stops at 5 GiB, and a model may be
# bigger. Presigned uploads (CPods, pods) are one PUT, so artifact_max_bytes stays within 5 GiB.
MULTIPART_THRESHOLD = 1024**3
# S3 takes at most 10,000 parts of at least 5 MiB (the last one excepted).
MIN_PART_BYTES = 64 * 1024**2
MAX_PARTS = 10_000
OCTET_STREAM = "application/octet-stream"
# What one read of a keyed object hands on at a time (a download streams through the cloud).
CHUNK_BYTES = 1024 * 1024


@dataclass(frozen=True)
class S3Location:
    endpoint: str
    public_endpoint: str
    bucket: str
    region: str
    presign_expiry_s: int


@dataclass(frozen=True)
class S3Credentials:
    access_key_id: str
    secret_access_key: str
    session_token: str | None = None

    def __repr__(self) -> str:  # never the keys, in a log line or a traceback
        return "S3Credentials(***)"


def _client(endpoint: str, region: str, credentials: S3Credentials) -> S3Client:
    config = Config(
        signature_version="s3v4",
        s3={"addressing_style": "path"},  # works for every S3-compatible server, whatever its DNS
        connect_timeout=5,
        read_timeout=60,
        retries={"max_attempts": 2, "mode": "standard"},
        # Checksums only where this module asks for them (the sha256 of each artifact).
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    client: S3Client = boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        region_name=region,
        aws_access_key_id=credentials.access_key_id,
        aws_secret_access_key=credentials.secret_access_key,
        aws_session_token=credentials.session_token,
        config=config,
    )
    return client


def _checksum(sha256_hex: str) -> str:
    return base64.b64encode(bytes.fromhex(sha256_hex)).decode()


def _attachment(path: str) -> str:
    name = path.rsplit("/", 1)[-1]
    quoted = quote(name)
    if quoted == name:
        return f'attachment; filename="{name}"'
    return f"attachment; filename*=utf-8''{quoted}"


def _status(exc: ClientError) -> object:
    return exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")


def _chunks(body: Any) -> Iterator[bytes]:
    """A GET's body in chunks, closed when done or abandoned (a client that went away)."""
    try:
        yield from body.iter_chunks(CHUNK_BYTES)
    except (BotoCoreError, OSError) as exc:
        raise _unavailable(exc) from None
    finally:
        body.close()


def _unavailable(exc: Exception) -> StoreUnavailable:
    if isinstance(exc, ClientError):
        status = _status(exc)
        code = exc.response.get("Error", {}).get("Code", "")
        return StoreUnavailable(f"the object store answered HTTP {status} {code}".rstrip())
    return StoreUnavailable(f"the object store is unreachable: {type(exc).__name__}")


class S3ArtifactStore:
    def __init__(self, location: S3Location, credentials: S3Credentials) -> None:
        self.location = location
        self.multipart_threshold, self.part_bytes = MULTIPART_THRESHOLD, MIN_PART_BYTES
        self._client = _client(location.endpoint, location.region, credentials)
        # URLs for CPods and browsers name the endpoint they reach; signing needs no connection.
        self._signer = _client(location.public_endpoint, location.region, credentials)

    def _key(self, artifact: Artifact) -> str:
        return f"{artifact.job_id}/{artifact.attempt}/{artifact.path}"

    async def upload_target(self, artifact: Artifact, size: int, sha256: str, within_s: int) -> UploadTarget:
        key, checksum = self._key(artifact), _checksum(sha256)
        held = await asyncio.to_thread(self._held, key)
        if held is not None and held != (size, checksum):
            raise AlreadyStored(f"{artifact.path} is already stored with other bytes")
        expires = min(self.location.presign_expiry_s, within_s)
        headers = {
            "Content-Length": str(size),
            "Content-Type": OCTET_STREAM,
            "x-amz-checksum-sha256": checksum,
        }
        if held is None:
            headers["If-None-Match"] = "*"
            params = self._put_params(key, size, checksum) | {"IfNoneMatch": "*"}
        else:
            params = self._put_params(key, size, checksum)
        url = self._signer.generate_presigned_url("put_object", Params=params, ExpiresIn=expires)
        return UploadTarget(url=url, headers=headers, expires_in_s=expires)

    def _put_params(self, key: str, size: int, checksum: str) -> dict[str, object]:
        return {
            "Bucket": self.location.bucket,
            "Key": key,
            "ContentLength": size,
            "ContentType": OCTET_STREAM,
            "ChecksumSHA256": checksum,
        }

    async def check_uploaded(self, artifact: Artifact, size: int, sha256: str) -> None:
        held = await asyncio.to_thread(self._held, self._key(artifact))
        if held is None:
            raise NotStored("the object store holds no such object")
        if held[0] != size:
            raise NotStored(f"the object store holds {held[0]} bytes, not {size}")
        if held[1] != _checksum(sha256):
            raise NotStored("the object store's sha256 of the object is not the one announced")

    def _held(self, key: str) -> tuple[int, str | None] | None:
        """The size and sha256 checksum of the object at ``key``; None when there is none."""
        head = self._head(key, checksum=True)
        return None if head is None else (head["ContentLength"], head.get("ChecksumSHA256"))

    def _head(self, key: str, *, checksum: bool = False) -> HeadObjectOutputTypeDef | None:
        try:
            if checksum:
                return self._client.head_object(Bucket=self.location.bucket, Key=key, ChecksumMode="ENABLED")
            return self._client.head_object(Bucket=self.location.bucket, Key=key)
        except ClientError as exc:
            if _status(exc) == 404:
                return None
            raise _unavailable(exc) from None
        except BotoCoreError as exc:
            raise _unavailable(exc) from None

    async def put(
        self,
        artifact: Artifact,
        chunks: AsyncIterator[bytes],
        max_bytes: int,
        expected_sha256: str | None = None,
        *,
        once: bool = False,
    ) -> tuple[int, str]:
        """An agent that streams through the cloud: the bytes are spooled to an unlinked temporary
        file (never held in memory), hashed, then put with their checksum."""
        with tempfile.TemporaryFile() as spool:
            size, digest = await write_checked(chunks, spool, max_bytes, expected_sha256)
            await asyncio.to_thread(self._put_spooled, spool, artifact, size, digest, once)
        return size, digest

    def _put_spooled(self, spool: IO[bytes], artifact: Artifact, size: int, sha256: str, once: bool) -> None:
        spool.seek(0)
        # A write-once put is an attempt's artifact, at most 5 GiB (config.py): always one PUT.
        if size > self.multipart_threshold and not once:
            self._put_in_parts(spool, artifact, size)
            return
        key, checksum = self._key(artifact), _checksum(sha256)
        bucket = self.location.bucket
        try:
            if once:
                self._client.put_object(
                    Bucket=bucket,
                    Key=key,
                    Body=spool,
                    ContentLength=size,
                    ContentType=OCTET_STREAM,
                    ChecksumSHA256=checksum,
                    IfNoneMatch="*",
                )
            else:
                self._client.put_object(
                    Bucket=bucket,
                    Key=key,
                    Body=spool,
                    ContentLength=size,
                    ContentType=OCTET_STREAM,
                    ChecksumSHA256=checksum,
                )
        except ClientError as exc:
            if not once or _status(exc) != 412:
                raise _unavailable(exc) from None
            if self._held(key) != (size, checksum):  # 412: the key holds an object; these bytes?
                raise AlreadyStored(f"{artifact.path} is already stored with other bytes") from None
        except BotoCoreError as exc:
            raise _unavailable(exc) from None

    def _put_in_parts(self, spool: IO[bytes], artifact: Artifact, size: int) -> None:
        """A multipart upload. The store checks each part's own sha256 (a whole object's sha256 is
        not a multipart checksum S3 keeps); the cloud hashed all of it while spooling."""
        part = max(self.part_bytes, -(-size // MAX_PARTS))
        transfer = TransferConfig(multipart_threshold=part, multipart_chunksize=part, max_concurrency=4)
        try:
            self._client.upload_fileobj(
                spool,
                self.location.bucket,
                self._key(artifact),
                ExtraArgs={"ContentType": OCTET_STREAM, "ChecksumAlgorithm": "SHA256"},
                Config=transfer,
            )
        except (BotoCoreError, ClientError, S3UploadFailedError) as exc:
            raise _unavailable(exc) from None

    async def read(self, artifact: Artifact, start: int, length: int) -> bytes:
        return await asyncio.to_thread(self._read, self._key(artifact), start, length)

    def _read(self, key: str, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        try:
            answer = self._client.get_object(
                Bucket=self.location.bucket, Key=key, Range=f"bytes={start}-{start + length - 1}"
            )
            return answer["Body"].read()
        except ClientError as exc:
            status = _status(exc)
            if status == 404:
                raise NotStored("the object store holds no such object") from None
            if status == 416:  # the range starts at or past the object's end
                return b""
            raise _unavailable(exc) from None
        except BotoCoreError as exc:
            raise _unavailable(exc) from None

    async def delete(self, artifact: Artifact) -> None:
        await asyncio.to_thread(self._delete, self._key(artifact))

    def _delete(self, key: str) -> None:
        try:
            self._client.delete_object(Bucket=self.location.bucket, Key=key)  # none there: 204 too
        except (BotoCoreError, ClientError) as exc:
            raise _unavailable(exc) from None

    def download(self, artifact: Artifact, headers: dict[str, str], media_type: str) -> Response:
        """A redirect to a presigned GET of the object, served as the attachment the local store's
        answer is; the cloud's own headers go on the redirect, which is all of it the cloud serves."""
        url = self._signer.generate_presigned_url(
            "get_object",
            Params={
                "Bucket": self.location.bucket,
                "Key": self._key(artifact),
                "ResponseContentType": media_type,
                "ResponseContentDisposition": _attachment(artifact.path),
                "ResponseCacheControl": "private, no-store",
            },
            ExpiresIn=self.location.presign_expiry_s,
        )
        return RedirectResponse(url, status_code=307, headers=headers)

    # Keyed objects (storage.KeyedObjects): the offline artifact an operator put in the bucket, and the
    # copies of it that name this cloud (services/fleet/download_object.py).

    def head_key(self, key: str) -> StoredObject | None:
        head = self._head(key)
        if head is None:
            return None
        etag = str(head.get("ETag", "")).strip('"')
        return StoredObject(head["ContentLength"], etag, dict(head.get("Metadata", {})))

    def read_key(self, key: str, start: int = 0, end: int | None = None) -> Iterator[bytes]:
        try:
            if start or end is not None:
                answer = self._client.get_object(
                    Bucket=self.location.bucket, Key=key, Range=f"bytes={start}-{'' if end is None else end}"
                )
            else:
                answer = self._client.get_object(Bucket=self.location.bucket, Key=key)
        except ClientError as exc:
            if _status(exc) == 404:
                raise NotStored(f"the object store holds no object {key}") from None
            raise _unavailable(exc) from None
        except BotoCoreError as exc:
            raise _unavailable(exc) from None
        return _chunks(answer["Body"])

    def put_key(self, key: str, path: Path, metadata: dict[str, str]) -> None:
        part = max(self.part_bytes, -(-path.stat().st_size // MAX_PARTS))
        transfer = TransferConfig(multipart_threshold=self.multipart_threshold, multipart_chunksize=part)
        try:
            self._client.upload_file(
                str(path),
                self.location.bucket,
                key,
                ExtraArgs={"ContentType": OCTET_STREAM, "Metadata": metadata},
                Config=transfer,
            )
        except (BotoCoreError, ClientError, S3UploadFailedError) as exc:
            raise _unavailable(exc) from None

    def keys_under(self, prefix: str) -> list[tuple[str, float]]:
        found: list[tuple[str, float]] = []
        try:
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.location.bucket, Prefix=prefix
            )
            for page in pages:
                found += [(o["Key"], o["LastModified"].timestamp()) for o in page.get("Contents", [])]
        except (BotoCoreError, ClientError) as exc:
            raise _unavailable(exc) from None
        return found

    def delete_key(self, key: str) -> None:
        self._delete(key)
