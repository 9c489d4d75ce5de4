"""A stopped dev environment's workspace claim on the kubernetes runtime (kube_devenv.py): the
claims the agent made for one environment, in its tenant's namespace, go once the cloud says to
forget that workspace (``forget_workspace``); another environment's claim stays."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kubernetes_asyncio import client

from sxwl.agent.runtimes.kube_devenv import DevEnvs, DevEnvSettings, claim_manifest, claim_name
from sxwl.agent.runtimes.kube_objects import KubeJob
from sxwl.protocol.devenvs import DevEnvSpec
from tests.k8s.test_jobs_runtime import in_cluster
from tests.support.k8s import K8sCluster

pytestmark = pytest.mark.k8s

SETTINGS = DevEnvSettings(image="lab:1", agent_namespace="sxwl-system", agent_labels={}, size="1Gi")


def _record(namespace: str) -> KubeJob:
    return KubeJob(
        job_id="j",
        attempt=1,
        name="dev",
        owner_id="u",
        namespace=namespace,
        k8s_name="sxwl-j-1",
        nodes=1,
        gpus_per_node=0,
        max_runtime_s=None,
        started_at=0.0,
    )


def test_a_forgotten_workspace_loses_its_claim_and_no_other(k8s_cluster: K8sCluster) -> None:
    namespace = f"sxwl-tenant-claims-{uuid.uuid4().hex[:6]}"
    k8s_cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    kept, gone = uuid.uuid4().hex, uuid.uuid4().hex

    async def body(api: Any) -> None:
        core = client.CoreV1Api(api)
        for workspace in (kept, gone):
            spec = DevEnvSpec(base_url=f"/dev/{workspace}/", workspace=workspace, token="t" * 40)
            await core.create_namespaced_persistent_volume_claim(
                namespace, claim_manifest(_record(namespace), spec, SETTINGS)
            )
        envs = DevEnvs(api, SETTINGS)
        assert envs.forget(gone)
        await envs.sweep()
        await envs.sweep()  # nothing left to do: no error
        # The listed claim's own metadata, not a second read: a claim being deleted may be gone
        # by the time of that read (a 404 in CI).
        claims = {
            c.metadata.name: c.metadata
            for c in (await core.list_namespaced_persistent_volume_claim(namespace)).items
        }
        assert claim_name(kept) in claims
        gone_claim = claims.get(claim_name(gone))
        assert gone_claim is None or gone_claim.deletion_timestamp is not None

    try:
        in_cluster(k8s_cluster, body)
    finally:
        k8s_cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
