"""One namespace per tenant, ``<prefix><owner_id>``, labelled ``sxwl.ai/tenant``, made on first use
with a NetworkPolicy (ingress only from pods of the same namespace: the ranks of a job talk, other
tenants cannot reach them), a ResourceQuota, and Pod Security ``baseline`` enforced. Endpoint
replicas' and dev environments' pods are left out of that policy: each has its own, admitting only
the agent (kube_engine.py, kube_devenv.py); a namespace made before is brought up to date once per
agent start."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio import client

from sxwl.agent.runtimes.kube_objects import (
    DEV_ENV,
    ENGINE,
    MANAGED_BY,
    MANAGER,
    TENANT,
    create_ignoring_conflict,
    dns_label,
)

NETWORK_POLICY = "sxwl-tenant-isolation"
RESOURCE_QUOTA = "sxwl-tenant-quota"
DEFAULT_QUOTA = {"requests.nvidia.com/gpu": "1024", "pods": "1000"}


class Tenancy:
    def __init__(self, api_client: Any, *, prefix: str, quota: Mapping[str, str] | None) -> None:
        self.core = client.CoreV1Api(api_client)
        self.networking = client.NetworkingV1Api(api_client)
        self.prefix = prefix
        self.quota = dict(quota or DEFAULT_QUOTA)
        self._made: set[str] = set()  # namespaces this process made or found complete

    def namespace_for(self, owner_id: str) -> str:
        return dns_label(self.prefix + owner_id)

    async def ensure(self, owner_id: str) -> None:
        """The tenant's namespace with its policy and quota; each create is idempotent (409 is fine),
        so an agent that stopped half-way finishes the job on its next attempt."""
        namespace = self.namespace_for(owner_id)
        if namespace in self._made:
            return
        labels = {
            TENANT: dns_label(owner_id),
            MANAGED_BY: MANAGER,
            "pod-security.kubernetes.io/enforce": "baseline",
        }
        await create_ignoring_conflict(
            self.core.create_namespace, {"metadata": {"name": namespace, "labels": labels}}
        )
        meta = {"name": NETWORK_POLICY, "labels": {MANAGED_BY: MANAGER}}
        policy = {"metadata": meta, "spec": isolation_spec()}
        if not await create_ignoring_conflict(
            self.networking.create_namespaced_network_policy, namespace, policy
        ):
            await self.networking.patch_namespaced_network_policy(NETWORK_POLICY, namespace, policy)
        await create_ignoring_conflict(
            self.core.create_namespaced_resource_quota,
            namespace,
            {"metadata": {**meta, "name": RESOURCE_QUOTA}, "spec": {"hard": self.quota}},
        )
        self._made.add(namespace)


def isolation_spec() -> dict[str, Any]:
    """Only pods of this namespace (the tenant's own) may connect: ranks talk freely. An endpoint
    replica's or a dev environment's pod is not selected: were it, the tenant's other pods could
    reach its engine or JupyterLab past the agent (policies add up)."""
    return {
        "podSelector": {
            "matchExpressions": [{"key": key, "operator": "DoesNotExist"} for key in (ENGINE, DEV_ENV)]
        },
        "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"podSelector": {}}]}],
    }
