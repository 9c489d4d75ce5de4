"""``/downloads/3k-artifact.tgz``: the offline artifact for providers (docs/artifact.md, "Serving"),
resumable (Range, HEAD), with its sha256 and size in headers, beside it as ``.sha256`` (for
``sha256sum -c``) and in ``3k-artifact.json``. Public, as the guide's ``wget`` has no credentials.
A file is answered by Starlette's FileResponse; an object of the artifact store is streamed from the
store a chunk at a time, the Range passed on to it."""

from __future__ import annotations

import re

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from sxwl.cloud.errors import error_body
from sxwl.cloud.services.fleet import download_object, downloads
from sxwl.cloud.storage import KeyedObjects, NotStored, StoreUnavailable
from sxwl.cloud.web.kit import ctx_of

router = APIRouter()
PATH = f"/downloads/{downloads.NAME}"
MEDIA_TYPE = "application/gzip"
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")


def cloud_url(request: Request) -> str:
    return ctx_of(request).settings.public_url.rstrip("/") or str(request.base_url).rstrip("/")


def _refusal(status: int, message: str, code: str) -> Response:
    return JSONResponse(error_body(status, message, code), status_code=status)


async def _served(request: Request) -> downloads.Served | Response:
    ctx = ctx_of(request)
    try:
        if ctx.settings.artifact_key:
            return await run_in_threadpool(download_object.served, ctx.settings, ctx.artifacts)
        return await run_in_threadpool(downloads.served, ctx.settings)
    except downloads.NoArtifact as exc:
        return _refusal(404, str(exc), "no_artifact")
    except downloads.BadArtifact as exc:
        return _refusal(503, str(exc), "bad_artifact")
    except StoreUnavailable as exc:
        return _refusal(503, f"{exc}; try again later", "artifact_store_unavailable")


def byte_range(request: Request, etag: str, size: int) -> tuple[int, int] | None:
    """The one range asked for, as (first, last) byte; None for the whole object (no Range, one we
    do not serve such as several ranges, or an If-Range naming other bytes). ValueError: it starts
    past the end (416)."""
    wanted, condition = request.headers.get("range"), request.headers.get("if-range")
    found = _RANGE.fullmatch(wanted.replace(" ", "")) if wanted else None
    if found is None or (condition is not None and condition != etag):
        return None
    first, last = found.groups()
    if not first:  # the last N bytes
        if not last or int(last) == 0:
            return None
        return max(size - int(last), 0), size - 1
    start, end = int(first), min(int(last), size - 1) if last else size - 1
    if start >= size:
        raise ValueError(start)
    return None if end < start else (start, end)


async def _from_store(request: Request, served: downloads.Served, headers: dict[str, str]) -> Response:
    store = ctx_of(request).artifacts
    assert isinstance(store, KeyedObjects)  # download_object.served refused any other store
    try:
        wanted = byte_range(request, headers["etag"], served.size)
    except ValueError:
        return Response(status_code=416, headers={"content-range": f"bytes */{served.size}"})
    start, end = wanted or (0, served.size - 1)
    headers = {**headers, "accept-ranges": "bytes", "content-length": str(end - start + 1)}
    status = 200 if wanted is None else 206
    if wanted is not None:
        headers["content-range"] = f"bytes {start}-{end}/{served.size}"
    if request.method == "HEAD":
        return Response(status_code=status, headers=headers, media_type=MEDIA_TYPE)
    try:
        chunks = await run_in_threadpool(store.read_key, served.key, start, None if wanted is None else end)
    except NotStored:
        message = download_object.missing_key(ctx_of(request).settings)
        return _refusal(404, message, "no_artifact")
    except StoreUnavailable as exc:
        return _refusal(503, f"{exc}; try again later", "artifact_store_unavailable")
    return StreamingResponse(chunks, status_code=status, headers=headers, media_type=MEDIA_TYPE)


@router.api_route(PATH, methods=["GET", "HEAD"], include_in_schema=False)
async def artifact(request: Request) -> Response:
    served = await _served(request)
    if isinstance(served, Response):
        return served
    headers = {
        "etag": f'"{served.sha256}"',
        "x-checksum-sha256": served.sha256,
        "x-artifact-version": served.version,
        "cache-control": "no-cache",
    }
    if served.path is None:
        return await _from_store(request, served, headers)
    return FileResponse(served.path, media_type=MEDIA_TYPE, headers=headers)


@router.get(PATH + ".sha256", include_in_schema=False)
async def artifact_sha256(request: Request) -> Response:
    served = await _served(request)
    if isinstance(served, Response):
        return served
    return PlainTextResponse(f"{served.sha256}  {downloads.NAME}\n")


@router.get("/downloads/3k-artifact.json", include_in_schema=False)
async def artifact_summary(request: Request) -> Response:
    served = await _served(request)
    if isinstance(served, Response):
        return served
    return JSONResponse({**served.summary(), "url": cloud_url(request) + PATH})
