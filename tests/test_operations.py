"""Health, metrics, OpenAPI, request ids and logs that never carry secrets."""

from __future__ import annotations

import logging

import pytest
from fastapi.testclient import TestClient

from sxwl.cloud.kit.logs import JsonFormatter
from tests.conftest import login, register
from tests.support.cloud import METRICS_AUTH


def test_healthz(client: TestClient) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_openapi_lists_the_contract_paths(client: TestClient) -> None:
    spec = client.get("/api/v1/openapi.json").json()
    for path in (
        "/api/v1/auth/register",
        "/api/v1/auth/login",
        "/api/v1/me",
        "/api/v1/me/access-key",
        "/api/v1/me/access-key/rotate",
    ):
        assert path in spec["paths"]


def test_metrics_count_requests_by_route_and_time_them(client: TestClient) -> None:
    register(client, "owner@example.com")
    headers = login(client, "owner@example.com")
    for _ in range(3):
        client.get("/api/v1/me", headers=headers)
    text = client.get("/metrics", headers=METRICS_AUTH).text
    assert 'sxwl_http_requests_total{method="GET",route="/api/v1/me",status="200"} 3.0' in text
    assert 'sxwl_http_request_duration_seconds_count{method="GET",route="/api/v1/me"} 3.0' in text
    assert 'route="/api/v1/auth/register",status="201"' in text


def test_every_response_has_a_request_id(client: TestClient) -> None:
    first = client.get("/healthz").headers["x-request-id"]
    second = client.get("/api/v1/nope").headers["x-request-id"]
    assert first and second and first != second


def test_logs_are_json_with_request_ids_and_no_secrets(
    client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    register(client, "owner@example.com", password="pa55word-SECRET")
    headers = login(client, "owner@example.com", "pa55word-SECRET")
    key = client.get("/api/v1/me/access-key", headers=headers).json()["access_key"]
    client.post("/api/v1/auth/login", json={"email": "owner@example.com", "password": "wrong-SECRET-2"})
    client.get("/api/v1/me?token=query-SECRET-3", headers=headers)

    formatter = JsonFormatter()
    lines = [formatter.format(r) for r in caplog.records if r.name.startswith("sxwl")]
    text = "\n".join(lines)
    request_lines = [line for line in lines if '"msg": "request"' in line]
    assert len(request_lines) >= 5
    assert all('"request_id"' in line for line in request_lines)
    assert '"path": "/api/v1/auth/login"' in text
    token = headers["Authorization"].removeprefix("Bearer ")
    for secret in ("pa55word-SECRET", "wrong-SECRET-2", "query-SECRET-3", token, key):
        assert secret not in text
