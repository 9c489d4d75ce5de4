"""An endpoint replica on the kubernetes runtime (kube_engine.py): the pod's manifest (engine image,
run, port, inputs, termination message), the NetworkPolicy admitting only the agent's pods to the
engine's port, the tenant policy leaving replicas out, the reason of an engine the supervisor gave
up on, the runtime's refusal without an engine image, and where the tunnel reaches a replica.
The supervisor serving on a TCP port (as in a pod) runs for real, in front of the stand-in vLLM of
tests/support/fake_vllm.py."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes_asyncio.client import (
    ApiClient,
    V1ContainerState,
    V1ContainerStateRunning,
    V1ContainerStateTerminated,
    V1ContainerStatus,
    V1ObjectMeta,
    V1Pod,
    V1PodStatus,
)
from typer.testing import CliRunner

from sxwl.agent import engine_probe
from sxwl.agent import main as agent_main
from sxwl.agent.forward_targets import SocketTarget, TcpTarget, open_target
from sxwl.agent.runtimes import kube_engine
from sxwl.agent.runtimes.kube_engine import LISTEN_PORT, EngineSettings
from sxwl.agent.runtimes.kube_manifests import job_manifest
from sxwl.agent.runtimes.kube_objects import CONTAINER, ENGINE, KubeJob
from sxwl.agent.runtimes.kube_tenancy import isolation_spec
from sxwl.agent.runtimes.kube_uploads import UploadConfig
from sxwl.agent.runtimes.kubernetes import KubernetesRuntime
from sxwl.engine.supervisor import RUN_ENV
from sxwl.protocol import Assignment
from sxwl.protocol.endpoints import EngineRun, EngineSpec, engine_target
from sxwl.protocol.finetune import JobInput
from sxwl.protocol.reasons import Reason, english
from tests.support.agent import eventually
from tests.support.net import free_port
from tests.support.threads import run_on_thread

TOKEN = "sxup_" + "t" * 43
UPLOADS = UploadConfig(url="https://cloud.example", image="registry.example/sxwl-agent:1")
ENGINE_IMAGE = "registry.example/sxwl-engine:1"
AGENT_LABELS = (("app.kubernetes.io/name", "sxwl-agent"), ("app.kubernetes.io/instance", "x"))
SETTINGS = EngineSettings(ENGINE_IMAGE, "sxwl-system", AGENT_LABELS)
SHA = "ab" * 32
FAKE = Path(__file__).parent / "support" / "fake_vllm.py"


def record() -> KubeJob:
    return KubeJob(
        job_id="j1",
        attempt=2,
        name="chat",
        owner_id="u1",
        namespace="sxwl-tenant-u1",
        k8s_name="sxwl-j1-2",
        nodes=1,
        gpus_per_node=0,
        max_runtime_s=None,
        started_at=0.0,
        engine=True,
    )


def replica(gpus: int = 0, adapter: bool = False) -> Assignment:
    names = ["model", "adapter"] if adapter else ["model"]
    return Assignment(
        job_id="j1",
        attempt=2,
        name="chat",
        owner_id="u1",
        command=[],
        gpus_per_node=gpus,
        nodes=1,
        upload_token=TOKEN,
        inputs=[JobInput(name=n, sha256=SHA, size=10, archive=True) for n in names],
        engine=EngineSpec(served_name="chat", adapter=adapter, max_model_len=512),
    )


def manifest(assignment: Assignment) -> dict[str, Any]:
    return job_manifest(
        record(),
        assignment,
        master_port=29500,
        stop_grace_s=10,
        run_as_non_root=False,
        pod_annotations={},
        uploads=UPLOADS,
        engine_image=ENGINE_IMAGE,
    )


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A LabelSelector as the API server evaluates it (matchLabels, In, Exists, DoesNotExist)."""
    for key, value in selector.get("matchLabels", {}).items():
        if labels.get(key) != value:
            return False
    for expression in selector.get("matchExpressions", []):
        key, operator = expression["key"], expression["operator"]
        if operator == "DoesNotExist" and key in labels:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "In" and labels.get(key) not in expression["values"]:
            return False
    return True


