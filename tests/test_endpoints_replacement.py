"""A failed replica replaced (docs/endpoints.md, "Replacing a failed replica"), with the CPod's agent
driven by hand over the agent protocol: a replica that served and failed is followed by a new job for
its index, the endpoint degraded until that one serves and ready again after; past the hourly bound
the endpoint fails with the last reason and its other replicas are stopped; a replica that never
served is not replaced."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from fastapi.testclient import TestClient

from sxwl.cloud.services.endpoints.replacement import PER_HOUR
from tests.support.billing_api import BILLING
from tests.support.clock import TestClock
from tests.test_endpoints_api import URL, Endpoints


@pytest.fixture
def eps(clock: TestClock, make_client: Callable[..., TestClient]) -> Iterator[Endpoints]:
    setup = Endpoints(make_client(**BILLING), clock)
    setup.top_up("100")
    yield setup
    setup.check_ledger()


def _serve(eps: Endpoints, job_id: str) -> int:
    attempt = eps.take(job_id)
    eps.status(job_id, attempt, "running")
    return attempt


def test_a_failed_replica_is_replaced_and_the_endpoint_is_ready_again(eps: Endpoints) -> None:
    endpoint = eps.created()
    (first,) = (r["job_id"] for r in endpoint["replica_jobs"])
    _serve(eps, first)
    assert eps.get(endpoint["id"])["state"] == "ready"
    eps.tick(60)
    eps.finish(first, 1, "failed", reason="engine gave up")
    degraded = eps.get(endpoint["id"])
    assert degraded["state"] == "degraded" and degraded["reason"] == "engine gave up"
    old, new = degraded["replica_jobs"]
    assert (old["replica"], old["job_id"], old["state"]) == (1, first, "failed")
    assert new["replica"] == 1 and new["state"] in ("queued", "assigned")  # the scheduler is awake
    # The replacement is the same replica: the same engine and inputs, placed as any job.
    assert _serve(eps, new["job_id"]) == 1
    ready = eps.get(endpoint["id"])
    assert ready["state"] == "ready" and ready["replicas_ready"] == 1
    # The replica's log is the live job's.
    logs = eps.client.get(f"{URL}/{endpoint['id']}/logs", headers=eps.user, follow_redirects=False)
    assert new["job_id"] in logs.headers["location"]
    eps.tick(60)
    eps.meter()
    eps.client.delete(f"{URL}/{endpoint['id']}", headers=eps.user)
    eps.finish(new["job_id"], 1, "cancelled")
    eps.meter()


def test_past_its_hourly_bound_the_endpoint_fails_with_the_last_reason(eps: Endpoints) -> None:
    endpoint = eps.created(replicas=2)
    first, second = (r["job_id"] for r in endpoint["replica_jobs"])
    _serve(eps, first)
    _serve(eps, second)
    current = second
    for time in range(PER_HOUR):
        eps.tick(60)
        eps.finish(current, 1, "failed", reason=f"engine gave up {time}")
        view = eps.get(endpoint["id"])
        assert view["state"] == "degraded", view
        current = view["replica_jobs"][-1]["job_id"]
        _serve(eps, current)
        assert eps.get(endpoint["id"])["state"] == "ready"
    eps.tick(60)
    eps.finish(current, 1, "failed", reason="engine gave up at last")
    view = eps.get(endpoint["id"])
    assert len(view["replica_jobs"]) == 2 + PER_HOUR  # nothing more replaced
    assert view["state"] == "degraded" and "after 3 replacements within an hour" in view["reason"]
    # The other replica is stopped: an endpoint that gave up bills nothing more.
    (command,) = eps.poll(wait=0)["commands"]
    assert command["job_id"] == first and command["cancel"] is True
    eps.finish(first, 1, "cancelled")
    failed = eps.get(endpoint["id"])
    assert failed["state"] == "failed", failed
    assert failed["reason"].startswith("replica 2 failed again after 3 replacements within an hour")
    assert failed["reason"].endswith("the endpoint stopped: engine gave up at last")
    eps.meter()


def test_replacements_older_than_an_hour_do_not_count(eps: Endpoints) -> None:
    endpoint = eps.created()
    (current,) = (r["job_id"] for r in endpoint["replica_jobs"])
    _serve(eps, current)
    for _ in range(PER_HOUR + 1):
        eps.tick(1300)  # three replacements never fall within one hour
        eps.finish(current, 1, "failed", reason="engine gave up")
        view = eps.get(endpoint["id"])
        assert view["state"] == "degraded", view
        current = view["replica_jobs"][-1]["job_id"]
        _serve(eps, current)
    eps.meter()
    eps.client.delete(f"{URL}/{endpoint['id']}", headers=eps.user)
    eps.finish(current, 1, "cancelled")
    eps.meter()


def test_a_replica_that_never_served_is_not_replaced(eps: Endpoints) -> None:
    endpoint = eps.created()
    (first,) = (r["job_id"] for r in endpoint["replica_jobs"])
    eps.take(first)
    eps.finish(first, 1, "failed", reason="CUDA out of memory")
    failed = eps.get(endpoint["id"])
    assert failed["state"] == "failed" and failed["reason"] == "CUDA out of memory"
    assert len(failed["replica_jobs"]) == 1
