"""The kubernetes runtime's inventory at scale, on the real test control plane (tests/support/k8s.py).

Creates N KWOK nodes x 8 GPUs and M pods of 1 GPU each (through the API, in bulk; the real scheduler
places them and KWOK runs them), then measures, in a fresh child process (so RSS is the inventory's):

- the time to the first complete inventory (``await KubernetesInventory.start()``: one paged list of
  Nodes and of live Pods) and the RSS it adds;
- the CPU time of one heartbeat's ``nodes()`` from the watch cache;
- against it, in the same run: a full list of Nodes and Pods per heartbeat (same raw-JSON parsing),
  and the same with the client's generated models (``list_node()`` / ``list_pod_for_all_namespaces()``
  deserialised, as naive client code does).

Appends a dated section to bench/RESULTS.md. Run:
``.venv/bin/python bench/k8s_inventory.py [--nodes 1000] [--pods 5000]`` (needs ``make k8s-bins``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from bench.common import RESULTS  # noqa: E402
from kubernetes_asyncio import client  # noqa: E402
from tests.support.k8s import GpuNodeSpec, K8sCluster, api_client, gpu_node_manifest  # noqa: E402

PRODUCT = "NVIDIA-H100-80GB-HBM3"


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def create_nodes(api: Any, count: int) -> None:
    core = client.CoreV1Api(api)
    spec = GpuNodeSpec(product=PRODUCT, memory_mib=81559, gpus=8)
    semaphore = asyncio.Semaphore(32)

    async def one(i: int) -> None:
        async with semaphore:
            await core.create_node(gpu_node_manifest(f"bench-{i:04d}", spec))

    await asyncio.gather(*(one(i) for i in range(count)))


async def create_pods(api: Any, namespace: str, count: int) -> None:
    core = client.CoreV1Api(api)
    semaphore = asyncio.Semaphore(32)

    async def one(i: int) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"p-{i:05d}", "labels": {"app": "bench"}},
            "spec": {
                "restartPolicy": "Never",
                "nodeSelector": {"nvidia.com/gpu.product": PRODUCT},
                "containers": [
                    {
                        "name": "c",
                        "image": "registry.example/train:1",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    }
                ],
            },
        }
        async with semaphore:
            await core.create_namespaced_pod(namespace, body)

    await asyncio.gather(*(one(i) for i in range(count)))


async def running_pods(api: Any, namespace: str) -> int:
    core = client.CoreV1Api(api)
    response = await core.list_namespaced_pod(
        namespace, field_selector="status.phase=Running", _preload_content=False
    )
    page = json.loads(await response.read())
    return len(page["items"])


async def measure(kubeconfig: str, heartbeats: int, model_heartbeats: int) -> dict[str, Any]:
    """In the child process: the inventory's numbers."""
    from sxwl.agent.inventory.kubernetes import LIVE_PODS, KubernetesInventory

    result: dict[str, Any] = {}
    async with api_client(Path(kubeconfig)) as api:
        baseline = rss_mib()
        started = time.perf_counter()
        cpu = time.process_time()
        inventory = KubernetesInventory(api)
        await inventory.start()
        nodes = inventory.nodes()
        result["first_inventory_s"] = time.perf_counter() - started
        result["first_inventory_cpu_s"] = time.process_time() - cpu
        result["nodes"] = len(nodes)
        result["gpus"] = sum(n.gpu.count for n in nodes if n.gpu)
        result["used"] = sum(n.gpu.used for n in nodes if n.gpu)
        result["rss_baseline_mib"] = baseline
        result["rss_after_start_mib"] = rss_mib()

        cpu = time.process_time()
        for _ in range(heartbeats):
            inventory.nodes()
        result["cache_cpu_ms"] = (time.process_time() - cpu) / heartbeats * 1000

        # A full list per heartbeat, same parsing (raw JSON into the same few fields).
        cpu, wall = time.process_time(), time.perf_counter()
        peak = rss_mib()
        for _ in range(heartbeats):
            fresh = KubernetesInventory(api)
            await fresh.node_cache.list()
            await fresh.pod_cache.list()
            fresh.nodes()
            peak = max(peak, rss_mib())
        result["list_cpu_ms"] = (time.process_time() - cpu) / heartbeats * 1000
        result["list_wall_ms"] = (time.perf_counter() - wall) / heartbeats * 1000
        result["rss_after_lists_mib"] = peak

        # The same with the client's models, as code that calls list_node() plainly does.
        core = client.CoreV1Api(api)
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(model_heartbeats):
            await core.list_node()
            await core.list_pod_for_all_namespaces(field_selector=LIVE_PODS)
            peak = max(peak, rss_mib())
        result["model_cpu_ms"] = (time.process_time() - cpu) / model_heartbeats * 1000
        result["model_wall_ms"] = (time.perf_counter() - wall) / model_heartbeats * 1000
        result["rss_after_models_mib"] = peak
        result["lists"] = [inventory.node_cache.lists, inventory.pod_cache.lists]
        await inventory.aclose()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=5000)
    parser.add_argument("--heartbeats", type=int, default=20)
    parser.add_argument("--model-heartbeats", type=int, default=3)
    parser.add_argument("--no-results", action="store_true", help="do not append to bench/RESULTS.md")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(measure(args.child, args.heartbeats, args.model_heartbeats))))
        return

    cluster = K8sCluster().start()
    try:
        setup: dict[str, float] = {}

        async def build() -> None:
            async with api_client(cluster.kubeconfig) as api:
                t = time.perf_counter()
                await create_nodes(api, args.nodes)
                setup["nodes_s"] = time.perf_counter() - t
                print(f"{args.nodes} nodes created in {setup['nodes_s']:.1f} s", flush=True)
                deadline = time.monotonic() + 600
                while True:
                    nodes = await client.CoreV1Api(api).list_node()
                    ready = sum(
                        any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])
                        for n in nodes.items
                    )
                    if ready >= args.nodes or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(2)
                setup["nodes_ready_s"] = time.perf_counter() - t
                print(f"{ready} nodes ready after {setup['nodes_ready_s']:.1f} s", flush=True)
                await client.CoreV1Api(api).create_namespace({"metadata": {"name": "bench"}})
                t = time.perf_counter()
                await create_pods(api, "bench", args.pods)
                setup["pods_s"] = time.perf_counter() - t
                deadline = time.monotonic() + 900
                print(f"{args.pods} pods created in {setup['pods_s']:.1f} s", flush=True)
                while True:
                    running = await running_pods(api, "bench")
                    if running >= args.pods or time.monotonic() > deadline:
                        break
                    await asyncio.sleep(3)
                setup["pods_running_s"] = time.perf_counter() - t
                setup["running"] = running
                print(f"{running} pods running after {setup['pods_running_s']:.1f} s", flush=True)

        asyncio.run(build())
        child = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                str(cluster.kubeconfig),
                "--heartbeats",
                str(args.heartbeats),
                "--model-heartbeats",
                str(args.model_heartbeats),
            ],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"},
        )
        result = json.loads(child.stdout.strip().splitlines()[-1])
    finally:
        cluster.stop()

    report(args, setup, result)


