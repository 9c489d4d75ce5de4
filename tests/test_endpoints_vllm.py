"""Endpoints on a GPU CPod (docs/endpoints.md, "Engines"): vLLM cannot run on these machines, so a
stand-in `vllm` on the agent's PATH (tests/support/fake_vllm.py) records the command line the
engine's supervisor gives it and each request it answers. A real cloud and a real agent with
simulated GPUs, the replica in its sandbox, the `openai` client through the tunnel: the test asserts
on what the stand-in recorded (the pinned flags, --enable-lora for an adapter, the served names),
and that an engine that keeps exiting is started again in place, then fails the replica with its
last lines as the reason."""

from __future__ import annotations

import io
import json
import os
import sys
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.finetune_models import CatalogModel, ModelKind
from tests.support import cloud as cloud_support
from tests.support import scrape
from tests.support.agent import eventually
from tests.support.finetune_rows import add_model
from tests.test_finetune_system import MODEL, FineTuneWorld
from tests.test_jobs_process import PRODUCT

openai = pytest.importorskip("openai")
URL = "/api/v1/endpoints"
FAKE = Path(__file__).parent / "support" / "fake_vllm.py"


class GpuWorld(FineTuneWorld):
    def __init__(self, root: Path, db_url: str, **env: str) -> None:
        super().__init__(root, db_url, **env)
        self.bin = root / "fakebin"
        self.bin.mkdir()
        vllm = self.bin / "vllm"
        vllm.write_text(f"#!{sys.executable}\n" + FAKE.read_text())
        vllm.chmod(0o755)
        path = f"{self.bin}:{os.environ['PATH']}"
        self.agent("g", 2, "--share-dir", str(self.bin), env={"PATH": path})
        self.online()

    def create(self, **body: Any) -> dict[str, Any]:
        payload = {"name": "chat", "model": MODEL, "gpus": 1, "gpu_product": PRODUCT} | body
        response = httpx.post(f"{self.url}{URL}", headers=self.user, json=payload)
        assert response.status_code == 201, response.text
        out: dict[str, Any] = response.json()
        return out

    def wait_endpoint(self, endpoint_id: str, *states: str, timeout: float = 60) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            found: dict[str, Any] = httpx.get(f"{self.url}{URL}/{endpoint_id}", headers=self.user).json()
            return found if found["state"] in states else None

        return eventually(reached, timeout=timeout, what=f"endpoint {endpoint_id} {'/'.join(states)}")

    def calls(self, job_id: str, file: str = "vllm-calls.jsonl") -> list[dict[str, Any]]:
        (work,) = (self.root / "agent-g" / "jobs").glob(f"{job_id}*/work")
        return [json.loads(line) for line in (work / file).read_text().splitlines()]

    def wait_load(self, endpoint_id: str, wanted: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        """The first replica's load once the heartbeats brought one that ``wanted`` takes."""

        def reached() -> dict[str, Any] | None:
            found = httpx.get(f"{self.url}{URL}/{endpoint_id}", headers=self.user).json()
            load: dict[str, Any] | None = found["replica_jobs"][0]["load"]
            return load if load is not None and wanted(load) else None

        return eventually(reached, timeout=30, what=f"endpoint {endpoint_id}'s load")

    def close(self) -> None:
        """Every endpoint deleted and its replicas stopped before the agents go: a replica's engine
        runs in its own sessions and would outlive them (a test that failed midway included)."""
        try:
            for endpoint in self.client_endpoints():
                self.delete(endpoint["id"])
        finally:
            super().close()

    def client_endpoints(self) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = httpx.get(f"{self.url}{URL}", headers=self.user).json()
        return found

    def delete(self, endpoint_id: str) -> None:
        deleted = httpx.delete(f"{self.url}{URL}/{endpoint_id}", headers=self.user).json()
        for replica in deleted["replica_jobs"]:
            self.wait_state(replica["job_id"], "cancelled", "failed", timeout=60)


@pytest.fixture
def gworld(tmp_path: Path) -> Iterator[GpuWorld]:
    w = GpuWorld(tmp_path, f"sqlite:///{tmp_path / 'sxwl.db'}")
    yield w
    w.close()


def _adapter_tar() -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        config = json.dumps({"peft_type": "LORA", "r": 8}).encode()
        info = tarfile.TarInfo("adapter_config.json")
        info.size = len(config)
        tar.addfile(info, io.BytesIO(config))
    return out.getvalue()


def test_a_gpu_replica_runs_pinned_vllm_and_the_openai_client_reaches_it(gworld: GpuWorld) -> None:
    endpoint = gworld.create(max_model_len=2048, engine_args={"dtype": "bfloat16", "max_num_seqs": 8})
    ready = gworld.wait_endpoint(endpoint["id"], "ready", "failed")
    assert ready["state"] == "ready", ready
    (replica,) = ready["replica_jobs"]
    answer = gworld.api.chat.completions.create(model="chat", messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content == "fake vllm says hi"
    streamed = list(
        gworld.api.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in streamed if c.choices) == "fake vllm says "
    assert streamed[-1].usage is not None and streamed[-1].usage.completion_tokens == 3
    # By its served name too: the model it serves, among the caller's ready endpoints.
    legacy = gworld.api.completions.create(model=MODEL, prompt="hello", max_tokens=2)
    assert legacy.choices[0].text == "fake vllm"

    argv, *requests = gworld.calls(replica["job_id"])
    assert argv["argv"] == [
        "serve",
        "/sxwl/work/inputs/model",
        "--host",
        "127.0.0.1",
        "--port",
        "8000",
        "--served-model-name",
        "chat",
        "--max-model-len",
        "2048",
        "--dtype",
        "bfloat16",
        "--max-num-seqs",
        "8",
    ]
    # The cloud asks for the usage of a stream (stream_options), and names the endpoint's model.
    assert requests == [
        {"path": "/v1/chat/completions", "model": "chat", "stream": False},
        {"path": "/v1/chat/completions", "model": "chat", "stream": True},
        {"path": "/v1/completions", "model": "chat", "stream": False},
    ]
    (day,) = httpx.get(f"{gworld.url}{URL}/{endpoint['id']}", headers=gworld.user).json()["usage"]
    assert (day["requests"], day["prompt_tokens"], day["completion_tokens"]) == (3, 21, 4 + 3 + 2)
    # Per endpoint in Prometheus: calls, tokens, time to first token, no stream left open.
    found = scrape.samples(httpx.get(f"{gworld.url}/metrics", headers=cloud_support.METRICS_AUTH).text)
    labels = {"endpoint": endpoint["id"]}
    assert scrape.value(found, "sxwl_endpoint_requests_total", outcome="ok", **labels) == 3
    assert scrape.value(found, "sxwl_endpoint_tokens_total", kind="completion", **labels) == 9
    assert scrape.value(found, "sxwl_endpoint_time_to_first_token_seconds_count", **labels) == 3
    assert scrape.value(found, "sxwl_endpoint_open_streams", **labels) == 0
    gworld.delete(endpoint["id"])


def test_an_adapter_is_served_by_vllm_with_enable_lora_on_its_base(gworld: GpuWorld) -> None:
    ctx = CloudContext.from_settings(
        cloud_support.test_settings(gworld.root / "cloud", gworld.env["SXWL_DATABASE_URL"])
    )
    with ctx.db.session() as session:
        base = session.scalars(select(CatalogModel).where(CatalogModel.name == MODEL)).one()
        base_id = base.id
    user_id = httpx.get(f"{gworld.url}/api/v1/me", headers=gworld.user).json()["id"]
    adapter = f"ft:{MODEL}:demo:ftjob-1"
    add_model(ctx, adapter, _adapter_tar(), owner_id=user_id, kind=ModelKind.ADAPTER, base_model_id=base_id)
    ctx.db.dispose()
    endpoint = gworld.create(name="tuned", model=adapter)
    assert gworld.wait_endpoint(endpoint["id"], "ready", "failed")["state"] == "ready"
    answer = gworld.api.chat.completions.create(model="tuned", messages=[{"role": "user", "content": "hi"}])
    assert answer.model == "tuned"
    argv, request = gworld.calls(endpoint["replica_jobs"][0]["job_id"])
    assert argv["argv"] == [
        "serve",
        "/sxwl/work/inputs/model",
        "--host",
        "127.0.0.1",
        "--port",
        "8000",
        "--enable-lora",
        "--lora-modules",
        "tuned=/sxwl/work/inputs/adapter",
        "--served-model-name",
        "tuned-base",
    ]
    assert request["model"] == "tuned"  # the adapter, not its base
    gworld.delete(endpoint["id"])


def test_an_engine_that_keeps_exiting_is_restarted_in_place_then_fails_with_its_last_lines(
    gworld: GpuWorld,
) -> None:
    endpoint = gworld.create(name="crashy")
    failed = gworld.wait_endpoint(endpoint["id"], "failed", "ready")
    assert failed["state"] == "failed"
    assert "exited 4 times" in failed["reason"] and "CUDA out of memory" in failed["reason"]
    (replica,) = failed["replica_jobs"]
    assert replica["attempt"] == 1  # restarted in place, not requeued
    log = gworld.logs(replica["job_id"])
    assert log.count("::sxwl-engine:: starting the engine") == 4
    call = gworld.api.chat.completions.with_raw_response
    with pytest.raises(openai.APIStatusError) as refused:
        call.create(model="crashy", messages=[{"role": "user", "content": "hi"}])
    assert refused.value.status_code == 503
    assert refused.value.response.headers["retry-after"] == "10"


def test_a_replica_whose_cpod_is_lost_mid_stream_is_requeued_and_the_endpoint_serves_again(
    gworld: GpuWorld,
) -> None:
    endpoint = gworld.create(name="slow")
    ready = gworld.wait_endpoint(endpoint["id"], "ready", "failed")
    (replica,) = ready["replica_jobs"]
    (record,) = (gworld.root / "agent-g" / "jobs").glob(f"{replica['job_id']}*/job.json")
    supervisor = json.loads(record.read_text())["pid"]
    stream = gworld.api.chat.completions.create(
        model="slow", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
    )
    first = next(iter(stream))
    assert first.choices[0].delta.content == "fake "
    # The engine's own gauges reach the endpoint through the heartbeat: this stream runs, 2 wait.
    load = gworld.wait_load(endpoint["id"], lambda load: load["running"] == 1)
    assert (load["waiting"], load["source"]) == (2, "engine")
    # The CPod is lost mid-stream: its agent dies (its replica's processes run on, unreachable).
    gworld.agents[0].stop()
    with pytest.raises((openai.APIError, httpx.HTTPError)):
        list(stream)  # cut, not a short answer that looks whole
    lost = gworld.wait_endpoint(endpoint["id"], "degraded", "pending", "deploying")
    assert lost["replica_jobs"][0]["state"] in ("queued", "lost", "assigned", "starting")
    # Another CPod takes the requeued replica, and the endpoint serves again.
    path = f"{gworld.bin}:{os.environ['PATH']}"
    gworld.agent("h", 2, "--share-dir", str(gworld.bin), env={"PATH": path})
    again = gworld.wait_endpoint(endpoint["id"], "ready")
    assert again["replica_jobs"][0]["attempt"] == 2
    answer = gworld.api.chat.completions.create(model="slow", messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content == "fake vllm says hi"
    # The lost CPod comes back: its stale attempt is stopped (fencing), its engine with it.
    gworld.agent("g", 2, "--share-dir", str(gworld.bin), env={"PATH": path})

    def gone() -> bool:
        try:
            os.kill(supervisor, 0)
        except ProcessLookupError:
            return True
        return False

    eventually(gone, timeout=60, what="the stale replica's supervisor stopped")
    gworld.delete(endpoint["id"])


def test_an_engine_that_dies_mid_serve_is_replaced_and_the_endpoint_is_ready_again(gworld: GpuWorld) -> None:
    """The engine crashes while it serves (the stand-in exits when told to), is restarted in place
    three times, crashes again and fails its replica; the endpoint submits a replacement, shows
    degraded while it deploys and serves again once it does (docs/endpoints.md)."""
    endpoint = gworld.create(name="dies")
    ready = gworld.wait_endpoint(endpoint["id"], "ready", "failed")
    assert ready["state"] == "ready", ready
    (first,) = ready["replica_jobs"]
    once = gworld.api.with_options(max_retries=0).chat.completions

    def replaced() -> dict[str, Any] | None:
        with pytest.raises((openai.APIError, httpx.HTTPError)):
            once.create(model="dies", messages=[{"role": "user", "content": "exit"}])
        found: dict[str, Any] = httpx.get(f"{gworld.url}{URL}/{endpoint['id']}", headers=gworld.user).json()
        return found if len(found["replica_jobs"]) > 1 else None

    degraded = eventually(replaced, timeout=120, what="the dead replica replaced")
    assert degraded["state"] == "degraded", degraded
    old, new = degraded["replica_jobs"]
    assert (old["job_id"], old["state"], old["attempt"]) == (first["job_id"], "failed", 1)
    assert new["replica"] == 1 and new["job_id"] != first["job_id"]
    assert "exited 4 times" in degraded["reason"] and "engine core died" in degraded["reason"]
    again = gworld.wait_endpoint(endpoint["id"], "ready")
    assert [r["state"] for r in again["replica_jobs"]] == ["failed", "running"]
    answer = gworld.api.chat.completions.create(model="dies", messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content == "fake vllm says hi"
    # The replacement's own engine answered; the dead one's saw only the crashing requests.
    assert {c.get("model") for c in gworld.calls(new["job_id"])[1:]} == {"dies"}
    assert gworld.logs(first["job_id"]).count("::sxwl-engine:: starting the engine") == 4
    gworld.delete(endpoint["id"])


def test_an_engine_without_metrics_reports_the_requests_the_agent_forwards(gworld: GpuWorld) -> None:
    """`transformers serve` has no /metrics (the stand-in named `…bare…` answers 404 there, as it
    does): the agent asks once, then counts the tunnel's streams to the engine itself."""
    endpoint = gworld.create(name="slowbare")
    assert gworld.wait_endpoint(endpoint["id"], "ready", "failed")["state"] == "ready"
    idle = gworld.wait_load(endpoint["id"], lambda load: load["source"] == "agent")
    assert (idle["running"], idle["waiting"]) == (0, None)
    stream = gworld.api.chat.completions.create(
        model="slowbare", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True
    )
    chunks = iter(stream)
    assert next(chunks).choices[0].delta.content == "fake "
    gworld.wait_load(endpoint["id"], lambda load: load["running"] == 1)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "vllm says "
    gworld.wait_load(endpoint["id"], lambda load: load["running"] == 0)
    replica = endpoint["replica_jobs"][0]["job_id"]
    assert gworld.calls(replica, "vllm-metrics.jsonl") == [{"refused": True}]  # asked once
    gworld.delete(endpoint["id"])
