"""The Helm chart deploy/helm/sxwl-agent on the real control plane, and the agent (`--runtime
kubernetes`) run as a process outside the cluster — KWOK runs no containers — with the chart's
ServiceAccount token against a real `sxwl serve`: its RBAC is enough for registering, heartbeats, the
token Secret and leader election, and no more."""

from __future__ import annotations

import base64
import json
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_asyncio import client

from tests.support.agent import AgentProcess, eventually
from tests.support.cloud import CloudProcess, Provider
from tests.support.k8s import REPO, K8sCluster, api_client
from tests.support.net import free_port
from tests.support.threads import run_on_thread

pytestmark = pytest.mark.k8s

CHART = REPO / "deploy" / "helm" / "sxwl-agent"
RELEASE = "sxwl-agent"  # the release name holds the chart's name: objects are called sxwl-agent
INTERVAL = "0.3"


@pytest.fixture
def cloud(tmp_path: Path) -> Iterator[CloudProcess]:
    process = CloudProcess(
        tmp_path / "cloud",
        free_port(),
        env={
            "SXWL_DATABASE_URL": f"sqlite:///{tmp_path / 'sxwl.db'}",
            "SXWL_HEARTBEAT_INTERVAL_MIN_S": "0.1",
            "SXWL_LIVENESS_CHECK_S": "0.1",
            "SXWL_OFFLINE_GRACE_S": "1.5",
        },
    )
    yield process
    process.stop()


def install(cluster: K8sCluster, cloud_url: str, access_key: str, *values: str) -> str:
    """A namespace of its own, 3kctl's Secret `sxwl-agent` in it, and the chart installed there."""
    ns = f"sxwl-system-{uuid.uuid4().hex[:6]}"
    cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "sxwl-agent", "namespace": ns},
            "stringData": {"SXWL_API_URL": cloud_url, "SXWL_ACCESS_KEY": access_key},
        }
    )
    cluster.helm(
        "install",
        RELEASE,
        str(CHART),
        "-n",
        ns,
        f"--set=cloud.url={cloud_url}",
        "--set=existingSecret=sxwl-agent",
        *values,
    )
    return ns


def service_account_kubeconfig(cluster: K8sCluster, ns: str, path: Path) -> Path:
    async def token() -> str:
        async with api_client(cluster.kubeconfig) as api:
            request = client.AuthenticationV1TokenRequest(
                spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
            )
            answer = await client.CoreV1Api(api).create_namespaced_service_account_token(RELEASE, ns, request)
            return str(answer.status.token)

    return cluster.write_token_kubeconfig(path, run_on_thread(token()), ns)


def agent(
    cloud: CloudProcess, tmp_path: Path, key: str | None, kubeconfig: Path, ns: str, *args: str
) -> AgentProcess:
    return AgentProcess(
        cloud.url,
        tmp_path / "unused-state",
        key,
        "--runtime",
        "kubernetes",
        "--kubeconfig",
        str(kubeconfig),
        "--namespace",
        ns,
        "--heartbeat-interval",
        INTERVAL,
        *args,
    )


def can_i(cluster: K8sCluster, ns: str, *args: str) -> bool:
    answer = cluster.kubectl(
        "auth", "can-i", *args, f"--as=system:serviceaccount:{ns}:{RELEASE}", "-n", ns, check=False
    )
    return answer.strip() == "yes"


def secret_fields(cluster: K8sCluster, ns: str, name: str) -> dict[str, str]:
    secret = cluster.get("secret", name, ns)
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


