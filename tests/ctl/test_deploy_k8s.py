"""`3kctl deploy all` end to end against the real Kubernetes control plane of tests/support/k8s.py,
then a user's training job on the CPod it built.

Real: the sshd loopback hosts (preflight, the kubeconfig fetched over SSH), helm and kubectl (the
artifact's bin/helm and bin/kubectl are the test cluster's own binaries), the API server, the
sxwl-agent chart (deploy/helm/sxwl-agent, packaged here), `sxwl serve` and the agent, and the real
worker nodes (tests/support/k8s_node.py) where the user's tiny-lm job runs in containers while the
console shows its log, before its checkpoint downloads. Recorded: KubeKey (`FakeKubeKey`: it turns
bare metal into Kubernetes, which no test machine allows); its `create cluster` hands over the test
control plane's admin kubeconfig. The chart's own Deployment lands on a KWOK node, where no container
runs, and no agent image can be pulled here: the test runs the agent as a process outside the
cluster with the Deployment's arguments and the chart's ServiceAccount token, reading the accessKey
from the Secret 3kctl created — as tests/k8s/test_chart.py does."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import numpy as np
import pytest
import yaml
from playwright.sync_api import Browser, expect, sync_playwright

from sxwl.ctl.artifact import write_checksums
from tests.ctl.conftest import REPO, MakeHosts, make_artifact, run_ctl
from tests.ctl.hosts import config_text
from tests.support.agent import AgentProcess, eventually
from tests.support.browser import PASSWORD, launch, screenshot, sign_in
from tests.support.cloud import CloudProcess
from tests.support.k8s import K8sCluster
from tests.support.k8s_node import RealNodes, host_ip
from tests.support.net import free_port
from tests.support.real_cpod import TINY_LM_DIR, placement_flags, tiny_lm_image

pytestmark = pytest.mark.k8s

NAMESPACE = "sxwl-system"
PRODUCT = "NVIDIA-H100-80GB-HBM3"
T = TypeVar("T")


@pytest.fixture
def cloud(tmp_path: Path) -> Iterator[CloudProcess]:
    # On the host's address, not loopback: the tenant pods on the real nodes upload to it.
    host = host_ip()
    process = CloudProcess(
        tmp_path / "cloud",
        free_port(host),
        host=host,
        env={
            "SXWL_DATABASE_URL": f"sqlite:///{tmp_path / 'sxwl.db'}",
            "SXWL_HEARTBEAT_INTERVAL_MIN_S": "0.1",
            "SXWL_LIVENESS_CHECK_S": "0.1",
        },
    )
    yield process
    process.stop()


class Provider:
    """A provider account on the cloud: its accessKey and its console view of the CPods."""

    def __init__(self, cloud: CloudProcess) -> None:
        self.url = cloud.url
        email = f"e2e-{secrets.token_hex(4)}@example.com"
        credentials = {"email": email, "password": "correct horse"}
        httpx.post(
            f"{self.url}/api/v1/auth/register", json={**credentials, "role": "provider"}
        ).raise_for_status()
        token = httpx.post(f"{self.url}/api/v1/auth/login", json=credentials).json()["access_token"]
        self.headers = {"Authorization": f"Bearer {token}"}
        self.key: str = httpx.get(f"{self.url}/api/v1/me/access-key", headers=self.headers).json()[
            "access_key"
        ]

    def cpod(self, name: str, nodes: list[str]) -> dict[str, Any] | None:
        """The CPod, once it is online and reports every one of these nodes."""
        for cpod in httpx.get(f"{self.url}/api/v1/cpods", headers=self.headers).json():
            reported = {n["name"] for n in cpod["nodes"]}
            if cpod["name"] == name and cpod["status"] == "online" and set(nodes) <= reported:
                result: dict[str, Any] = cpod
                return result
        return None


def stand_in_chart(cluster: K8sCluster, root: Path, name: str, version: str, into: Path) -> None:
    """A STAND-IN for the node-feature-discovery / gpu-operator chart: the real charts' images cannot
    run under KWOK (no containers), and their DaemonSets would never become ready for `helm --wait`.
    It holds one ConfigMap with the values 3kctl gave it, so the test can check them."""
    source = root / name
    (source / "templates").mkdir(parents=True)
    (source / "Chart.yaml").write_text(
        f"apiVersion: v2\nname: {name}\nversion: {version}\n"
        "description: stand-in for tests (KWOK runs no containers)\n"
    )
    (source / "templates" / "values.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-values\n"
        "  namespace: {{ .Release.Namespace }}\ndata:\n  values.yaml: {{ toYaml .Values | quote }}\n"
    )
    package(cluster, source, into)


def package(cluster: K8sCluster, source: Path, into: Path) -> None:
    out = into.parent / "packaged"
    out.mkdir(exist_ok=True)
    cluster.helm("package", str(source), "--destination", str(out))
    chart = yaml.safe_load((source / "Chart.yaml").read_text())
    (out / f"{chart['name']}-{chart['version']}.tgz").rename(into)


def real_artifact(cluster: K8sCluster, root: Path) -> Path:
    """The artifact: the real manifest, the cluster's helm and kubectl as bin/helm and bin/kubectl,
    stand-in platform charts, the real sxwl-agent chart; bin/kk and the KubeKey tarball stay stand-in
    files (FakeKubeKey never runs them)."""
    artifact = make_artifact(root / "artifact")
    for tool in ("helm", "kubectl"):
        (artifact / "bin" / tool).unlink()
        (artifact / "bin" / tool).symlink_to(cluster.bins / tool)
    charts = artifact / "charts"
    stand_in_chart(
        cluster,
        root / "src",
        "node-feature-discovery",
        "0.16.6",
        charts / "node-feature-discovery-0.16.6.tgz",
    )
    stand_in_chart(cluster, root / "src", "gpu-operator", "v24.9.0", charts / "gpu-operator-v24.9.0.tgz")
    package(cluster, REPO / "deploy" / "helm" / "sxwl-agent", charts / "sxwl-agent-0.1.0.tgz")
    write_checksums(artifact)
    return artifact


def ledger_step(work: Path, name: str) -> str | None:
    try:
        state = json.loads((work / "state.json").read_text())
    except (FileNotFoundError, ValueError):
        return None
    status: str | None = state.get("deploy all", {}).get("steps", {}).get(name, {}).get("status")
    return status


def secret_fields(cluster: K8sCluster, name: str) -> dict[str, str]:
    secret = cluster.get("secret", name, NAMESPACE)
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


def start_agent(cluster: K8sCluster, cloud: CloudProcess, tmp_path: Path, *extra: str) -> AgentProcess:
    """What the chart's Deployment would run, as a process: its args, its ServiceAccount's token,
    the accessKey from the Secret 3kctl created; ``extra``: what the provider's chart values add."""
    deployment = cluster.get("deployment", "sxwl-agent", NAMESPACE)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = [a for a in container["args"] if not a.startswith(("--state-dir=", "--heartbeat-interval="))]
    token = cluster.kubectl("create", "token", "sxwl-agent", "-n", NAMESPACE, "--duration=1h").strip()
    kubeconfig = cluster.write_token_kubeconfig(tmp_path / "agent.kubeconfig", token, NAMESPACE)
    access_key = secret_fields(cluster, "sxwl-agent")["SXWL_ACCESS_KEY"]
    return AgentProcess(
        cloud.url,
        tmp_path / "agent-state",
        access_key,
        *args,
        "--heartbeat-interval=0.3",
        "--kubeconfig",
        str(kubeconfig),
        "--namespace",
        NAMESPACE,
        *extra,
    )


