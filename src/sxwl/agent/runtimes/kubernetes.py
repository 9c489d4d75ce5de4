"""The ``kubernetes`` runtime: each job attempt is a Kubernetes Job in its tenant's namespace.

- One namespace per tenant, ``<prefix><owner_id>``, labelled ``sxwl.ai/tenant``, made on first use
  with a NetworkPolicy (ingress only from pods of the same namespace: the ranks of a job talk, other
  tenants cannot reach them), a ResourceQuota, and Pod Security ``baseline`` enforced.
- A single-node attempt is a Job (completions = parallelism = 1, backoffLimit 0); a multi-node one an
  Indexed Job (completions = parallelism = nodes) with a headless Service, so that rank 0 is
  ``<job>-0.<service>``. Every pod gets torchrun's env (MASTER_ADDR, MASTER_PORT, NNODES, NODE_RANK
  from the completion index, NPROC_PER_NODE), SXWL_JOB_ID / SXWL_JOB_NAME / SXWL_ATTEMPT, and the
  user's env.
- Tenant pods: no service-account token, no privilege escalation, no host namespaces or paths, a
  memory-backed ``/dev/shm``, ``nvidia.com/gpu`` limits, a nodeSelector on the GPU product.
- Names, labels and annotations carry the job id and attempt: the Job's name is a function of them,
  so an attempt is created at most once (a second create is answered 409 and adopted), and a
  restarted agent rebuilds its state from the cluster.
- Status from Job and Pod conditions; image-pull errors and pods unschedulable past a timeout end the
  attempt as failed with the reason; stop and cancel delete the Job with foreground propagation.
- Logs: every pod's log (with timestamps, so nothing is shipped twice) is appended to a local spool
  file, each line prefixed ``[rank N] ``; JobSync ships that file by offset like the local runtime's.
  The spool's length is saved with the record, so a restart truncates a half-written tail.
- No artifacts: there is no volume shared with the agent (``output_dir`` is None).

All I/O happens in ``refresh`` (one list of Jobs and one of Pods per pass, cluster-wide, filtered by
label); the other methods only change local state."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from sxwl.agent.runtimes.base import Outcome
from sxwl.protocol import Assignment

log = logging.getLogger("sxwl.agent.kubernetes")

MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGER = "sxwl-agent"
JOB_ID = "sxwl.ai/job-id"
ATTEMPT = "sxwl.ai/attempt"
TENANT = "sxwl.ai/tenant"
JOB_NAME = "sxwl.ai/job-name"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
GPU = "nvidia.com/gpu"
GPU_PRODUCT = "nvidia.com/gpu.product"
CONTAINER = "main"
NETWORK_POLICY = "sxwl-tenant-isolation"
RESOURCE_QUOTA = "sxwl-tenant-quota"
IMAGE_PULL_REASONS = {"ImagePullBackOff", "ErrImagePull", "InvalidImageName", "ErrImageNeverPull"}
DEFAULT_QUOTA = {"requests.nvidia.com/gpu": "1024", "pods": "1000"}
# Lines of a pod's log fetched again around the last one shipped (clock skew between agent and node).
LOG_SINCE_MARGIN_S = 120
API_ERRORS = (ApiException, aiohttp.ClientError, asyncio.TimeoutError, OSError)


def dns_label(text: str, limit: int = 63) -> str:
    """A DNS-1123 label made from ``text``: lower case, ``-`` for anything else, trimmed."""
    label = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return label[:limit].rstrip("-") or "x"


def _ts_key(stamp: str) -> str:
    """An RFC 3339 UTC timestamp with nanoseconds padded to nine digits: strings that sort in time."""
    stamp = stamp.rstrip("Z")
    whole, _, fraction = stamp.partition(".")
    return f"{whole}.{fraction.ljust(9, '0')[:9]}"


def new_log_lines(text: str, mark: str | None, seen_at_mark: int) -> tuple[list[str], str | None, int]:
    """The lines of a ``timestamps=true`` pod log not shipped yet: those after ``mark`` (the newest
    timestamp shipped, normalised by ``_ts_key``), and those at it beyond the ``seen_at_mark`` already
    shipped. Returns them without their timestamps, the new mark and how many lines it has shipped."""
    out: list[str] = []
    skip = seen_at_mark if mark is not None else 0
    count = skip
    for raw in text.splitlines():
        stamp, _, line = raw.partition(" ")
        if not stamp[:1].isdigit():
            continue  # not a timestamped line
        key = _ts_key(stamp)
        if mark is not None and key < mark:
            continue
        if key == mark and skip > 0:
            skip -= 1
            continue
        if key != mark:
            mark, count = key, 0
        count += 1
        out.append(line)
    return out, mark, count


@dataclass
class KubeJob:
    """What the agent keeps about one attempt, in ``job.json`` beside its log spool."""

    job_id: str
    attempt: int
    name: str
    owner_id: str
    namespace: str
    k8s_name: str
    nodes: int
    gpus_per_node: int
    max_runtime_s: int | None
    started_at: float
    spec: dict[str, Any] | None = None  # the assignment, until the Job exists
    created: bool = False  # the Job exists in the cluster (or did)
    log_offset: int = 0
    spool_size: int = 0  # bytes of the spool covered by ``log_marks``
    log_marks: dict[str, list[Any]] = field(default_factory=dict)  # pod -> [timestamp, lines at it]
    stop_reason: str | None = None
    stop_cancel: bool = False
    stop_at: float | None = None
    delete_sent: bool = False
    outcome: Outcome | None = None
    exit_code: int | None = None
    reported: bool = False
    reported_state: str | None = None
    fenced: bool = False
    lost_reason: str | None = None
    artifacts_uploaded: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"{self.job_id}:{self.attempt}"

    @property
    def service(self) -> str:
        return self.k8s_name


@dataclass
class _Seen:
    """What one refresh read about an attempt, for ``poll`` to turn into an outcome."""

    outcome: Outcome
    exit_code: int | None
    reason: str | None


class KubernetesRuntime:
    def __init__(
        self,
        api_client: Any,
        namespace_prefix: str = "sxwl-tenant-",
        stop_grace_s: float = 10.0,
        *,
        state_dir: Path | None = None,
        unschedulable_timeout_s: float = 120.0,
        master_port: int = 29500,
        tenant_quota: Mapping[str, str] | None = None,
        run_as_non_root: bool = False,
        pod_annotations: Callable[[Assignment], Mapping[str, str]] | None = None,
    ) -> None:
        self.api = api_client
        self.batch = client.BatchV1Api(api_client)
        self.core = client.CoreV1Api(api_client)
        self.networking = client.NetworkingV1Api(api_client)
        self.prefix = namespace_prefix
        self.stop_grace_s = stop_grace_s
        self.unschedulable_timeout_s = unschedulable_timeout_s
        self.master_port = master_port
        self.tenant_quota = dict(tenant_quota or DEFAULT_QUOTA)
        self.run_as_non_root = run_as_non_root
        self.pod_annotations = pod_annotations
        base = state_dir if state_dir is not None else Path(tempfile.mkdtemp(prefix="sxwl-k8s-"))
        self.root = base / "k8s-jobs"
        self.jobs: dict[str, KubeJob] = {}
        self._seen: dict[str, _Seen] = {}
        self._namespaces: set[str] = set()
        self._adopted = False
        self._garbage: dict[str, KubeJob] = {}  # reported attempts whose Job is still to delete
        self._unschedulable_since: dict[str, float] = {}  # pod uid -> first seen unschedulable

    # ---- state on disk ---------------------------------------------------------------------------

    def workdir(self, job_id: str, attempt: int) -> Path:
        return self.root / f"{job_id}-{attempt}"

    def save(self, job: KubeJob) -> None:
        directory = self.workdir(job.job_id, job.attempt)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / "job.json"
        temp = path.with_suffix(".tmp")
        temp.write_text(json.dumps(asdict(job)))
        os.replace(temp, path)

    def log_path(self, job: KubeJob) -> Path:
        return self.workdir(job.job_id, job.attempt) / "output.log"

    def output_dir(self, job: KubeJob) -> Path | None:
        return None  # no volume shared with the pods: no artifacts on Kubernetes CPods yet

    def adopt(self) -> list[KubeJob]:
        """Takes back the records on disk; the cluster is read on the first ``refresh``, which
        adopts Jobs the records do not know and reports as lost those whose Job is gone."""
        if self.root.exists():
            for path in sorted(self.root.glob("*/job.json")):
                job = KubeJob(**json.loads(path.read_text()))
                spool = self.log_path(job)
                if spool.exists() and spool.stat().st_size > job.spool_size:
                    with spool.open("r+b") as handle:  # a tail written after the last save
                        handle.truncate(job.spool_size)
                if job.reported:
                    self._garbage[job.key] = job
                else:
                    self.jobs[job.key] = job
        return []

    # ---- GPUs ------------------------------------------------------------------------------------

    def used_gpu_count(self) -> int:
        return sum(j.nodes * j.gpus_per_node for j in self.jobs.values() if j.outcome is None)

    # ---- lifecycle -------------------------------------------------------------------------------

    def namespace_for(self, owner_id: str) -> str:
        return dns_label(self.prefix + owner_id)

    def knows(self, job_id: str, attempt: int) -> bool:
        return f"{job_id}:{attempt}" in self.jobs or self.workdir(job_id, attempt).exists()

    def start(self, assignment: Assignment) -> KubeJob:
        """Records the attempt; its Job is created by the next ``refresh``. Refuses (RuntimeError)
        what cannot run as a Kubernetes workload."""
        key = f"{assignment.job_id}:{assignment.attempt}"
        if key in self.jobs:
            return self.jobs[key]
        if not assignment.image:
            raise RuntimeError(
                "the job has no container image; a Kubernetes CPod runs every job as a container"
            )
        job = KubeJob(
            job_id=assignment.job_id,
            attempt=assignment.attempt,
            name=assignment.name,
            owner_id=assignment.owner_id,
            namespace=self.namespace_for(assignment.owner_id),
            k8s_name=dns_label(f"sxwl-{assignment.job_id}-{assignment.attempt}", 52),
            nodes=assignment.nodes,
            gpus_per_node=assignment.gpus_per_node,
            max_runtime_s=assignment.max_runtime_s,
            started_at=time.time(),
            spec=assignment.model_dump(mode="json"),
        )
        self.jobs[key] = job
        self.save(job)
        log.info("accepted job %s attempt %d as %s/%s", job.job_id, job.attempt, job.namespace, job.k8s_name)
        return job

    def stop(self, job_id: str, attempt: int, reason: str, cancel: bool) -> KubeJob | None:
        """Marks the attempt stopping; ``refresh`` deletes its Job (foreground)."""
        job = self.jobs.get(f"{job_id}:{attempt}")
        if job is None or job.outcome is not None or job.stop_at is not None:
            return job
        job.stop_reason, job.stop_cancel, job.stop_at = reason, cancel, time.time()
        self.save(job)
        return job

    def poll(self) -> list[KubeJob]:
        finished = []
        for job in list(self.jobs.values()):
            if job.outcome is not None:
                continue
            seen = self._seen.pop(job.key, None)
            if seen is None and job.stop_at is not None and not job.created:
                seen = _Seen("cancelled" if job.stop_cancel else "failed", None, None)
            if seen is None:
                continue
            job.outcome, job.exit_code = seen.outcome, seen.exit_code
            if seen.reason and job.stop_reason is None:
                job.stop_reason = seen.reason
            job.spec = None
            self.save(job)
            finished.append(job)
            log.info(
                "job %s attempt %d ended: %s (exit %s)", job.job_id, job.attempt, job.outcome, job.exit_code
            )
        return finished

    def done(self, job: KubeJob) -> None:
        """The cloud has the final state: the Job (and Service) are deleted by the next refresh."""
        job.reported = True
        self.save(job)
        self.jobs.pop(job.key, None)
        self._garbage[job.key] = job

    # ---- I/O -------------------------------------------------------------------------------------

    async def refresh(self) -> list[KubeJob]:
        lost: list[KubeJob] = []
        try:
            k8s_jobs, pods = await self._list()
            if not self._adopted:
                lost = self._adopt_cluster(k8s_jobs)
                self._adopted = True
            pending = [
                j for j in self.jobs.values() if j.outcome is None and not j.created and j.stop_at is None
            ]
            for job in pending:
                await self._create(job)
            if any(job.created for job in pending):
                k8s_jobs, pods = await self._list()
            for job in list(self.jobs.values()):
                if job.outcome is not None or job.key in self._seen:
                    continue
                mine = pods.get(job.key, [])
                await self._collect_logs(job, mine)
                await self._observe(job, k8s_jobs.get(job.key), mine)
            for key, job in list(self._garbage.items()):
                await self._delete(job)
                if key not in k8s_jobs:
                    del self._garbage[key]
                    shutil.rmtree(self.workdir(job.job_id, job.attempt), ignore_errors=True)
        except API_ERRORS as exc:
            log.warning("kubernetes API: %s; retrying on the next pass", _short(exc))
        return lost

    async def _list(self) -> tuple[dict[str, Any], dict[str, list[Any]]]:
        selector = f"{MANAGED_BY}={MANAGER}"
        jobs: dict[str, Any] = {}
        for item in (await self.batch.list_job_for_all_namespaces(label_selector=selector)).items:
            key = self._key_of(item)
            if key:
                jobs[key] = item
        pods: dict[str, list[Any]] = {}
        for item in (await self.core.list_pod_for_all_namespaces(label_selector=selector)).items:
            key = self._key_of(item)
            if key:
                pods.setdefault(key, []).append(item)
        return jobs, pods

    def _key_of(self, obj: Any) -> str | None:
        if not obj.metadata.namespace.startswith(self.prefix):
            return None
        labels = obj.metadata.labels or {}
        if JOB_ID not in labels or ATTEMPT not in labels:
            return None
        return f"{labels[JOB_ID]}:{labels[ATTEMPT]}"

    def _adopt_cluster(self, k8s_jobs: dict[str, Any]) -> list[KubeJob]:
        lost = []
        for key, job in list(self.jobs.items()):
            if job.created and key not in k8s_jobs and job.outcome is None:
                job.lost_reason = "its Kubernetes Job was gone when the agent restarted"
                job.reported = True
                self.save(job)
                del self.jobs[key]
                lost.append(job)
                log.warning(
                    "job %s attempt %d: its Job vanished while the agent was away", job.job_id, job.attempt
                )
            elif key in k8s_jobs and not job.created:
                job.created = True
                self.save(job)
        for key, item in k8s_jobs.items():
            if key in self.jobs or key in self._garbage:
                continue
            if item.metadata.deletion_timestamp is not None:
                continue
            job = self._record_from(item)
            self.jobs[key] = job
            self.save(job)
            log.info("re-adopted job %s attempt %d from the cluster", job.job_id, job.attempt)
        return lost

    def _record_from(self, item: Any) -> KubeJob:
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
            started_at=meta.creation_timestamp.timestamp() if meta.creation_timestamp else time.time(),
            created=True,
        )

    async def _create_ignoring_conflict(self, call: Any, *args: Any) -> bool:
        """True when created now, False when it already existed."""
        try:
            await call(*args)
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    async def _ensure_namespace(self, job: KubeJob) -> None:
        ns = job.namespace
        if ns in self._namespaces:
            return
        labels = {
            TENANT: dns_label(job.owner_id),
            MANAGED_BY: MANAGER,
            "pod-security.kubernetes.io/enforce": "baseline",
        }
        await self._create_ignoring_conflict(
            self.core.create_namespace, {"metadata": {"name": ns, "labels": labels}}
        )
        meta = {"name": NETWORK_POLICY, "labels": {MANAGED_BY: MANAGER}}
        await self._create_ignoring_conflict(
            self.networking.create_namespaced_network_policy,
            ns,
            {
                "metadata": meta,
                "spec": {
                    "podSelector": {},
                    "policyTypes": ["Ingress"],
                    # Only pods of this namespace (the tenant's own) may connect: ranks talk freely.
                    "ingress": [{"from": [{"podSelector": {}}]}],
                },
            },
        )
        await self._create_ignoring_conflict(
            self.core.create_namespaced_resource_quota,
            ns,
            {"metadata": {**meta, "name": RESOURCE_QUOTA}, "spec": {"hard": self.tenant_quota}},
        )
        self._namespaces.add(ns)

    async def _create(self, job: KubeJob) -> None:
        assert job.spec is not None
        assignment = Assignment.model_validate(job.spec)
        try:
            await self._ensure_namespace(job)
            if job.nodes > 1:
                await self._create_ignoring_conflict(
                    self.core.create_namespaced_service, job.namespace, self.service_manifest(job)
                )
            created = await self._create_ignoring_conflict(
                self.batch.create_namespaced_job, job.namespace, self.job_manifest(job, assignment)
            )
        except ApiException as exc:
            if exc.status in (400, 403, 404, 422):  # the request itself is wrong: will not get better
                self._seen[job.key] = _Seen(
                    "failed", None, f"could not create the Kubernetes Job: {_short(exc)}"
                )
                return
            raise
        job.created = True
        self.save(job)
        log.info(
            "%s Job %s/%s for job %s attempt %d",
            "created" if created else "found existing",
            job.namespace,
            job.k8s_name,
            job.job_id,
            job.attempt,
        )

    async def _delete(self, job: KubeJob) -> None:
        try:
            await self.batch.delete_namespaced_job(
                job.k8s_name,
                job.namespace,
                propagation_policy="Foreground",
                grace_period_seconds=max(0, int(self.stop_grace_s)),
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
        if job.nodes > 1:
            try:
                await self.core.delete_namespaced_service(job.service, job.namespace)
            except ApiException as exc:
                if exc.status != 404:
                    raise

    async def _stop_now(self, job: KubeJob, reason: str) -> None:
        """The agent ends the attempt as failed (image pull, unschedulable)."""
        if job.stop_at is None:
            job.stop_reason, job.stop_cancel, job.stop_at = reason, False, time.time()
            self.save(job)
            log.warning("job %s attempt %d: %s", job.job_id, job.attempt, reason)

    async def _observe(self, job: KubeJob, item: Any, pods: list[Any]) -> None:
        if job.stop_at is not None:
            if job.created and not job.delete_sent:
                await self._delete(job)
                job.delete_sent = True
                self.save(job)
            # Ended once the Job is gone (or, should deletion hang, a minute past the grace).
            if item is None or time.time() - job.stop_at > self.stop_grace_s + 60:
                outcome: Outcome = "cancelled" if job.stop_cancel else "failed"
                self._seen[job.key] = _Seen(outcome, _exit_code(pods), None)
            return
        if item is None:
            if job.created:
                self._seen[job.key] = _Seen(
                    "failed", None, "its Kubernetes Job was deleted outside the agent"
                )
            return
        conditions = {c.type: c for c in (item.status.conditions or []) if c.status == "True"}
        if "Complete" in conditions:
            self._seen[job.key] = _Seen("succeeded", 0, None)
            return
        if "Failed" in conditions:
            failed = conditions["Failed"]
            code = _exit_code(pods)
            if failed.reason == "DeadlineExceeded":
                reason: str | None = f"max runtime of {job.max_runtime_s} s exceeded"
            elif code is None:
                reason = f"{failed.reason}: {failed.message}" if failed.message else failed.reason
            else:
                reason = None  # JobSync says "exit code N"
            self._seen[job.key] = _Seen("failed", code, reason)
            return
        now = time.monotonic()
        for pod in pods:
            for status in (pod.status.container_statuses or []) + (pod.status.init_container_statuses or []):
                waiting = status.state.waiting if status.state else None
                if waiting is not None and waiting.reason in IMAGE_PULL_REASONS:
                    detail = f": {waiting.message}" if waiting.message else ""
                    image = status.image or "the image"
                    await self._stop_now(job, f"could not pull {image} ({waiting.reason}){detail}")
                    return
            scheduled = next((c for c in (pod.status.conditions or []) if c.type == "PodScheduled"), None)
            uid = pod.metadata.uid
            if scheduled is not None and scheduled.status == "False" and scheduled.reason == "Unschedulable":
                since = self._unschedulable_since.setdefault(uid, now)
                if now - since > self.unschedulable_timeout_s:
                    limit = f"{self.unschedulable_timeout_s:g}"
                    await self._stop_now(job, f"unschedulable for more than {limit} s: {scheduled.message}")
                    return
            else:
                self._unschedulable_since.pop(uid, None)

    async def _collect_logs(self, job: KubeJob, pods: list[Any]) -> None:
        """Appends what each pod wrote since the last pass to the spool, prefixed by its rank."""
        chunks: list[bytes] = []
        for pod in sorted(pods, key=_rank):
            statuses = pod.status.container_statuses or []
            if not any(s.state and (s.state.running or s.state.terminated) for s in statuses):
                continue
            name = pod.metadata.name
            mark, seen = job.log_marks.get(name, [None, 0])
            kwargs: dict[str, Any] = {"container": CONTAINER, "timestamps": True}
            if mark is not None:
                elapsed = time.time() - _parse_mark(mark)
                kwargs["since_seconds"] = max(1, int(elapsed) + LOG_SINCE_MARGIN_S)
            try:
                text = await self.core.read_namespaced_pod_log(name, pod.metadata.namespace, **kwargs)
            except ApiException as exc:
                log.debug("no log yet from pod %s: %s", name, _short(exc))
                continue
            lines, mark, seen = new_log_lines(str(text or ""), mark, seen)
            if lines:
                prefix = f"[rank {_rank(pod)}] "
                chunks.append("".join(f"{prefix}{line}\n" for line in lines).encode())
                job.log_marks[name] = [mark, seen]
        if not chunks:
            return
        path = self.log_path(job)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("ab") as handle:
            handle.truncate(job.spool_size)
            handle.seek(job.spool_size)
            for chunk in chunks:
                handle.write(chunk)
            job.spool_size = handle.tell()
        self.save(job)

    # ---- manifests -------------------------------------------------------------------------------

    def labels(self, job: KubeJob) -> dict[str, str]:
        return {
            MANAGED_BY: MANAGER,
            JOB_ID: job.job_id,
            ATTEMPT: str(job.attempt),
            TENANT: dns_label(job.owner_id),
        }

    def service_manifest(self, job: KubeJob) -> dict[str, Any]:
        return {
            "metadata": {"name": job.service, "labels": self.labels(job)},
            "spec": {
                "clusterIP": "None",
                "selector": {JOB_ID: job.job_id, ATTEMPT: str(job.attempt)},
                "publishNotReadyAddresses": True,  # rank 0's name resolves before it is Ready
                "ports": [{"name": "master", "port": self.master_port}],
            },
        }

    def job_manifest(self, job: KubeJob, assignment: Assignment) -> dict[str, Any]:
        multi = job.nodes > 1
        env: dict[str, Any] = {k: {"value": v} for k, v in assignment.env.items()}
        env.update(
            SXWL_JOB_ID={"value": job.job_id},
            SXWL_JOB_NAME={"value": job.name},
            SXWL_ATTEMPT={"value": str(job.attempt)},
            MASTER_ADDR={"value": f"{job.k8s_name}-0.{job.service}" if multi else "127.0.0.1"},
            MASTER_PORT={"value": str(self.master_port)},
            NNODES={"value": str(job.nodes)},
            NPROC_PER_NODE={"value": str(max(1, job.gpus_per_node))},
            NODE_RANK=(
                {"valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}}}
                if multi
                else {"value": "0"}
            ),
            PYTHONUNBUFFERED={"value": "1"},
        )
        container: dict[str, Any] = {
            "name": CONTAINER,
            "image": assignment.image,
            "env": [{"name": name, **value} for name, value in env.items()],
            "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],  # noqa: S108 - the pod's shm,
            "securityContext": {"allowPrivilegeEscalation": False, "privileged": False},
        }
        if isinstance(assignment.command, str):
            container["command"] = ["/bin/sh", "-c", assignment.command]
        elif assignment.command:
            container["command"] = list(assignment.command)
        if job.gpus_per_node:
            container["resources"] = {"limits": {GPU: str(job.gpus_per_node)}}
        if multi:
            container["ports"] = [{"name": "master", "containerPort": self.master_port}]
        pod_security: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
        if self.run_as_non_root:
            pod_security["runAsNonRoot"] = True
        pod_spec: dict[str, Any] = {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "hostNetwork": False,
            "hostPID": False,
            "hostIPC": False,
            "terminationGracePeriodSeconds": max(0, int(self.stop_grace_s)),
            "securityContext": pod_security,
            "containers": [container],
            "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
        }
        if assignment.gpu_product:
            pod_spec["nodeSelector"] = {GPU_PRODUCT: assignment.gpu_product}
        if multi:
            pod_spec["subdomain"] = job.service
        annotations = {JOB_ID: job.job_id, ATTEMPT: str(job.attempt), JOB_NAME: job.name}
        pod_annotations = {
            **annotations,
            **(self.pod_annotations(assignment) if self.pod_annotations else {}),
        }
        spec: dict[str, Any] = {
            "completions": job.nodes,
            "parallelism": job.nodes,
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": self.labels(job), "annotations": pod_annotations},
                "spec": pod_spec,
            },
        }
        if multi:
            spec["completionMode"] = "Indexed"
        if job.max_runtime_s:
            spec["activeDeadlineSeconds"] = job.max_runtime_s
        return {
            "metadata": {"name": job.k8s_name, "labels": self.labels(job), "annotations": annotations},
            "spec": spec,
        }


def _rank(pod: Any) -> int:
    index = (pod.metadata.annotations or {}).get(COMPLETION_INDEX, "0")
    return int(index) if str(index).isdigit() else 0


def _exit_code(pods: list[Any]) -> int | None:
    """The first non-zero exit code among the pods, by rank; else 0 if one exited, else None."""
    codes = []
    for pod in sorted(pods, key=_rank):
        for status in pod.status.container_statuses or []:
            terminated = status.state.terminated if status.state else None
            if terminated is not None and terminated.exit_code is not None:
                codes.append(int(terminated.exit_code))
    nonzero = [c for c in codes if c != 0]
    return nonzero[0] if nonzero else (0 if codes else None)


def _parse_mark(mark: str) -> float:
    whole = mark.partition(".")[0]
    try:
        return datetime.fromisoformat(whole + "+00:00").timestamp()
    except ValueError:
        return 0.0


def _short(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        try:
            message = json.loads(exc.body or "{}").get("message")
        except (ValueError, AttributeError):
            message = None
        return f"{exc.status} {message or exc.reason}"
    return str(exc) or type(exc).__name__
