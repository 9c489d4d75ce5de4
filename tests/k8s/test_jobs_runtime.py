"""The agent's kubernetes runtime against the real control plane: jobs as Jobs and Indexed Jobs on KWOK
GPU nodes, tenant namespaces and their isolation, status, cancel, and a restarted agent."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import uuid
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes_asyncio import client, watch
from kubernetes_asyncio.client.exceptions import ApiException

from sxwl.agent.runtimes.base import Runtime
from sxwl.agent.runtimes.kube_logs import new_log_lines
from sxwl.agent.runtimes.kube_objects import (
    ATTEMPT,
    COMPLETION_INDEX,
    DEV_ENV,
    ENGINE,
    JOB_ID,
    TENANT,
    KubeJob,
)
from sxwl.agent.runtimes.kube_tenancy import NETWORK_POLICY, RESOURCE_QUOTA, Tenancy, isolation_spec
from sxwl.agent.runtimes.kubernetes import KubernetesRuntime
from sxwl.protocol import SHA256_HEADER, Assignment
from sxwl.protocol.reasons import Reason, english
from tests.support.agent import AgentProcess, eventually
from tests.support.k8s import DURATION, EXIT_CODE, OUTCOME, K8sCluster, api_client, wait_until
from tests.support.threads import run_on_thread

pytestmark = pytest.mark.k8s

# Kwok outcome for a test's pods, passed through the runtime's pod_annotations hook from these env keys.
ENV_TO_ANNOTATION = {"KWOK_OUTCOME": OUTCOME, "KWOK_EXIT_CODE": EXIT_CODE, "KWOK_DURATION": DURATION}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def kwok_annotations(assignment: Assignment) -> Mapping[str, str]:
    return {ENV_TO_ANNOTATION[k]: v for k, v in assignment.env.items() if k in ENV_TO_ANNOTATION}


@pytest.fixture(scope="module")
def products(k8s_cluster: K8sCluster) -> dict[str, str]:
    """GPU products of this module's own: two 8-GPU nodes for single-node jobs, four for the 4-node job."""
    small, big = unique("NVIDIA-H100-TEST"), unique("NVIDIA-H800-TEST")
    k8s_cluster.add_gpu_nodes(unique("jr-h100"), 2, product=small, memory_mib=81559, gpus=8)
    k8s_cluster.add_gpu_nodes(unique("jr-h800"), 4, product=big, memory_mib=81559, gpus=8)
    return {"small": small, "big": big}


def assignment(product: str | None, **overrides: Any) -> Assignment:
    fields: dict[str, Any] = {
        "job_id": uuid.uuid4().hex,
        "attempt": 1,
        "name": "train",
        "owner_id": uuid.uuid4().hex,
        "command": ["python", "train.py"],
        "image": "registry.example/train:1",
        "env": {"LR": "0.1"},
        "gpu_product": product,
        "gpus_per_node": 1,
        "nodes": 1,
        **overrides,
    }
    return Assignment(**fields)


def said(job: KubeJob) -> str | None:
    """The attempt's reason in English, as the API says it (the runtime keeps it as a code)."""
    return english(Reason.read(job.stop_reason))


def make_runtime(api: Any, state_dir: Path, prefix: str, **kwargs: Any) -> KubernetesRuntime:
    return KubernetesRuntime(
        api,
        namespace_prefix=prefix,
        stop_grace_s=1,
        state_dir=state_dir,
        pod_annotations=kwok_annotations,
        **kwargs,
    )


async def drive(
    runtime: KubernetesRuntime, check: Callable[[], Any], seconds: float = 60, what: str = ""
) -> Any:
    """Runs refresh + poll, as JobSync does, until ``check`` holds."""

    async def step() -> Any:
        await runtime.refresh()
        runtime.poll()
        return check()

    return await wait_until(step, seconds=seconds, interval=0.3, what=what)


async def finished(runtime: KubernetesRuntime, job: KubeJob, seconds: float = 60) -> KubeJob:
    await drive(runtime, lambda: job.outcome is not None, seconds, f"job {job.job_id} to end")
    return job


