"""A Kubernetes CPod's input cache (sxwl/agent/cache_server.py, docs/agent.md "The input cache on
Kubernetes"): the agent's InputCache fetches an attempt's inputs from a real cloud once, its server
answers the attempt's pods on a real socket, and the pod's fetcher (run as the init container runs
it, the machine's own python3 without the project) reads them from there instead of the cloud; who
may read what; and every way the cache can fail falling back to the cloud."""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from sxwl.agent.cache_server import CacheServer
from sxwl.agent.client import CloudClient
from sxwl.agent.input_grants import InputGrants
from sxwl.agent.inputs import InputCache
from sxwl.agent.main import app as agent_app
from sxwl.agent.pod_fetcher import CACHE_PATH, cache_credential
from sxwl.protocol import SHA256_HEADER
from sxwl.protocol.finetune import JobInput
from tests.support.cloud import METRICS_AUTH
from tests.test_pod_inputs import FILES, MODEL_TAR, WEIGHTS, Cloud, cloud, fetch, placed

__all__ = ["cloud"]  # the fixture
POD_INPUT_ROUTE = "/api/v1/agent/pod-inputs/{job_id}/{attempt}/{name}"


def pod_input_requests(url: str) -> int:
    """How many times pods asked the cloud itself for an input (its request counter, by route)."""
    text = httpx.get(f"{url}/metrics", headers=METRICS_AUTH, timeout=30).text
    return int(
        sum(
            sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
            if sample.name == "sxwl_http_requests_total" and sample.labels.get("route") == POD_INPUT_ROUTE
        )
    )


