"""The kubernetes runtime's pods against the real control plane (KWOK nodes fake the containers): the
uploader and its token Secret (owned by the Job, gone with it), the reasons an attempt ends with (an
upload refused, a rank that fails early, a pod deleted under the job; codes, here in English), and
tolerations."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from sxwl.agent.runtimes.kube_objects import COMPLETION_INDEX, JOB_ID, KubeJob
from sxwl.agent.runtimes.kube_uploads import UploadConfig, secret_name
from tests.k8s.test_jobs_runtime import (
    assignment,
    cluster_jobs,
    cluster_pods,
    drive,
    finished,
    in_cluster,
    make_runtime,
    products,
    said,
    unique,
)
from tests.support.agent import AgentProcess, eventually
from tests.support.k8s import EXIT_CODE, MESSAGE, OUTCOME, REASON, K8sCluster, wait_until

pytestmark = pytest.mark.k8s
__all__ = ["products"]  # the module's GPU nodes, from the runtime's tests

UPLOADS = UploadConfig(url="http://cloud.test:8000", image="registry.example/sxwl-agent:1")
TOKEN = "sxup_" + "k" * 43
TOLERATION = {"key": "sxwl.test/real", "operator": "Equal", "value": "true", "effect": "NoSchedule"}


def test_the_uploader_gets_the_token_secret_and_its_refusal_is_the_reason(
    k8s_cluster: K8sCluster, products: dict[str, str], tmp_path: Path
) -> None:
    async def body(api: Any) -> None:
        runtime = make_runtime(
            api, tmp_path, unique("sxwl-t") + "-", uploads=UPLOADS, tolerations=[TOLERATION]
        )
        a = assignment(products["small"], upload_token=TOKEN, env={"LR": "0.1"})
        job = runtime.start(a)
        await drive(runtime, lambda: job.secret_made, what="the Job and its Secret")
        (k8s_job,) = await cluster_jobs(api, job)
        secret = await client.CoreV1Api(api).read_namespaced_secret(secret_name(job), job.namespace)
        assert base64.b64decode(secret.data["token"]).decode() == TOKEN
        (owner,) = secret.metadata.owner_references
        assert (owner.kind, owner.name, owner.uid) == ("Job", k8s_job.metadata.name, k8s_job.metadata.uid)
        # The token is no longer in the agent's record on disk once the Secret holds it.
        record = (runtime.workdir(job.job_id, job.attempt) / "job.json").read_text()
        assert TOKEN not in record

        (pod,) = await wait_until(lambda: cluster_pods(api, job), what="the pod")
        main, uploader = pod.spec.containers
        assert (main.name, uploader.name) == ("main", "uploader")
        assert {m.name for m in main.volume_mounts} == {"dshm", "sxwl"}
        assert {m.name for m in uploader.volume_mounts} == {"sxwl", "sxwl-upload"}
        assert TOKEN not in json.dumps(api.sanitize_for_serialization(pod.spec))
        assert any(t.key == TOLERATION["key"] and t.effect == "NoSchedule" for t in pod.spec.tolerations)

        # The job fails and the uploader says a file was refused: the reason says both.
        refused = (
            "error: artifact model.bin refused: larger than 1073741824 bytes (1 file (9 bytes) uploaded)"
        )
        annotations = {OUTCOME: "fail", EXIT_CODE: "3", MESSAGE: refused}
        for key, value in annotations.items():
            k8s_cluster.kubectl("annotate", "-n", job.namespace, f"pod/{pod.metadata.name}", f"{key}={value}")
        await finished(runtime, job)
        assert (job.outcome, job.exit_code) == ("failed", 3)
        assert said(job) == "exit code 3; artifacts not uploaded: " + refused.removeprefix("error: ")

        # Reported: the Job goes, and the garbage collector takes its Secret with it.
        runtime.done(job)

        async def secret_gone() -> bool:
            await runtime.refresh()
            try:
                await client.CoreV1Api(api).read_namespaced_secret(secret_name(job), job.namespace)
            except ApiException as exc:
                return bool(exc.status == 404)
            return False

        await wait_until(secret_gone, seconds=60, what="the Secret deleted with its Job")

    in_cluster(k8s_cluster, body)


def test_a_rank_that_fails_early_fails_the_job_naming_it_and_the_others_are_stopped(
    k8s_cluster: K8sCluster, products: dict[str, str], tmp_path: Path
) -> None:
    async def body(api: Any) -> None:
        runtime = make_runtime(api, tmp_path, unique("sxwl-t") + "-", uploads=UPLOADS)
        job = runtime.start(assignment(products["big"], nodes=2, gpus_per_node=8, upload_token=TOKEN))

        async def running() -> list[Any]:
            await runtime.refresh()
            pods = await cluster_pods(api, job)
            return pods if len(pods) == 2 and all(p.status.phase == "Running" for p in pods) else []

        pods = await wait_until(running, what="two running ranks")
        assert len({p.spec.node_name for p in pods}) == 2  # one rank per node
        term = pods[0].spec.affinity.pod_anti_affinity.required_during_scheduling_ignored_during_execution[0]
        assert term.topology_key == "kubernetes.io/hostname"
        rank1 = next(p for p in pods if p.metadata.annotations[COMPLETION_INDEX] == "1")
        # (KWOK ends every container of the pod alike: the uploader's line says its uploads went well)
        ended = {OUTCOME: "fail", EXIT_CODE: "5", MESSAGE: "ok: 0 files (0 bytes) uploaded"}
        for key, value in ended.items():
            k8s_cluster.kubectl(
                "annotate", "-n", job.namespace, f"pod/{rank1.metadata.name}", f"{key}={value}"
            )
        await finished(runtime, job)
        assert (job.outcome, job.exit_code) == ("failed", 5)
        assert said(job) == "rank 1 failed: exit code 5; the other ranks were stopped"
        left = await cluster_pods(api, job)
        assert all(p.status.phase in ("Succeeded", "Failed") for p in left), "rank 0 left running"

    in_cluster(k8s_cluster, body)


def test_a_pod_deleted_under_the_job_ends_it_with_that_reason(
    k8s_cluster: K8sCluster, products: dict[str, str], tmp_path: Path
) -> None:
    async def body(api: Any) -> None:
        runtime = make_runtime(api, tmp_path, unique("sxwl-t") + "-")
        job = runtime.start(assignment(products["small"]))
        await drive(runtime, lambda: job.created)
        (pod,) = await wait_until(lambda: cluster_pods(api, job), what="the pod")
        k8s_cluster.kubectl("delete", "pod", "-n", job.namespace, pod.metadata.name, "--wait=false")
        await finished(runtime, job)
        assert job.outcome == "failed"
        assert (said(job), job.never_ran) == ("a pod of the job was deleted before it finished", False)

    in_cluster(k8s_cluster, body)


def test_a_failed_job_with_many_upload_errors_reaches_the_cloud_with_a_bounded_reason(
    k8s_cluster: K8sCluster, products: dict[str, str], tmp_path: Path
) -> None:
    """Through `sxwl serve` and `sxwl-agent --runtime kubernetes` as processes: the reason, exit code
    and upload error reach the job, cut to what a reason may hold."""
    from tests.test_jobs_process import World

    agent_ns = unique("sxwl-agent")
    k8s_cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": agent_ns}})
    world = World(tmp_path, f"sqlite:///{tmp_path / 'sxwl.db'}")
    try:
        world.agents.append(
            AgentProcess(
                world.url,
                tmp_path / "agent",
                world.key,
                *("--runtime", "kubernetes", "--kubeconfig", str(k8s_cluster.kubeconfig)),
                *("--namespace", agent_ns, "--heartbeat-interval", "0.3"),
                *("--uploader-image", "registry.example/sxwl-agent:1"),
            )
        )
        world.online()
        body = {
            "name": "t",
            "command": "python train.py",
            "image": "registry.example/train:1",
            "gpu_product": products["small"],
            "gpus_per_node": 1,
        }
        response = httpx.post(f"{world.url}/api/v1/jobs", headers=world.user, json=body)
        assert response.status_code == 201, response.text
        job_id = response.json()["id"]
        selector = f"{JOB_ID}={job_id}"

        def pod() -> str:
            return k8s_cluster.kubectl(
                "get",
                "pods",
                "-A",
                "-l",
                selector,
                "-o",
                "jsonpath={.items[0].metadata.namespace}/{.items[0].metadata.name}",
                check=False,
            )

        ns, _, name = eventually(pod, timeout=60, what="the job's pod").partition("/")
        errors = "; ".join(f"artifact part-{i}.bin refused: larger than 10 bytes" for i in range(20))
        for key, value in {OUTCOME: "fail", EXIT_CODE: "3", MESSAGE: f"error: {errors}"}.items():
            k8s_cluster.kubectl("annotate", "-n", ns, f"pod/{name}", f"{key}={value}")
        job = world.wait_state(job_id, "failed", timeout=60)
        assert job["exit_code"] == 3
        said = "exit code 3; artifacts not uploaded: artifact part-0.bin refused: larger than 10 bytes; "
        assert job["reason"].startswith(said)
        # Cut to what the reason's column holds (500 characters, its codes' JSON included: the
        # exit code's and the upload problem's nested in the one that joins them).
        assert 350 < len(job["reason"]) < 500 and job["reason"].endswith("…")
    finally:
        world.close()


def test_kubernetes_reasons_are_said_in_words(
    k8s_cluster: K8sCluster, products: dict[str, str], tmp_path: Path
) -> None:
    # exit code, Kubernetes' reason, the termination message, the reason said, whether it never ran
    cases = {
        "oom": ("137", "OOMKilled", "", "out of memory (OOMKilled, exit code 137)", False),
        # A program's own exit 127: its log's tail is not a shell's "not found" (tests/test_kube_status.py
        # has the shell's, whose evidence includes how long the container ran).
        "exit-127": ("127", "Error", "usage: train.py [-h]", "exit code 127", False),
        "no-shell": (
            "128",
            "StartError",
            'exec: "/bin/sh": no such file or directory',
            'the container could not start (StartError): exec: "/bin/sh": no such file or directory',
            True,
        ),
    }

    async def body(api: Any) -> None:
        # No uploader here: KWOK would end it with the main container's status.
        runtime = make_runtime(api, tmp_path, unique("sxwl-t") + "-")
        jobs = {key: runtime.start(assignment(products["small"])) for key in cases}
        await drive(runtime, lambda: all(j.created for j in jobs.values()), what="the Jobs")
        for key, job in jobs.items():

            async def pods_of(job: KubeJob = job) -> list[Any]:
                return await cluster_pods(api, job)

            (pod,) = await wait_until(pods_of, what="the pod")
            code, reason, message, _, _ = cases[key]
            for name, value in {OUTCOME: "fail", EXIT_CODE: code, REASON: reason, MESSAGE: message}.items():
                k8s_cluster.kubectl(
                    "annotate", "-n", job.namespace, f"pod/{pod.metadata.name}", f"{name}={value}"
                )
        await drive(runtime, lambda: all(j.outcome for j in jobs.values()), what="the Jobs to end")
        got = {key: (job.outcome, said(job), job.never_ran) for key, job in jobs.items()}
        assert got == {key: ("failed", words, never) for key, (_, _, _, words, never) in cases.items()}
        assert (jobs["oom"].exit_code, jobs["exit-127"].exit_code) == (137, 127)
        # A container that could not start is stopped by the agent (a real pod's uploader would wait
        # for it for ever), unless the Job controller saw the pod fail first: 128 then.
        assert jobs["no-shell"].exit_code in (None, 128)

    in_cluster(k8s_cluster, body)