async def cluster_jobs(api: Any, job: KubeJob) -> list[Any]:
    found = await client.BatchV1Api(api).list_namespaced_job(
        job.namespace, label_selector=f"{JOB_ID}={job.job_id},{ATTEMPT}={job.attempt}"
    )
    return list(found.items)


async def cluster_pods(api: Any, job: KubeJob) -> list[Any]:
    found = await client.CoreV1Api(api).list_namespaced_pod(
        job.namespace, label_selector=f"{JOB_ID}={job.job_id},{ATTEMPT}={job.attempt}"
    )
    return list(found.items)


def in_cluster(cluster: K8sCluster, body: Callable[[Any], Awaitable[None]]) -> None:
    async def main() -> None:
        async with api_client(cluster.kubeconfig) as api:
            await body(api)

    run_on_thread(main())


def env_of(pod: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for var in pod.spec.containers[0].env:
        out[var.name] = var.value if var.value_from is None else var.value_from.field_ref.field_path
    return out


def test_a_tenant_namespace_made_before_engines_gets_its_policy_brought_up_to_date(
    k8s_cluster: K8sCluster,
) -> None:
    """Its old policy selected every pod, so a replica there would be reachable by the tenant's other
    pods: the agent's first use of the namespace narrows it."""
    prefix = unique("sxwl-old") + "-"

    async def body(api: Any) -> None:
        tenancy = Tenancy(api, prefix=prefix, quota=None)
        namespace = tenancy.namespace_for("u1")
        core, net = client.CoreV1Api(api), client.NetworkingV1Api(api)
        await core.create_namespace({"metadata": {"name": namespace}})
        old = {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{"from": [{"podSelector": {}}]}]}
        await net.create_namespaced_network_policy(
            namespace, {"metadata": {"name": NETWORK_POLICY}, "spec": old}
        )
        await tenancy.ensure("u1")
        policy = await net.read_namespaced_network_policy(NETWORK_POLICY, namespace)
        assert api.sanitize_for_serialization(policy.spec) == isolation_spec()
        await core.delete_namespace(namespace)

    in_cluster(k8s_cluster, body)


def test_runtime_satisfies_the_protocol(tmp_path: Path) -> None:
    runtime: Runtime[KubeJob] = KubernetesRuntime(object(), state_dir=tmp_path)  # type-checked by mypy
    assert runtime.jobs == {}


