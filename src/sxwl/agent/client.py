"""The agent's HTTP client of the cloud: every call has a timeout, failures are typed."""

from __future__ import annotations

from typing import Any

import httpx

import sxwl
from sxwl.protocol import (
    PROTOCOL_HEADER,
    PROTOCOL_VERSION,
    Heartbeat,
    HeartbeatReply,
    RegisterReply,
    RegisterRequest,
)

TIMEOUT = httpx.Timeout(15.0, connect=5.0)


class Unreachable(Exception):
    """The cloud did not answer, or answered 5xx: try again later."""


class Refused(Exception):
    """The cloud refused our credentials (401) or our protocol: retrying cannot help."""

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message)
        self.code = code


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

    async def _post(self, path: str, token: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            response = await self._http.post(path, json=body, headers={"Authorization": f"Bearer {token}"})
        except httpx.HTTPError as exc:
            raise Unreachable(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__) from None
        if response.status_code >= 500 or response.status_code == 429:
            raise Unreachable(f"HTTP {response.status_code}")
        if response.is_error:
            error = _error(response)
            raise Refused(
                f"{error.get('message', response.text[:200])} (HTTP {response.status_code})",
                str(error.get("code", response.status_code)),
            )
        data: dict[str, Any] = response.json()
        return data

    async def register(self, access_key: str, request: RegisterRequest) -> RegisterReply:
        data = await self._post("/api/v1/agent/register", access_key, request.model_dump(exclude_none=True))
        reply = RegisterReply.model_validate(data)
        if reply.protocol_version != PROTOCOL_VERSION:
            raise Refused(
                f"cloud speaks protocol {reply.protocol_version}, this agent {PROTOCOL_VERSION}",
                "unsupported_protocol",
            )
        return reply

    async def heartbeat(self, token: str, heartbeat: Heartbeat) -> HeartbeatReply:
        data = await self._post("/api/v1/agent/heartbeat", token, heartbeat.model_dump(exclude_none=True))
        return HeartbeatReply.model_validate(data)


def _error(response: httpx.Response) -> dict[str, Any]:
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return {}
    return error if isinstance(error, dict) else {}
