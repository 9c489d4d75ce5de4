"""``/downloads/3k-artifact.tgz``: the offline artifact for providers (docs/artifact.md, "Serving"),
resumable (Range, HEAD), with its sha256 and size in headers, beside it as ``.sha256`` (for
``sha256sum -c``) and in ``3k-artifact.json``. Public, as the guide's ``wget`` has no credentials."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool

from sxwl.cloud.errors import error_body
from sxwl.cloud.services.fleet import downloads
from sxwl.cloud.web.kit import ctx_of

router = APIRouter()
PATH = f"/downloads/{downloads.NAME}"


def cloud_url(request: Request) -> str:
    return ctx_of(request).settings.public_url.rstrip("/") or str(request.base_url).rstrip("/")


async def _served(request: Request) -> downloads.Served | Response:
    try:
        return await run_in_threadpool(downloads.served, ctx_of(request).settings)
    except downloads.NoArtifact as exc:
        return JSONResponse(error_body(404, str(exc), "no_artifact"), status_code=404)
    except downloads.BadArtifact as exc:
        return JSONResponse(error_body(503, str(exc), "bad_artifact"), status_code=503)


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
    return FileResponse(served.path, media_type="application/gzip", headers=headers)


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