def test_single_node_job_succeeds_in_an_isolated_tenant_namespace(
    k8s_cluster: K8sCluster, products: dict[str, str], tmp_path: Path
) -> None:
    prefix = unique("sxwl-t") + "-"

    async def body(api: Any) -> None:
        runtime = make_runtime(api, tmp_path, prefix)
        runtime.adopt()
        a = assignment(products["small"], env={"LR": "0.1", "KWOK_OUTCOME": "succeed", "KWOK_DURATION": "2s"})
        job = runtime.start(a)
        assert runtime.used_gpu_count() == 1
        await drive(runtime, lambda: job.created, what="the Job to be created")
        assert job.namespace == f"{prefix}{a.owner_id}"
        core, net = client.CoreV1Api(api), client.NetworkingV1Api(api)
        ns = await core.read_namespace(job.namespace)
        assert ns.metadata.labels[TENANT] == a.owner_id
        assert ns.metadata.labels["pod-security.kubernetes.io/enforce"] == "baseline"
        policy = await net.read_namespaced_network_policy(NETWORK_POLICY, job.namespace)
        # Every pod of the namespace but endpoint replicas' and dev environments', each kind of which
        # has its own policy admitting only the agent (kube_engine.py, kube_devenv.py).
        assert policy.spec.pod_selector.match_labels is None
        selects = [(e.key, e.operator) for e in policy.spec.pod_selector.match_expressions]
        assert selects == [(ENGINE, "DoesNotExist"), (DEV_ENV, "DoesNotExist")]
        assert policy.spec.policy_types == ["Ingress"]
        assert [[peer.pod_selector.match_labels for peer in rule._from] for rule in policy.spec.ingress] == [
            [None]
        ]
        assert all(peer.namespace_selector is None for rule in policy.spec.ingress for peer in rule._from)
        quota = await core.read_namespaced_resource_quota(RESOURCE_QUOTA, job.namespace)
        assert quota.spec.hard["requests.nvidia.com/gpu"]

        (k8s_job,) = await cluster_jobs(api, job)
        assert (k8s_job.spec.completions, k8s_job.spec.parallelism, k8s_job.spec.backoff_limit) == (1, 1, 0)
        assert k8s_job.spec.completion_mode == "NonIndexed"
        assert k8s_job.metadata.annotations[JOB_ID] == a.job_id

        pods = await wait_until(lambda: cluster_pods(api, job), what="the pod")
        spec = pods[0].spec
        assert spec.automount_service_account_token is False
        assert not spec.host_network and not spec.host_pid and not spec.host_ipc
        assert all(v.host_path is None for v in spec.volumes)
        container = spec.containers[0]
        assert container.security_context.allow_privilege_escalation is False
        assert container.security_context.privileged is False
        assert not any(m.mount_path.startswith("/var/run/secrets") for m in container.volume_mounts)
        shm = next(v for v in spec.volumes if v.name == "dshm")
        assert shm.empty_dir.medium == "Memory"
        assert any(m.mount_path == "/dev/shm" and m.name == "dshm" for m in container.volume_mounts)
        assert container.resources.limits == {"nvidia.com/gpu": "1"}
        assert spec.node_selector == {"nvidia.com/gpu.product": products["small"]}
        assert container.image == a.image and container.command == ["python", "train.py"]
        env = env_of(pods[0])
        assert env["LR"] == "0.1" and env["SXWL_JOB_ID"] == a.job_id and env["SXWL_ATTEMPT"] == "1"
        assert (env["NNODES"], env["NODE_RANK"], env["NPROC_PER_NODE"]) == ("1", "0", "1")

        await finished(runtime, job)
        assert (job.outcome, job.exit_code, job.stop_reason) == ("succeeded", 0, None)
        assert job.command_started  # its main container ran: JobSync reported it running
        assert runtime.used_gpu_count() == 0
        runtime.done(job)
        workdir = runtime.workdir(job.job_id, job.attempt)
        await drive(runtime, lambda: not workdir.exists(), what="the reported attempt to be cleaned up")
        assert await cluster_jobs(api, job) == []

    in_cluster(k8s_cluster, body)


def test_single_node_job_fails_with_its_exit_code(
    k8s_cluster: K8sCluster, products: dict[str, str], tmp_path: Path
) -> None:
    async def body(api: Any) -> None:
        runtime = make_runtime(api, tmp_path, unique("sxwl-t") + "-")
        env = {"KWOK_OUTCOME": "fail", "KWOK_EXIT_CODE": "3"}
        job = await finished(runtime, runtime.start(assignment(products["small"], env=env)))
        assert (job.outcome, job.exit_code, said(job), job.never_ran) == ("failed", 3, "exit code 3", False)

    in_cluster(k8s_cluster, body)


