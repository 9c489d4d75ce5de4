"""The Kubernetes objects of one attempt, as pure functions of its record and assignment.

A single-node attempt is a Job (completions = parallelism = 1, backoffLimit 0); a multi-node one an
Indexed Job (completions = parallelism = nodes) with a headless Service, so that rank 0 is
``<job>-0.<service>``. Every pod gets torchrun's env (MASTER_ADDR, MASTER_PORT, NNODES, NODE_RANK from
the completion index, NPROC_PER_NODE), SXWL_JOB_ID / SXWL_JOB_NAME / SXWL_ATTEMPT, and the user's env.
Tenant pods get no service-account token, no privilege escalation, no host namespaces or paths, a
memory-backed ``/dev/shm``, ``nvidia.com/gpu`` limits and a nodeSelector on the GPU product
(invariant 7, docs/architecture.md)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
from sxwl.protocol import Assignment


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
        NODE_RANK=(
            {"valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}}
            if multi
            else {"value": "0"}
        ),
        PYTHONUNBUFFERED={"value": "1"},
    )
    return [{"name": name, **value} for name, value in env.items()]


def _container(job: KubeJob, assignment: Assignment, master_port: int) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": assignment.image,
        "env": _env(job, assignment, master_port),
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],  # noqa: S108 - the pod's shm,
        "securityContext": {"allowPrivilegeEscalation": False, "privileged": False},
    }
    if isinstance(assignment.command, str):
        container["command"] = ["/bin/sh", "-c", assignment.command]
    elif assignment.command:
        container["command"] = list(assignment.command)
    if job.gpus_per_node:
        container["resources"] = {"limits": {GPU: str(job.gpus_per_node)}}
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
) -> dict[str, Any]:
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
        "containers": [_container(job, assignment, master_port)],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
    }
    if assignment.gpu_product:
        pod_spec["nodeSelector"] = {GPU_PRODUCT: assignment.gpu_product}
    if multi:
        pod_spec["subdomain"] = job.service
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
    return {
        "metadata": {"name": job.k8s_name, "labels": labels(job), "annotations": annotations},
        "spec": spec,
    }