def test_a_replica_pod_runs_the_engine_image_on_its_inputs_and_serves_on_its_port() -> None:
    job = manifest(replica(adapter=True))
    template = job["spec"]["template"]
    pod = template["spec"]
    assert template["metadata"]["labels"][ENGINE] == "true"
    (fetcher,) = pod["initContainers"]
    assert [
        i["name"] for i in json.loads(next(e["value"] for e in fetcher["env"] if e["name"] == "SXWL_INPUTS"))
    ] == [
        "model",
        "adapter",
    ]
    main = next(c for c in pod["containers"] if c["name"] == CONTAINER)
    assert main["image"] == ENGINE_IMAGE
    assert main["command"][-3:] == ["python3", "-m", "sxwl.engine"]  # under the uploads' wrapper
    env = {e["name"]: e.get("value") for e in main["env"]}
    run = EngineRun.model_validate_json(env[RUN_ENV])
    assert (run.engine, run.gpus, run.listen_port, run.socket) == ("transformers", 0, LISTEN_PORT, None)
    assert (run.model_dir, run.adapter_dir) == ("/sxwl-inputs/model", "/sxwl-inputs/adapter")
    assert (run.served_name, run.max_model_len, run.work_dir) == ("chat", 512, "/sxwl-engine")
    assert env["HF_HUB_OFFLINE"] == "1"
    assert main["ports"] == [{"name": "engine", "containerPort": LISTEN_PORT, "protocol": "TCP"}]
    assert {"name": "sxwl-inputs", "mountPath": "/sxwl-inputs", "readOnly": True} in main["volumeMounts"]
    assert {"name": "sxwl-engine", "mountPath": "/sxwl-engine"} in main["volumeMounts"]
    assert {"name": "sxwl-engine", "emptyDir": {}} in pod["volumes"]
    assert main["terminationMessagePath"] == "/sxwl-engine/engine-failed.json"
    assert pod["automountServiceAccountToken"] is False and pod["hostNetwork"] is False
    gpu = EngineRun.model_validate_json(
        next(
            e["value"]
            for e in manifest(replica(gpus=2))["spec"]["template"]["spec"]["containers"][0]["env"]
            if e["name"] == RUN_ENV
        )
    )
    assert (gpu.engine, gpu.gpus, gpu.adapter_dir) == ("vllm", 2, None)


def test_a_replica_without_its_model_or_the_engine_image_gets_no_pod() -> None:
    bare = replica().model_copy(update={"inputs": []})
    with pytest.raises(ValueError, match="uploads"):
        job_manifest(
            record(), replica(), master_port=1, stop_grace_s=1, run_as_non_root=False, pod_annotations={}
        )
    with pytest.raises(ValueError, match="engine_image"):
        job_manifest(
            record(),
            replica(),
            master_port=1,
            stop_grace_s=1,
            run_as_non_root=False,
            pod_annotations={},
            uploads=UPLOADS,
        )
    with pytest.raises(RuntimeError, match="input model"):
        kube_engine.engine_run(bare)