def test_four_node_job_gets_each_rank_its_env_and_cancel_deletes_it(
    k8s_cluster: K8sCluster, products: dict[str, str], tmp_path: Path
) -> None:
    async def body(api: Any) -> None:
        runtime = make_runtime(api, tmp_path, unique("sxwl-t") + "-")
        a = assignment(products["big"], nodes=4, gpus_per_node=8, env={"EPOCHS": "3"})
        job = runtime.start(a)
        assert runtime.used_gpu_count() == 32
        await drive(runtime, lambda: job.created)
        (k8s_job,) = await cluster_jobs(api, job)
        assert k8s_job.spec.completion_mode == "Indexed"
        assert (k8s_job.spec.completions, k8s_job.spec.parallelism) == (4, 4)
        service = await client.CoreV1Api(api).read_namespaced_service(job.service, job.namespace)
        assert service.spec.cluster_ip == "None"
        assert service.spec.selector == {JOB_ID: a.job_id, ATTEMPT: "1"}

        async def running() -> list[Any]:
            pods = await cluster_pods(api, job)
            return pods if len(pods) == 4 and all(p.status.phase == "Running" for p in pods) else []

        pods = await wait_until(running, what="four running pods")
        assert len({p.spec.node_name for p in pods}) == 4
        ranks = sorted(int(p.metadata.annotations[COMPLETION_INDEX]) for p in pods)
        assert ranks == [0, 1, 2, 3]
        for pod in pods:
            env = env_of(pod)
            assert env["NODE_RANK"] == f"metadata.annotations['{COMPLETION_INDEX}']"
            assert env["MASTER_ADDR"] == f"{job.k8s_name}-0.{job.service}"
            assert env["MASTER_PORT"] == "29500"
            assert (env["NNODES"], env["NPROC_PER_NODE"]) == ("4", "8")
            assert env["EPOCHS"] == "3" and env["SXWL_JOB_ID"] == a.job_id
            assert pod.spec.subdomain == job.service
            assert pod.spec.hostname == f"{job.k8s_name}-{pod.metadata.annotations[COMPLETION_INDEX]}"
            assert pod.spec.containers[0].resources.limits == {"nvidia.com/gpu": "8"}
            assert pod.spec.automount_service_account_token is False

        runtime.stop(job.job_id, job.attempt, "cancelled", cancel=True)
        await finished(runtime, job)
        assert (job.outcome, job.stop_reason) == ("cancelled", "cancelled")
        assert not job.never_ran  # its containers ran: the time until the cancel is billed
        assert await cluster_jobs(api, job) == []
        assert await cluster_pods(api, job) == []
        with pytest.raises(ApiException) as missing:
            await client.CoreV1Api(api).read_namespaced_service(job.service, job.namespace)
        assert missing.value.status == 404

    in_cluster(k8s_cluster, body)


def test_restarted_agent_adopts_the_running_job_without_a_second_one(
    k8s_cluster: K8sCluster, products: dict[str, str], tmp_path: Path
) -> None:
    prefix = unique("sxwl-t") + "-"

    async def body(api: Any) -> None:
        first = make_runtime(api, tmp_path / "a", prefix)
        a = assignment(products["small"])
        job = first.start(a)
        await drive(first, lambda: job.created)
        await wait_until(lambda: cluster_pods(api, job), what="the pod")

        # Same state dir: the record is taken back, the cluster confirms it.
        second = make_runtime(api, tmp_path / "a", prefix)
        assert second.adopt() == []
        assert second.knows(a.job_id, a.attempt)
        assert second.start(a) is second.jobs[job.key]  # a re-delivered assignment starts nothing
        assert await second.refresh() == []
        assert second.jobs[job.key].created

        # State dir lost: the Job is found in the cluster; the re-delivered assignment is not created twice.
        third = make_runtime(api, tmp_path / "b", prefix)
        third.adopt()
        again = third.start(a)
        assert await third.refresh() == []
        assert third.jobs[job.key] is again and again.created
        assert len(await cluster_jobs(api, job)) == 1
        fourth = make_runtime(api, tmp_path / "c", prefix)
        fourth.adopt()
        await fourth.refresh()
        adopted = fourth.jobs[job.key]
        assert (adopted.namespace, adopted.k8s_name, adopted.gpus_per_node, adopted.nodes) == (
            job.namespace,
            job.k8s_name,
            1,
            1,
        )
        assert fourth.used_gpu_count() == 1

        # The pod ends while the old agent is gone: the new one reports it.
        (pod,) = await cluster_pods(api, job)
        k8s_cluster.kubectl("annotate", "-n", job.namespace, f"pod/{pod.metadata.name}", f"{OUTCOME}=succeed")
        await finished(second, second.jobs[job.key])
        assert second.jobs[job.key].outcome == "succeeded"
        assert len(await cluster_jobs(api, job)) == 1

        # A Job deleted while the agent was away: its attempt is reported lost.
        k8s_cluster.kubectl("delete", "job", "-n", job.namespace, job.k8s_name, "--wait=true")
        # (state dir b still holds the attempt as running: the third agent saw it so)
        fifth = make_runtime(api, tmp_path / "b", prefix)
        fifth.adopt()
        lost = await fifth.refresh()
        assert [j.key for j in lost] == [job.key]
        assert "gone" in (lost[0].lost_reason or "")

    in_cluster(k8s_cluster, body)


