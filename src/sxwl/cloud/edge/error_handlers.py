"""How every error the cloud returns over HTTP gets the contract's JSON body (``errors``).
Unhandled exceptions are answered in ``middleware.RequestContext`` (so the 500 carries the request
id), slow or oversized requests in ``middleware.BodyLimit`` and ``head_deadline``."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from sxwl.cloud.errors import DEFAULT_CODES, AppError, error_body


def _field_name(loc: tuple[Any, ...]) -> str:
    # Drop the "body"/"query" prefix: users know the field by its own name.
    parts = (
        [str(p) for p in loc[1:]]
        if loc and loc[0] in ("body", "query", "path", "header")
        else list(map(str, loc))
    )
    return ".".join(parts) or "body"


def validation_details(exc: RequestValidationError) -> list[dict[str, str]]:
    details = []
    for err in exc.errors():
        message = str(err.get("msg", "invalid"))
        if err.get("type") == "missing":
            message = "field required"
        details.append({"field": _field_name(tuple(err.get("loc", ()))), "message": message})
    return details


def install(app: FastAPI) -> None:
    @app.exception_handler(AppError)
    async def _app_error(request: Request, exc: AppError) -> JSONResponse:
        body = error_body(exc.status, exc.message, exc.code, exc.details, path=request.url.path)
        return JSONResponse(body, exc.status, headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        details = validation_details(exc)
        summary = "; ".join(f"{d['field']}: {d['message']}" for d in details)
        body = error_body(422, summary or "invalid request", details=details, path=request.url.path)
        return JSONResponse(body, 422)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        html_error = getattr(request.app.state, "html_error", None)
        wants_html = "text/html" in request.headers.get("accept", "")
        if html_error and wants_html and not request.url.path.startswith("/api/"):
            response: Response = html_error(request, exc.status_code)
            return response
        message = exc.detail if isinstance(exc.detail, str) else DEFAULT_CODES.get(exc.status_code, "error")
        body = error_body(exc.status_code, message, path=request.url.path)
        return JSONResponse(body, exc.status_code, headers=exc.headers)
