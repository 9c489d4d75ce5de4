"""The agent's HTTP client of the cloud: every call has a timeout, failures are typed."""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, BinaryIO

import httpx

import sxwl
from sxwl.agent.tenant_files import OutputFile
from sxwl.protocol import (
    PROTOCOL_HEADER,
    PROTOCOL_VERSION,
    SHA256_HEADER,
    ArtifactUpload,
    AssignmentsReply,
    Heartbeat,
    HeartbeatReply,
    IsolationReply,
    IsolationReport,
    JobStatus,
    JobStatusReply,
    LogAppendReply,
    RegisterReply,
    RegisterRequest,
    UploadTargetReply,
    paths,
)

TIMEOUT = httpx.Timeout(15.0, connect=5.0)


class Unreachable(Exception):
    """The cloud did not answer, or answered 5xx/429: try again later."""


class Refused(Exception):
    """The cloud refused our credentials (401) or our protocol: retrying cannot help."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


class Rejected(Exception):
    """The cloud answered 4xx to one request: that request is wrong, the agent goes on."""


class Stale(Exception):
    """The cloud no longer wants this job attempt (409): stop it and report nothing more for it."""


class LogGap(Exception):
    def __init__(self, next_offset: int) -> None:
        super().__init__(f"the cloud expects offset {next_offset}")
        self.next_offset = next_offset


class CloudClient:
    def __init__(self, api_url: str, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.api_url = api_url.rstrip("/")
        self._http = httpx.AsyncClient(
            base_url=self.api_url,
            timeout=TIMEOUT,
            transport=transport,
            headers={PROTOCOL_HEADER: str(PROTOCOL_VERSION), "User-Agent": f"sxwl-agent/{sxwl.__version__}"},
        )

    async def close(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, token: str, **kwargs: Any) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}", **kwargs.pop("headers", {})}
        try:
            response = await self._http.request(method, path, headers=headers, **kwargs)
        except httpx.HTTPError as exc:
            raise Unreachable(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__) from None
        _raise_for(response)
        return response

    async def register(self, access_key: str, request: RegisterRequest) -> RegisterReply:
        try:
            response = await self._call(
                "POST", paths.url(paths.REGISTER), access_key, json=request.model_dump(exclude_none=True)
            )
        except Rejected as exc:
            raise Refused(str(exc), "rejected") from None
        reply = RegisterReply.model_validate(response.json())
        if reply.protocol_version != PROTOCOL_VERSION:
            raise Refused(
                f"cloud speaks protocol {reply.protocol_version}, this agent {PROTOCOL_VERSION}",
                "unsupported_protocol",
            )
        return reply

    async def isolation(self, token: str, report: IsolationReport) -> IsolationReply:
        response = await self._call("PUT", paths.url(paths.ISOLATION), token, json=report.model_dump())
        return IsolationReply.model_validate(response.json())

    async def heartbeat(self, token: str, heartbeat: Heartbeat) -> HeartbeatReply:
        try:
            response = await self._call(
                "POST", paths.url(paths.HEARTBEAT), token, json=heartbeat.model_dump(exclude_none=True)
            )
        except Rejected as exc:
            raise Refused(str(exc), "rejected") from None
        return HeartbeatReply.model_validate(response.json())

    async def assignments(self, token: str, wait_s: float) -> AssignmentsReply:
        response = await self._call(
            "GET",
            paths.url(paths.ASSIGNMENTS),
            token,
            params={"wait": wait_s},
            timeout=httpx.Timeout(wait_s + 15.0, connect=5.0),
        )
        try:
            return AssignmentsReply.model_validate_json(response.content)
        except ValueError:
            # A hold cut short can end with its keep-alive newlines and nothing after them.
            raise Unreachable(f"the long-poll's answer was not a reply: {response.content[:100]!r}") from None

    async def ack(self, token: str, command_id: int) -> None:
        await self._call("POST", paths.url(paths.COMMAND_ACK, command_id=command_id), token)

    async def report(self, token: str, job_id: str, status: JobStatus) -> JobStatusReply:
        response = await self._call(
            "POST",
            paths.url(paths.JOB_STATUS, job_id=job_id),
            token,
            json=status.model_dump(exclude_none=True),
        )
        return JobStatusReply.model_validate(response.json())

    async def append_log(self, token: str, job_id: str, attempt: int, offset: int, data: bytes) -> int:
        response = await self._call(
            "POST",
            paths.url(paths.JOB_LOGS, job_id=job_id),
            token,
            params={"attempt": attempt, "offset": offset},
            content=data,
            headers={"Content-Type": "application/octet-stream"},
        )
        return LogAppendReply.model_validate(response.json()).next_offset

    async def upload_artifact(
        self, token: str, job_id: str, attempt: int, path: str, file: OutputFile
    ) -> None:
        """Asks the cloud where the file goes, naming its size and sha256 from a first pass, then
        streams it there: to the cloud, which stores it only if the bytes hash the same, or to the
        object store's presigned URL, after which the cloud checks and records it
        (docs/object-storage.md). Either way nothing is recorded that is not stored. Both passes
        read the one open file (tenant_files.py), never its name again."""
        digest = await asyncio.to_thread(_sha256, file)
        upload = ArtifactUpload(path=path, size=file.size, sha256=digest).model_dump()
        params = {"attempt": attempt}
        answer = await self._call(
            "POST", paths.url(paths.UPLOAD_TARGET, job_id=job_id), token, params=params, json=upload
        )
        target = UploadTargetReply.model_validate(answer.json())
        if target.via == "cloud" or target.url is None:
            await self._call(
                "PUT",
                paths.url(paths.JOB_ARTIFACT, job_id=job_id, path=path),
                token,
                params=params,
                content=_chunks(file),
                headers={"Content-Type": "application/octet-stream", SHA256_HEADER: digest},
            )
            return
        await self._put_to_store(target.url, target.headers, file)
        await self._call(
            "POST", paths.url(paths.UPLOAD_DONE, job_id=job_id), token, params=params, json=upload
        )

    async def fetch_input(
        self, token: str, job_id: str, attempt: int, name: str, dest: Path
    ) -> tuple[int, str]:
        """Streams one of the attempt's inputs into ``dest``; returns its size and sha256. The cloud
        answers with the bytes or a 307 to the object store's presigned URL, which httpx follows
        without our Authorization header (it drops it on a redirect to another origin), so the CPod
        token never reaches the store."""
        path = paths.url(paths.JOB_INPUT, job_id=job_id, name=name)
        headers = {"Authorization": f"Bearer {token}"}
        digest, size = hashlib.sha256(), 0
        try:
            async with self._http.stream(
                "GET", path, headers=headers, params={"attempt": attempt}, follow_redirects=True
            ) as response:
                if response.is_error:
                    await response.aread()
                    _raise_for(response)
                with dest.open("wb") as handle:
                    async for chunk in response.aiter_bytes(1024 * 1024):
                        await asyncio.to_thread(_write_and_hash, handle, digest, chunk)
                        size += len(chunk)
        except httpx.HTTPError as exc:
            raise Unreachable(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__) from None
        return size, digest.hexdigest()

    async def _put_to_store(self, url: str, headers: dict[str, str], file: OutputFile) -> None:
        """The presigned PUT: no token of ours goes with it, and the headers are the signed ones
        (their Content-Length keeps httpx from a chunked body, which S3 refuses)."""
        try:
            response = await self._http.put(url, headers=headers, content=_chunks(file))
        except httpx.HTTPError as exc:
            raise Unreachable(f"object store: {type(exc).__name__}: {exc}") from None
        if response.status_code >= 500:
            raise Unreachable(f"object store: HTTP {response.status_code}")
        if response.is_error:
            code = re.search(r"<Code>([^<]{1,100})</Code>", response.text)
            raise Rejected(
                f"the object store refused the upload: HTTP {response.status_code}"
                + (f" {code.group(1)}" if code else "")
            )


async def _chunks(file: OutputFile) -> AsyncIterator[bytes]:
    chunks = file.chunks()
    while chunk := await asyncio.to_thread(next, chunks, b""):
        yield chunk


def _write_and_hash(handle: BinaryIO, digest: hashlib._Hash, chunk: bytes) -> None:
    handle.write(chunk)
    digest.update(chunk)


def _sha256(file: OutputFile) -> str:
    digest = hashlib.sha256()
    for chunk in file.chunks():
        digest.update(chunk)
    return digest.hexdigest()


def _raise_for(response: httpx.Response) -> None:
    """The typed failure an answer stands for, if it is one (its body must have been read)."""
    if response.status_code >= 500 or response.status_code == 429:
        raise Unreachable(f"HTTP {response.status_code}")
    if not response.is_error:
        return
    error = _error(response)
    message = f"{error.get('message', response.text[:200])} (HTTP {response.status_code})"
    code = str(error.get("code", response.status_code))
    if response.status_code == 401 or code == "unsupported_protocol":
        raise Refused(message, code)
    if code == "stale_attempt":
        raise Stale(message)
    if code == "log_gap":
        raise LogGap(int(error["details"]["next_offset"]))
    raise Rejected(message)


def _error(response: httpx.Response) -> dict[str, Any]:
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return {}
    return error if isinstance(error, dict) else {}
