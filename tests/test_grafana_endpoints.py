"""The endpoints' Grafana dashboard (deploy/grafana/endpoints.json, docs/operations.md): every
panel's PromQL names only series that a running cloud's /metrics exports, and it shows each of the
endpoint metrics (docs/endpoints.md, "Metrics")."""

from __future__ import annotations

import json
import re
from pathlib import Path

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from tests.support.cloud import METRICS_AUTH

DASHBOARD = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "endpoints.json"
# The series Prometheus stores for a family of each type (before any call, a labelled family has
# its HELP and TYPE but no samples yet; its series are these names).
SERIES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
}


def test_the_endpoints_dashboard_queries_only_series_the_cloud_exports(client: TestClient) -> None:
    scraped = client.get("/metrics", headers=METRICS_AUTH)
    assert scraped.status_code == 200
    exposed = set()
    for family in text_string_to_metric_families(scraped.text):
        exposed |= {family.name + suffix for suffix in SERIES.get(family.type, ("",))}
        exposed |= {sample.name for sample in family.samples}
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    queries = [v["definition"] for v in variables.values() if v["type"] == "query"]
    titled = {}
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        titled[panel["title"]] = {t["expr"] for t in panel["targets"]}
        queries += [t["expr"] for t in panel["targets"]]
    queried = {name for query in queries for name in re.findall(r"\bsxwl_[a-z_]+\b", query)}
    assert queried and queried <= exposed, sorted(queried - exposed)
    assert {
        "sxwl_endpoint_requests_total",
        "sxwl_endpoint_time_to_first_token_seconds_bucket",
        "sxwl_endpoint_tokens_total",
        "sxwl_endpoint_open_streams",
    } <= queried
    assert set(titled) == {
        "Requests by outcome",
        "Errors",
        "Time to first token",
        "Tokens per second",
        "Open streams",
    }
