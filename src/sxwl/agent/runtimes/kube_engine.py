"""Endpoint replicas on Kubernetes (docs/endpoints.md, "Engines"; docs/agent.md, "Endpoints on
Kubernetes"): what an attempt with ``Assignment.engine`` adds to its Job, and the NetworkPolicy that
keeps its engine to the agent.

- The pod fetches the model (and a fine-tune's adapter) like a fine-tune's pod (kube_inputs.py) and
  runs the CPod's engine image: ``python3 -m sxwl.engine``, its ``EngineRun`` in the environment,
  serving on ``LISTEN_PORT`` of the pod's address (the engine itself listens on the pod's loopback:
  the supervisor bridges to it, as in the local runtime's sandbox).
- The pod carries the ``sxwl.ai/engine`` label. The tenant namespace's own policy (kube_tenancy.py)
  leaves such pods out, and the replica's policy, made before its Job, admits to ``LISTEN_PORT`` only
  the agent's pods (its namespace and labels) and nothing else; without the agent's labels (an agent
  outside the cluster) it admits no pod at all.
- The supervisor writes why it gave up (its last lines) to the container's termination message,
  which becomes the replica's reason, as on the local runtime."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from sxwl.agent.forward_targets import TcpTarget
from sxwl.agent.runtimes.kube_inputs import INPUTS_DIR
from sxwl.agent.runtimes.kube_objects import (
    ATTEMPT,
    CONTAINER,
    ENGINE,
    JOB_ID,
    KubeJob,
    create_ignoring_conflict,
    labels,
)
from sxwl.agent.runtimes.kube_status import Seen
from sxwl.engine.supervisor import EXIT_GAVE_UP, FAILED_FILE, RUN_ENV
from sxwl.protocol import Assignment
from sxwl.protocol.endpoints import EngineRun
from sxwl.protocol.reasons import Reason

LISTEN_PORT = 8001  # the supervisor's, on the pod's address
ENGINE_DIR = "/sxwl-engine"  # the engine's work dir (a merged model, its last lines): an emptyDir
ENGINE_VOLUME = "sxwl-engine"
COMMAND = ["python3", "-m", "sxwl.engine"]
NAMESPACE_NAME = "kubernetes.io/metadata.name"  # every namespace's own label (Kubernetes 1.22+)
REASON_LINES = 8
# The libraries' caches go to the engine's volume: the image need not have a writable home.
ENGINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_HOME": f"{ENGINE_DIR}/hf-home", "TOKENIZERS_PARALLELISM": "false"}


@dataclass(frozen=True)
class EngineSettings:
    """The CPod's engine image, and who the replicas' policy admits: the agent's namespace and its
    pods' labels (none: no pod)."""

    image: str
    agent_namespace: str
    agent_labels: tuple[tuple[str, str], ...] = field(default_factory=tuple)


def engine_run(assignment: Assignment) -> EngineRun:
    """The supervisor's run, every path as the main container sees it."""
    spec = assignment.engine
    assert spec is not None
    names = {item.name for item in assignment.inputs}
    if "model" not in names or (spec.adapter and "adapter" not in names):
        raise RuntimeError("an endpoint needs the input model (and a fine-tune's, the adapter)")
    return EngineRun(
        **spec.model_dump(),
        engine="vllm" if assignment.gpus_per_node > 0 else "transformers",
        model_dir=f"{INPUTS_DIR}/model",
        adapter_dir=f"{INPUTS_DIR}/adapter" if spec.adapter else None,
        work_dir=ENGINE_DIR,
        listen_port=LISTEN_PORT,
        gpus=assignment.gpus_per_node,
    )


