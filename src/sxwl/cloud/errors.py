"""The cloud's errors and the JSON error body of the contract. Free of the web framework, so that
services and the ``sxwl`` commands on the server's own database raise them without importing it;
``error_handlers`` answers them over HTTP."""

from __future__ import annotations

from typing import Any

DEFAULT_CODES = {
    400: "bad_request",
    401: "unauthorized",
    402: "payment_required",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    408: "timeout",
    409: "conflict",
    413: "too_large",
    422: "invalid",
    429: "too_many_requests",
    431: "too_large",
    500: "internal",
}


class AppError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        code: str | None = None,
        details: Any = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code or DEFAULT_CODES.get(status, "error")
        self.message = message
        self.details = details
        self.headers = headers


def invalid(field: str, message: str) -> AppError:
    """A 422 naming one field, shaped like the validation errors pydantic produces."""
    return AppError(422, f"{field}: {message}", details=[{"field": field, "message": message}])


# The OpenAI-compatible API's prefix: its errors carry OpenAI's fields too (``error_body``).
OPENAI_PREFIX = "/v1"
# OpenAI's ``type`` of an error by its status; any other 4xx is an invalid request, a 5xx a server error.
OPENAI_TYPES = {
    401: "authentication_error",
    402: "insufficient_quota",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}


def error_body(
    status: int, message: str, code: str | None = None, details: Any = None, path: str = ""
) -> dict[str, Any]:
    """The contract's error body; under /v1 (``path``) also OpenAI's ``type`` and ``param`` (the
    field at fault, the first that ``details`` names), which the official ``openai`` client reads."""
    error = {"code": code or DEFAULT_CODES.get(status, "error"), "message": message, "details": details}
    if path == OPENAI_PREFIX or path.startswith(OPENAI_PREFIX + "/"):
        kind = "server_error" if status >= 500 else OPENAI_TYPES.get(status, "invalid_request_error")
        error |= {"type": kind, "param": _param(details)}
    return {"error": error}


def _param(details: Any) -> str | None:
    if isinstance(details, list) and details and isinstance(details[0], dict):
        field = details[0].get("field")
        return field if isinstance(field, str) else None
    return None
