"""The ``kubernetes`` runtime made from the agent's flags (PodSettings): where pods upload, the
images that run fine-tunes, endpoint replicas and dev environments, the storage of dev
environments' workspaces, and who the replicas' and environments' NetworkPolicies admit."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sxwl.agent.loop import AgentConfig
from sxwl.agent.pod_settings import PodSettings

if TYPE_CHECKING:  # the Kubernetes client is imported only by agents that use it: it is slow to load
    from kubernetes_asyncio.client import ApiClient

    from sxwl.agent.runtimes.kubernetes import KubernetesRuntime

TENANT_NAMESPACE_PREFIX = "sxwl-tenant-"
DEV_ENV_HELP = {
    "image": "kubernetes runtime: the image that runs dev environments (python3 with JupyterLab; the "
    "trainer image has it); needs --uploader-image. Without it this CPod runs no dev environments.",
    "class": "kubernetes runtime: the storage class of dev environments' workspaces (default: the "
    "cluster's default class).",
    "size": "kubernetes runtime: the size of each dev environment's workspace.",
}


def job_runtime(
    api: ApiClient, config: AgentConfig, pods: PodSettings | None = None, namespace: str = "default"
) -> KubernetesRuntime:
    """``namespace``: the agent's own, where the pods the replicas' and environments' policies admit run."""
    from sxwl.agent.runtimes.kube_devenv import DevEnvSettings
    from sxwl.agent.runtimes.kube_engine import EngineSettings
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
    engine = None
    if pods.engine_image:
        engine = EngineSettings(pods.engine_image, namespace, pods.agent_labels)
    dev_envs = None
    if pods.dev_env_image:
        dev_envs = DevEnvSettings(
            image=pods.dev_env_image,
            agent_namespace=namespace,
            agent_labels=dict(pods.agent_labels),
            storage_class=pods.workspace_storage_class,
            size=pods.workspace_size,
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
        engine=engine,
        dev_envs=dev_envs,
    )
