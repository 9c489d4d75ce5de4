"""HTTP edges on a real uvicorn server, configured as ``sxwl serve`` does: unhandled errors, who may
set X-Forwarded-For, slow clients; and a log read past its end."""

from __future__ import annotations

import http.client
import json
import logging
import select
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import APIRouter, FastAPI, Request
from fastapi.testclient import TestClient
from pydantic import ValidationError
from sqlalchemy import text

from sxwl.cloud.app import API_PREFIX, API_ROUTERS, create_app
from sxwl.cloud.config import Settings
from sxwl.cloud.context import CloudContext
from sxwl.cloud.edge.body_rules import BodyRules
from sxwl.cloud.kit.logs import JsonFormatter
from sxwl.ctl import cloud as ctl_cloud
from sxwl.protocol import paths
from tests.conftest import MakeSettings
from tests.support.cloud import test_settings as settings_for
from tests.support.served import Served, read_until_closed
from tests.test_jobs_api import Setup


def sqlite_settings(tmp_path: Path, **overrides: object) -> Settings:
    tmp_path.mkdir(parents=True, exist_ok=True)
    return settings_for(tmp_path / "data", f"sqlite:///{tmp_path / 'sxwl.db'}", **overrides)


def failing_app(settings: Settings) -> FastAPI:
    """The cloud with routes that fail the way a bug would: only this test adds them."""
    app = create_app(settings)
    router = APIRouter()

    @router.get("/test/boom")
    def boom() -> None:
        raise RuntimeError("kaboom in a worker thread")

    @router.post("/test/boom-in-transaction")
    async def boom_in_transaction(request: Request) -> None:
        await request.body()
        ctx: CloudContext = request.app.state.ctx
        with ctx.db.session() as session:
            session.execute(text("SELECT 1"))
            raise RuntimeError("kaboom inside a transaction")

    app.include_router(router)
    return app


def error_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "sxwl.http" and r.getMessage() == "unhandled error"]


def test_unhandled_error_is_the_contract_500_with_request_id_and_keeps_the_connection(
    make_settings: MakeSettings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="sxwl.http")
    with Served(failing_app(make_settings()), make_settings()) as served:
        conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=10)
        seen = []
        for method, path, body in (
            ("GET", "/test/boom", None),
            ("POST", "/test/boom-in-transaction", b'{"unread": true}'),
        ):
            conn.request(method, path, body=body)
            response = conn.getresponse()
            assert response.status == 500
            assert response.getheader("content-type") == "application/json"
            assert json.loads(response.read()) == {
                "error": {"code": "internal", "message": "internal server error", "details": None}
            }
            request_id = response.getheader("x-request-id")
            assert request_id and len(request_id) == 16
            assert response.getheader("connection") is None  # neither closed nor announced as closing
            seen.append(request_id)
            socket_used = conn.sock
            # The same connection serves the next request; the database is fine after the rollback.
            login = json.dumps({"email": "a@example.com", "password": "not the password"})
            conn.request("POST", "/api/v1/auth/login", login, {"Content-Type": "application/json"})
            after = conn.getresponse()
            assert after.status == 401 and after.read()
            assert conn.sock is socket_used
        conn.close()

    records = error_records(caplog)
    assert [r.request_id for r in records] == seen  # type: ignore[attr-defined]
    for record, message in zip(records, ("worker thread", "inside a transaction"), strict=True):
        line = json.loads(JsonFormatter().format(record))
        assert line["request_id"] == record.request_id  # type: ignore[attr-defined]
        assert line["path"].startswith("/test/boom")
        assert "Traceback" in line["exc"] and message in line["exc"]


def login_attempt(url: str, email: str, forwarded_for: str) -> httpx.Response:
    return httpx.post(
        f"{url}/api/v1/auth/login",
        json={"email": email, "password": "not the password"},
        headers={"X-Forwarded-For": forwarded_for},
    )