def test_job_without_image_is_refused_with_a_clear_reason(
    k8s_cluster: K8sCluster, products: dict[str, str], tmp_path: Path
) -> None:
    async def body(api: Any) -> None:
        runtime = make_runtime(api, tmp_path, unique("sxwl-t") + "-")
        a = assignment(products["small"], image=None)
        with pytest.raises(RuntimeError, match="no container image"):
            runtime.start(a)
        await runtime.refresh()
        assert runtime.jobs == {}
        with pytest.raises(ApiException) as missing:
            await client.CoreV1Api(api).read_namespace(runtime.namespace_for(a.owner_id))
        assert missing.value.status == 404

    in_cluster(k8s_cluster, body)


def test_job_for_a_gpu_product_no_node_has_fails_unschedulable_and_is_removed(
    k8s_cluster: K8sCluster, products: dict[str, str], tmp_path: Path
) -> None:
    async def body(api: Any) -> None:
        runtime = make_runtime(api, tmp_path, unique("sxwl-t") + "-", unschedulable_timeout_s=2)
        job = runtime.start(assignment("NVIDIA-NO-SUCH-GPU"))
        await finished(runtime, job)
        assert job.outcome == "failed"
        assert str(said(job)).startswith("unschedulable for more than 2 s: ")
        assert "node" in str(said(job))  # the scheduler's message
        assert job.never_ran  # no pod ever ran: it costs nothing
        assert await cluster_jobs(api, job) == []

    in_cluster(k8s_cluster, body)


def test_image_pull_error_fails_the_job_with_the_reason(
    k8s_cluster: K8sCluster, products: dict[str, str], tmp_path: Path
) -> None:
    async def body(api: Any) -> None:
        runtime = make_runtime(api, tmp_path, unique("sxwl-t") + "-")
        a = assignment(products["small"], env={"KWOK_OUTCOME": "image-pull-error"})
        job = await finished(runtime, runtime.start(a))
        assert job.outcome == "failed"
        assert str(said(job)).startswith("could not pull registry.example/train:1 (ImagePullBackOff)")
        assert job.never_ran and not job.command_started  # never reported running: never billed
        assert await cluster_jobs(api, job) == []

    in_cluster(k8s_cluster, body)


def test_max_runtime_is_the_jobs_active_deadline(
    k8s_cluster: K8sCluster, products: dict[str, str], tmp_path: Path
) -> None:
    async def body(api: Any) -> None:
        runtime = make_runtime(api, tmp_path, unique("sxwl-t") + "-")
        job = await finished(runtime, runtime.start(assignment(products["small"], max_runtime_s=2)))
        assert (job.outcome, said(job), job.never_ran) == ("failed", "max runtime of 2 s exceeded", False)

    in_cluster(k8s_cluster, body)


def test_log_lines_are_shipped_once_across_passes() -> None:
    text = "2025-01-01T00:00:01Z a\n2025-01-01T00:00:01.5Z b\n2025-01-01T00:00:01.5Z c\n"
    lines, mark, seen = new_log_lines(text, None, 0)
    assert lines == ["a", "b", "c"] and seen == 2
    later = text + "2025-01-01T00:00:01.5Z d\n2025-01-01T00:00:02Z e\n"
    lines, mark, seen = new_log_lines(later, mark, seen)
    assert (lines, seen) == (["d", "e"], 1)
    assert new_log_lines(later, mark, seen)[0] == []


