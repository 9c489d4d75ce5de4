"""/metrics answers only the scraper that sends the metrics token (docs/operations.md, "Metrics"):
anonymous callers, a wrong token and a user's own API token get a 401; a cloud with no token set
answers no one."""

from __future__ import annotations

from collections.abc import Callable

from fastapi.testclient import TestClient

from tests.conftest import login, register
from tests.support.cloud import METRICS_AUTH, METRICS_TOKEN


def test_metrics_need_the_scrape_token(client: TestClient) -> None:
    register(client, "dev@example.com", "user")
    user = login(client, "dev@example.com")
    for headers in (
        {},
        {"Authorization": "Bearer wrong"},
        {"Authorization": f"Bearer {METRICS_TOKEN}x"},
        {"Authorization": f"Basic {METRICS_TOKEN}"},
        user,
    ):
        refused = client.get("/metrics", headers=headers)
        assert refused.status_code == 401, headers
        assert refused.headers["www-authenticate"] == 'Bearer realm="metrics"'
        assert "SXWL_METRICS_TOKEN" in refused.json()["error"]["message"]
        assert "sxwl_" not in refused.text
    scraped = client.get("/metrics", headers=METRICS_AUTH)
    assert scraped.status_code == 200 and scraped.headers["content-type"].startswith("text/plain")
    assert "sxwl_cpods" in scraped.text and "sxwl_http_requests_total" in scraped.text


def test_without_a_token_set_metrics_answer_no_one(make_client: Callable[..., TestClient]) -> None:
    client = make_client(metrics_token="")
    for headers in ({}, {"Authorization": "Bearer "}, METRICS_AUTH):
        assert client.get("/metrics", headers=headers).status_code == 401
