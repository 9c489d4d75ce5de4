"""The error answers of the REST API as the OpenAPI document declares them: every status an endpoint
can answer, with the one error body (src/sxwl/cloud/errors.py). The fuzz run (tests/test_fuzz_api.py)
fails on an answer that is not declared here. And ``no_store``, for the answers no cache may keep."""

from __future__ import annotations

from typing import Any

from fastapi import Response
from pydantic import BaseModel, JsonValue

# For an answer that carries a secret (a token, an accessKey, a presigned URL) or a statement: no
# cache, a browser's or a proxy's, keeps a copy. Console pages send it too (web/kit.py).
NO_STORE = {"Cache-Control": "no-store"}


def no_store(response: Response) -> None:
    """A route's dependency: its answer carries ``NO_STORE`` (an answer the route builds itself, a
    CSV, must add it too: FastAPI does not copy these headers onto it)."""
    response.headers.update(NO_STORE)


class ErrorBody(BaseModel):
    code: str
    message: str
    # A 422's fields ([{"field", "message"}]), or what an error adds (the next log offset, say).
    details: JsonValue = None


class ErrorOut(BaseModel):
    error: ErrorBody


_WHY = {
    400: "Malformed body, or an agent protocol this cloud does not support",
    401: "No token, or one that is invalid, expired or revoked",
    402: "The balance does not cover the job's first hour; details say how much is missing",
    403: "Not allowed for this caller (or a console request without its CSRF token)",
    404: "No such resource",
    409: "Conflicts with the current state",
    413: "Body too large",
    422: "Invalid input; details name the fields",
    429: "Too many attempts; retry later",
    502: "An endpoint's engine answered wrongly or its answer was cut",
    503: "The object store did not answer, or an endpoint does not serve yet (Retry-After); retry later",
    504: "An endpoint's engine did not start answering in time",
}

Responses = dict[int | str, dict[str, Any]]


def errors(*statuses: int) -> Responses:
    return {status: {"model": ErrorOut, "description": _WHY[status]} for status in statuses}


# What every router's endpoints may answer besides their own: the caller (401/403) and its input.
SIGNED_IN = errors(401, 403, 422)
WITH_BODY = errors(400, 413, 422)
