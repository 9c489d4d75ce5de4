"""A 4-node job end to end: submitted in the cloud (`sxwl serve`), run by `sxwl-agent --runtime
kubernetes` as an Indexed Job on four KWOK GPU nodes, finished there and reported back; then a
2-node job cancelled from the cloud and removed from the cluster."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sxwl.agent.runtimes.kube_objects import ATTEMPT, COMPLETION_INDEX, JOB_ID
from tests.support.agent import AgentProcess, eventually
from tests.support.k8s import OUTCOME, K8sCluster

pytestmark = pytest.mark.k8s

NODES, GPUS = 4, 8


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


@pytest.fixture
def gpu_nodes(k8s_cluster: K8sCluster) -> Iterator[tuple[str, list[str]]]:
    """Four 8-GPU KWOK nodes of a product no other test uses; deleted afterwards."""
    product = unique("NVIDIA-H20-E2E")
    names = k8s_cluster.add_gpu_nodes(unique("e2e-mn"), NODES, product=product, memory_mib=97871, gpus=GPUS)
    try:
        yield product, names
    finally:
        k8s_cluster.kubectl("delete", "node", *names, "--ignore-not-found", "--wait=false", check=False)


def items(cluster: K8sCluster, kind: str, namespace: str, selector: str) -> list[dict[str, Any]]:
    text = cluster.kubectl("get", kind, "-n", namespace, "-l", selector, "-o", "json")
    found: list[dict[str, Any]] = json.loads(text)["items"]
    return found


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for var in pod["spec"]["containers"][0].get("env", []):
        if "valueFrom" in var:
            out[var["name"]] = var["valueFrom"]["fieldRef"]["fieldPath"]
        else:
            out[var["name"]] = var.get("value", "")
    return out


def test_four_node_job_end_to_end_then_a_cancelled_two_node_job(
    k8s_cluster: K8sCluster, gpu_nodes: tuple[str, list[str]], tmp_path: Path
) -> None:
    from tests.test_jobs_process import World

    product, node_names = gpu_nodes
    agent_ns = unique("sxwl-agent")
    k8s_cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": agent_ns}})
    world = World(tmp_path, f"sqlite:///{tmp_path / 'sxwl.db'}")
    try:
        agent = AgentProcess(
            world.url,
            tmp_path / "agent",
            world.key,
            *("--runtime", "kubernetes", "--kubeconfig", str(k8s_cluster.kubeconfig)),
            *("--namespace", agent_ns, "--heartbeat-interval", "0.3", "--name", "k8s-mn"),
        )
        world.agents.append(agent)
        world.online()
        (cpod,) = httpx.get(f"{world.url}/api/v1/cpods", headers=world.provider).json()
        owner_id = httpx.get(f"{world.url}/api/v1/me", headers=world.user).json()["id"]
        tenant_ns = f"sxwl-tenant-{owner_id}"

        def submit(nodes: int) -> str:
            body = {
                "name": f"mn-{nodes}",
                "command": ["torchrun", "train.py"],
                "image": "registry.example/train:1",
                "env": {"FOO": "bar"},
                "gpu_product": product,
                "gpus_per_node": GPUS,
                "nodes": nodes,
            }
            response = httpx.post(f"{world.url}/api/v1/jobs", headers=world.user, json=body)
            assert response.status_code == 201, response.text
            job_id: str = response.json()["id"]
            return job_id

        # --- a 4-node job runs to success --------------------------------------------------------
        job_id = submit(NODES)
        job = world.wait_state(job_id, "running", timeout=90)
        assert job["cpod_id"] == cpod["id"]
        assert len(job["node_names"]) == NODES and len(set(job["node_names"])) == NODES
        assert set(job["node_names"]) <= set(node_names)

        selector = f"{JOB_ID}={job_id},{ATTEMPT}=1"
        (k8s_job,) = eventually(
            lambda: items(k8s_cluster, "jobs", tenant_ns, selector), timeout=30, what="the Indexed Job"
        )
        spec = k8s_job["spec"]
        assert spec["completionMode"] == "Indexed"
        assert (spec["completions"], spec["parallelism"]) == (NODES, NODES)
        (service,) = items(k8s_cluster, "services", tenant_ns, selector)
        assert service["spec"]["clusterIP"] == "None"

        def running_pods() -> list[dict[str, Any]]:
            pods = items(k8s_cluster, "pods", tenant_ns, selector)
            ok = len(pods) == NODES and all(p.get("status", {}).get("phase") == "Running" for p in pods)
            return pods if ok else []

        pods = eventually(running_pods, timeout=60, what="four running pods")
        assert len({p["spec"]["nodeName"] for p in pods}) == NODES
        assert {p["spec"]["nodeName"] for p in pods} <= set(node_names)
        ranks = sorted(int(p["metadata"]["annotations"][COMPLETION_INDEX]) for p in pods)
        assert ranks == list(range(NODES))
        for pod in pods:
            env = env_of(pod)
            assert (env["NNODES"], env["NPROC_PER_NODE"]) == (str(NODES), str(GPUS))
            assert env["NODE_RANK"] == f"metadata.annotations['{COMPLETION_INDEX}']"
            assert env["MASTER_ADDR"].startswith(f"{k8s_job['metadata']['name']}-0.")
            assert env["FOO"] == "bar"
            assert pod["spec"]["automountServiceAccountToken"] is False
            mounts = pod["spec"]["containers"][0].get("volumeMounts", [])
            assert not any(m["mountPath"].startswith("/var/run/secrets") for m in mounts)
            assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": str(GPUS)}

        for pod in pods:
            name = pod["metadata"]["name"]
            k8s_cluster.kubectl("annotate", "-n", tenant_ns, f"pod/{name}", f"{OUTCOME}=succeed")
        job = world.wait_state(job_id, "succeeded", "failed", "lost", timeout=90)
        assert job["state"] == "succeeded", job
        assert job["exit_code"] == 0
        timeline = world.events(job_id)
        for kind in ("assigned", "starting", "running", "succeeded"):
            assert kind in timeline, timeline
        assert [k for k in timeline if k in ("assigned", "starting", "running", "succeeded")] == [
            "assigned",
            "starting",
            "running",
            "succeeded",
        ]

        # --- a 2-node job is cancelled from the cloud --------------------------------------------
        cancel_id = submit(2)
        world.wait_state(cancel_id, "running", timeout=90)
        cancel_selector = f"{JOB_ID}={cancel_id}"
        eventually(
            lambda: items(k8s_cluster, "jobs", tenant_ns, cancel_selector), timeout=30, what="the 2-node Job"
        )
        response = httpx.post(f"{world.url}/api/v1/jobs/{cancel_id}/cancel", headers=world.user)
        assert response.status_code in (200, 202, 204), response.text
        job = world.wait_state(cancel_id, "cancelled", "succeeded", "failed", "lost", timeout=60)
        assert job["state"] == "cancelled", job
        eventually(
            lambda: not items(k8s_cluster, "jobs", tenant_ns, cancel_selector),
            timeout=30,
            what="the cancelled Job to be deleted",
        )
        assert agent.proc.poll() is None
    finally:
        world.close()