def request_clients(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        getattr(r, "client", "")
        for r in caplog.records
        if r.name == "sxwl.http" and getattr(r, "path", "") == "/api/v1/auth/login"
    ]


def test_forwarded_for_is_ignored_unless_the_peer_is_a_trusted_proxy(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="sxwl.http")
    limits = {"rate_login_ip": "2/60", "rate_login_account": "100/60"}
    settings = sqlite_settings(tmp_path / "default", **limits)
    with Served(create_app(settings), settings) as served:
        # By default loopback is no proxy: every attempt counts against 127.0.0.1, whatever it says.
        assert login_attempt(served.url, "a@example.com", "203.0.113.1").status_code == 401
        assert login_attempt(served.url, "b@example.com", "203.0.113.2").status_code == 401
        assert login_attempt(served.url, "c@example.com", "203.0.113.3").status_code == 429
    assert request_clients(caplog) == ["127.0.0.1"] * 3

    caplog.clear()
    settings = sqlite_settings(tmp_path / "proxied", trusted_proxies="10.0.0.0/8, 127.0.0.1", **limits)
    with Served(create_app(settings), settings) as served:
        assert login_attempt(served.url, "a@example.com", "203.0.113.1").status_code == 401
        assert login_attempt(served.url, "b@example.com", "203.0.113.1").status_code == 401
        assert login_attempt(served.url, "c@example.com", "203.0.113.1").status_code == 429
        # Another client behind the same proxy has its own limit.
        assert login_attempt(served.url, "d@example.com", "198.51.100.4, 10.1.2.3").status_code == 401
    assert request_clients(caplog) == ["203.0.113.1"] * 3 + ["198.51.100.4"]


@pytest.mark.parametrize("value", ["localhost", "10.0.0.1/8", "127.0.0.1, nope"])
def test_trusted_proxies_must_be_addresses_or_networks(tmp_path: Path, value: str) -> None:
    with pytest.raises(ValidationError, match="trusted_proxies"):
        sqlite_settings(tmp_path, trusted_proxies=value)


def test_log_read_past_the_end_answers_the_real_end(client: TestClient) -> None:
    setup = Setup(client)
    job = setup.submit()
    setup.poll()
    assert setup.status(job["id"], 1, "running").status_code == 200
    assert setup.log(job["id"], 1, 0, b"step 1\n").json()["next_offset"] == 7

    def read(offset: int, **params: Any) -> httpx.Response:
        url = f"/api/v1/jobs/{job['id']}/logs"
        response: httpx.Response = client.get(url, headers=setup.user, params={"offset": offset, **params})
        return response

    for offset in (7, 8, 10**12):
        past = read(offset)
        assert past.status_code == 200 and past.text == ""
        assert past.headers["X-Next-Offset"] == "7" and past.headers["X-Log-Complete"] == "false"
    assert setup.status(job["id"], 1, "succeeded", exit_code=0).status_code == 200
    done = read(999, attempt=1)
    assert (
        done.text == "" and done.headers["X-Next-Offset"] == "7" and done.headers["X-Log-Complete"] == "true"
    )
    # Following from the answered offset gets nothing twice and nothing lost.
    assert read(0).text == "step 1\n"


SLOW = {"request_head_timeout_s": 1.0, "request_body_timeout_s": 1.0, "keep_alive_timeout_s": 1}


@pytest.fixture
def slow_limits_server(tmp_path: Path) -> Any:
    settings = sqlite_settings(tmp_path, **SLOW)
    with Served(create_app(settings), settings) as served:
        yield served


def trickle(sock: socket.socket, pieces: list[bytes], every_s: float = 0.2) -> float:
    """Sends ``pieces`` one by one until the server answers; returns when it did (monotonic)."""
    for piece in pieces:
        if select.select([sock], [], [], every_s)[0]:
            return time.monotonic()
        sock.sendall(piece)
    raise AssertionError("the server waited for the whole trickle")


def parse(raw: bytes) -> tuple[str, dict[str, str], Any]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status, *lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return status, headers, json.loads(body)


