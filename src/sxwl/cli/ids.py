"""Ids as users type them: a whole id, or a unique prefix of one (docs/cli.md). The cloud answers a
whole id directly; a prefix is looked up in the caller's own listing, and one that matches nothing,
or several, is refused naming the command that lists them."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from typing import Any

from sxwl.cli import client
from sxwl.cli.client import CliError

SHOWN_CANDIDATES = 5
# Every id the cloud makes; anything else is no id, and is not sent (a "/" would name another route).
ID_TEXT = re.compile(r"[A-Za-z0-9_-]+")


def unique(prefix: str, ids: Iterable[str], noun: str, listing: str) -> str:
    """The one id of ``ids`` that starts with ``prefix``."""
    found: list[str] = []
    if prefix:
        for candidate in ids:
            if candidate.startswith(prefix):
                found.append(candidate)
                if len(found) > SHOWN_CANDIDATES:
                    break
    if not found:
        raise CliError(f"no {noun} {prefix!r}: `{listing}` shows yours")
    if len(found) > 1:
        shown = ", ".join(found[:SHOWN_CANDIDATES]) + (", …" if len(found) > SHOWN_CANDIDATES else "")
        raise CliError(f"{prefix!r} matches several {noun}s ({shown}); give more of the id")
    return found[0]


def openai_pages(path: str, limit: int) -> Iterator[str]:
    """Every id of an OpenAI-style listing (``data``, ``has_more``, ``after``), page by page, read
    only as far as the caller needs."""
    after: str | None = None
    while True:
        params: dict[str, Any] = {"limit": limit, **({"after": after} if after else {})}
        page = client.call("GET", path, params=params).json()
        for item in page["data"]:
            yield str(item["id"])
        if not page["has_more"] or not page["data"]:
            return
        after = str(page["data"][-1]["id"])


def fetch(given: str, get: Callable[[str], dict[str, Any]], ids: Callable[[], Iterable[str]], *,
          noun: str, listing: str) -> dict[str, Any]:  # fmt: skip
    """The object ``get`` returns for ``given``, or for the one id that ``given`` begins."""
    if not given.strip():
        raise CliError(f"an empty {noun} id: give one, or a unique prefix (`{listing}`)", exit_code=2)
    if not ID_TEXT.fullmatch(given):
        raise CliError(f"no {noun} {given!r}: `{listing}` shows yours")
    try:
        return get(given)
    except client.ApiError as exc:
        if exc.status != 404:
            raise
    return get(unique(given, ids(), noun, listing))


def _getter(path: str) -> Callable[[str], dict[str, Any]]:
    def get(found: str) -> dict[str, Any]:
        body: dict[str, Any] = client.call("GET", f"{path}/{found}").json()
        return body

    return get


def fine_tune(given: str) -> dict[str, Any]:
    """A fine-tune by id or unique prefix."""
    path = "/v1/fine_tuning/jobs"
    return fetch(given, _getter(path), partial(openai_pages, path, 100), noun="fine-tune",
                 listing="sxwl finetune list")  # fmt: skip


def data_file(given: str) -> dict[str, Any]:
    """A file by id or unique prefix."""
    path = "/v1/files"
    return fetch(given, _getter(path), partial(openai_pages, path, 200), noun="file",
                 listing="sxwl files list")  # fmt: skip


def job(given: str) -> dict[str, Any]:
    """A job by id or unique prefix (the cloud's search narrows the listing: ids that begin with the
    prefix, and names that contain it, so a page as long as it gives)."""

    def candidates() -> Iterable[str]:
        found = client.call("GET", "/api/v1/jobs", params={"q": given, "per_page": 200})
        return [str(j["id"]) for j in found.json()["items"]]

    return fetch(given, _getter("/api/v1/jobs"), candidates, noun="job", listing="sxwl jobs list")