def test_agent_kubernetes_runtime_end_to_end(
    k8s_cluster: K8sCluster, products: dict[str, str], tmp_path: Path
) -> None:
    """Submit in the cloud, Job in the cluster, pod on a KWOK GPU node, final state back in the cloud,
    through `sxwl serve` and `sxwl-agent --runtime kubernetes` as processes."""
    from tests.test_jobs_process import World

    agent_ns = unique("sxwl-agent")
    k8s_cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": agent_ns}})
    world = World(tmp_path, f"sqlite:///{tmp_path / 'sxwl.db'}")
    try:
        agent = AgentProcess(
            world.url,
            tmp_path / "agent",
            world.key,
            *("--runtime", "kubernetes", "--kubeconfig", str(k8s_cluster.kubeconfig)),
            *("--namespace", agent_ns, "--heartbeat-interval", "0.3", "--name", "k8s"),
            *("--uploader-image", "registry.example/sxwl-agent:1"),
            *("--pod-toleration", "sxwl.test/real=true:NoSchedule"),
        )
        world.agents.append(agent)
        world.online()
        body = {
            "name": "t",
            "command": ["python", "train.py"],
            "image": "registry.example/train:1",
            "gpu_product": products["small"],
            "gpus_per_node": 1,
        }
        response = httpx.post(f"{world.url}/api/v1/jobs", headers=world.user, json=body)
        assert response.status_code == 201, response.text
        job_id = response.json()["id"]
        world.wait_state(job_id, "running", timeout=60)

        def pod() -> str:
            return k8s_cluster.kubectl(
                "get",
                "pods",
                "-A",
                "-l",
                f"{JOB_ID}={job_id}",
                "-o",
                "jsonpath={.items[0].metadata.namespace}/{.items[0].metadata.name}",
                check=False,
            )

        ns, _, name = eventually(pod, timeout=30, what="the job's pod").partition("/")
        spec = json.loads(k8s_cluster.kubectl("get", "pod", "-n", ns, name, "-o", "json"))["spec"]
        assert [c["name"] for c in spec["containers"]] == ["main", "uploader"]
        assert {
            "key": "sxwl.test/real",
            "operator": "Equal",
            "value": "true",
            "effect": "NoSchedule",
        } in spec["tolerations"]
        # The pod's uploader would put its files with the token the agent got from the cloud.
        secret = eventually(
            lambda: k8s_cluster.kubectl(
                "get", "secret", "-n", ns, f"sxwl-{job_id}-1-upload", "-o", "json", check=False
            ),
            timeout=30,
            what="the upload token's Secret",
        )
        token = base64.b64decode(json.loads(secret)["data"]["token"]).decode()
        put = httpx.put(
            f"{world.url}/api/v1/agent/uploads/{job_id}/1/model.bin",
            headers={
                "Authorization": f"Bearer {token}",
                SHA256_HEADER: hashlib.sha256(b"weights").hexdigest(),
            },
            content=b"weights",
        )
        assert put.status_code == 201, put.text
        k8s_cluster.kubectl("annotate", "-n", ns, f"pod/{name}", f"{OUTCOME}=succeed")
        job = world.wait_state(job_id, "succeeded", timeout=60)
        assert job["exit_code"] == 0
        listed = httpx.get(f"{world.url}/api/v1/jobs/{job_id}/artifacts", headers=world.user).json()
        assert [a["path"] for a in listed] == ["model.bin"]
        assert token not in agent.log
        assert agent.proc.poll() is None
    finally:
        world.close()


def test_a_stop_deletes_the_pods_with_the_clouds_grace(
    k8s_cluster: K8sCluster, products: dict[str, str], tmp_path: Path
) -> None:
    async def body(api: Any) -> None:
        runtime = make_runtime(api, tmp_path, unique("sxwl-t") + "-")  # --stop-grace 1
        job = runtime.start(assignment(products["small"]))
        await drive(runtime, lambda: job.created, what="the Job to be created")
        pods = await wait_until(lambda: cluster_pods(api, job), what="the pod")
        graces: list[int] = []
        stream = watch.Watch().stream(
            client.CoreV1Api(api).list_namespaced_pod,
            job.namespace,
            field_selector=f"metadata.name={pods[0].metadata.name}",
            timeout_seconds=60,
        )

        async def follow() -> None:
            async for event in stream:
                if (grace := event["object"].metadata.deletion_grace_period_seconds) is not None:
                    graces.append(grace)
                if event["type"] == "DELETED":
                    return

        watching = asyncio.create_task(follow())
        await asyncio.sleep(0.5)  # the watch is open before the stop
        runtime.stop(job.job_id, job.attempt, "balance exhausted", cancel=True, grace_s=37)
        await finished(runtime, job)
        await asyncio.wait_for(watching, 30)
        assert graces and graces[0] == 37  # the cloud's grace, not the agent's --stop-grace of 1
        assert (job.outcome, job.stop_reason) == ("cancelled", "balance exhausted")

    in_cluster(k8s_cluster, body)