def test_chart_lints_and_renders(k8s_cluster: K8sCluster) -> None:
    lint = k8s_cluster.helm("lint", "--strict", str(CHART), "--set=cloud.url=https://x", "--set=accessKey=k")
    assert "0 chart(s) failed" in lint
    rendered = list(
        yaml.safe_load_all(
            k8s_cluster.helm(
                "template",
                "x",
                str(CHART),
                "--set=existingSecret=sxwl-agent",
                "--set=replicas=2",
                "-n",
                "sxwl-system",
            )
        )
    )
    kinds = {doc["kind"] for doc in rendered if doc}
    assert kinds == {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Deployment",
    }
    (deployment,) = [d for d in rendered if d and d["kind"] == "Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert "--leader-elect" in container["args"] and "--runtime=kubernetes" in container["args"]
    # Pods' uploaders run the agent's own image unless the values name another.
    assert f"--uploader-image={container['image']}" in container["args"]
    placed = k8s_cluster.helm(
        "template",
        "x",
        str(CHART),
        "--set=existingSecret=s",
        '--set-json=jobs.podNodeSelector={"sxwl.test/node": "real"}',
        '--set-json=jobs.podTolerations=["sxwl.test/real=true:NoSchedule"]',
        "--set=jobs.uploadUrl=https://in.cluster",
    )
    for arg in (
        "--pod-node-selector=sxwl.test/node=real",
        "--pod-toleration=sxwl.test/real=true:NoSchedule",
        "--upload-url=https://in.cluster",
    ):
        assert f"- {arg}" in placed
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 10001
    env = {e["name"]: e for e in container["env"]}
    assert env["SXWL_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "sxwl-agent"
    # Without existingSecret the chart makes the Secret from accessKey.
    own = k8s_cluster.helm("template", "x", str(CHART), "--set=cloud.url=https://c", "--set=accessKey=sxak_1")
    assert "kind: Secret" in own and base64.b64encode(b"sxak_1").decode() in own
    failed = k8s_cluster.helm("template", "x", str(CHART), check=False)
    assert failed == ""  # neither a Secret nor a key: helm refuses to render


def test_a_chart_with_a_trainer_image_serves_its_input_cache_to_its_pods(k8s_cluster: K8sCluster) -> None:
    def rendered(*values: str) -> dict[str, dict[str, Any]]:
        text = k8s_cluster.helm(
            "template", "x", str(CHART), "--set=existingSecret=s", "-n", "sxwl-system", *values
        )
        return {doc["kind"]: doc for doc in yaml.safe_load_all(text) if doc}

    docs = rendered("--set=jobs.trainerImage=ghcr.io/sxwl-ai/sxwl-trainer:0.1.0")
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    for arg in (
        "--serve-inputs=0.0.0.0:8471",
        "--inputs-url=http://x-sxwl-agent-inputs.sxwl-system.svc:8471",
        "--input-cache-dir=/var/cache/sxwl-inputs",
        "--input-cache-gib=100",
    ):
        assert arg in container["args"]
    assert container["ports"] == [{"name": "inputs", "containerPort": 8471}]
    assert {"name": "input-cache", "mountPath": "/var/cache/sxwl-inputs"} in container["volumeMounts"]
    assert {"name": "input-cache", "emptyDir": {"sizeLimit": "102Gi"}} in pod["volumes"]
    service = docs["Service"]
    assert service["metadata"]["name"] == "x-sxwl-agent-inputs"
    assert service["spec"]["ports"] == [{"name": "inputs", "port": 8471, "targetPort": "inputs"}]
    assert service["spec"]["selector"] == docs["Deployment"]["spec"]["selector"]["matchLabels"]

    kept = rendered(
        "--set=jobs.trainerImage=t", "--set=inputCache.existingClaim=cache", "--set=inputCache.maxGiB=500"
    )
    pod = kept["Deployment"]["spec"]["template"]["spec"]
    assert {"name": "input-cache", "persistentVolumeClaim": {"claimName": "cache"}} in pod["volumes"]
    assert pod["securityContext"]["fsGroup"] == 10001  # the claim's files are the agent's group's
    assert "--input-cache-gib=500" in pod["containers"][0]["args"]
    # Endpoint replicas or dev environments without fine-tunes: their pods fetch inputs too.
    for value in ("--set=jobs.engineImage=e", "--set=devEnvs.enabled=true"):
        args = rendered(value)["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"]
        assert [a for a in args if a.startswith("--serve-inputs=")], value
    # No image for work with inputs, or the cache turned off: each pod fetches from the cloud.
    for values in ((), ("--set=jobs.trainerImage=t", "--set=inputCache.enabled=false")):
        plain = rendered(*values)
        assert "Service" not in plain
        args = plain["Deployment"]["spec"]["template"]["spec"]["containers"][0]["args"]
        assert not [a for a in args if a.startswith(("--serve-inputs", "--inputs-url", "--input-cache"))]


def test_a_chart_with_dev_environments_gives_the_agent_their_image_and_storage(
    k8s_cluster: K8sCluster,
) -> None:
    def args(*values: str) -> list[str]:
        text = k8s_cluster.helm(
            "template", "x", str(CHART), "--set=existingSecret=s", "-n", "sxwl-system", *values
        )
        (deployment,) = [d for d in yaml.safe_load_all(text) if d and d["kind"] == "Deployment"]
        found: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
        return found

    chosen = args(
        "--set=devEnvs.enabled=true",
        "--set=devEnvs.image=lab:1",
        "--set=devEnvs.storageClass=rook-ceph-block",
        "--set=devEnvs.workspaceSize=50Gi",
    )
    assert {
        "--dev-env-image=lab:1",
        "--workspace-storage-class=rook-ceph-block",
        "--workspace-size=50Gi",
    } <= set(chosen)
    assert [
        a for a in chosen if a.startswith("--agent-pod-label=")
    ]  # the environments' policy admits the agent
    trainer = args("--set=devEnvs.enabled=true", "--set=jobs.trainerImage=t:1")
    assert "--dev-env-image=t:1" in trainer  # the trainer image has JupyterLab
    assert not [a for a in trainer if a.startswith("--workspace-storage-class")]  # the default class
    assert not [a for a in args("--set=jobs.trainerImage=t:1") if a.startswith(("--dev-env", "--workspace"))]


def test_a_chart_with_an_engine_image_lets_only_its_own_pods_reach_the_engines(
    k8s_cluster: K8sCluster,
) -> None:
    """The agent's flags name the image and its own pods' labels: each replica's NetworkPolicy
    admits those (kube_engine.py), which must be the Deployment's own selector."""
    text = k8s_cluster.helm(
        "template",
        "x",
        str(CHART),
        "--set=existingSecret=s",
        "--set=jobs.engineImage=e:1",
        "-n",
        "sxwl-system",
    )
    (deployment,) = [d for d in yaml.safe_load_all(text) if d and d["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--engine-image=e:1" in args
    labels = dict(
        a.removeprefix("--agent-pod-label=").split("=", 1) for a in args if a.startswith("--agent-pod-")
    )
    assert labels == deployment["spec"]["selector"]["matchLabels"]
    assert labels.items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    plain = k8s_cluster.helm("template", "x", str(CHART), "--set=existingSecret=s")
    assert "--engine-image" not in plain and "--agent-pod-label" not in plain


def test_chart_installs_and_the_agent_registers_with_its_service_account(
    k8s_cluster: K8sCluster, cloud: CloudProcess, tmp_path: Path
) -> None:
    provider = Provider(cloud, email="k8s@example.com")
    tag = uuid.uuid4().hex[:6]
    product = f"NVIDIA-H100-80GB-HBM3-{tag}"
    gpu_nodes = k8s_cluster.add_gpu_nodes(f"chart-{tag}", 2, product=product, memory_mib=81559, gpus=8)
    ns = install(k8s_cluster, cloud.url, provider.key, "--set=cpod.name=k8s-lab")
    assert "deployed" in k8s_cluster.helm("status", RELEASE, "-n", ns)
    kubeconfig = service_account_kubeconfig(k8s_cluster, ns, tmp_path / "agent.kubeconfig")
    kube_system_uid = k8s_cluster.get("namespace", "kube-system")["metadata"]["uid"]

    process = agent(cloud, tmp_path, provider.key, kubeconfig, ns, "--name", "k8s-lab")
    try:

        def online() -> dict[str, Any] | None:
            cpods = provider.cpods()
            if len(cpods) == 1 and cpods[0]["status"] == "online":
                names = {n["name"] for n in cpods[0]["nodes"]}
                return cpods[0] if set(gpu_nodes) <= names else None
            return None

        cpod = eventually(online, timeout=60, what=f"the CPod online with its GPU nodes; log:\n{process.log}")
        assert cpod["name"] == "k8s-lab" and cpod["runtime"] == "kubernetes"
        nodes = {n["name"]: n for n in cpod["nodes"]}
        for name in gpu_nodes:
            gpu = nodes[name]["gpu"]
            assert (gpu["vendor"], gpu["product"], gpu["count"], gpu["memory_mib"]) == (
                "nvidia",
                product,
                8,
                81559,
            )
            assert nodes[name]["status"] == "ready"

        # The CPod token is in the Secret, for this cloud and this cluster (kube-system's uid).
        saved = secret_fields(k8s_cluster, ns, "sxwl-agent-token")
        assert saved["cpod_id"] == cpod["id"]
        assert saved["cluster_uid"] == kube_system_uid
        assert saved["api_url"] == cloud.url
        assert provider.key not in json.dumps(saved)
        assert "(403)" not in process.log and " 403 " not in process.log and "Forbidden" not in process.log
    finally:
        process.signal(signal.SIGTERM)
        assert process.wait(20) == 0, process.log

    # Restarted without the accessKey: the token from the Secret is enough, and it is the same CPod.
    again = agent(cloud, tmp_path, None, kubeconfig, ns)
    try:
        eventually(
            lambda: "using the saved token" in again.log, timeout=30, what=f"the saved token:\n{again.log}"
        )
        assert [c["id"] for c in provider.cpods()] == [cpod["id"]]
    finally:
        again.signal(signal.SIGTERM)
        assert again.wait(20) == 0, again.log
        # The cluster is shared: later tests' pods must not land on these nodes.
        k8s_cluster.kubectl("delete", "node", "--wait=false", *gpu_nodes)


def test_leader_election_lets_one_replica_work(
    k8s_cluster: K8sCluster, cloud: CloudProcess, tmp_path: Path
) -> None:
    provider = Provider(cloud, email="lead@example.com")
    ns = install(k8s_cluster, cloud.url, provider.key, "--set=replicas=2")
    kubeconfig = service_account_kubeconfig(k8s_cluster, ns, tmp_path / "agent.kubeconfig")
    first = agent(cloud, tmp_path, provider.key, kubeconfig, ns, "--leader-elect")
    second: AgentProcess | None = None
    try:
        eventually(
            lambda: "registered as CPod" in first.log, timeout=60, what=f"the first to lead:\n{first.log}"
        )
        second = agent(cloud, tmp_path, provider.key, kubeconfig, ns, "--leader-elect")
        eventually(lambda: "standing by" in second.log, timeout=30, what=f"the second to wait:\n{second.log}")
        holder = k8s_cluster.get("lease", "sxwl-agent-leader", ns)["spec"]["holderIdentity"]
        assert "using the saved token" not in second.log and "registered" not in second.log
        # The leader stops and releases the Lease: the other one takes over, as the same CPod.
        first.signal(signal.SIGTERM)
        assert first.wait(20) == 0, first.log
        eventually(lambda: "using the saved token" in second.log, timeout=30, what=f"takeover:\n{second.log}")
        new_holder = k8s_cluster.get("lease", "sxwl-agent-leader", ns)["spec"]["holderIdentity"]
        assert new_holder != holder
        assert len(provider.cpods()) == 1
        eventually(
            lambda: provider.cpods()[0]["status"] == "online", timeout=30, what="online under the new leader"
        )
    finally:
        for process in (first, second):
            if process is not None:
                process.stop()


def test_chart_rbac_is_no_more_than_the_agent_uses(k8s_cluster: K8sCluster) -> None:
    ns = install(k8s_cluster, "http://127.0.0.1:1", "sxak_unused")
    allowed = [
        ("list", "nodes"),
        ("watch", "nodes"),
        ("watch", "pods", "--all-namespaces"),
        ("get", "namespaces/kube-system"),
        ("create", "secrets"),
        ("get", "secrets/sxwl-agent-token"),
        ("update", "secrets/sxwl-agent-token"),
        ("create", "leases.coordination.k8s.io"),
        ("update", "leases.coordination.k8s.io/sxwl-agent-leader"),
        # for the job runtime
        ("create", "jobs.batch", "-n", "sxwl-tenant-x"),
        ("delete", "jobs.batch", "-n", "sxwl-tenant-x"),
        ("delete", "pods", "-n", "sxwl-tenant-x"),  # a stop's grace (runtimes/kubernetes.py)
        ("get", "pods", "--subresource=log", "-n", "sxwl-tenant-x"),
        ("create", "namespaces"),
        ("create", "secrets", "-n", "sxwl-tenant-x"),  # an attempt's upload token
        # an endpoint replica's NetworkPolicy (runtimes/kube_engine.py), and the tenant's own, updated
        ("delete", "networkpolicies.networking.k8s.io", "-n", "sxwl-tenant-x"),
        ("patch", "networkpolicies.networking.k8s.io", "-n", "sxwl-tenant-x"),
        ("create", "persistentvolumeclaims", "-n", "sxwl-tenant-x"),  # a dev environment's workspace
        ("delete", "persistentvolumeclaims", "-n", "sxwl-tenant-x"),
        ("list", "persistentvolumeclaims", "--all-namespaces"),  # a stopped environment's, by label
    ]
    denied = [
        ("list", "secrets"),  # not even in its own namespace
        ("list", "secrets", "--all-namespaces"),
        ("get", "secrets/sxwl-agent"),  # the accessKey reaches it through the pod's env only
        ("get", "secrets/other", "-n", "kube-system"),
        ("get", "secrets", "-n", "sxwl-tenant-x"),  # it writes upload tokens and never reads them back
        ("delete", "secrets", "-n", "sxwl-tenant-x"),
        ("delete", "nodes"),
        ("patch", "nodes"),
        ("create", "pods"),
        ("delete", "namespaces"),
        ("update", "leases.coordination.k8s.io/other-lease"),
        ("create", "deployments.apps"),
        ("create", "clusterrolebindings.rbac.authorization.k8s.io"),
        ("create", "pods", "--subresource=exec"),
        ("update", "networkpolicies.networking.k8s.io", "-n", "sxwl-tenant-x"),
        ("get", "persistentvolumeclaims", "-n", "sxwl-tenant-x"),
        ("create", "persistentvolumes"),
        ("*", "*"),
    ]
    wrong = [a for a in allowed if not can_i(k8s_cluster, ns, *a)]
    wrong += [("NOT DENIED", *d) for d in denied if can_i(k8s_cluster, ns, *d)]
    assert wrong == []
