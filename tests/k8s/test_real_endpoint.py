"""An endpoint replica on a real Kubernetes node (docs/agent.md, "Endpoints on Kubernetes"): the
agent's kubernetes runtime with an engine image (tests/support/k8s_engine.py) makes the replica's
NetworkPolicy and Job; the pod's ``inputs`` init container fetches the tiny Llama from the agent's
input cache server (the real one, with the attempt's grant), the engine image runs the supervisor
and ``transformers serve`` on the node's CPU, and the agent finds the replica by its tunnel target,
asks its readiness as it does before reporting it running, and a chat completion sent over the
connection the agent opens to that target is answered. The policy selects the replica's pod (and
the tenant's own policy does not), admitting only the agent's pods to the engine's port; the test
nodes' ``bridge`` network plugin does not enforce policies, so no packet drop is claimed here. A
stop deletes the pod, the Job and the policy.

Then through the whole system: a real cloud and ``sxwl-agent --runtime kubernetes --engine-image``
(tests/support/real_cpod.py) deploy an endpoint of the tiny Llama; while a streamed chat completion
is open through the tunnel the replica's load in the heartbeat (the streams the agent forwards to the
pod's address: ``transformers serve`` has no metrics) is at least 1 on ``GET
/api/v1/endpoints/{id}``, and 0 again once it ended; the replica was reported running (billing's
start) only after its main container had started."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import tarfile
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import h11
import httpx
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from sxwl.agent import engine_probe
from sxwl.agent.cache_server import CacheServer
from sxwl.agent.client import CloudClient
from sxwl.agent.forward_targets import TcpTarget, open_target
from sxwl.agent.inputs import InputCache
from sxwl.agent.runtimes.kube_engine import LISTEN_PORT, EngineSettings, policy_name
from sxwl.agent.runtimes.kube_objects import CONTAINER, ENGINE
from sxwl.agent.runtimes.kube_tenancy import NETWORK_POLICY
from sxwl.agent.runtimes.kube_uploads import UploadConfig
from sxwl.agent.runtimes.kubernetes import KubernetesRuntime
from sxwl.protocol import Assignment
from sxwl.protocol.endpoints import EngineSpec, engine_target
from sxwl.protocol.finetune import JobInput
from tests.support.agent import eventually
from tests.support.k8s import K8sCluster, api_client
from tests.support.k8s_engine import engine_image
from tests.support.k8s_images import PYTHON_IMAGE
from tests.support.k8s_node import RealNodes
from tests.support.net import free_port
from tests.support.real_cpod import RealCPod
from tests.support.threads import run_on_thread
from tests.support.tiny_finetune import build_model, register_public_model
from tests.test_kube_engine import matches

pytestmark = pytest.mark.k8s
pytest.importorskip(
    "peft", reason="the tiny Llama is built with the training extra: pip install -e '.[train]'"
)

TOKEN = "sxup_" + "e" * 43
AGENT_LABELS = (("app.kubernetes.io/name", "sxwl-agent"),)
MODEL = "tiny-llama"


def _model_tar(tmp_path: Path) -> tuple[Path, str, int]:
    model = build_model(tmp_path / "tiny-llama")
    archive = tmp_path / "model.tar"
    with tarfile.open(archive, "w") as tar:
        for path in sorted(model.rglob("*")):
            tar.add(path, arcname=path.relative_to(model).as_posix(), recursive=False)
    data = archive.read_bytes()
    return archive, hashlib.sha256(data).hexdigest(), len(data)


async def _post(target: TcpTarget, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """One HTTP/1.1 request over the connection the agent opens to the target."""
    reader, writer = await open_target(target)
    payload = json.dumps(body).encode()
    conn = h11.Connection(h11.CLIENT)
    headers = [
        ("host", "engine"),
        ("content-type", "application/json"),
        ("content-length", str(len(payload))),
    ]
    writer.write(conn.send(h11.Request(method="POST", target="/v1/chat/completions", headers=headers)) or b"")
    writer.write((conn.send(h11.Data(data=payload)) or b"") + (conn.send(h11.EndOfMessage()) or b""))
    status, answer = 0, b""
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await asyncio.wait_for(reader.read(65536), 120))
            elif isinstance(event, h11.Response):
                status = event.status_code
            elif isinstance(event, h11.Data):
                answer += bytes(event.data)
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                return status, json.loads(answer)
    finally:
        writer.transport.abort()


def test_a_replica_on_a_real_node_serves_behind_its_policy_and_answers_through_the_agent(
    k8s_cluster: K8sCluster, real_nodes: RealNodes, tmp_path: Path
) -> None:
    image = engine_image(real_nodes)
    archive, sha256, size = _model_tar(tmp_path)
    (tmp_path / "cache").mkdir(mode=0o700)
    archive.rename(tmp_path / "cache" / sha256)  # the agent's cache, as after fetching it once
    cache = InputCache(tmp_path / "cache", CloudClient("http://127.0.0.1:9"), unpack_archives=False)
    port = free_port(real_nodes.host_address)
    server = CacheServer.bind(real_nodes.host_address, port)
    owner, job_id = f"ep-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    server.grants.allow(job_id, 1, TOKEN, frozenset({sha256}))
    assignment = Assignment(
        job_id=job_id,
        attempt=1,
        name="chat",
        owner_id=owner,
        command=[],
        gpus_per_node=0,
        nodes=1,
        upload_token=TOKEN,
        inputs=[JobInput(name="model", sha256=sha256, size=size, archive=True)],
        engine=EngineSpec(served_name="chat"),
    )
    placement = real_nodes.pod_placement()

    async def scenario() -> dict[str, Any]:
        stop = asyncio.Event()
        serving = asyncio.create_task(server.run(cache, stop))
        seen: dict[str, Any] = {}
        async with api_client(k8s_cluster.kubeconfig) as api:
            runtime = KubernetesRuntime(
                api,
                state_dir=tmp_path / "agent",
                uploads=UploadConfig(
                    url="http://127.0.0.1:9",  # the cloud: not reached, the cache has the model
                    image=PYTHON_IMAGE,
                    cache_url=f"http://{real_nodes.host_address}:{port}",
                ),
                node_selector=placement["nodeSelector"],
                tolerations=placement["tolerations"],
                engine=EngineSettings(image, "sxwl-system", AGENT_LABELS),
            )
            job = runtime.start(assignment)
            core, networking = client.CoreV1Api(api), client.NetworkingV1Api(api)
            try:
                target = None
                for _ in range(600):  # the agent's supervision passes, until the engine serves
                    await runtime.refresh()
                    # Its own attempt only: the runtime also adopts other tests' Jobs on the nodes.
                    ended = [j for j in runtime.poll() if j.job_id == job_id]
                    assert ended == [], runtime.log_path(job).read_text(errors="replace")[-3000:]
                    target = runtime.attempt_target(engine_target(job_id, 1))
                    if target is not None and await engine_probe.serving(target):
                        break
                    await asyncio.sleep(1)
                else:
                    raise AssertionError(runtime.log_path(job).read_text(errors="replace")[-3000:])
                assert isinstance(target, TcpTarget) and target.port == LISTEN_PORT
                question = {"model": "chat", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
                seen["answer"] = await _post(target, question)
                (pod,) = (
                    await core.list_namespaced_pod(job.namespace, label_selector=f"{ENGINE}=true")
                ).items
                seen["pod_ip"], seen["pod_labels"] = pod.status.pod_ip, pod.metadata.labels
                seen["target"] = target
                policies = await networking.list_namespaced_network_policy(job.namespace)
                seen["policy"] = policy_name(job)
                seen["policies"] = {
                    p.metadata.name: api.sanitize_for_serialization(p.spec) for p in policies.items
                }
                seen["log"] = runtime.log_path(job).read_text(errors="replace")
                runtime.stop(job_id, 1, "a test's stop", cancel=True, grace_s=5)
                for _ in range(180):
                    await runtime.refresh()
                    if any(j.job_id == job_id for j in runtime.poll()):
                        break
                    await asyncio.sleep(1)
                seen["outcome"] = job.outcome
                runtime.done(job)
                await runtime.refresh()  # the reported attempt's objects go
                try:
                    await networking.read_namespaced_network_policy(policy_name(job), job.namespace)
                    seen["policy_after"] = "still there"
                except ApiException as exc:
                    seen["policy_after"] = exc.status
                left = await core.list_namespaced_pod(job.namespace, label_selector=f"{ENGINE}=true")
                seen["pods_after"] = [
                    p.metadata.name for p in left.items if p.metadata.deletion_timestamp is None
                ]
            finally:
                stop.set()
                await serving
                await core.delete_namespace(job.namespace)
        return seen

    seen = run_on_thread(scenario())
    status, answer = seen["answer"]
    assert status == 200, answer
    assert answer["choices"][0]["message"]["role"] == "assistant"
    assert seen["target"] == TcpTarget(seen["pod_ip"], LISTEN_PORT)
    assert "::sxwl-engine:: starting the engine" in seen["log"]
    policies = seen["policies"]
    engine = policies[seen["policy"]]
    assert matches(engine["podSelector"], seen["pod_labels"])
    assert engine["ingress"] == [
        {
            "from": [
                {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "sxwl-system"}},
                    "podSelector": {"matchLabels": dict(AGENT_LABELS)},
                }
            ],
            "ports": [{"port": LISTEN_PORT, "protocol": "TCP"}],
        }
    ]
    assert not matches(policies[NETWORK_POLICY]["podSelector"], seen["pod_labels"])
    assert seen["outcome"] == "cancelled"
    assert seen["policy_after"] == 404
    assert seen["pods_after"] == []


def _endpoint(cpod: RealCPod, endpoint_id: str) -> dict[str, Any]:
    found: dict[str, Any] = httpx.get(f"{cpod.url}/api/v1/endpoints/{endpoint_id}", headers=cpod.user).json()
    return found


def _load_when(
    cpod: RealCPod, endpoint_id: str, wanted: str, check: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """The replica's load on the cloud's endpoint once the heartbeats brought one ``check`` takes."""

    def reached() -> dict[str, Any] | None:
        load: dict[str, Any] | None = _endpoint(cpod, endpoint_id)["replica_jobs"][0]["load"]
        return load if load is not None and check(load) else None

    return eventually(reached, timeout=60, what=f"a load {wanted}; agent:\n{cpod.agent_log[-3000:]}")


def test_a_replica_s_load_on_a_real_node_shows_on_the_cloud_while_a_streamed_call_is_open(
    k8s_cluster: K8sCluster, real_nodes: RealNodes, tmp_path: Path
) -> None:
    image = engine_image(real_nodes)
    serve = f"{real_nodes.host_address}:{free_port(real_nodes.host_address)}"
    flags = ("--engine-image", image, "--serve-inputs", serve)
    cpod = RealCPod(k8s_cluster, real_nodes, tmp_path, *flags)
    try:
        settings = {
            "SXWL_DATABASE_URL": f"sqlite:///{cpod.root / 'sxwl.db'}",
            "SXWL_DATA_DIR": str(cpod.root / "cloud"),
        }
        model_dir = build_model(tmp_path / MODEL)
        register_public_model(MODEL, model_dir, {**os.environ, **settings})
        end_token = json.loads((model_dir / "config.json").read_text())["eos_token_id"]
        body = {"name": "chat", "model": MODEL, "gpus": 0}
        created = httpx.post(f"{cpod.url}/api/v1/endpoints", headers=cpod.user, json=body)
        assert created.status_code == 201, created.text
        endpoint_id: str = created.json()["id"]

        def settled() -> dict[str, Any] | None:
            found = _endpoint(cpod, endpoint_id)
            return found if found["state"] in ("ready", "failed") else None

        what = f"endpoint {endpoint_id} ready; agent:\n{cpod.agent_log[-3000:]}"
        ready = eventually(settled, timeout=900, what=what)
        (replica,) = ready["replica_jobs"]
        assert ready["state"] == "ready", (replica, cpod.log(replica["job_id"])[-3000:])
        # Billing starts at the replica's `running`: after its main container started, not at its pull.
        job = cpod.job(replica["job_id"])
        (pod,) = cpod.pods(replica["job_id"])
        main = next(s for s in pod["status"]["containerStatuses"] if s["name"] == CONTAINER)
        started = datetime.fromisoformat(main["state"]["running"]["startedAt"])
        assert datetime.fromisoformat(job["started_at"]) >= started, (job, main)

        idle = _load_when(cpod, endpoint_id, "from the agent", lambda load: load["source"] == "agent")
        assert (idle["running"], idle["waiting"]) == (0, None)
        # Its end token barred, the random model streams all its tokens, for seconds on a CPU: the test
        # reads the first chunk and waits for the load while the stream is open.
        question = {
            "model": "chat",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 200,
            "logit_bias": {str(end_token): -100.0},
            "stream": True,
        }
        url = f"{cpod.url}/v1/chat/completions"
        with httpx.stream("POST", url, headers=cpod.user, json=question, timeout=120) as streamed:
            assert streamed.status_code == 200, streamed.read()
            lines = streamed.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))
            busy = _load_when(cpod, endpoint_id, "of 1 or more", lambda load: load["running"] >= 1)
            rest = [line for line in lines if line.startswith("data:")]
        assert (busy["source"], busy["waiting"]) == ("agent", None)
        # It streamed all its 200 tokens (none ended it early) and was counted while it did.
        assert any('"completion_tokens":200' in line.replace(" ", "") for line in rest), rest[-3:]
        done = _load_when(cpod, endpoint_id, "back to 0", lambda load: load["running"] == 0)
        assert done["source"] == "agent"

        deleted = httpx.delete(f"{cpod.url}/api/v1/endpoints/{endpoint_id}", headers=cpod.user)
        assert deleted.status_code == 200, deleted.text
        assert cpod.finished(replica["job_id"])["state"] == "cancelled"
        cpod.nothing_left(replica["job_id"])
    finally:
        cpod.stop()
        k8s_cluster.kubectl("delete", "namespace", cpod.tenant_ns, "--wait=false", check=False)