def shape(manifest: dict[str, Any], assignment: Assignment) -> None:
    """Makes a Job's pod a replica's: the label, the run, the port, the work dir, the message."""
    template = manifest["spec"]["template"]
    template["metadata"]["labels"][ENGINE] = "true"
    pod = template["spec"]
    main = next(c for c in pod["containers"] if c["name"] == CONTAINER)
    main["env"].append({"name": RUN_ENV, "value": engine_run(assignment).model_dump_json()})
    main["env"].extend({"name": k, "value": v} for k, v in ENGINE_ENV.items())
    main["ports"] = [{"name": "engine", "containerPort": LISTEN_PORT, "protocol": "TCP"}]
    main["volumeMounts"].append({"name": ENGINE_VOLUME, "mountPath": ENGINE_DIR})
    main["terminationMessagePath"] = f"{ENGINE_DIR}/{FAILED_FILE}"
    pod["volumes"].append({"name": ENGINE_VOLUME, "emptyDir": {}})


def policy_name(job: KubeJob) -> str:
    return f"{job.k8s_name}-engine"


def policy_manifest(job: KubeJob, settings: EngineSettings) -> dict[str, Any]:
    """Ingress to the replica's pod: only the agent's pods, only to the supervisor's port."""
    sources = []
    if settings.agent_labels:
        sources.append(
            {
                "namespaceSelector": {"matchLabels": {NAMESPACE_NAME: settings.agent_namespace}},
                "podSelector": {"matchLabels": dict(settings.agent_labels)},
            }
        )
    ingress = [{"from": sources, "ports": [{"protocol": "TCP", "port": LISTEN_PORT}]}] if sources else []
    return {
        "metadata": {"name": policy_name(job), "labels": labels(job)},
        "spec": {
            "podSelector": {"matchLabels": {JOB_ID: job.job_id, ATTEMPT: str(job.attempt), ENGINE: "true"}},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def address(pods: list[Any]) -> str | None:
    """The pod's IP while its main container runs."""
    for pod in pods:
        running = any(
            s.name == CONTAINER and s.state is not None and s.state.running is not None
            for s in pod.status.container_statuses or []
        )
        if running and pod.status.pod_ip and pod.metadata.deletion_timestamp is None:
            return str(pod.status.pod_ip)
    return None


def failure(pods: list[Any]) -> Reason | None:
    """Why the supervisor gave up on the engine, from its termination message."""
    for pod in pods:
        for status in pod.status.container_statuses or []:
            ended = status.state.terminated if status.name == CONTAINER and status.state else None
            if ended is None or ended.exit_code != EXIT_GAVE_UP:
                continue
            try:
                said = json.loads(ended.message or "")
                lines = [str(line) for line in said["lines"]][-REASON_LINES:]
                return Reason.of("endpoint.engine_failed", exits=int(said["exits"]), lines="\n".join(lines))
            except (ValueError, KeyError, TypeError):
                continue
    return None


class Engines:
    """The replicas' policies in the cluster, and where their engines are reached."""

    def __init__(self, api_client: Any, settings: EngineSettings | None) -> None:
        self.networking = client.NetworkingV1Api(api_client)
        self.settings = settings

    def target(self, job: KubeJob | None) -> TcpTarget | None:
        if job is None or not job.engine or not job.engine_host:
            return None
        return TcpTarget(job.engine_host, LISTEN_PORT)

    def said(self, job: KubeJob, pods: list[Any], seen: Seen | None) -> Seen | None:
        """An ended replica's outcome, with the supervisor's reason where it gave up on the engine."""
        gave_up = failure(pods) if seen is not None and job.engine else None
        if seen is None or gave_up is None:
            return seen
        return Seen(seen.outcome, seen.exit_code, gave_up, seen.never_ran)

    async def allow_agent(self, job: KubeJob) -> None:
        """The policy first: a pod no policy selects would take connections from anywhere."""
        assert self.settings is not None
        create = self.networking.create_namespaced_network_policy
        await create_ignoring_conflict(create, job.namespace, policy_manifest(job, self.settings))

    async def delete(self, job: KubeJob) -> None:
        try:
            await self.networking.delete_namespaced_network_policy(policy_name(job), job.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def observe(self, job: KubeJob, pods: list[Any]) -> bool:
        """Records where the engine is reached now; True when that changed."""
        host = address(pods)
        if host == job.engine_host:
            return False
        job.engine_host = host
        return True
