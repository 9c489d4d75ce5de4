"""The two things 3kctl asks the cloud, with nothing but the provider's accessKey: is the key valid,
and which of the provider's CPods are online (``GET /api/v1/agent/access-key/check``)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import httpx

from sxwl.ctl.errors import CtlError

DEFAULT_CLOUD = "https://llm.sxwl.ai"
CHECK_PATH = "/api/v1/agent/access-key/check"
TIMEOUT = httpx.Timeout(15.0, connect=10.0)


class AccessKeyRefused(CtlError):
    pass


@dataclass(frozen=True)
class CPodBrief:
    name: str
    status: str
    revoked: bool = False


@dataclass(frozen=True)
class KeyCheck:
    provider: str
    cpods: list[CPodBrief]
    min_artifact_version: str = ""  # empty: a cloud that does not say

    def cpod(self, name: str) -> CPodBrief | None:
        live = [c for c in self.cpods if c.name == name and not c.revoked]
        online = [c for c in live if c.status == "online"]
        chosen = online or live
        return chosen[0] if chosen else None


def check_access_key(cloud: str, access_key: str) -> KeyCheck:
    url = cloud.rstrip("/") + CHECK_PATH
    try:
        response = httpx.get(url, headers={"Authorization": f"Bearer {access_key}"}, timeout=TIMEOUT)
    except httpx.HTTPError as exc:
        raise CtlError(
            f"cannot reach the cloud at {cloud}: {exc or type(exc).__name__}; check --cloud and this "
            "machine's network (the CPod dials the cloud, never the reverse)"
        ) from None
    if response.status_code == 401:
        raise AccessKeyRefused(
            f"the cloud at {cloud} refused this accessKey (wrong, or rotated since it was copied): copy the "
            "current accessKey from the console (账户 / Account page) and pass it with --access-key"
        )
    if response.status_code == 404:
        raise CtlError(f"{url} does not exist: is {cloud} an 算想云 cloud (check --cloud)?")
    if response.status_code >= 400:
        raise CtlError(
            f"the cloud answered {response.status_code} to the accessKey check: {_message(response)}"
        )
    try:
        body = response.json()
        return KeyCheck(
            provider=str(body["provider"]),
            cpods=[
                CPodBrief(str(c["name"]), str(c["status"]), bool(c.get("revoked", False)))
                for c in body.get("cpods", [])
            ],
            min_artifact_version=str(body.get("min_artifact_version") or ""),
        )
    except (ValueError, KeyError, TypeError):
        raise CtlError(f"the cloud at {cloud} gave an unexpected answer to the accessKey check") from None


def _message(response: httpx.Response) -> str:
    try:
        body: Any = response.json()
        return str(body["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:200]


def _numbers(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version.split("-")[0].split("+")[0]))


def refuses_artifact(check: KeyCheck, cloud: str, version: str) -> str | None:
    """Why the cloud does not accept an artifact of ``version`` (older than it accepts), else None."""
    if not check.min_artifact_version or _numbers(version) >= _numbers(check.min_artifact_version):
        return None
    return (
        f"this artifact is version {version}; the cloud at {cloud} accepts {check.min_artifact_version} "
        f"or newer (its agent would not speak to it): download the current artifact with "
        f"`wget {cloud.rstrip('/')}/downloads/3k-artifact.tgz` and run its 3kctl"
    )