@pytest.fixture
def gpu_nodes(k8s_cluster: K8sCluster) -> Iterator[list[str]]:
    """Three KWOK GPU nodes `e2e<tag>-0..2`: the nodes KubeKey would have joined; the sshd hosts get
    the same names. Deleted afterwards: the cluster is shared by the session."""
    nodes = k8s_cluster.add_gpu_nodes(
        f"e2e{secrets.token_hex(3)}", 3, product=PRODUCT, memory_mib=81559, gpus=8
    )
    yield nodes
    k8s_cluster.kubectl("delete", "node", "--wait=false", *nodes, check=False)


def test_deploy_all_on_a_real_control_plane(
    k8s_cluster: K8sCluster,
    real_nodes: RealNodes,
    gpu_nodes: list[str],
    make_hosts: MakeHosts,
    ssh_key: Path,
    cloud: CloudProcess,
    tmp_path: Path,
) -> None:
    cluster, nodes = k8s_cluster, gpu_nodes
    tag = secrets.token_hex(3)
    hosts = make_hosts(nodes)
    name = f"cpod-{tag}"
    config = tmp_path / "conf" / "config-sample.conf"
    config.parent.mkdir()
    config.write_text(f"name: {name}\n" + config_text(hosts, ssh_key))
    work = config.parent / ".3kctl"
    artifact = real_artifact(cluster, tmp_path)
    provider = Provider(cloud)
    key = provider.key
    kk_records = tmp_path / "records" / "kk"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SXWL_3KCTL_")}
    env.update(
        COLUMNS="200",
        NO_COLOR="1",
        TERM="dumb",
        SXWL_3KCTL_FAKE_KK=str(kk_records),
        SXWL_3KCTL_FAKE_KK_KUBECONFIG=str(cluster.kubeconfig),
        SXWL_3KCTL_POLL_INTERVAL="0.2",
    )  # no SXWL_3KCTL_FAKE_KUBE: helm and kubectl are real
    env.pop("SXWL_ACCESS_KEY", None)
    env.pop("SXWL_API_URL", None)
    out_path, err_path = tmp_path / "deploy.out", tmp_path / "deploy.err"
    agent: AgentProcess | None = None
    try:
        with out_path.open("w") as out, err_path.open("w") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "sxwl.ctl", "deploy", "all", f"--access-key={key}", "--cloud",
                 cloud.url, "-f", str(config), "--artifact", str(artifact), "--wait-timeout", "120"],
                env=env, stdout=out, stderr=err, text=True,
            )  # fmt: skip
            try:
                # Once the chart is installed, its pod would start the agent: here, a process does.
                deadline = time.monotonic() + 240
                while ledger_step(work, "sxwl-agent") != "done":
                    assert proc.poll() is None, out_path.read_text() + err_path.read_text()
                    assert time.monotonic() < deadline, out_path.read_text() + err_path.read_text()
                    time.sleep(0.2)
                # The provider keeps tenant pods on its worker nodes (chart values jobs.*): the real ones.
                image = tiny_lm_image(real_nodes)
                agent = start_agent(cluster, cloud, tmp_path, "--uploader-image", image, *placement_flags())
                rc = proc.wait(180)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        output = out_path.read_text()
        (work / "deploy-output.txt").write_text(output + err_path.read_text())  # kept for the reader
        assert rc == 0, output + err_path.read_text() + (agent.log if agent else "")
        assert "CPod deployed." in output
        # Only KubeKey is a stand-in: helm and kubectl ran for real.
        assert "note: test stand-ins in use: fake-kubekey\n" in err_path.read_text()
        assert re.search(rf"算力详情\s+{re.escape(cloud.url)}/compute", output), output

        # KubeKey (recorded): registry, images, cluster, with the generated cluster file.
        calls = [json.loads(line) for line in (kk_records / "kk-calls.jsonl").read_text().splitlines()]
        kk = str(artifact / "bin" / "kk")
        cluster_file = str(work / "kubekey-cluster.yaml")
        tarball = str(artifact / "kubekey" / "kubekey-artifact.tar.gz")
        assert [c["argv"] for c in calls] == [
            [kk, "init", "registry", "-f", cluster_file, "-a", tarball],
            [kk, "artifact", "image", "push", "-f", cluster_file, "-a", tarball],
            [kk, "create", "cluster", "--with-packages", "--yes", "-f", cluster_file, "-a", tarball],
        ]
        generated = yaml.safe_load((kk_records / calls[2]["cluster_file"]).read_text())
        assert [h["name"] for h in generated["spec"]["hosts"]] == nodes
        # The kubeconfig step fetched the real admin kubeconfig over SSH.
        assert cluster.server in (work / "kubeconfig").read_text()
        assert (work / "kubeconfig").stat().st_mode & 0o777 == 0o600

        # Real helm releases, deployed, in their namespaces.
        # By name and namespace: in a shared session, tests/k8s/test_chart.py leaves other sxwl-agent
        # releases (in namespaces of their own).
        releases = {
            (r["name"], r["namespace"]): r for r in json.loads(cluster.helm("list", "-A", "-o", "json"))
        }
        for release, namespace, chart in [
            ("node-feature-discovery", "node-feature-discovery", "node-feature-discovery-0.16.6"),
            ("gpu-operator", "gpu-operator", "gpu-operator-v24.9.0"),
            ("sxwl-agent", NAMESPACE, "sxwl-agent-0.1.0"),
        ]:
            assert releases[release, namespace]["status"] == "deployed"
            assert releases[release, namespace]["chart"] == chart
        # The manifest's values reached the charts, images pointed at the private registry.
        gpu_values = yaml.safe_load(
            cluster.get("configmap", "gpu-operator-values", "gpu-operator")["data"]["values.yaml"]
        )
        assert gpu_values["driver"] == {"enabled": False}
        assert gpu_values["devicePlugin"] == {"repository": "dockerhub.kubekey.local/kubesphereio"}
        deployment = cluster.get("deployment", "sxwl-agent", NAMESPACE)
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert container["image"] == "dockerhub.kubekey.local/kubesphereio/sxwl-agent:0.1.0"
        assert f"--name={name}" in container["args"]
        env_of = {e["name"]: e for e in container["env"]}
        assert env_of["SXWL_API_URL"]["value"] == cloud.url
        assert env_of["SXWL_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]["name"] == "sxwl-agent"

        # 3kctl's Secret: exactly the two keys, the accessKey never in a log.
        assert secret_fields(cluster, "sxwl-agent") == {"SXWL_API_URL": cloud.url, "SXWL_ACCESS_KEY": key}
        assert key not in (work / "logs" / "agent-secret.log").read_text()

        # The CPod is online on the cloud, with the KWOK GPU nodes, as its provider sees it.
        assert agent is not None
        cpod = eventually(
            lambda: provider.cpod(name, nodes),
            timeout=30,
            what=f"the CPod online with nodes {nodes}; agent log:\n{agent.log}",
        )
        assert cpod["runtime"] == "kubernetes"
        gpus = {n["name"]: n["gpu"] for n in cpod["nodes"] if n["name"] in nodes}
        assert {n: (g["product"], g["count"]) for n, g in gpus.items()} == {n: (PRODUCT, 8) for n in nodes}

        # The ledger: every step done.
        steps = json.loads((work / "state.json").read_text())["deploy all"]["steps"]
        assert list(steps) == [
            "config",
            "preflight",
            "artifact",
            "kubekey-config",
            "registry",
            "images",
            "kubernetes",
            "kubeconfig",
            "node-feature-discovery",
            "gpu-operator",
            "agent-secret",
            "sxwl-agent",
            "wait-online",
        ]
        assert {s["status"] for s in steps.values()} == {"done"}

        # `3kctl status`: the nodes, the components and the CPod, through the real kubectl and helm.
        status = run_ctl(
            "status",
            "-f",
            str(config),
            "--artifact",
            str(artifact),
            f"--access-key={key}",
            "--cloud",
            cloud.url,
        )
        text = status.text
        (work / "status-output.txt").write_text(text)  # kept for the reader
        for node in nodes:
            assert re.search(rf"{node}\s.*✓.*8 {PRODUCT}", text), text
        for release, namespace in [
            ("node-feature-discovery", "node-feature-discovery"),
            ("gpu-operator", "gpu-operator"),
            ("sxwl-agent", NAMESPACE),
        ]:
            assert re.search(rf"{release}\s+│\s+{namespace}\s+│.*✓ deployed", text), text
        assert "deploy all: 13 steps done" in text
        assert f"✓ cloud: CPod {name} is online on {cloud.url}/compute" in text
        # KWOK marks the Deployment's pod Ready; the shared cluster may hold other tests' unready nodes.
        assert "✓ agent: sxwl-agent 1/1 ready" in text, text
        assert status.rc == (0 if all_nodes_ready(cluster) else 1), text

        # A user trains tiny-lm on the new CPod: real containers on the real node, the log live in
        # the console, the checkpoint downloaded.
        train_on_the_cpod(cloud, image, tmp_path)
    finally:
        if agent is not None:
            agent.stop()
        # The cluster is shared by the session: leave nothing that later tests could trip over.
        for release, namespace in [
            ("sxwl-agent", NAMESPACE),
            ("gpu-operator", "gpu-operator"),
            ("node-feature-discovery", "node-feature-discovery"),
        ]:
            cluster.helm("uninstall", release, "-n", namespace, "--wait", check=False)
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


def train_on_the_cpod(cloud: CloudProcess, image: str, tmp_path: Path) -> None:
    email = f"dev-{secrets.token_hex(3)}@example.com"
    register = {"email": email, "password": PASSWORD, "role": "user"}
    httpx.post(f"{cloud.url}/api/v1/auth/register", json=register).raise_for_status()
    token = httpx.post(f"{cloud.url}/api/v1/auth/login", json={"email": email, "password": PASSWORD})
    user = {"Authorization": f"Bearer {token.json()['access_token']}"}
    body = {
        "name": "tiny-lm",
        "command": 'exec python3 "$TINY_LM_DIR/train.py"',
        "image": image,
        "gpus_per_node": 0,
        "env": {"TINY_LM_DIR": TINY_LM_DIR, "TINY_LM_STEPS": "400"},
    }
    response = httpx.post(f"{cloud.url}/api/v1/jobs", headers=user, json=body)
    assert response.status_code == 201, response.text
    job_id = response.json()["id"]

    seen = in_a_browser(lambda browser: watch_the_log(browser, cloud.url, email, job_id))
    assert seen != "true", "the log showed steps only once the job had ended"
    job = httpx.get(f"{cloud.url}/api/v1/jobs/{job_id}", headers=user).json()
    assert job["state"] == "succeeded", job
    artifacts = httpx.get(f"{cloud.url}/api/v1/jobs/{job_id}/artifacts", headers=user).json()
    checkpoint = next(a for a in artifacts if a["path"].startswith("checkpoint"))
    data = httpx.get(f"{cloud.url}/api/v1/jobs/{job_id}/artifacts/{checkpoint['path']}", headers=user)
    assert data.status_code == 200 and hashlib.sha256(data.content).hexdigest() == checkpoint["sha256"]
    (tmp_path / checkpoint["path"]).write_bytes(data.content)
    with np.load(tmp_path / checkpoint["path"]) as weights:
        assert len(weights.files) > 0


def watch_the_log(browser: Browser, url: str, email: str, job_id: str) -> str | None:
    """The job page follows the log: returns its completeness flag when step 20 showed."""
    # Not new_context(): clipboard permissions need a secure origin, and this one is the host's address.
    context = browser.new_context(locale="zh-CN", base_url=url)
    context.set_default_timeout(10_000)
    try:
        page = context.new_page()
        sign_in(page, email)
        page.goto(f"/jobs/{job_id}")
        log = page.locator("#job-log")
        expect(log).to_contain_text("[rank 0] step 20 loss", timeout=120_000)
        live = log.get_attribute("data-complete")
        screenshot(page, "job-real-node-live-log")
        expect(log).to_have_attribute("data-complete", "true", timeout=180_000)
        expect(log).to_contain_text("[rank 0] step 400 loss")
        return live
    finally:
        context.close()


def in_a_browser(work: Callable[[Browser], T]) -> T:
    """``work`` with a Chromium of its own, on a thread of its own: Playwright's sync API keeps an event
    loop running on its thread, and the session's browser fixture would make every later test's
    ``asyncio.run`` (tests/k8s) fail there."""
    result: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with sync_playwright() as playwright:
                browser = launch(playwright)
                try:
                    result.append(work(browser))
                finally:
                    browser.close()
        except BaseException as exc:  # re-raised on the test's thread
            errors.append(exc)

    thread = threading.Thread(target=run, name="console-browser")
    thread.start()
    thread.join(600)
    if errors:
        raise errors[0]
    assert result, "the browser did not finish in 600 s"
    return result[0]


def all_nodes_ready(cluster: K8sCluster) -> bool:
    items = json.loads(cluster.kubectl("get", "nodes", "-o", "json"))["items"]
    return all(
        any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))
        for n in items
    )
