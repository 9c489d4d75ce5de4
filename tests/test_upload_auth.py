"""Every upload route checks its caller, and the caller's storage quota, before it reads a byte of
the body (api/uploads.py): an anonymous or badly signed 200 MiB upload is answered while the client
is still sending, and nothing of it reaches the application, a temporary file or the store. On a
real uvicorn server on loopback, configured as ``sxwl serve`` configures it."""

from __future__ import annotations

import contextlib
import select
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from fastapi import APIRouter, UploadFile
from sqlalchemy import func
from sqlalchemy import select as sql_select
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sxwl.cloud.app import create_app
from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.finetune_models import CatalogModel, DataFile
from sxwl.cloud.db.models import Artifact
from sxwl.cloud.edge.body_rules import BodyRules, body_rule
from tests.conftest import MakeSettings
from tests.support.cloud import test_settings as settings_for
from tests.support.served import Served

BIG = 200 * 1024 * 1024
# Loopback and the kernel's socket buffers take a few MiB before a server that reads nothing stops
# the sender; a server that read the body would take all 200.
EARLY = 24 * 1024 * 1024
BOUNDARY = "sxwl-test-boundary"
JOB = "0" * 32


class BodyBytes:
    """Counts the body bytes the application receives (the outermost middleware)."""

    received = 0

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def counted() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                BodyBytes.received += len(message.get("body", b""))
            return message

        await self.app(scope, counted, send)


@dataclass(frozen=True)
class Answer:
    status: int
    head: str
    body: bytes
    sent: int  # body bytes the client had sent when the answer came


def form(fields: dict[str, str]) -> tuple[bytes, bytes]:
    """The bytes before and after a file part's content in a multipart body."""
    prefix = "".join(
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'
        for name, value in fields.items()
    )
    prefix += (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="big.jsonl"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    )
    return prefix.encode(), f"\r\n--{BOUNDARY}--\r\n".encode()


def upload(
    port: int,
    method: str,
    path: str,
    headers: dict[str, str],
    fields: dict[str, str] | None,
    expect: bool = False,
) -> Answer:
    """Sends a 200 MiB body as fast as the server takes it, until the server answers."""
    prefix, suffix = form(fields) if fields is not None else (b"", b"")
    total = len(prefix) + BIG + len(suffix)
    kind = f"multipart/form-data; boundary={BOUNDARY}" if fields is not None else "application/octet-stream"
    lines = [
        f"{method} {path} HTTP/1.1",
        "Host: 127.0.0.1",
        f"Content-Type: {kind}",
        f"Content-Length: {total}",
    ]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    if expect:
        lines.append("Expect: 100-continue")  # curl's way: the body only after "100 Continue"
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        sock.setblocking(False)
        sent, received = 0, b""
        filler = b"\0" * (256 * 1024)
        deadline = time.monotonic() + 120
        while b"\r\n\r\n" not in received and time.monotonic() < deadline:
            writers = [sock] if sent < total and not expect else []
            readable, writable, _ = select.select([sock], writers, [], 1.0)
            if readable:
                data = sock.recv(65536)
                if not data:
                    break
                received += data
            if writable:
                at = sent
                piece = (
                    prefix[at : at + len(filler)]
                    if at < len(prefix)
                    else filler[: min(len(filler), total - len(suffix) - at)]
                    if at < total - len(suffix)
                    else suffix[at - (total - len(suffix)) :]
                )
                with contextlib.suppress(BlockingIOError):
                    sent += sock.send(piece)
        head, _, body = received.partition(b"\r\n\r\n")
        length = next(
            (
                int(line.split(b":")[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ),
            0,
        )
        sock.setblocking(True)
        while len(body) < length and (data := sock.recv(65536)):
            body += data
        return Answer(int(head.split(b" ")[1]), head.decode(), body, sent)
    finally:
        sock.close()


@dataclass(frozen=True)
class Cloud:
    served: Served
    ctx: CloudContext
    spool: Path  # where Starlette would spool form files


@pytest.fixture
def cloud(make_settings: MakeSettings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cloud]:
    spool = tmp_path / "spool"
    spool.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spool))
    settings = make_settings(storage_quota_bytes=1024 * 1024)
    app = create_app(settings)
    app.add_middleware(BodyBytes)
    BodyBytes.received = 0
    with Served(app, settings) as served:
        yield Cloud(served, app.state.ctx, spool)


