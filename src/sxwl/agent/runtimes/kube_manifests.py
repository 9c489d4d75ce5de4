"""The Kubernetes objects of one attempt, as pure functions of its record and assignment.

A single-node attempt is a Job (completions = parallelism = 1, backoffLimit 0); a multi-node one an
Indexed Job (completions = parallelism = nodes) with a headless Service, so that rank 0 is
``<job>-0.<service>``. Every pod gets torchrun's env (MASTER_ADDR, MASTER_PORT, NNODES, NODE_RANK from
the completion index, NPROC_PER_NODE), SXWL_JOB_ID / SXWL_JOB_NAME / SXWL_ATTEMPT, and the user's env.
Tenant pods get no service-account token, no privilege escalation, no host namespaces or paths, a
memory-backed ``/dev/shm``, ``nvidia.com/gpu`` limits and a nodeSelector on the GPU product
(invariant 7, docs/architecture.md), plus the provider's node selector and tolerations. The ranks of a
multi-node job go to different nodes (a required podAntiAffinity on the host name). With an upload
config the command runs under kube_wrapper.py's wrapper beside the ``uploader`` of kube_uploads.py; a
fine-tune's pod also fetches its inputs in an init container and runs the trainer image
(kube_inputs.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sxwl.agent.runtimes import kube_engine, kube_inputs, kube_uploads
from sxwl.agent.runtimes.kube_objects import (
    ATTEMPT,
    COMPLETION_INDEX,
    CONTAINER,
    GPU,
    GPU_PRODUCT,
    JOB_ID,
    JOB_NAME,
    KubeJob,
    labels,
)
from sxwl.agent.runtimes.kube_uploads import UploadConfig
from sxwl.agent.runtimes.kube_wrapper import wrapped
from sxwl.protocol import Assignment

HOSTNAME = "kubernetes.io/hostname"


def service_manifest(job: KubeJob, *, master_port: int) -> dict[str, Any]:
    return {
        "metadata": {"name": job.service, "labels": labels(job)},
        "spec": {
            "clusterIP": "None",
            "selector": {JOB_ID: job.job_id, ATTEMPT: str(job.attempt)},
            "publishNotReadyAddresses": True,  # rank 0's name resolves before it is Ready
            "ports": [{"name": "master", "port": master_port}],
        },
    }


def _rank_env(job: KubeJob) -> dict[str, Any]:
    if job.nodes > 1:
        return {"valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}}
    return {"value": "0"}


def _env(job: KubeJob, assignment: Assignment, master_port: int) -> list[dict[str, Any]]:
    multi = job.nodes > 1
    env: dict[str, Any] = {k: {"value": v} for k, v in assignment.env.items()}
    env.update(
        SXWL_JOB_ID={"value": job.job_id},
        SXWL_JOB_NAME={"value": job.name},
        SXWL_ATTEMPT={"value": str(job.attempt)},
        MASTER_ADDR={"value": f"{job.k8s_name}-0.{job.service}" if multi else "127.0.0.1"},
        MASTER_PORT={"value": str(master_port)},
        NNODES={"value": str(job.nodes)},
        NPROC_PER_NODE={"value": str(max(1, job.gpus_per_node))},
        NODE_RANK=_rank_env(job),
        PYTHONUNBUFFERED={"value": "1"},
    )
    return [{"name": name, **value} for name, value in env.items()]


def _container(
    job: KubeJob,
    assignment: Assignment,
    master_port: int,
    uploads: bool,
    memory_limit: str | None,
    image: str | None,
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image,
        "env": _env(job, assignment, master_port),
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],  # noqa: S108 - the pod's shm,
        "securityContext": {"allowPrivilegeEscalation": False, "privileged": False},
        # A failed container's status says the tail of its log: the shell's "not found" when it
        # could not find the command (kube_status.py tells a start that failed by it).
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if assignment.inputs:
        container["volumeMounts"].append(kube_inputs.MAIN_MOUNT)
    if assignment.trainer is not None:
        container["env"].extend({"name": k, "value": v} for k, v in kube_inputs.TRAINER_ENV.items())
    if uploads:
        command = kube_inputs.trainer_command() if assignment.trainer is not None else assignment.command
        command = kube_engine.COMMAND if assignment.engine is not None else command
        container["command"] = wrapped(command)
        container["env"].append(kube_uploads.MAIN_ENV)
        container["volumeMounts"].append(kube_uploads.MAIN_MOUNT)
    elif isinstance(assignment.command, str):
        container["command"] = ["/bin/sh", "-c", assignment.command]
    elif assignment.command:
        container["command"] = list(assignment.command)
    limits: dict[str, str] = {}
    if job.gpus_per_node:
        limits[GPU] = str(job.gpus_per_node)
    # Requests default to the limits: Kubernetes' scheduler reserves what the attempt asked for (a
    # dev environment's cores and memory), else the agent's default memory bound.
    if assignment.cpus:
        limits["cpu"] = str(assignment.cpus)
    if assignment.memory_mib:
        limits["memory"] = f"{assignment.memory_mib}Mi"
    elif memory_limit:
        limits["memory"] = memory_limit
    if limits:
        container["resources"] = {"limits": limits}
    if job.nodes > 1:
        container["ports"] = [{"name": "master", "containerPort": master_port}]
    return container


def job_manifest(
    job: KubeJob,
    assignment: Assignment,
    *,
    master_port: int,
    stop_grace_s: float,
    run_as_non_root: bool,
    pod_annotations: Mapping[str, str],
    node_selector: Mapping[str, str] | None = None,
    tolerations: list[dict[str, str]] | None = None,
    uploads: UploadConfig | None = None,
    memory_limit: str | None = None,
    trainer_image: str | None = None,
    engine_image: str | None = None,
) -> dict[str, Any]:
    """The Job; with ``uploads`` (the agent has an upload URL and the assignment a token) its pods
    also carry the uploader, the shared volume and the token's Secret (kube_uploads.py). An
    assignment with inputs needs ``uploads`` (its fetcher holds the token), and one that runs the
    trainer also ``trainer_image``: the runtime refuses it before this."""
    if (assignment.inputs or assignment.trainer is not None) and uploads is None:
        raise ValueError("a fine-tune's pod fetches its inputs with the upload token: uploads are needed")
    if assignment.trainer is not None and not trainer_image:
        raise ValueError("a fine-tune runs the trainer image: trainer_image is needed")
    if assignment.engine is not None and not engine_image:
        raise ValueError("an endpoint's replica runs the engine image: engine_image is needed")
    image = trainer_image if assignment.trainer is not None else assignment.image
    image = engine_image if assignment.engine is not None else image
    multi = job.nodes > 1
    pod_security: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    if run_as_non_root:
        pod_security["runAsNonRoot"] = True
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "hostNetwork": False,
        "hostPID": False,
        "hostIPC": False,
        "terminationGracePeriodSeconds": max(0, int(stop_grace_s)),
        "securityContext": pod_security,
        "containers": [_container(job, assignment, master_port, uploads is not None, memory_limit, image)],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
    }
    if uploads is not None:
        pod_spec["containers"].append(kube_uploads.uploader_container(job, uploads, _rank_env(job)))
        pod_spec["volumes"].extend(kube_uploads.volumes(job))
        if assignment.inputs:
            pod_spec["initContainers"] = [kube_inputs.init_container(job, assignment, uploads)]
            pod_spec["volumes"].append(kube_inputs.volume())
    selector = dict(node_selector or {})
    if assignment.gpu_product:
        selector[GPU_PRODUCT] = assignment.gpu_product
    if selector:
        pod_spec["nodeSelector"] = selector
    if tolerations:
        pod_spec["tolerations"] = list(tolerations)
    if multi:
        pod_spec["subdomain"] = job.service
        # One rank per node: two ranks on one node would share its GPUs' PCIe and network.
        pod_spec["affinity"] = {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "labelSelector": {"matchLabels": {JOB_ID: job.job_id, ATTEMPT: str(job.attempt)}},
                        "topologyKey": HOSTNAME,
                    }
                ]
            }
        }
    annotations = {JOB_ID: job.job_id, ATTEMPT: str(job.attempt), JOB_NAME: job.name}
    spec: dict[str, Any] = {
        "completions": job.nodes,
        "parallelism": job.nodes,
        "backoffLimit": 0,
        "template": {
            "metadata": {"labels": labels(job), "annotations": {**annotations, **pod_annotations}},
            "spec": pod_spec,
        },
    }
    if multi:
        spec["completionMode"] = "Indexed"
    if job.max_runtime_s:
        spec["activeDeadlineSeconds"] = job.max_runtime_s
    manifest = {
        "metadata": {"name": job.k8s_name, "labels": labels(job), "annotations": annotations},
        "spec": spec,
    }
    if assignment.engine is not None:
        kube_engine.shape(manifest, assignment)
    return manifest
