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


def error_body(status: int, message: str, code: str | None = None, details: Any = None) -> dict[str, Any]:
    return {
        "error": {"code": code or DEFAULT_CODES.get(status, "error"), "message": message, "details": details}
    }
