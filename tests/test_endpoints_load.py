"""An engine's load in the heartbeat (docs/endpoints.md, "Load"), with the CPod's agent driven by
hand over the agent protocol: what a beat says of a serving replica's engine is shown by the API,
`sxwl endpoints show`'s formatting and the console's Endpoints page in both languages; a load is
only taken from the CPod that runs the attempt, and a bad one is refused naming its field."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from sxwl.cli.endpoints import _load
from sxwl.cloud.services.endpoints import routing
from tests.support.billing_api import BILLING
from tests.support.clock import TestClock
from tests.support.cpods import access_key, beat, gpu_node, register_cpod
from tests.test_endpoints_api import Endpoints
from tests.test_reasons import signed_in


@pytest.fixture
def eps(clock: TestClock, make_client: Callable[..., TestClient]) -> Iterator[Endpoints]:
    setup = Endpoints(make_client(**BILLING), clock)
    setup.top_up("100")
    yield setup
    setup.check_ledger()


def _beat(eps: Endpoints, loads: dict[str, dict[str, Any]]) -> Any:
    """A heartbeat listing the running attempts, with a load for those in ``loads``."""
    eps.seq += 1
    jobs = [
        {"job_id": job_id, "attempt": attempt, "state": "running"}
        | ({"load": loads[job_id]} if job_id in loads else {})
        for job_id, attempt in eps.listed
    ]
    node = gpu_node("w1", count=eps.gpus, used=eps.used + sum(eps.listed.values()))
    return beat(eps.client, eps.token, eps.seq, [node], jobs=jobs)


def test_a_serving_replica_s_load_is_shown_as_its_cpod_s_heartbeat_said(eps: Endpoints) -> None:
    endpoint = eps.created(replicas=2)
    first, second = (r["job_id"] for r in endpoint["replica_jobs"])
    for job_id in (first, second):
        eps.status(job_id, eps.take(job_id), "running")
    assert all(r["load"] is None for r in eps.get(endpoint["id"])["replica_jobs"])
    said = {
        first: {"running": 3, "waiting": 1, "source": "engine"},
        second: {"running": 2, "source": "agent"},
    }
    assert _beat(eps, said).json()["accepted"]
    replicas = {r["job_id"]: r for r in eps.get(endpoint["id"])["replica_jobs"]}
    assert {k: replicas[first]["load"][k] for k in ("running", "waiting", "source")} == said[first]
    assert replicas[second]["load"]["waiting"] is None and replicas[second]["load"]["running"] == 2
    assert replicas[first]["load"]["at"]
    line = _load(replicas[first]["load"])
    assert line.startswith("; load 3 running, 1 waiting (engine metrics, ")
    assert _load(replicas[second]["load"]).startswith("; load 2 running (counted by the agent, ")
    # The console sums the serving replicas; a waiting count only where every engine gives one.
    for lang, text in (("en", "load: 5 in flight"), ("zh", "负载：5 个请求处理中")):
        page = signed_in(eps.client, "dev@example.com", lang).get("/endpoints")
        assert text in page.text, page.text
    _beat(eps, {first: said[first], second: {"running": 0, "waiting": 4, "source": "engine"}})
    for lang, text in (("en", "load: 3 running, 5 waiting"), ("zh", "负载：3 个请求运行中，5 个排队")):
        page = signed_in(eps.client, "dev@example.com", lang).get("/endpoints")
        assert text in page.text, page.text
    # A beat without loads forgets them: an old figure is not shown as the engine's now.
    eps.beat()
    assert all(r["load"] is None for r in eps.get(endpoint["id"])["replica_jobs"])


def test_another_cpod_s_word_on_a_replica_s_load_is_not_taken(eps: Endpoints) -> None:
    endpoint = eps.created()
    (job_id,) = (r["job_id"] for r in endpoint["replica_jobs"])
    eps.status(job_id, eps.take(job_id), "running")
    other = register_cpod(eps.client, access_key(eps.client, eps.provider), cluster_uid="other-cluster")
    load = {"running": 9, "waiting": 9, "source": "engine"}
    job = {"job_id": job_id, "attempt": 1, "state": "running", "load": load}
    answer = beat(eps.client, other["cpod_token"], 1, [gpu_node("x1", count=1)], jobs=[job])
    assert answer.status_code == 200, answer.text
    (replica,) = eps.get(endpoint["id"])["replica_jobs"]
    assert replica["load"] is None


@pytest.mark.parametrize(
    ("load", "field"),
    [
        ({"running": -1, "source": "engine"}, "running"),
        ({"running": 1, "waiting": "2", "source": "engine"}, "waiting"),
        ({"running": 1, "source": "guess"}, "source"),
    ],
)
def test_a_bad_load_is_refused_naming_its_field(eps: Endpoints, load: dict[str, Any], field: str) -> None:
    job = {"job_id": "j1", "attempt": 1, "state": "running", "load": load}
    answer = beat(eps.client, eps.token, eps.seq + 1, [gpu_node("w1", count=eps.gpus)], jobs=[job])
    assert answer.status_code == 422, answer.text
    assert field in str(answer.json()["error"]["details"])


def test_a_call_goes_to_the_less_busy_of_two_serving_replicas(eps: Endpoints) -> None:
    """Routing takes two serving replicas at random and sends the call to the one whose engine
    the heartbeats said was less busy (running and waiting); with no load said, either."""
    endpoint = eps.created(replicas=2)
    first, second = (r["job_id"] for r in endpoint["replica_jobs"])
    for job_id in (first, second):
        eps.status(job_id, eps.take(job_id), "running")

    def routed() -> set[str]:
        with eps.ctx.db.session() as session:
            serving = routing.serving(session, eps.user_id, "chat")
        routes = {routing.pick(serving, eps.ctx.engine_loads) for _ in range(40)}
        return {route.target.rsplit("-", 1)[0] for route in routes}

    assert routed() == {first, second}  # nothing said yet: both take calls
    _beat(
        eps,
        {first: {"running": 1, "waiting": 3, "source": "engine"}, second: {"running": 2, "source": "agent"}},
    )
    assert routed() == {second}
    _beat(
        eps,
        {first: {"running": 0, "waiting": 0, "source": "engine"}, second: {"running": 2, "source": "agent"}},
    )
    assert routed() == {first}
