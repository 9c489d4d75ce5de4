"""/metrics: the fleet's gauges from the database, the scheduler's and agents' histograms, and the
counters summed across the workers of `sxwl serve --workers 2`."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
from fastapi.testclient import TestClient

from tests.support.agent import eventually
from tests.support.cloud import METRICS_AUTH
from tests.support.postgres import TempPostgres
from tests.support.scrape import Samples, samples, value
from tests.test_jobs_api import PRODUCT, Setup
from tests.test_workers import Workers

DASHBOARD = Path(__file__).resolve().parents[1] / "deploy" / "grafana" / "sxwl-cloud.json"


def scrape(client: TestClient) -> Samples:
    response = client.get("/metrics", headers=METRICS_AUTH)
    assert response.status_code == 200
    return samples(response.text)


def test_fleet_gauges_and_histograms_follow_cpods_and_jobs(client: TestClient) -> None:
    before = scrape(client)
    setup = Setup(client, gpus=8)  # one online CPod with 8 A100s, a user
    queued = setup.submit(gpus_per_node=64)  # more than any CPod has: stays queued
    job = setup.submit(gpus_per_node=2)
    (assignment,) = setup.poll()["assignments"]
    assert assignment["job_id"] == job["id"]
    assert setup.status(job["id"], 1, "starting").status_code == 200
    assert setup.status(job["id"], 1, "running").status_code == 200  # only the first report counts

    found = scrape(client)
    assert value(found, "sxwl_cpods", status="online") == 1
    assert value(found, "sxwl_cpods", status="offline") == 0
    assert value(found, "sxwl_gpus_offered", product=str(PRODUCT)) == 8
    assert value(found, "sxwl_gpus_allocatable", product=str(PRODUCT)) == 8
    assert value(found, "sxwl_gpus_in_use", product=str(PRODUCT)) == 0  # as the CPod last reported
    assert value(found, "sxwl_jobs", state="queued") == 1
    assert value(found, "sxwl_jobs", state="running") == 1
    assert value(found, "sxwl_jobs", state="succeeded") == 0
    assert value(found, "sxwl_queue_depth") == 1
    assert 0 < value(found, "sxwl_queue_oldest_age_seconds") < 60
    assert value(found, "sxwl_cpod_heartbeat_age_cpods", le="10") == 1
    assert value(found, "sxwl_cpod_heartbeat_age_cpods", le="+Inf") == 1

    def grew(name: str) -> float:
        return value(found, name) - value(before, name)

    assert grew("sxwl_dispatch_latency_seconds_count") == 1
    assert 0 <= grew("sxwl_dispatch_latency_seconds_sum") < 10
    assert grew("sxwl_scheduling_pass_duration_seconds_count") >= 1
    assert grew("sxwl_db_queries_total") > 10

    cancelled = client.post(f"/api/v1/jobs/{queued['id']}/cancel", headers=setup.user)
    assert cancelled.status_code == 200, cancelled.text
    after = scrape(client)
    assert value(after, "sxwl_queue_depth") == 0 and value(after, "sxwl_queue_oldest_age_seconds") == 0
    assert value(after, "sxwl_jobs", state="cancelled") == 1


def test_the_dashboard_queries_only_metrics_that_exist(client: TestClient) -> None:
    Setup(client)
    client.get("/healthz")
    exposed = {name for name, _ in scrape(client)}
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["schemaVersion"] >= 36 and dashboard["uid"] and dashboard["title"]
    (datasource,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert datasource["query"] == "prometheus"
    queried = set()
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${" + datasource["name"] + "}"}
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            queried |= set(re.findall(r"\bsxwl_[a-z_]+\b", target["expr"]))
    assert queried and queried <= exposed, sorted(queried - exposed)
    # Every metric this change adds is on the dashboard.
    assert {
        "sxwl_cpods",
        "sxwl_gpus_offered",
        "sxwl_gpus_allocatable",
        "sxwl_gpus_in_use",
        "sxwl_jobs",
        "sxwl_queue_depth",
        "sxwl_queue_oldest_age_seconds",
        "sxwl_scheduling_pass_duration_seconds_bucket",
        "sxwl_dispatch_latency_seconds_bucket",
        "sxwl_cpod_heartbeat_age_cpods",
        "sxwl_notifications_sent_total",
        "sxwl_notifications_received_total",
        "sxwl_db_queries_total",
    } <= queried


def test_counters_add_up_across_workers_and_gauges_do_not(postgres: TempPostgres, tmp_path: Path) -> None:
    cloud = Workers(postgres.create_database(), tmp_path / "data")
    try:
        url = cloud.url
        httpx.post(
            f"{url}/api/v1/auth/register",
            json={"email": "dev@example.com", "password": "correct horse", "role": "user"},
        ).raise_for_status()
        token = httpx.post(
            f"{url}/api/v1/auth/login", json={"email": "dev@example.com", "password": "correct horse"}
        ).json()["access_token"]
        submitted = httpx.post(
            f"{url}/api/v1/jobs",
            headers={"Authorization": f"Bearer {token}"},
            json={"name": "t", "command": "true", "gpus_per_node": 1},
        )
        assert submitted.status_code == 201, submitted.text

        def healthz_total(worker: str) -> float | None:
            """The summed /healthz count, as a scrape answered by ``worker`` reports it."""
            response = httpx.get(f"{url}/metrics", headers={"Connection": "close", **METRICS_AUTH})
            if response.headers["x-sxwl-worker"] != worker:
                return None
            found = samples(response.text)
            assert value(found, "sxwl_jobs", state="queued") == 1  # read once, not once per worker
            assert value(found, "sxwl_queue_depth") == 1
            return value(found, "sxwl_http_requests_total", method="GET", route="/healthz", status="200")

        start = eventually(lambda: healthz_total("0"), what="a scrape by worker 0")
        served = {httpx.get(f"{url}/healthz", headers={"Connection": "close"}).headers["x-sxwl-worker"]}
        for _ in range(39):
            served.add(httpx.get(f"{url}/healthz", headers={"Connection": "close"}).headers["x-sxwl-worker"])
        assert served == {"0", "1"}  # both workers counted some of them
        assert eventually(lambda: healthz_total("0"), what="a scrape by worker 0") == start + 40
        assert eventually(lambda: healthz_total("1"), what="a scrape by worker 1") == start + 40
    finally:
        cloud.stop()