def report(args: argparse.Namespace, setup: dict[str, float], r: dict[str, Any]) -> None:
    inventory_rss = r["rss_after_start_mib"] - r["rss_baseline_mib"]
    lines = [
        "",
        f"## Kubernetes inventory: {args.nodes:,} KWOK nodes x 8 GPUs, {args.pods:,} pods "
        f"({datetime.date.today().isoformat()})",
        "",
        f"`bench/k8s_inventory.py --nodes {args.nodes} --pods {args.pods}` on {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, the test control plane of tests/support/k8s.py "
        "(real API server, "
        "scheduler and KWOK). Setup: nodes created in "
        f"{setup['nodes_s']:.1f} s and Ready after {setup['nodes_ready_s']:.1f} s; pods created in "
        f"{setup['pods_s']:.1f} s, {int(setup['running']):,} Running after {setup['pods_running_s']:.1f} s.",
        "",
        f"The inventory saw {r['nodes']:,} nodes, {r['gpus']:,} GPUs, {r['used']:,} in use; "
        f"lists made by the watch cache during the run (nodes, pods): {r['lists']}.",
        "",
        "| | value |",
        "|---|--:|",
        f"| time to the first complete inventory (`start()`: paged lists of nodes and live pods) | "
        f"{r['first_inventory_s']:.2f} s ({r['first_inventory_cpu_s']:.2f} s CPU) |",
        f"| agent RSS: before / after the first inventory (the cache's share) | "
        f"{r['rss_baseline_mib']:.0f} / {r['rss_after_start_mib']:.0f} MiB (+{inventory_rss:.0f} MiB) |",
        f"| CPU per heartbeat, watch cache (`nodes()`) | {r['cache_cpu_ms']:.2f} ms |",
        f"| CPU per heartbeat, full list of nodes and pods (same raw-JSON parsing) | "
        f"{r['list_cpu_ms']:.0f} ms (wall {r['list_wall_ms']:.0f} ms) |",
        f"| CPU per heartbeat, full list with the client's models | "
        f"{r['model_cpu_ms']:.0f} ms (wall {r['model_wall_ms']:.0f} ms) |",
        f"| agent RSS peak after the full lists / after the model lists | "
        f"{r['rss_after_lists_mib']:.0f} / {r['rss_after_models_mib']:.0f} MiB |",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if not args.no_results:
        with RESULTS.open("a") as handle:
            handle.write(text)


if __name__ == "__main__":
    main()