class Agent:
    """What a Kubernetes agent with --serve-inputs holds: the cache of packed inputs and its server."""

    def __init__(self, cloud: Cloud, root: Path) -> None:
        self.cloud = cloud
        self.cpod_token = cloud.ft.agent["Authorization"].removeprefix("Bearer ")
        self.cache = InputCache(root / "cache", CloudClient(cloud.url), unpack_archives=False)
        self.server = CacheServer.bind("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sock.getsockname()[1]}"
        self.grants: InputGrants = self.server.grants
        self.loop = asyncio.new_event_loop()

    def prepare(self, assignment: dict[str, Any]) -> list[Path]:
        """The attempt's inputs in the cache (what JobSync does before the Job is made), then its grant."""

        async def fetch_all() -> list[Path]:
            return [
                await self.cache.fetch(
                    self.cpod_token, assignment["job_id"], assignment["attempt"], JobInput(**item)
                )
                for item in assignment["inputs"]
            ]

        held = asyncio.run_coroutine_threadsafe(fetch_all(), self.loop).result(60)
        shas = frozenset(item["sha256"] for item in assignment["inputs"])
        self.grants.allow(assignment["job_id"], assignment["attempt"], assignment["upload_token"], shas)
        return held

    def get(self, assignment: dict[str, Any], sha256: str, credential: str | None = None) -> httpx.Response:
        path = CACHE_PATH.format(job_id=assignment["job_id"], attempt=assignment["attempt"], sha256=sha256)
        credential = credential or cache_credential(assignment["upload_token"])
        return httpx.get(self.url + path, headers={"Authorization": f"Bearer {credential}"}, timeout=30)


@contextmanager
def running_agent(cloud: Cloud, root: Path) -> Iterator[Agent]:
    agent = Agent(cloud, root)
    stop = asyncio.Event()

    async def serve() -> None:
        try:
            await agent.server.run(agent.cache, stop)
        finally:
            await agent.cache.client.close()

    # Everything of the agent's loop runs in its thread: the main thread may hold another running
    # loop (Playwright's sync API leaves one behind in an xdist worker).
    thread = threading.Thread(target=agent.loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    try:
        yield agent
    finally:
        agent.loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        agent.loop.close()


@pytest.fixture
def agent(cloud: Cloud, tmp_path: Path) -> Iterator[Agent]:
    with running_agent(cloud, tmp_path / "agent") as made:
        yield made


def test_the_pod_reads_every_input_from_the_agent_and_never_asks_the_cloud(
    cloud: Cloud, agent: Agent, tmp_path: Path
) -> None:
    assignment = cloud.running()
    held = agent.prepare(assignment)
    assert held[0].read_bytes() == MODEL_TAR  # kept as the cloud sent it: the pod unpacks it
    assert sorted(entry.sha256 for entry in agent.cache.entries()) == sorted(
        item["sha256"] for item in assignment["inputs"]
    )
    before = pod_input_requests(cloud.url)

    code, message, stderr = fetch(tmp_path / "pod", cloud.url, assignment, SXWL_INPUTS_CACHE_URL=agent.url)

    assert code == 0, stderr
    assert message.endswith("fetched, 3 from the CPod's cache"), message
    assert "input model: 2" in stderr and "from the CPod's cache" in stderr
    assert pod_input_requests(cloud.url) == before  # not one input came from the cloud
    inputs = tmp_path / "pod" / "inputs"
    assert {name: (inputs / "model" / name).read_bytes() for name in FILES} == FILES  # unpacked in the pod
    assert placed(inputs)["model/model.safetensors"] == 0o444
    assert assignment["upload_token"] not in stderr + message


def test_the_cache_answers_only_the_granted_attempt_with_its_own_credential_and_inputs(
    cloud: Cloud, agent: Agent
) -> None:
    assignment = cloud.running()
    agent.prepare(assignment)
    model = next(item for item in assignment["inputs"] if item["name"] == "model")
    ok = agent.get(assignment, model["sha256"])
    assert ok.status_code == 200 and ok.content == MODEL_TAR
    assert ok.headers[SHA256_HEADER] == model["sha256"]
    assert hashlib.sha256(ok.content).hexdigest() == model["sha256"]

    # The upload token itself is not the credential: the cache never learns it.
    assert agent.get(assignment, model["sha256"], credential=assignment["upload_token"]).status_code == 403
    assert agent.get(assignment, model["sha256"], credential="0" * 64).status_code == 403
    other_attempt = {**assignment, "attempt": assignment["attempt"] + 1}
    assert agent.get(other_attempt, model["sha256"]).status_code == 403
    # Another tenant's attempt that knows the sha256 of what this one brought gets nothing either.
    stranger = {**assignment, "job_id": "job-of-someone-else", "upload_token": "their own token"}
    agent.grants.allow(stranger["job_id"], 1, stranger["upload_token"], frozenset({"f" * 64}))
    assert agent.get({**stranger, "attempt": 1}, model["sha256"]).status_code == 403
    # A sha256 outside the attempt's inputs, a malformed one, none at all.
    assert agent.get(assignment, "e" * 64).status_code == 403
    assert agent.get(assignment, "../../cpod.json").status_code == 404
    anonymous = httpx.get(agent.url + f"/v1/inputs/{assignment['job_id']}/1/{model['sha256']}", timeout=30)
    assert anonymous.status_code == 403 and anonymous.json()["error"]["code"] == "forbidden"

    # Once the cloud has the attempt's end, its grant goes.
    agent.grants.revoke(assignment["job_id"], assignment["attempt"])
    assert agent.get(assignment, model["sha256"]).status_code == 403


def test_whatever_goes_wrong_at_the_cache_the_pod_gets_its_inputs_from_the_cloud(
    cloud: Cloud, agent: Agent, tmp_path: Path
) -> None:
    assignment = cloud.running()
    held = agent.prepare(assignment)
    model = next(item for item in assignment["inputs"] if item["name"] == "model")
    model_file = next(path for path in held if path.name == model["sha256"])
    # Same size, other bytes: the fetcher checks the cache's answer like the cloud's.
    os.chmod(model_file, 0o644)
    model_file.write_bytes(os.urandom(len(MODEL_TAR)))
    training = next(item for item in assignment["inputs"] if item["name"] == "training_file")
    (agent.cache.root / training["sha256"]).unlink()  # evicted: not here any more
    before = pod_input_requests(cloud.url)

    code, message, stderr = fetch(tmp_path / "pod", cloud.url, assignment, SXWL_INPUTS_CACHE_URL=agent.url)

    assert code == 0, stderr
    assert message.endswith("fetched, 1 from the CPod's cache"), message
    assert "input model: not from the CPod's cache (sha256 " in stderr
    assert "input training_file: not from the CPod's cache (HTTP 404); from the cloud" in stderr
    assert pod_input_requests(cloud.url) == before + 2
    assert (tmp_path / "pod" / "inputs" / "model" / "model.safetensors").read_bytes() == WEIGHTS

    # An agent restarted since (no grants), or a replica that is not the leader (bound, not serving):
    # the cloud, every input, and at once.
    agent.grants.revoke(assignment["job_id"], assignment["attempt"])
    code, message, stderr = fetch(tmp_path / "pod2", cloud.url, assignment, SXWL_INPUTS_CACHE_URL=agent.url)
    assert code == 0 and message.endswith("fetched, 0 from the CPod's cache"), stderr
    assert "(HTTP 403); from the cloud" in stderr
    idle = CacheServer.bind("127.0.0.1", 0)
    gone = f"http://127.0.0.1:{idle.sock.getsockname()[1]}"
    try:
        code, message, stderr = fetch(tmp_path / "pod3", cloud.url, assignment, SXWL_INPUTS_CACHE_URL=gone)
    finally:
        idle.sock.close()
    assert code == 0 and message.endswith("fetched, 0 from the CPod's cache"), stderr
    assert "ConnectionRefusedError" in stderr
    assert pod_input_requests(cloud.url) == before + 2 + 3 + 3


FINE_TUNES = ["--runtime", "kubernetes", "--trainer-image", "t", "--uploader-image", "u"]


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--serve-inputs", "127.0.0.1:8471"], "needs --runtime kubernetes and one of --trainer-image"),
        (FINE_TUNES[:2] + FINE_TUNES[4:] + ["--serve-inputs", "127.0.0.1:8471"], "one of --trainer-image"),
        ([*FINE_TUNES, "--serve-inputs", "8471"], "--serve-inputs 8471: expected HOST:PORT"),
        ([*FINE_TUNES, "--serve-inputs", "0.0.0.0:8471"], "give --inputs-url, the address pods reach"),
    ],
)
def test_serve_inputs_refuses_what_cannot_work_and_names_the_fix(
    flags: list[str], said: str, tmp_path: Path
) -> None:
    result = CliRunner().invoke(
        agent_app, ["--api-url", "http://127.0.0.1:9", "--state-dir", str(tmp_path), *flags]
    )
    assert result.exit_code == 2, result.output
    assert said in result.output
    assert not (tmp_path / "cpod.json").exists()


def test_serve_inputs_on_a_port_that_is_taken_stops_the_agent_at_start(tmp_path: Path) -> None:
    taken = CacheServer.bind("127.0.0.1", 0)
    taken.sock.listen()  # another program serving there
    port = taken.sock.getsockname()[1]
    flags = [*FINE_TUNES, "--serve-inputs", f"127.0.0.1:{port}"]
    try:
        result = CliRunner().invoke(
            agent_app, ["--api-url", "http://127.0.0.1:9", "--state-dir", str(tmp_path), *flags]
        )
    finally:
        taken.sock.close()
    assert result.exit_code == 2, result.output
    assert f"--serve-inputs 127.0.0.1:{port}: cannot listen" in result.output
