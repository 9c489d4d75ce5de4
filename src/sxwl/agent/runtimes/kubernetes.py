"""The ``kubernetes`` runtime: each job attempt is a Kubernetes Job in its tenant's namespace
(kube_tenancy.py), made from the manifests of kube_manifests.py, its pods' logs spooled by
kube_logs.py.

- Names, labels and annotations carry the job id and attempt: the Job's name is a function of them,
  so an attempt is created at most once (a second create is answered 409 and adopted), and a
  restarted agent rebuilds its state from the cluster.
- Status from Job and Pod conditions (kube_status.py); an attempt is reported running once every
  rank's ``main`` container has started (not while a pod pulls its image or fetches its inputs:
  billing starts there); image-pull errors, containers that cannot start and pods unschedulable past
  a timeout end the attempt as failed with the reason; stop and cancel delete the Job with foreground
  propagation.
- Artifacts leave each pod through its own ``uploader`` container (kube_uploads.py), with a token of
  the attempt's in a Secret the Job owns; the agent never reads pod files (``outputs`` is None),
  and an attempt ends only once its pods (uploaders included) have finished. A fine-tune's pod
  fetches its inputs with the same token and runs the trainer image (kube_inputs.py).
- A dev environment's attempt is such a Job running JupyterLab on a workspace claim that outlives
  it, reached by the agent at its pod's address (kube_devenv.py).

An endpoint replica's pod runs the engine image behind a NetworkPolicy of its own (kube_engine.py).

All I/O happens in ``refresh`` (one list of Jobs and one of Pods per pass, cluster-wide, filtered by
label); the other methods only change local state."""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from sxwl.agent.engine_probe import engine_job
from sxwl.agent.forward_targets import Target
from sxwl.agent.runtimes.base import RECORD_FILE, AttemptDirs, Outcome
from sxwl.agent.runtimes.kube_devenv import DevEnvs, DevEnvSettings, dress
from sxwl.agent.runtimes.kube_engine import Engines, EngineSettings
from sxwl.agent.runtimes.kube_follow import LogFollowers
from sxwl.agent.runtimes.kube_inputs import FETCHER, FETCHER_KEY, start_refusal
from sxwl.agent.runtimes.kube_logs import collect_logs, truncate_spool
from sxwl.agent.runtimes.kube_manifests import job_manifest, service_manifest
from sxwl.agent.runtimes.kube_objects import (
    API_ERRORS,
    KubeJob,
    create_ignoring_conflict,
    delete_objects,
    dns_label,
    list_attempts,
    record_from,
    short,
)
from sxwl.agent.runtimes.kube_status import (
    Seen,
    began,
    exit_code,
    never_started,
    outcome,
    settled,
    start_problem,
    unschedulable,
)
from sxwl.agent.runtimes.kube_tenancy import Tenancy
from sxwl.agent.runtimes.kube_uploads import UploadConfig, secret_manifest
from sxwl.agent.status_report import Refusal
from sxwl.agent.tenant_files import OutputTree
from sxwl.protocol import Assignment, Node, attempt_key
from sxwl.protocol.reasons import Reason, english

log = logging.getLogger("sxwl.agent.kubernetes")
# How long past the grace a stopped or failed attempt's pods may take to finish before it ends anyway.
SETTLE_MARGIN_S = 60.0


