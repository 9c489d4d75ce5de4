"""The ``kubernetes`` runtime as the agent's flags make it (PodSettings, pod_settings.py), and the
help of its dev environments' flags (docs/dev-envs.md, "On Kubernetes")."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sxwl.agent.pod_settings import PodSettings

if TYPE_CHECKING:  # the Kubernetes client is imported only by agents that use it: it is slow to load
    from kubernetes_asyncio.client import ApiClient

    from sxwl.agent.loop import AgentConfig
    from sxwl.agent.runtimes.kubernetes import KubernetesRuntime

TENANT_NAMESPACE_PREFIX = "sxwl-tenant-"
# The label of the chart's agent pods: the dev environments' NetworkPolicy admits those of the
# agent's namespace.
AGENT_POD_LABELS = {"sxwl.ai/component": "agent"}
DEV_ENV_HELP = {
    "image": "kubernetes runtime: the image that runs dev environments (python3 with JupyterLab; the "
    "trainer image has it); needs --uploader-image. Without it this CPod runs no dev environments.",
    "class": "kubernetes runtime: the storage class of dev environments' workspaces (default: the "
    "cluster's default class).",
    "size": "kubernetes runtime: the size of each dev environment's workspace.",
}


def job_runtime(
    api: ApiClient, config: AgentConfig, pods: PodSettings | None = None, namespace: str = "sxwl-system"
) -> KubernetesRuntime:
    """``namespace``: the agent's own, whose agent pods alone reach dev environments."""
    from sxwl.agent.runtimes.kube_devenv import DevEnvSettings
    from sxwl.agent.runtimes.kube_uploads import UploadConfig
    from sxwl.agent.runtimes.kubernetes import KubernetesRuntime

    pods = pods or PodSettings(upload_url=config.api_url)
    uploads = None
    if pods.uploader_image:
        uploads = UploadConfig(
            url=pods.upload_url, image=pods.uploader_image, ca_pem=pods.upload_ca, cache_url=pods.inputs_url
        )
    else:
        logging.getLogger("sxwl.agent").warning(
            "no --uploader-image: files that jobs write to $SXWL_OUTPUT_DIR do not reach the cloud"
        )
    # Job records under the state dir: on the chart's emptyDir they outlive a container restart.
    return KubernetesRuntime(
        api,
        namespace_prefix=TENANT_NAMESPACE_PREFIX,
        stop_grace_s=config.stop_grace_s,
        state_dir=config.state_dir,
        uploads=uploads,
        node_selector=dict(pods.node_selector),
        tolerations=list(pods.tolerations),
        memory_limit=pods.memory_limit,
        trainer_image=pods.trainer_image,
        dev_envs=DevEnvSettings(
            image=pods.dev_env_image,
            agent_namespace=namespace,
            agent_labels=AGENT_POD_LABELS,
            storage_class=pods.workspace_storage_class,
            size=pods.workspace_size,
        )
        if pods.dev_env_image
        else None,
    )