def test_request_head_that_trickles_in_gets_408_and_is_closed(slow_limits_server: Served) -> None:
    with slow_limits_server.connect() as sock:
        started = time.monotonic()
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n")
        answered = trickle(sock, [b"X-Slow: %d\r\n" % i for i in range(100)])
        status, headers, body = parse(read_until_closed(sock))
    assert 0.9 < answered - started < 3
    assert status == "HTTP/1.1 408 Request Timeout" and headers["connection"] == "close"
    assert body["error"]["code"] == "timeout"


def test_silent_and_idle_connections_are_closed(slow_limits_server: Served) -> None:
    with slow_limits_server.connect() as sock:
        started = time.monotonic()
        assert read_until_closed(sock) == b""  # not a byte sent: closed without an answer
        assert 0.9 < time.monotonic() - started < 3
    with slow_limits_server.connect() as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        started = time.monotonic()
        answer = read_until_closed(sock)  # keep-alive, then closed when idle
        assert answer.startswith(b"HTTP/1.1 200") and b'{"status":"ok"}' in answer
        assert 0.9 < time.monotonic() - started < 3


def test_oversized_request_head_is_431(slow_limits_server: Served) -> None:
    with slow_limits_server.connect() as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Pad: " + b"a" * 70_000 + b"\r\n\r\n")
        status, headers, body = parse(read_until_closed(sock))
    assert status.startswith("HTTP/1.1 431") and headers["connection"] == "close"
    assert body["error"]["code"] == "too_large"


def test_request_body_that_trickles_in_gets_408_and_is_closed(slow_limits_server: Served) -> None:
    with slow_limits_server.connect() as sock:
        started = time.monotonic()
        sock.sendall(
            b"POST /api/v1/auth/register HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
            b"Content-Length: 400\r\n\r\n{"
        )
        answered = trickle(sock, [b" "] * 100)
        status, headers, body = parse(read_until_closed(sock))
    assert 0.9 < answered - started < 3
    assert status == "HTTP/1.1 408 Request Timeout" and headers["connection"] == "close"
    assert len(headers["x-request-id"]) == 16
    assert body["error"] == {
        "code": "timeout",
        "message": "request body not received within 1 s",
        "details": None,
    }


def test_a_request_in_time_is_served(slow_limits_server: Served) -> None:
    """The deadlines are per request: a keep-alive connection serves requests for longer."""
    with httpx.Client(base_url=slow_limits_server.url) as http_client:
        for i in range(4):
            response = http_client.post(
                "/api/v1/auth/register",
                json={"email": f"u{i}@example.com", "password": "long enough", "role": "user"},
            )
            assert response.status_code == 201, response.text
            time.sleep(0.4)


def test_3kctl_checks_the_key_on_the_agent_protocols_path() -> None:
    # 3kctl travels without pydantic, so it cannot import sxwl.protocol: its copy must agree.
    assert paths.url(paths.ACCESS_KEY_CHECK) == ctl_cloud.CHECK_PATH


def test_routes_declare_their_body_rules(tmp_path: Path) -> None:
    settings = settings_for(
        tmp_path, f"sqlite:///{tmp_path / 'x.db'}", heartbeat_max_bytes=4096, artifact_max_bytes=10**9
    )
    rules = BodyRules([(API_PREFIX, router) for router in API_ROUTERS], settings)
    default = (settings.max_body_bytes, settings.request_body_timeout_s)
    assert rules.rule_for("POST", paths.url(paths.HEARTBEAT)) == (4096, settings.request_body_timeout_s)
    upload = paths.url(paths.JOB_ARTIFACT, job_id="j1", path="ckpt/model.bin")
    assert rules.rule_for("PUT", upload) == (10**9, settings.artifact_upload_timeout_s)
    assert rules.rule_for("GET", upload) == default  # not the upload route
    assert rules.rule_for("POST", "/api/v1/jobs") == default