def nothing_kept(cloud: Cloud) -> None:
    assert BodyBytes.received == 0  # not a byte of any body reached the application
    assert list(cloud.spool.iterdir()) == []
    store = cloud.ctx.settings.data_dir / "artifacts"
    assert not store.exists() or [p for p in store.rglob("*") if p.is_file()] == []
    with cloud.ctx.db.session() as session:
        for table in (DataFile, CatalogModel, Artifact):
            assert session.scalar(sql_select(func.count()).select_from(table)) == 0


ROUTES = [
    ("POST", "/v1/files", {"purpose": "fine-tune"}),
    ("POST", "/api/v1/models", {"name": "big"}),
    ("POST", "/api/v1/admin/models", {"name": "big"}),
    ("POST", "/finetune/files", {"csrf_token": "x"}),  # the console's upload
    ("PUT", f"/api/v1/agent/jobs/{JOB}/artifacts/out.bin?attempt=1", None),  # a CPod's
    ("PUT", f"/api/v1/agent/uploads/{JOB}/1/out.bin", None),  # a Kubernetes pod's
]
CALLERS = {
    "anonymous": {},
    "bad token": {"Authorization": "Bearer sxwl_not-a-real-token-0123456789"},
    "bad session": {"Cookie": "sxwl_session=not-a-real-session"},
}


@pytest.mark.parametrize("caller", list(CALLERS))
@pytest.mark.parametrize(("method", "path", "fields"), ROUTES, ids=[r[1].split("?")[0] for r in ROUTES])
def test_an_unknown_callers_200_mib_upload_is_refused_before_it_is_read(
    cloud: Cloud, caller: str, method: str, path: str, fields: dict[str, str] | None
) -> None:
    answer = upload(cloud.served.port, method, path, CALLERS[caller], fields)
    if path.startswith("/finetune"):
        assert answer.status == 303 and "location: /login" in answer.head.lower()
    elif "/uploads/" in path and caller == "bad token":  # a token that is no attempt's upload token
        assert answer.status == 403 and b'"not_your_upload"' in answer.body
    else:
        assert answer.status == 401, answer.body
    assert answer.sent < EARLY, f"answered only after {answer.sent} bytes"
    nothing_kept(cloud)


def test_a_client_that_waits_for_100_continue_sends_no_body_at_all(cloud: Cloud) -> None:
    answer = upload(cloud.served.port, "POST", "/v1/files", {}, {"purpose": "fine-tune"}, expect=True)
    assert answer.status == 401 and answer.sent == 0 and "100 Continue" not in answer.head
    nothing_kept(cloud)


def test_a_declared_size_over_the_quota_is_refused_before_it_is_read(cloud: Cloud) -> None:
    url = cloud.served.url
    httpx.post(
        f"{url}/api/v1/auth/register",
        json={"email": "dev@example.com", "password": "correct horse", "role": "user"},
    ).raise_for_status()
    token = httpx.post(
        f"{url}/api/v1/auth/login", json={"email": "dev@example.com", "password": "correct horse"}
    ).json()["access_token"]
    signed_in = {"Authorization": f"Bearer {token}"}
    BodyBytes.received = 0  # those of the sign-up and sign-in
    for path, fields in (("/v1/files", {"purpose": "fine-tune"}), ("/api/v1/models", {"name": "big"})):
        answer = upload(cloud.served.port, "POST", path, signed_in, fields)
        assert answer.status == 413 and b'"storage_quota_exceeded"' in answer.body, answer.body
        assert answer.sent < EARLY
    nothing_kept(cloud)


def test_a_large_body_route_that_fastapi_would_read_first_stops_the_app(tmp_path: Path) -> None:
    router = APIRouter()

    @router.post("/careless")
    @body_rule(lambda s: (s.file_max_bytes, s.artifact_upload_timeout_s))
    async def careless(file: UploadFile) -> None:  # read by FastAPI before any dependency runs
        await file.close()

    with pytest.raises(RuntimeError, match="/test/careless has a body rule and a body FastAPI reads"):
        BodyRules([("/test", router)], settings_for(tmp_path, f"sqlite:///{tmp_path / 'x.db'}"))
