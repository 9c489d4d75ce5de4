"""The test control plane itself: API server, KWOK GPU nodes, Job outcomes, Indexed Jobs, Deployments,
and ServiceAccount tokens authorised by RBAC."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from tests.support.k8s import DURATION, EXIT_CODE, OUTCOME, K8sCluster, api_client, wait_until
from tests.support.threads import run_on_thread

pytestmark = pytest.mark.k8s

T = TypeVar("T")

# (label value of nvidia.com/gpu.product, nvidia.com/gpu.memory in MiB, GPUs per node)
GPU_TYPES = [
    ("NVIDIA-H100-80GB-HBM3", 81559, 8),
    ("NVIDIA-A100-SXM4-40GB", 40960, 8),
    ("NVIDIA-GeForce-RTX-4090", 24564, 4),
]


def run(body: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return run_on_thread(body())


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def gpu_nodes(k8s_cluster: K8sCluster) -> dict[str, list[str]]:
    """Two KWOK nodes of each GPU type, Ready."""
    nodes: dict[str, list[str]] = {}
    for product, memory, gpus in GPU_TYPES:
        prefix = unique("gpu-" + product.split("-")[-2].lower())
        nodes[product] = k8s_cluster.add_gpu_nodes(prefix, 2, product=product, memory_mib=memory, gpus=gpus)
    return nodes


def namespace(cluster: K8sCluster) -> str:
    name = unique("t")
    cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    return name


def job_manifest(
    name: str, annotations: dict[str, str], *, completions: int = 1, indexed: bool = False, gpus: int = 1
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "backoffLimit": 0,
        "completions": completions,
        "parallelism": completions,
        "template": {
            "metadata": {"annotations": annotations},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "train",
                        "image": "registry.example/train:1",
                        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                    }
                ],
            },
        },
    }
    if indexed:
        spec["completionMode"] = "Indexed"
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": spec}


def condition(obj: Any, kind: str) -> bool:
    return any(c.type == kind and c.status == "True" for c in (obj.status.conditions or []))


async def job_pods(core: Any, ns: str, job: str) -> list[Any]:
    pods = await core.list_namespaced_pod(ns, label_selector=f"batch.kubernetes.io/job-name={job}")
    return list(pods.items)


def test_api_server_answers(k8s_cluster: K8sCluster) -> None:
    async def body() -> None:
        async with api_client(k8s_cluster.kubeconfig) as api:
            version = await client.VersionApi(api).get_code()
            assert version.git_version.startswith("v1.")
            namespaces = await client.CoreV1Api(api).list_namespace()
            assert {"default", "kube-system"} <= {ns.metadata.name for ns in namespaces.items}

    run(body)
    assert "Kubernetes control plane" in k8s_cluster.kubectl("cluster-info")


def test_gpu_nodes_become_ready_with_gfd_labels(
    k8s_cluster: K8sCluster, gpu_nodes: dict[str, list[str]]
) -> None:
    async def body() -> None:
        async with api_client(k8s_cluster.kubeconfig) as api:
            core = client.CoreV1Api(api)
            for product, memory, gpus in GPU_TYPES:
                nodes = await core.list_node(label_selector=f"nvidia.com/gpu.product={product}")
                assert sorted(n.metadata.name for n in nodes.items) == sorted(gpu_nodes[product])
                for node in nodes.items:
                    labels = node.metadata.labels
                    assert labels["nvidia.com/gpu.memory"] == str(memory)
                    assert labels["nvidia.com/gpu.count"] == str(gpus)
                    assert labels["nvidia.com/cuda.driver.major"] == "550"
                    assert labels["nvidia.com/cuda.runtime.major"] == "12"
                    assert node.status.allocatable["nvidia.com/gpu"] == str(gpus)
                    assert node.status.capacity["nvidia.com/gpu"] == str(gpus)
                    assert condition(node, "Ready")
                    assert not node.spec.unschedulable

    run(body)


def _run_job(cluster: K8sCluster, annotations: dict[str, str], terminal: str) -> tuple[Any, list[Any]]:
    ns = namespace(cluster)
    name = unique("job")
    cluster.apply({**job_manifest(name, annotations), "metadata": {"name": name, "namespace": ns}})

    async def body() -> tuple[Any, list[Any]]:
        async with api_client(cluster.kubeconfig) as api:
            batch, core = client.BatchV1Api(api), client.CoreV1Api(api)

            async def finished() -> Any:
                job = await batch.read_namespaced_job(name, ns)
                return job if condition(job, "Complete") or condition(job, "Failed") else None

            job = await wait_until(finished, seconds=90, what=f"job {name} to finish")
            assert condition(job, terminal), job.status
            return job, await job_pods(core, ns, name)

    return run(body)


def test_job_pod_asked_to_succeed_completes(k8s_cluster: K8sCluster, gpu_nodes: dict[str, list[str]]) -> None:
    job, pods = _run_job(k8s_cluster, {OUTCOME: "succeed", DURATION: "1s"}, "Complete")
    assert job.status.succeeded == 1
    assert len(pods) == 1
    pod = pods[0]
    assert pod.status.phase == "Succeeded"
    assert pod.spec.node_name in {n for names in gpu_nodes.values() for n in names}
    assert pod.status.container_statuses[0].state.terminated.exit_code == 0


def test_job_pod_asked_to_fail_fails_with_exit_code(
    k8s_cluster: K8sCluster, gpu_nodes: dict[str, list[str]]
) -> None:
    job, pods = _run_job(k8s_cluster, {OUTCOME: "fail", DURATION: "1s", EXIT_CODE: "3"}, "Failed")
    assert job.status.failed == 1
    assert len(pods) == 1
    assert pods[0].status.phase == "Failed"
    terminated = pods[0].status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (3, "Error")


def test_pod_without_outcome_keeps_running(k8s_cluster: K8sCluster, gpu_nodes: dict[str, list[str]]) -> None:
    """The default: a pod on a KWOK node runs until it is deleted."""
    ns = namespace(k8s_cluster)
    name = unique("job")
    k8s_cluster.apply({**job_manifest(name, {}), "metadata": {"name": name, "namespace": ns}})

    async def body() -> None:
        async with api_client(k8s_cluster.kubeconfig) as api:
            core = client.CoreV1Api(api)

            async def running() -> list[Any]:
                return [p for p in await job_pods(core, ns, name) if p.status.phase == "Running"]

            await wait_until(running, seconds=60, what="a running pod")
            await asyncio.sleep(3)  # past the default outcome delay of 1s: still running
            assert [p.status.phase for p in await job_pods(core, ns, name)] == ["Running"]
            await client.BatchV1Api(api).delete_namespaced_job(name, ns, propagation_policy="Foreground")

    run(body)


def test_indexed_job_runs_four_pods_with_distinct_indexes(
    k8s_cluster: K8sCluster, gpu_nodes: dict[str, list[str]]
) -> None:
    # Four nodes of their own (other tests' pods keep running on the shared ones), 8 GPUs each.
    product = unique("NVIDIA-H20")
    nodes = k8s_cluster.add_gpu_nodes(unique("h20"), 4, product=product, memory_mib=97871, gpus=8)
    ns = namespace(k8s_cluster)
    name = unique("multi")
    manifest = job_manifest(name, {}, completions=4, indexed=True, gpus=8)
    manifest["spec"]["template"]["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": product}
    k8s_cluster.apply({**manifest, "metadata": {"name": name, "namespace": ns}})

    async def body() -> None:
        async with api_client(k8s_cluster.kubeconfig) as api:
            batch, core = client.BatchV1Api(api), client.CoreV1Api(api)

            async def four_running() -> list[Any]:
                pods = [p for p in await job_pods(core, ns, name) if p.status.phase == "Running"]
                return pods if len(pods) == 4 else []

            pods = await wait_until(four_running, seconds=90, what="4 running pods")
            indexes = {p.metadata.annotations["batch.kubernetes.io/job-completion-index"] for p in pods}
            assert indexes == {"0", "1", "2", "3"}
            # 8 GPUs each: one pod per node.
            assert sorted(p.spec.node_name for p in pods) == sorted(nodes)
            for pod in pods:  # torchrun's NODE_RANK comes from here
                env = {e.name: e for e in pod.spec.containers[0].env or []}
                field_path = env["JOB_COMPLETION_INDEX"].value_from.field_ref.field_path
                assert "['batch.kubernetes.io/job-completion-index']" in field_path

            # Cancelling: foreground deletion removes the pods before the Job.
            await batch.delete_namespaced_job(name, ns, propagation_policy="Foreground")

            async def gone() -> bool:
                try:
                    await batch.read_namespaced_job(name, ns)
                except ApiException as error:
                    return bool(error.status == 404)
                return False

            await wait_until(gone, seconds=60, what="the job to be deleted")
            assert await job_pods(core, ns, name) == []

    run(body)


def test_deployment_becomes_available(k8s_cluster: K8sCluster, gpu_nodes: dict[str, list[str]]) -> None:
    ns = namespace(k8s_cluster)
    labels = {"app": "web"}
    k8s_cluster.apply(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web", "namespace": ns},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "web", "image": "registry.example/web:1"}]},
                },
            },
        }
    )

    async def body() -> None:
        async with api_client(k8s_cluster.kubeconfig) as api:
            apps = client.AppsV1Api(api)

            async def available() -> bool:
                deployment = await apps.read_namespaced_deployment("web", ns)
                return bool(deployment.status.available_replicas == 2)

            await wait_until(available, seconds=90, what="2 available replicas")

    run(body)


def test_service_account_token_is_authorised_by_rbac(k8s_cluster: K8sCluster, tmp_path: Path) -> None:
    ns, other = namespace(k8s_cluster), namespace(k8s_cluster)
    k8s_cluster.apply(
        [
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "agent", "namespace": ns}},
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": "pod-reader", "namespace": ns},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "agent-reads-pods", "namespace": ns},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
                "subjects": [{"kind": "ServiceAccount", "name": "agent", "namespace": ns}],
            },
        ]
    )

    async def body() -> None:
        async with api_client(k8s_cluster.kubeconfig) as api:
            request = client.AuthenticationV1TokenRequest(
                spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600)
            )
            answer = await client.CoreV1Api(api).create_namespaced_service_account_token("agent", ns, request)
            token = answer.status.token
        assert token

        kubeconfig = k8s_cluster.write_token_kubeconfig(tmp_path / "agent.kubeconfig", token, ns)
        async with api_client(kubeconfig) as api:
            core = client.CoreV1Api(api)
            review = await client.AuthenticationV1Api(api).create_self_subject_review(
                client.V1SelfSubjectReview()
            )
            assert review.status.user_info.username == f"system:serviceaccount:{ns}:agent"
            assert (await core.list_namespaced_pod(ns)).items == []
            for forbidden in (
                core.list_namespaced_secret(ns),
                core.list_namespaced_pod(other),
                core.list_node(),
            ):
                with pytest.raises(ApiException) as error:
                    await forbidden
                assert error.value.status == 403

    run(body)


def test_helm_installs_a_chart(
    k8s_cluster: K8sCluster, tmp_path: Path, gpu_nodes: dict[str, list[str]]
) -> None:
    ns = namespace(k8s_cluster)
    k8s_cluster.helm("create", str(tmp_path / "demo"))  # helm's starter chart: Deployment, Service, SA
    k8s_cluster.helm("install", "demo", str(tmp_path / "demo"), "-n", ns, "--wait", "--timeout=90s")
    assert "deployed" in k8s_cluster.helm("status", "demo", "-n", ns)
    deployment = k8s_cluster.get("deployment", "demo", ns)
    assert deployment["status"]["availableReplicas"] == 1
