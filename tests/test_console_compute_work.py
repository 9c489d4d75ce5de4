"""算力详情 names the work on a provider's CPod for what it is (docs/dev-envs.md, "The provider's
view"; docs/endpoints.md): a plain job, replica N of an endpoint, a dev environment, in zh-CN and
English, and shows nothing of the tenant's: no job or environment names, no environment variables,
no email, no secret."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import pytest
from fastapi.testclient import TestClient

from sxwl.cloud.services.scheduling import scheduler
from tests.support.billing_api import BILLING, PRODUCT
from tests.support.clock import TestClock
from tests.test_endpoints_api import Endpoints
from tests.test_reasons import signed_in

SECRET = "hf_tenant-secret-value-0001"


@pytest.fixture
def eps(clock: TestClock, make_client: Callable[..., TestClient]) -> Iterator[Endpoints]:
    setup = Endpoints(make_client(**BILLING), clock)
    setup.top_up("100")
    setup.gpus = 8  # room for all of it at once
    setup.beat()
    yield setup


def _work(html: str) -> dict[str, list[str]]:
    """Each work row's cells as text, by its job id."""
    rows = re.findall(r'<tr data-job="(\w+)" data-work="[\w-]+">(.*?)</tr>', html, re.S)
    return {
        job_id: [
            re.sub(r"<[^>]+>|\s+", " ", cell).strip()
            for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
        ]
        for job_id, row in rows
    }


def test_the_provider_sees_replicas_and_dev_environments_as_what_they_are(
    eps: Endpoints, clock: TestClock
) -> None:
    endpoint = eps.created(name="chat", replicas=2)
    replicas = [r["job_id"] for r in endpoint["replica_jobs"]]
    job = eps.submit(name="private-experiment", env={"HF_TOKEN": SECRET}, gpus_per_node=1)
    env = eps.client.post(
        "/api/v1/dev-envs",
        headers=eps.user,
        json={"name": "my-secret-lab", "gpus": 1, "gpu_product": PRODUCT},
    )
    assert env.status_code == 201, env.text
    env_job = env.json()["job_id"]
    scheduler.schedule_once(eps.ctx)
    assigned = {a["job_id"]: a for a in eps.poll()["assignments"]}
    assert set(assigned) == {*replicas, job["id"], env_job}
    for job_id, assignment in assigned.items():
        eps.status(job_id, 1, "starting")
        eps.listed[job_id, 1] = assignment["gpus_per_node"]
    eps.beat()
    eps.status(replicas[0], 1, "running")
    for lang, named in (
        ("zh", ["推理服务 chat 的副本 1", "推理服务 chat 的副本 2", "任务", "开发环境"]),
        ("en", ["Replica 1 of endpoint chat", "Replica 2 of endpoint chat", "Job", "Dev environment"]),
    ):
        page = signed_in(eps.client, "owner@example.com", lang).get("/compute")
        assert page.status_code == 200, page.text
        work = _work(page.text)
        assert [work[j][0] for j in [*replicas, job["id"], env_job]] == named
        assert work[replicas[0]][2] == ("运行中" if lang == "zh" else "Running")
        assert work[replicas[0]][3] == "1" and work[replicas[1]][4] == "—"  # not running yet
        for private in (SECRET, "HF_TOKEN", "private-experiment", "my-secret-lab", "dev@example.com"):
            assert private not in page.text
    # Work that ended leaves the list.
    eps.finish(job["id"], 1, "succeeded")
    page = signed_in(eps.client, "owner@example.com", "en").get("/compute")
    assert job["id"] not in _work(page.text) and len(_work(page.text)) == 3
