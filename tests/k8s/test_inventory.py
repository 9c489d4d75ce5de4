"""The kubernetes runtime's inventory (src/sxwl/agent/inventory/kubernetes.py) against the real control
plane: three GPU node types, GPUs held by pods, cordoned and not-ready nodes — and all of it followed
through watch events after one list, not by listing again."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest
from kubernetes_asyncio import client

from sxwl.agent.inventory.kubernetes import KubernetesInventory, cluster_uid, parse_quantity
from sxwl.protocol import GpuInfo, Node
from tests.support.k8s import DURATION, OUTCOME, K8sCluster, api_client, gpu_node_manifest, wait_until
from tests.support.threads import run_on_thread

pytestmark = pytest.mark.k8s

T = TypeVar("T")


def run(body: Callable[[], Coroutine[Any, Any, T]]) -> T:
    return run_on_thread(body())


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def gpu(node: Node) -> GpuInfo:
    assert node.gpu is not None, node
    return node.gpu


def gpu_pod(name: str, node: str, gpus: int, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [
                {
                    "name": "train",
                    "image": "registry.example/train:1",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                }
            ],
        },
    }


def test_parse_quantity() -> None:
    assert parse_quantity("64") == 64
    assert parse_quantity("500m") * 1000 == 500
    assert parse_quantity("512Gi") == 512 * 1024**3
    assert parse_quantity("1k") == 1000
    assert parse_quantity(None) == 0
    assert parse_quantity("junk") == 0


def test_inventory_of_three_gpu_types_follows_watch_events(k8s_cluster: K8sCluster) -> None:
    tag = uuid.uuid4().hex[:6]
    h100 = k8s_cluster.add_gpu_nodes(
        f"inv-h100-{tag}", 2, product="NVIDIA-H100-80GB-HBM3", memory_mib=81559, gpus=8
    )
    a100 = k8s_cluster.add_gpu_nodes(
        f"inv-a100-{tag}",
        1,
        product="NVIDIA-A100-SXM4-40GB",
        memory_mib=40960,
        gpus=8,
        driver=(535, 104, 5),
        cuda_runtime=(12, 2),
    )
    rtx = k8s_cluster.add_gpu_nodes(
        f"inv-4090-{tag}",
        1,
        product="NVIDIA-GeForce-RTX-4090",
        memory_mib=24564,
        gpus=4,
        cpu="32",
        memory="128Gi",
    )
    mine = {*h100, *a100, *rtx}
    ns = unique("inv")
    k8s_cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})

    async def body() -> None:
        async with api_client(k8s_cluster.kubeconfig) as api:
            core = client.CoreV1Api(api)
            inventory = KubernetesInventory(api)
            await inventory.start()
            try:

                def by_name() -> dict[str, Node]:
                    return {n.name: n for n in inventory.nodes()}

                async def until(check: Callable[[dict[str, Node]], bool], what: str) -> dict[str, Node]:
                    async def probe() -> dict[str, Node] | None:
                        nodes = by_name()
                        return nodes if check(nodes) else None

                    result: dict[str, Node] = await wait_until(probe, seconds=60, what=what)
                    return result

                # The first list is complete: every node, with the GFD labels and allocatable resources.
                nodes = by_name()
                assert mine <= set(nodes)
                first = nodes[h100[0]]
                assert first.status == "ready"
                assert (first.cpu_cores, first.memory_mib) == (64, 512 * 1024)
                assert first.gpu is not None
                assert first.gpu.model_dump(exclude={"devices"}) == {
                    "vendor": "nvidia",
                    "product": "NVIDIA-H100-80GB-HBM3",
                    "memory_mib": 81559,
                    "count": 8,
                    "allocatable": 8,
                    "used": 0,
                    "driver": "550.54.15",
                    "cuda": "12.4",
                }
                a = nodes[a100[0]].gpu
                assert a is not None
                assert (a.product, a.memory_mib, a.count, a.driver, a.cuda) == (
                    "NVIDIA-A100-SXM4-40GB",
                    40960,
                    8,
                    "535.104.5",
                    "12.2",
                )
                r = nodes[rtx[0]]
                assert r.gpu is not None
                assert (r.gpu.product, r.gpu.memory_mib, r.gpu.count, r.cpu_cores, r.memory_mib) == (
                    "NVIDIA-GeForce-RTX-4090",
                    24564,
                    4,
                    32,
                    128 * 1024,
                )

                # A pod holding 2 GPUs counts as used on its node.
                await core.create_namespaced_pod(ns, gpu_pod("hold-2", h100[0], 2))
                nodes = await until(lambda n: gpu(n[h100[0]]).used == 2, "2 GPUs used on h100-0")
                assert gpu(nodes[h100[1]]).used == 0

                # A pod that succeeded holds none: used goes back to 0 once it ends.
                await core.create_namespaced_pod(
                    ns, gpu_pod("done-3", a100[0], 3, {OUTCOME: "succeed", DURATION: "2s"})
                )

                async def succeeded() -> bool:
                    pod = await core.read_namespaced_pod("done-3", ns)
                    return bool(pod.status.phase == "Succeeded")

                await wait_until(succeeded, seconds=60, what="the pod to succeed")
                await until(lambda n: gpu(n[a100[0]]).used == 0, "a100 free")

                # Cordoned: nothing is allocatable, the GPUs still count.
                await core.patch_node(h100[1], {"spec": {"unschedulable": True}})
                nodes = await until(lambda n: gpu(n[h100[1]]).allocatable == 0, "cordoned")
                assert gpu(nodes[h100[1]]).count == 8
                assert nodes[h100[1]].status == "ready"

                # A node added after the start appears from the watch: a node no kubelet (no KWOK)
                # looks after, whose Ready condition is False.
                lost = unique("inv-lost")
                manifest = gpu_node_manifest_not_ready(lost)
                await core.create_node(manifest)
                nodes = await until(lambda n: lost in n, "the new node")
                assert nodes[lost].status == "not_ready"
                assert nodes[lost].gpu is not None
                assert (gpu(nodes[lost]).count, gpu(nodes[lost]).allocatable) == (8, 0)

                # A KWOK node added after the start turns ready through MODIFIED events.
                (late,) = k8s_cluster.add_gpu_nodes(
                    f"inv-late-{tag}", 1, product="NVIDIA-H20", memory_mib=97871, gpus=8, wait=False
                )
                await until(lambda n: late in n and n[late].status == "ready", "the late node ready")

                # Deleted nodes and pods leave the cache.
                await core.delete_node(lost)
                await core.delete_namespaced_pod("hold-2", ns, grace_period_seconds=0)
                await until(
                    lambda n: lost not in n and gpu(n[h100[0]]).used == 0,
                    "the node and the pod gone",
                )

                # All of that came from watch events after one list of each kind.
                assert (inventory.node_cache.lists, inventory.pod_cache.lists) == (1, 1)
                assert inventory.node_cache.events > 0 and inventory.pod_cache.events > 0

                # The CPod's identity: the kube-system namespace's uid.
                kube_system = await core.read_namespace("kube-system")
                assert await cluster_uid(api) == kube_system.metadata.uid
            finally:
                await inventory.aclose()

    try:
        run(body)
    finally:  # the cluster is shared: later tests' pods must not land on these nodes
        k8s_cluster.kubectl(
            "delete", "node", "--ignore-not-found", "--wait=false", *mine, f"inv-late-{tag}-0"
        )


def gpu_node_manifest_not_ready(name: str) -> dict[str, Any]:
    """A GPU node no kubelet manages (no KWOK annotation), reported NotReady."""
    from tests.support.k8s import GpuNodeSpec

    manifest = gpu_node_manifest(name, GpuNodeSpec(product="NVIDIA-H100-80GB-HBM3", memory_mib=81559, gpus=8))
    manifest["metadata"]["annotations"] = {}
    manifest["status"]["conditions"] = [
        {"type": "Ready", "status": "False", "reason": "KubeletNotReady", "message": "no kubelet"}
    ]
    return manifest


class _ExpiredWatch:
    """The answer the API server gives a watch from a resourceVersion it no longer has. (The test
    control plane's watch cache replays even very old versions, and etcd's compaction does not show
    through it within a test's time, so this one answer is played back; the list and the watch after it
    are the real ones.)"""

    def __init__(self) -> None:
        status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "code": 410}
        status["message"] = "too old resource version: 2 (300)"
        self.lines = [json.dumps({"type": "ERROR", "object": status}).encode() + b"\n"]
        self.content = self

    async def readline(self) -> bytes:
        return self.lines.pop(0) if self.lines else b""

    def release(self) -> None:
        return None


def test_an_expired_watch_lists_again(k8s_cluster: K8sCluster) -> None:
    """A resourceVersion the API server no longer has (410 Gone) costs one new list, then watching
    goes on."""
    (node,) = k8s_cluster.add_gpu_nodes(
        unique("inv-gone"), 1, product="NVIDIA-L40S", memory_mib=46068, gpus=4
    )

    async def body() -> None:
        async with api_client(k8s_cluster.kubeconfig) as api:
            inventory = KubernetesInventory(api)
            await inventory.node_cache.list()
            await inventory.pod_cache.list()
            real = inventory.node_cache.list_call
            expired = [_ExpiredWatch()]

            async def list_call(**kwargs: Any) -> Any:
                if kwargs.get("watch") and expired:
                    return expired.pop()
                return await real(**kwargs)

            inventory.node_cache.list_call = list_call
            await inventory.start_watches()
            try:

                async def relisted() -> bool:
                    return inventory.node_cache.lists >= 2

                await wait_until(relisted, seconds=30, what="a second list after 410")
                await client.CoreV1Api(api).patch_node(
                    node, {"metadata": {"labels": {"sxwl.test/seen": "y"}}}
                )
                await client.CoreV1Api(api).patch_node(node, {"spec": {"unschedulable": True}})

                async def cordoned() -> bool:
                    n = {x.name: x for x in inventory.nodes()}[node]
                    return n.gpu is not None and n.gpu.allocatable == 0

                await wait_until(cordoned, seconds=30, what="the watch to follow after the re-list")
                assert inventory.node_cache.lists == 2
            finally:
                await inventory.aclose()

    try:
        run(body)
    finally:
        k8s_cluster.kubectl("delete", "node", "--wait=false", node)
