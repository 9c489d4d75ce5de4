"""HTTP client of the CLI, with the credentials kept by ``sxwl login``."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

TIMEOUT = httpx.Timeout(30.0, connect=10.0)
# The exit status when what a command followed or sent ended badly: a job or fine-tune followed to
# its end (`-f`) that did not succeed, a dataset uploaded with errors (docs/cli.md, "Exit status").
ENDED_BADLY = 3


class CliError(Exception):
    """A failure to print as one line and exit 1 (or ``exit_code``)."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def config_dir() -> Path:
    if override := os.environ.get("SXWL_CONFIG_DIR"):
        return Path(override)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "sxwl"


def credentials_path() -> Path:
    return config_dir() / "credentials.json"


@dataclass(frozen=True)
class Credentials:
    url: str
    token: str
    email: str

    def save(self) -> Path:
        path = credentials_path()
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Created 0600 from the start: the token is never readable by others, not even briefly.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump({"url": self.url, "token": self.token, "email": self.email}, handle)
        os.chmod(path, 0o600)
        return path

    @classmethod
    def load(cls) -> Credentials:
        path = credentials_path()
        try:
            data = json.loads(path.read_text())
            return cls(url=data["url"], token=data["token"], email=data["email"])
        except FileNotFoundError:
            raise CliError("not signed in: run `sxwl login --url URL --email EMAIL` first") from None
        except (ValueError, KeyError):
            raise CliError(f"{path} is damaged: run `sxwl login` again") from None


class ApiError(CliError):
    """An error answer of the API, with its status and details for callers that explain them."""

    def __init__(self, message: str, status: int, details: Any) -> None:
        super().__init__(message)
        self.status = status
        self.details = details


def error_message(response: httpx.Response) -> str:
    try:
        error = response.json()["error"]
        message = str(error["message"])
    except (ValueError, KeyError, TypeError):
        return f"HTTP {response.status_code}: {response.text[:200]}"
    return f"{message} (HTTP {response.status_code})"


def request(method: str, url: str, token: str | None = None, **kwargs: Any) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.request(method, url, headers=headers, timeout=TIMEOUT, **kwargs)
    except httpx.HTTPError as exc:
        raise CliError(f"cannot reach {url}: {exc}") from None
    if response.status_code == 401 and token:
        raise CliError("the saved sign-in is no longer valid: run `sxwl login` again")
    if response.is_error:
        try:
            details = response.json()["error"].get("details")
        except (ValueError, KeyError, TypeError, AttributeError):
            details = None
        raise ApiError(error_message(response), response.status_code, details)
    return response


def call(method: str, path: str, **kwargs: Any) -> httpx.Response:
    creds = Credentials.load()
    return request(method, creds.url.rstrip("/") + path, creds.token, **kwargs)


def download(creds: Credentials, path: str, target: Path, advance: Callable[[int], object]) -> None:
    """Streams a file to ``target`` (written under a temporary name, renamed when complete)."""
    temp = target.with_name(target.name + ".part")
    headers = {"Authorization": f"Bearer {creds.token}"}
    try:
        # Redirects are followed (object storage's presigned URLs); httpx drops the token when one
        # leads to another origin.
        with httpx.stream(
            "GET", creds.url.rstrip("/") + path, headers=headers, timeout=TIMEOUT, follow_redirects=True
        ) as response:
            if response.is_error:
                response.read()
                raise CliError(error_message(response))
            with temp.open("wb") as handle:
                for chunk in response.iter_bytes():
                    handle.write(chunk)
                    advance(len(chunk))
    except httpx.HTTPError as exc:
        temp.unlink(missing_ok=True)
        raise CliError(f"download of {path} failed: {exc}") from None
    os.replace(temp, target)