def test_the_replica_policy_admits_only_the_agent_pods_to_the_engine_port() -> None:
    job = record()
    policy = kube_engine.policy_manifest(job, SETTINGS)
    pod_labels = manifest(replica())["spec"]["template"]["metadata"]["labels"]
    spec = policy["spec"]
    assert policy["metadata"]["name"] == "sxwl-j1-2-engine"
    assert matches(spec["podSelector"], pod_labels)
    other = {**pod_labels, "sxwl.ai/attempt": "1"}  # another attempt's pod is not this policy's
    assert not matches(spec["podSelector"], other)
    assert spec["policyTypes"] == ["Ingress"]
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": LISTEN_PORT}]
    (source,) = rule["from"]
    # Both selectors in one entry: pods with the agent's labels in the agent's namespace only.
    assert source["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "sxwl-system"}}
    assert source["podSelector"] == {"matchLabels": dict(AGENT_LABELS)}
    # An agent outside the cluster names no pod: the policy admits none.
    alone = kube_engine.policy_manifest(job, EngineSettings(ENGINE_IMAGE, "sxwl-system"))
    assert alone["spec"]["ingress"] == []


def test_the_tenant_policy_leaves_replica_pods_to_their_own() -> None:
    """Policies add up: were a replica selected by the tenant's policy too, the tenant's other pods
    could reach its engine around the agent."""
    selector = isolation_spec()["podSelector"]
    job_pod = {"sxwl.ai/job-id": "j", "sxwl.ai/attempt": "1"}
    assert matches(selector, job_pod)
    assert not matches(selector, manifest(replica())["spec"]["template"]["metadata"]["labels"])


def _pod(state: V1ContainerState, ip: str | None = "10.250.0.7") -> V1Pod:
    status = V1ContainerStatus(
        name=CONTAINER, image="i", image_id="", ready=True, restart_count=0, state=state
    )
    return V1Pod(metadata=V1ObjectMeta(name="p"), status=V1PodStatus(pod_ip=ip, container_statuses=[status]))


def test_a_running_replica_is_reached_at_its_pod_address_and_a_given_up_engine_says_why() -> None:
    running = _pod(V1ContainerState(running=V1ContainerStateRunning()))
    assert kube_engine.address([running]) == "10.250.0.7"
    assert kube_engine.address([_pod(V1ContainerState(running=V1ContainerStateRunning()), ip=None)]) is None
    said = json.dumps({"exits": 4, "status": 1, "lines": [f"line {i}" for i in range(12)]})
    gave_up = _pod(V1ContainerState(terminated=V1ContainerStateTerminated(exit_code=3, message=said)))
    assert kube_engine.address([gave_up]) is None
    reason = kube_engine.failure([gave_up])
    assert reason is not None
    lines = "\n".join(f"line {i}" for i in range(4, 12))  # the last 8, as on the local runtime
    assert reason == Reason.of("endpoint.engine_failed", exits=4, lines=lines)
    other = _pod(V1ContainerState(terminated=V1ContainerStateTerminated(exit_code=1, message="oops")))
    assert kube_engine.failure([other]) is None


def test_the_runtime_takes_replicas_only_with_the_engine_image_and_finds_them_for_the_tunnel(
    tmp_path: Path,
) -> None:
    async def started(settings: EngineSettings | None) -> tuple[bool, str, list[Any]]:
        async with ApiClient() as api:  # never called: start() only records the attempt
            runtime = KubernetesRuntime(
                api, state_dir=tmp_path / str(bool(settings)), uploads=UPLOADS, engine=settings
            )
            try:
                job = runtime.start(replica())
            except RuntimeError as exc:
                return runtime.takes_endpoints, str(exc), []
            target = engine_target(job.job_id, job.attempt)
            seen = [job.serves_engine, runtime.attempt_target(target)]  # no pod address yet
            running = _pod(V1ContainerState(running=V1ContainerStateRunning()))
            assert runtime.engines.observe(job, [running])
            seen += [
                runtime.attempt_target(target),
                runtime.engine_target(job),
                runtime.attempt_target("x.engine:80"),
            ]
            return runtime.takes_endpoints, job.key, seen

    refused = english(Reason.of("kube.no_engine"))
    assert run_on_thread(started(None)) == (False, refused, [])
    at = TcpTarget("10.250.0.7", LISTEN_PORT)
    assert run_on_thread(started(SETTINGS)) == (True, "j1:2", [True, None, at, at, None])


def test_the_supervisor_serves_the_engine_on_a_tcp_port_as_in_a_pod(tmp_path: Path) -> None:
    """The run comes from the environment, the agent's way in is a TCP port, and readiness is asked
    there as the agent asks it (health, then a listed model); SIGTERM stops engine and supervisor."""
    fakebin = tmp_path / "bin"
    fakebin.mkdir()
    (fakebin / "vllm").write_text(f"#!{sys.executable}\n" + FAKE.read_text())
    (fakebin / "vllm").chmod(0o755)
    port = free_port()
    run = EngineRun(
        served_name="chat",
        engine="vllm",
        model_dir=str(tmp_path),
        port=0,  # the engine on a free loopback port (8000 may be taken on this machine)
        work_dir=str(tmp_path),
        listen_port=port,
        gpus=1,
    )
    env = {**os.environ, RUN_ENV: run.model_dump_json(), "PATH": f"{fakebin}:{os.environ['PATH']}"}
    env["PYTHONPATH"] = str(Path(__file__).parents[1] / "src")
    proc = subprocess.Popen([sys.executable, "-m", "sxwl.engine"], env=env, cwd=tmp_path)
    try:
        target = TcpTarget("127.0.0.1", port)
        eventually(
            lambda: run_on_thread(engine_probe.serving(target)), timeout=60, what="the engine to serve"
        )
        answer = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"model": "chat", "messages": [{"role": "user", "content": "hi"}]},
            timeout=30,
        )
        assert answer.status_code == 200 and answer.json()["model"] == "chat"
        calls = [json.loads(line) for line in (tmp_path / "vllm-calls.jsonl").read_text().splitlines()]
        argv = calls[0]["argv"]
        assert argv[argv.index("--host") + 1] == "127.0.0.1"  # the engine itself stays on loopback
        assert str(port) not in argv
        assert {"path": "/v1/chat/completions", "model": "chat", "stream": False} in calls
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0


def test_a_socket_target_answers_only_when_its_server_runs_as_the_attempt_uid(tmp_path: Path) -> None:
    """How the local runtime's engine socket is now reached too: a server of another uid (a link
    the attempt put in its dir to someone else's socket) gets nothing sent."""

    async def opened(uid: int) -> str:
        server = await asyncio.start_unix_server(lambda r, w: w.close(), path=str(tmp_path / "engine.sock"))
        try:
            _reader, writer = await open_target(SocketTarget.at(tmp_path / "engine.sock", uid))
            writer.close()
            return "opened"
        except OSError as exc:
            return str(exc)
        finally:
            server.close()

    assert run_on_thread(opened(os.geteuid())) == "opened"
    assert (
        run_on_thread(opened(os.geteuid() + 1))
        == f"its socket is served by uid {os.geteuid()}, not the attempt's"
    )


def test_an_engine_image_without_an_uploader_image_stops_the_agent(tmp_path: Path) -> None:
    """A replica's pod fetches its model with the uploader's image and token."""
    args = ["--api-url", "http://127.0.0.1:9", "--runtime", "kubernetes", "--state-dir", str(tmp_path)]
    result = CliRunner().invoke(
        agent_main.app, [*args, "--engine-image", ENGINE_IMAGE], env={"SXWL_UPLOADER_IMAGE": ""}
    )
    assert result.exit_code == 2
    assert "--engine-image needs --uploader-image" in result.output