class KubernetesRuntime(AttemptDirs[KubeJob]):
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
        uploads: UploadConfig | None = None,
        node_selector: Mapping[str, str] | None = None,
        tolerations: list[dict[str, str]] | None = None,
        memory_limit: str | None = None,
        trainer_image: str | None = None,
        engine: EngineSettings | None = None,
        dev_envs: DevEnvSettings | None = None,
    ) -> None:
        self.api = api_client
        self.batch = client.BatchV1Api(api_client)
        self.core = client.CoreV1Api(api_client)
        self.followers = LogFollowers(self.core)
        self.tenancy = Tenancy(api_client, prefix=namespace_prefix, quota=tenant_quota)
        self.prefix = namespace_prefix
        self.stop_grace_s = stop_grace_s
        self.unschedulable_timeout_s = unschedulable_timeout_s
        self.master_port = master_port
        self.run_as_non_root = run_as_non_root
        self.pod_annotations = pod_annotations
        self.uploads = uploads
        self.node_selector = dict(node_selector or {})
        self.tolerations = list(tolerations or [])
        self.memory_limit = memory_limit
        self.trainer_image = trainer_image
        self.engines = Engines(api_client, engine)  # endpoint replicas (kube_engine.py)
        self.dev = DevEnvs(api_client, dev_envs) if dev_envs is not None else None
        base = state_dir if state_dir is not None else Path(tempfile.mkdtemp(prefix="sxwl-k8s-"))
        super().__init__(base / "k8s-jobs")
        self.jobs: dict[str, KubeJob] = {}
        self._seen: dict[str, Seen] = {}
        self._ended_since: dict[str, float] = {}  # attempt -> when its Job was first seen ended
        self._adopted = False
        self._garbage: dict[str, KubeJob] = {}  # reported attempts whose Job is still to delete
        self._unschedulable_since: dict[str, float] = {}  # pod uid -> first seen unschedulable

    @property
    def takes_fine_tunes(self) -> bool:
        """A fine-tune's pod fetches its inputs with the upload token and runs the trainer image."""
        return self.uploads is not None and self.trainer_image is not None

    @property
    def takes_endpoints(self) -> bool:
        """A replica's pod fetches its model with the upload token and runs the engine image."""
        return self.uploads is not None and self.engines.settings is not None

    @property
    def takes_dev_envs(self) -> bool:
        """An environment's pod fetches its inputs with the upload token and runs JupyterLab."""
        return self.uploads is not None and self.dev is not None

    # ---- state on disk ---------------------------------------------------------------------------

    def log_path(self, job: KubeJob) -> Path:
        return self.workdir(job.job_id, job.attempt) / "output.log"

    def outputs(self, job: KubeJob) -> OutputTree | None:
        return None  # the pods' uploaders put the artifacts themselves (kube_uploads.py)

    def adopt(self) -> list[KubeJob]:
        """Takes back the records on disk; the cluster is read on the first ``refresh``, which
        adopts Jobs the records do not know and reports as lost those whose Job is gone."""
        if self.root.exists():
            for path in sorted(self.root.glob(f"*/{RECORD_FILE}")):
                job = KubeJob(**json.loads(path.read_text()))
                truncate_spool(self.log_path(job), job)
                if job.reported:
                    self._garbage[job.key] = job
                else:
                    self.jobs[job.key] = job
        return []

    # ---- GPUs ------------------------------------------------------------------------------------

    def used_gpu_count(self) -> int:
        return sum(j.nodes * j.gpus_per_node for j in self.jobs.values() if j.outcome is None)

    def nodes_to_report(self, nodes: list[Node]) -> list[Node]:
        return nodes  # the cluster's own accounting (pods' GPU requests) already counts our jobs

    def accept_owners(self, owner_ids: frozenset[str] | None) -> None:
        """Nothing to do: every tenant's pods run in a namespace of their own."""

    def engine_target(self, job: KubeJob) -> Target | None:
        return self.engines.target(job)

    def forget_workspace(self, workspace: str) -> bool:
        """A stopped dev environment's workspace claim, deleted by the next refresh (kube_devenv.py)."""
        return self.dev is not None and self.dev.forget(workspace)

    def attempt_target(self, target: str) -> Target | None:
        """A replica's engine, or a dev environment's JupyterLab or sshd (kube_devenv.py)."""
        found = self.engines.target(engine_job(self.jobs, target))
        if found is None and self.dev is not None:
            return self.dev.target(target, self.jobs)
        return found

    # ---- lifecycle -------------------------------------------------------------------------------

    def namespace_for(self, owner_id: str) -> str:
        return self.tenancy.namespace_for(owner_id)

    def knows(self, job_id: str, attempt: int) -> bool:
        return attempt_key(job_id, attempt) in self.jobs or self.workdir(job_id, attempt).exists()

    def start(self, assignment: Assignment, inputs: Mapping[str, Path] | None = None) -> KubeJob:
        """Records the attempt; its Job is created by the next ``refresh``. Refuses (RuntimeError)
        what cannot run as a Kubernetes workload."""
        key = attempt_key(assignment.job_id, assignment.attempt)
        if key in self.jobs:
            return self.jobs[key]
        problem = start_refusal(assignment, self.takes_fine_tunes, self.takes_dev_envs, self.takes_endpoints)
        if problem is not None:
            raise Refusal(problem)
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
            engine=assignment.engine is not None,
            min_grace_s=self.dev.settings.save_grace_s if self.dev and assignment.jupyter else 0.0,
        )
        self.jobs[key] = job
        self.save(job)
        log.info("accepted job %s attempt %d as %s/%s", job.job_id, job.attempt, job.namespace, job.k8s_name)
        return job

    def poll(self) -> list[KubeJob]:
        finished = []
        for job in list(self.jobs.values()):
            if job.outcome is not None:
                continue
            seen = self._seen.pop(job.key, None)
            if seen is None and job.stop_at is not None and not job.created:
                # Stopped before its Job was made: nothing of it ran.
                seen = Seen("cancelled" if job.stop_cancel else "failed", None, None, never_ran=True)
            if seen is None:
                continue
            job.outcome, job.exit_code = seen.outcome, seen.exit_code
            job.never_ran = job.never_ran or seen.never_ran
            if seen.reason and job.stop_reason is None:
                job.stop_reason = seen.reason.stored
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
        self._ended_since.pop(job.key, None)
        self.followers.forget(job.key)
        self._garbage[job.key] = job

    # ---- I/O -------------------------------------------------------------------------------------

    async def refresh(self) -> list[KubeJob]:
        lost: list[KubeJob] = []
        try:
            k8s_jobs, pods = await list_attempts(self.batch, self.core, self.prefix)
            if not self._adopted:
                lost = self._adopt_cluster(k8s_jobs)
                self._adopted = True
            pending = [
                j for j in self.jobs.values() if j.outcome is None and not j.created and j.stop_at is None
            ]
            for job in pending:
                await self._create(job)
            if any(job.created for job in pending):
                k8s_jobs, pods = await list_attempts(self.batch, self.core, self.prefix)
            for job in list(self.jobs.values()):
                if job.outcome is not None or job.key in self._seen:
                    continue
                mine = pods.get(job.key, [])
                if not job.secret_made and job.key in k8s_jobs:
                    await self._make_secret(job, k8s_jobs[job.key])
                if job.engine and self.engines.observe(job, mine):
                    self.save(job)
                if not job.main_started and began(job.nodes, mine):
                    job.main_started = True  # JobSync reports it running now (command_started)
                    self.save(job)
                polled = [p for p in mine if not self.followers.owns(p)]
                if await collect_logs(self.core, job, polled, self.log_path(job)):
                    self.save(job)
                await self._observe(job, k8s_jobs.get(job.key), mine)
            if self.dev is not None:
                self.dev.seen(pods)
                await self.dev.sweep()
            for key in self.followers.take_changed():
                if key in self.jobs:
                    self.save(self.jobs[key])
            for key, job in list(self._garbage.items()):
                await self._delete(job)
                if key not in k8s_jobs:
                    del self._garbage[key]
                    shutil.rmtree(self.workdir(job.job_id, job.attempt), ignore_errors=True)
        except API_ERRORS as exc:
            log.warning("kubernetes API: %s; retrying on the next pass", short(exc))
        return lost

    def _adopt_cluster(self, k8s_jobs: dict[str, Any]) -> list[KubeJob]:
        lost = []
        for key, job in list(self.jobs.items()):
            if job.created and key not in k8s_jobs and job.outcome is None:
                job.lost_reason = Reason.of("agent.kube_job_gone").stored
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
            job = record_from(item)
            self.jobs[key] = job
            self.save(job)
            log.info("re-adopted job %s attempt %d from the cluster", job.job_id, job.attempt)
        return lost

    async def _create(self, job: KubeJob) -> None:
        assert job.spec is not None
        assignment = Assignment.model_validate(job.spec)
        try:
            await self.tenancy.ensure(job.owner_id)
            if job.engine:
                await self.engines.allow_agent(job)
            if job.nodes > 1:
                await create_ignoring_conflict(
                    self.core.create_namespaced_service,
                    job.namespace,
                    service_manifest(job, master_port=self.master_port),
                )
            if assignment.jupyter is not None and self.dev is not None:
                assignment = await self.dev.prepare(job, assignment)
            manifest = job_manifest(
                job,
                assignment,
                master_port=self.master_port,
                stop_grace_s=self.stop_grace_s,
                run_as_non_root=self.run_as_non_root,
                pod_annotations=self.pod_annotations(assignment) if self.pod_annotations else {},
                node_selector=self.node_selector,
                tolerations=self.tolerations,
                memory_limit=self.memory_limit,
                # Pods upload their artifacts when the agent has an upload URL and the cloud sent a token.
                uploads=self.uploads if assignment.upload_token is not None else None,
                trainer_image=self.trainer_image,
                engine_image=self.engines.settings.image if self.engines.settings else None,
            )
            if assignment.jupyter is not None and self.dev is not None:
                manifest = dress(manifest, job, assignment, self.dev.settings)
            create = self.batch.create_namespaced_job
            created = await create_ignoring_conflict(create, job.namespace, manifest)
        except ApiException as exc:
            if exc.status in (400, 403, 404, 422):  # the request itself is wrong: will not get better
                failed = Reason.of("kube.not_created", error=short(exc))
                self._seen[job.key] = Seen("failed", None, failed, never_ran=True)
                return
            raise
        job.created = True
        self.save(job)
        how = "created" if created else "found existing"
        log.info(
            "%s Job %s/%s for job %s attempt %d", how, job.namespace, job.k8s_name, job.job_id, job.attempt
        )

    async def _make_secret(self, job: KubeJob, item: Any) -> None:
        """The upload token's Secret, owned by the Job (made first, for its uid), so it goes with it;
        the pods' volume waits for it. Then the token is dropped from the record on disk."""
        assignment = Assignment.model_validate(job.spec) if job.spec is not None else None
        if assignment is not None and self.uploads is not None and assignment.upload_token is not None:
            programs = {FETCHER_KEY: FETCHER} if assignment.inputs else None
            manifest = secret_manifest(
                job, assignment.upload_token, self.uploads, item.metadata.uid, programs
            )
            try:
                await create_ignoring_conflict(self.core.create_namespaced_secret, job.namespace, manifest)
            except ApiException as exc:
                if exc.status not in (400, 403, 404, 422):
                    raise
                # Its pods wait for the Secret's volume: none has run.
                await self._stop_now(job, Reason.of("kube.no_secret", error=short(exc)), never_ran=True)
        if assignment is not None and assignment.jupyter is not None and self.dev is not None:
            await self.dev.make_secret(job, assignment.jupyter, item.metadata.uid)
        job.secret_made, job.spec = True, None
        self.save(job)

    async def _delete(self, job: KubeJob, pods: list[Any] | None = None) -> None:
        await delete_objects(
            self.core, self.batch, job, pods or [], max(0, int(job.grace(self.stop_grace_s)))
        )
        if job.engine:
            await self.engines.delete(job)

    async def _stop_now(self, job: KubeJob, reason: Reason, *, never_ran: bool) -> None:
        """The agent ends the attempt as failed (image pull, unschedulable); ``never_ran``: no pod's
        main container ever ran, so it costs nothing."""
        if job.stop_at is None:
            job.stop_reason, job.stop_cancel, job.stop_at = reason.stored, False, time.time()
            job.never_ran = never_ran
            self.save(job)
            log.warning("job %s attempt %d: %s", job.job_id, job.attempt, english(reason))

    async def _observe(self, job: KubeJob, item: Any, pods: list[Any]) -> None:
        if job.stop_at is not None:
            if job.created and not job.delete_sent:
                # A stop while no pod's main container has started (a cancel during the image pull):
                # the user's command never ran.
                job.never_ran = job.never_ran or never_started(pods)
                await self.followers.start(job, pods, self.log_path(job))  # before the pods can go
                await self._delete(job, pods)
                job.delete_sent = True
                self.save(job)
            # Ended once the Job is gone and its pods' last lines are in (or, should deletion hang,
            # a minute past the grace).
            overdue = time.time() - job.stop_at > job.grace(self.stop_grace_s) + 60
            if (item is None and not self.followers.busy(job.key)) or overdue:
                self.followers.forget(job.key)
                ended: Outcome = "cancelled" if job.stop_cancel else "failed"
                self._seen[job.key] = Seen(ended, exit_code(pods), None)
            return
        if item is None:
            if job.created:
                self._seen[job.key] = Seen("failed", None, Reason.of("kube.job_deleted"))
            return
        seen = self.engines.said(job, pods, outcome(job, item, pods))
        if seen is not None:
            # Final once every pod has finished, its uploader included, so the artifacts are in the
            # cloud before the final state; pods the Job controller is stopping get their grace.
            since = self._ended_since.setdefault(job.key, time.monotonic())
            overdue = time.monotonic() - since > self.stop_grace_s + SETTLE_MARGIN_S
            if settled(pods) or overdue:
                self._ended_since.pop(job.key, None)
                self._seen[job.key] = seen
            return
        unplaced, limit_s = self._unschedulable_since, self.unschedulable_timeout_s
        problem = start_problem(pods) or unschedulable(pods, unplaced, time.monotonic(), limit_s)
        if problem is not None:
            await self._stop_now(job, problem, never_ran=never_started(pods))
