"""What the ``kubernetes`` runtime keeps about an attempt and how it names things in the cluster:
the record (``KubeJob``), the labels and annotations every object carries, DNS-safe names, and the
small helpers every part of the runtime uses to talk to the API."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

from sxwl.agent.runtimes.base import AttemptRecord
from sxwl.protocol import attempt_key

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "sxwl-agent"
JOB_ID = "sxwl.ai/job-id"
ATTEMPT = "sxwl.ai/attempt"
TENANT = "sxwl.ai/tenant"
JOB_NAME = "sxwl.ai/job-name"
# On a dev environment's pods and workspace claim: the environment's id (kube_devenv.py).
DEV_ENV = "sxwl.ai/dev-env"
ENGINE = "sxwl.ai/engine"  # an endpoint replica's pod (kube_engine.py)
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
GPU = "nvidia.com/gpu"
GPU_PRODUCT = "nvidia.com/gpu.product"
CONTAINER = "main"
API_ERRORS = (ApiException, aiohttp.ClientError, asyncio.TimeoutError, OSError)


@dataclass(kw_only=True)
class KubeJob(AttemptRecord):
    """A Kubernetes attempt: where its Job lives, what it asked for, and how far its pods' logs have
    been spooled."""

    owner_id: str
    namespace: str
    k8s_name: str
    nodes: int
    gpus_per_node: int
    spec: dict[str, Any] | None = None  # the assignment, until the Job exists
    created: bool = False  # the Job exists in the cluster (or did)
    spool_size: int = 0  # bytes of the spool covered by ``log_marks``
    log_marks: dict[str, list[Any]] = field(default_factory=dict)  # pod -> [timestamp, lines at it]
    delete_sent: bool = False
    secret_made: bool = False  # the upload token's Secret exists (or the pods need none)
    engine: bool = False  # an endpoint replica's (kube_engine.py)
    engine_host: str | None = None  # its pod's IP while its engine's container runs
    main_started: bool = False  # every rank's main container has started (kube_status.began)
    # The least grace of its stop: a dev environment's, for its workspace to be saved (kube_devenv.py).
    min_grace_s: float = 0.0

    @property
    def service(self) -> str:
        return self.k8s_name

    def grace(self, default: float) -> float:
        return max(super().grace(default), self.min_grace_s)

    @property
    def serves_engine(self) -> bool:
        return self.engine

    @property
    def command_started(self) -> bool:
        return self.main_started


def dns_label(text: str, limit: int = 63) -> str:
    """A DNS-1123 label made from ``text``: lower case, ``-`` for anything else, trimmed."""
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return label[:limit].rstrip("-") or "x"


def labels(job: KubeJob) -> dict[str, str]:
    """The labels of every object made for the attempt: the runtime finds its objects by them."""
    return {
        MANAGED_BY: MANAGER,
        JOB_ID: job.job_id,
        ATTEMPT: str(job.attempt),
        TENANT: dns_label(job.owner_id),
    }


def record_from(item: Any) -> KubeJob:
    """The record of an attempt re-adopted from its Job in the cluster (the agent lost its own)."""
    meta, spec = item.metadata, item.spec
    annotations = meta.annotations or {}
    labels = meta.labels or {}
    container = spec.template.spec.containers[0]
    limits = (container.resources.limits if container.resources else None) or {}
    return KubeJob(
        job_id=labels[JOB_ID],
        attempt=int(labels[ATTEMPT]),
        name=annotations.get(JOB_NAME, ""),
        owner_id=labels.get(TENANT, ""),
        namespace=meta.namespace,
        k8s_name=meta.name,
        nodes=spec.completions or 1,
        gpus_per_node=int(limits.get(GPU, 0)),
        max_runtime_s=spec.active_deadline_seconds,
        engine=ENGINE in (spec.template.metadata.labels or {}),
        min_grace_s=_saving_grace(spec.template),
        started_at=meta.creation_timestamp.timestamp() if meta.creation_timestamp else time.time(),
        created=True,
    )


def _saving_grace(template: Any) -> float:
    """A dev environment's pod was given the grace to save its workspace: its stop keeps it."""
    if DEV_ENV not in (template.metadata.labels or {}):
        return 0.0
    return float(template.spec.termination_grace_period_seconds or 0)


async def list_attempts(batch: Any, core: Any, prefix: str) -> tuple[dict[str, Any], dict[str, list[Any]]]:
    """The runtime's Jobs and pods in the tenants' namespaces (those starting with ``prefix``), by
    attempt key: one list of each, cluster-wide, filtered by label."""
    selector = f"{MANAGED_BY}={MANAGER}"
    jobs: dict[str, Any] = {}
    for item in (await batch.list_job_for_all_namespaces(label_selector=selector)).items:
        key = _key_of(item, prefix)
        if key:
            jobs[key] = item
    pods: dict[str, list[Any]] = {}
    for item in (await core.list_pod_for_all_namespaces(label_selector=selector)).items:
        key = _key_of(item, prefix)
        if key:
            pods.setdefault(key, []).append(item)
    return jobs, pods


def _key_of(obj: Any, prefix: str) -> str | None:
    if not obj.metadata.namespace.startswith(prefix):
        return None
    found = obj.metadata.labels or {}
    if JOB_ID not in found or ATTEMPT not in found:
        return None
    return attempt_key(found[JOB_ID], found[ATTEMPT])


def rank(pod: Any) -> int:
    index = (pod.metadata.annotations or {}).get(COMPLETION_INDEX, "0")
    return int(index) if str(index).isdigit() else 0


async def create_ignoring_conflict(call: Callable[..., Awaitable[object]], *args: object) -> bool:
    """True when created now, False when it already existed."""
    try:
        await call(*args)
    except ApiException as exc:
        if exc.status == 409:
            return False
        raise
    return True


def short(exc: BaseException) -> str:
    """An API error as one line: its status and the server's message."""
    if isinstance(exc, ApiException):
        try:
            message = json.loads(exc.body or "{}").get("message")
        except (ValueError, AttributeError):
            message = None
        return f"{exc.status} {message or exc.reason}"
    return str(exc) or type(exc).__name__


async def delete_objects(core: Any, batch: Any, job: KubeJob, pods: list[Any], grace: int) -> None:
    """The attempt's pods, Job and Service, each gone already or not."""
    # The pods first, with the stop's grace: the garbage collector then deletes them without a
    # grace of its own, which leaves a pending deletion as it is (their manifest's grace is the
    # agent's --stop-grace; the cloud may ask for another, e.g. to save a checkpoint).
    for pod in pods:
        try:
            await core.delete_namespaced_pod(
                pod.metadata.name, pod.metadata.namespace, grace_period_seconds=grace
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
    try:
        await batch.delete_namespaced_job(
            job.k8s_name, job.namespace, propagation_policy="Foreground", grace_period_seconds=grace
        )
    except ApiException as exc:
        if exc.status != 404:
            raise
    if job.nodes > 1:
        try:
            await core.delete_namespaced_service(job.service, job.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
