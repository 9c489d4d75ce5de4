"""`3kctl deploy all` against a real cloud and real sshd hosts; KubeKey, helm and kubectl are the
recorded stand-ins of sxwl.ctl.runner (selected by their environment variables)."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.ctl.conftest import MakeHosts, Result, run_ctl
from tests.ctl.hosts import SshdHost, config_text
from tests.support.agent import AgentProcess
from tests.support.cloud import CloudProcess
from tests.support.net import free_port


@pytest.fixture(scope="module")
def cloud(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CloudProcess]:
    process = CloudProcess(
        tmp_path_factory.mktemp("cloud"),
        free_port(),
        env={"SXWL_HEARTBEAT_INTERVAL_MIN_S": "0.1", "SXWL_LIVENESS_CHECK_S": "0.1"},
    )
    yield process
    process.stop()


def provider_key(cloud: CloudProcess) -> str:
    email = f"provider-{secrets.token_hex(4)}@example.com"
    httpx.post(
        f"{cloud.url}/api/v1/auth/register",
        json={"email": email, "password": "correct horse", "role": "provider"},
    ).raise_for_status()
    token = httpx.post(
        f"{cloud.url}/api/v1/auth/login", json={"email": email, "password": "correct horse"}
    ).json()["access_token"]
    key: str = httpx.get(
        f"{cloud.url}/api/v1/me/access-key", headers={"Authorization": f"Bearer {token}"}
    ).json()["access_key"]
    return key


@dataclass
class Cluster:
    hosts: list[SshdHost]
    config: Path
    work: Path
    artifact: Path
    records: Path
    name: str
    cloud: CloudProcess
    key: str

    @property
    def env(self) -> dict[str, str]:
        return {
            "SXWL_3KCTL_FAKE_KK": str(self.records / "kk"),
            "SXWL_3KCTL_FAKE_KUBE": str(self.records / "kube"),
            "SXWL_3KCTL_POLL_INTERVAL": "0.2",
        }

    def deploy(self, *extra: str, env: dict[str, str] | None = None, key: str | None = None) -> Result:
        return run_ctl(
            "deploy",
            "all",
            f"--access-key={key or self.key}",
            "--cloud",
            self.cloud.url,
            "-f",
            str(self.config),
            "--artifact",
            str(self.artifact),
            "--wait-timeout",
            "30",
            *extra,
            env={**self.env, **(env or {})},
        )

    def kk_calls(self) -> list[dict[str, Any]]:
        path = self.records / "kk" / "kk-calls.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def kube_calls(self) -> list[dict[str, Any]]:
        path = self.records / "kube" / "kube-calls.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def ledger(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.work / "state.json").read_text())
        return data

    def agent(self, tmp_path: Path) -> AgentProcess:
        """What the sxwl-agent chart would start in the cluster: an agent registering this CPod's name."""
        return AgentProcess(
            self.cloud.url,
            tmp_path / "agent-state",
            self.key,
            "--name",
            self.name,
            "--heartbeat-interval",
            "0.2",
        )


@pytest.fixture
def cluster(
    tmp_path: Path, ssh_key: Path, make_hosts: MakeHosts, artifact: Path, cloud: CloudProcess
) -> Cluster:
    hosts = make_hosts(["master1", "worker1", "worker2"])
    name = f"cpod-{secrets.token_hex(3)}"
    config = tmp_path / "conf" / "config-sample.conf"
    config.parent.mkdir()
    config.write_text(f"name: {name}\n" + config_text(hosts, ssh_key))
    return Cluster(
        hosts,
        config,
        config.parent / ".3kctl",
        artifact,
        tmp_path / "records",
        name,
        cloud,
        provider_key(cloud),
    )


def subcommands(calls: list[dict[str, Any]]) -> list[str]:
    return [" ".join(a for a in call["argv"][1:4] if not a.startswith("-")) for call in calls]


def test_wrong_access_key_stops_before_any_host(cluster: Cluster) -> None:
    result = cluster.deploy(key="sk-not-a-real-key")
    assert result.rc == 1
    assert f"the cloud at {cluster.cloud.url} refused this accessKey" in result.err
    assert "copy the current accessKey from the console" in result.err
    assert not (cluster.work / "known_hosts").exists()
    assert not (cluster.work / "state.json").exists()
    assert all("publickey" not in host.log for host in cluster.hosts)  # no SSH login
    assert cluster.kk_calls() == []


def test_unreachable_cloud_is_a_clear_error(cluster: Cluster) -> None:
    result = run_ctl(
        "deploy",
        "all",
        "--access-key=k",
        "--cloud",
        f"http://127.0.0.1:{free_port()}",
        "-f",
        str(cluster.config),
        "--artifact",
        str(cluster.artifact),
    )
    assert result.rc == 1
    assert "cannot reach the cloud at http://127.0.0.1:" in result.err


def test_dry_run_prints_the_exact_plan_and_runs_nothing(cluster: Cluster) -> None:
    result = cluster.deploy("--dry-run")
    assert result.rc == 0, result.text
    out = result.out
    kk = str(cluster.artifact / "bin" / "kk")
    cluster_file = cluster.work / "kubekey-cluster.yaml"
    tarball = cluster.artifact / "kubekey" / "kubekey-artifact.tar.gz"
    assert f"$ {kk} create cluster --with-packages --yes -f {cluster_file} -a {tarball}" in out
    assert f"$ {kk} init registry -f {cluster_file} -a {tarball}" in out
    assert f"$ {kk} artifact image push -f {cluster_file} -a {tarball}" in out
    helm = str(cluster.artifact / "bin" / "helm")
    assert (
        f"$ {helm} upgrade --install gpu-operator {cluster.artifact / 'charts' / 'gpu-operator-v24.9.0.tgz'} "
        f"--namespace gpu-operator --create-namespace --kubeconfig {cluster.work / 'kubeconfig'}"
    ) in out
    assert f"--set-string cpod.name={cluster.name}" in out
    assert "SXWL_ACCESS_KEY: ********" in out
    assert cluster.key not in result.text
    steps = re.findall(r"^\s*\d+\. (\S+) — ", out, flags=re.MULTILINE)
    assert steps == [
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
    assert cluster.kk_calls() == [] and cluster.kube_calls() == []
    assert not cluster_file.exists()
    assert all("publickey" not in host.log for host in cluster.hosts)  # no SSH login


def test_deploy_all_registers_the_cpod(cluster: Cluster, tmp_path: Path) -> None:
    agent = cluster.agent(tmp_path)
    try:
        result = cluster.deploy()
    finally:
        agent.stop()
    assert result.rc == 0, result.text
    assert "accessKey accepted by" in result.out
    assert "CPod deployed." in result.out
    assert re.search(rf"算力详情\s+{re.escape(cluster.cloud.url)}/compute", result.out), result.out

    assert subcommands(cluster.kk_calls()) == ["init registry", "artifact image push", "create cluster"]
    create = cluster.kk_calls()[2]
    assert "--with-packages" in create["argv"] and create["argv"][-2] == "-a"
    generated = yaml.safe_load((cluster.records / "kk" / create["cluster_file"]).read_text())
    spec = generated["spec"]
    assert generated["metadata"]["name"] == cluster.name
    assert [h["name"] for h in spec["hosts"]] == ["master1", "worker1", "worker2"]
    assert spec["hosts"][1]["internalAddress"] == cluster.hosts[1].address
    assert spec["hosts"][1]["port"] == cluster.hosts[1].port
    assert spec["roleGroups"] == {
        "etcd": ["master1"],
        "control-plane": ["master1"],
        "worker": ["worker1", "worker2"],
        "registry": ["master1"],
    }
    assert spec["registry"]["privateRegistry"] == "dockerhub.kubekey.local"
    assert spec["kubernetes"]["version"] == "v1.27.16"

    kubeconfig = cluster.work / "kubeconfig"
    assert kubeconfig.stat().st_mode & 0o777 == 0o600
    assert f"https://{cluster.hosts[0].address}:6443" in kubeconfig.read_text()  # fetched over SSH, rewritten
    installs = [c["argv"][3] for c in cluster.kube_calls() if c["argv"][1:3] == ["upgrade", "--install"]]
    assert installs == ["node-feature-discovery", "gpu-operator", "sxwl-agent"]
    secret = next(c for c in cluster.kube_calls() if c["argv"][-3:] == ["apply", "-f", "-"])
    assert f"SXWL_ACCESS_KEY: {cluster.key}" in secret["stdin"]
    values = (cluster.work / "values" / "gpu-operator.yaml").read_text()
    assert "repository: dockerhub.kubekey.local/kubesphereio" in values
    for step in ("preflight", "kubernetes", "sxwl-agent", "wait-online"):
        assert (cluster.work / "logs" / f"{step}.log").exists()
    assert cluster.key not in (cluster.work / "logs" / "agent-secret.log").read_text()
    assert all(s["status"] == "done" for s in cluster.ledger()["deploy all"]["steps"].values())


def test_interrupted_deploy_resumes_without_redoing_steps(cluster: Cluster, tmp_path: Path) -> None:
    failed = cluster.deploy(env={"SXWL_3KCTL_FAKE_KK_FAIL": "create cluster"})
    assert failed.rc == 1
    assert "step 'kubernetes' failed: kk create cluster failed (exit 1)" in failed.err
    assert "continue with `3kctl deploy all … --resume` (the 6 completed steps are not redone)" in failed.err
    assert f"log: {cluster.work / 'logs' / 'kubernetes.log'}" in failed.err
    steps = cluster.ledger()["deploy all"]["steps"]
    assert steps["images"]["status"] == "done" and steps["kubernetes"]["status"] == "failed"
    assert "gpu-operator" not in steps

    agent = cluster.agent(tmp_path)
    try:
        resumed = cluster.deploy("--resume")
    finally:
        agent.stop()
    assert resumed.rc == 0, resumed.text
    assert "✓ [2/13] preflight: check every host (done earlier, skipped)" in resumed.out
    assert subcommands(cluster.kk_calls()) == [
        "init registry",
        "artifact image push",
        "create cluster",
        "create cluster",
    ]
    assert (cluster.work / "logs" / "preflight.log").read_text().count(
        "=== 3kctl deploy all: step preflight"
    ) == 1
    assert (cluster.work / "logs" / "kubernetes.log").read_text().count(
        "=== 3kctl deploy all: step kubernetes"
    ) == 2


def test_resume_refuses_a_changed_config(cluster: Cluster) -> None:
    assert cluster.deploy(env={"SXWL_3KCTL_FAKE_KK_FAIL": "init registry"}).rc == 1
    cluster.config.write_text(cluster.config.read_text().replace(f"name: {cluster.name}", "name: other"))
    result = cluster.deploy("--resume")
    assert result.rc == 2
    assert "changed since the steps" in result.err and "without --resume" in result.err


def test_cpod_that_never_comes_online(cluster: Cluster) -> None:
    result = cluster.deploy("--wait-timeout", "1")
    assert result.rc == 1
    assert f"CPod '{cluster.name}' did not come online within 1s (no CPod of that name" in result.err
    assert "logs deploy/sxwl-agent" in result.err
    assert cluster.ledger()["deploy all"]["steps"]["wait-online"]["status"] == "failed"


def test_preflight_failure_stops_the_deploy(cluster: Cluster) -> None:
    cluster.hosts[1].stop()
    result = cluster.deploy()
    assert result.rc == 1
    assert "step 'preflight' failed: preflight found problems (✗):" in result.err
    assert "✗ worker1 reachable: connection refused" in result.err
    assert cluster.kk_calls() == []


def test_damaged_artifact_stops_the_deploy_before_kubekey(cluster: Cluster) -> None:
    (cluster.artifact / "kubekey" / "kubekey-artifact.tar.gz").write_bytes(b"half a download")
    result = cluster.deploy()
    assert result.rc == 1
    assert "step 'artifact' failed: the artifact does not match its manifest:" in result.err
    assert "kubekey/kubekey-artifact.tar.gz: sha256" in result.err
    assert cluster.kk_calls() == []


def test_deploy_interrupted_by_ctrl_c_then_resumed(cluster: Cluster, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SXWL_3KCTL_")}
    env.update(cluster.env, SXWL_3KCTL_FAKE_KK_SLEEP="create cluster=60", COLUMNS="200")
    proc = subprocess.Popen(
        [sys.executable, "-m", "sxwl.ctl", "deploy", "all", f"--access-key={cluster.key}", "--cloud",
         cluster.cloud.url, "-f", str(cluster.config), "--artifact", str(cluster.artifact)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint,
    )  # fmt: skip
    log = cluster.work / "logs" / "kubernetes.log"
    deadline = time.monotonic() + 60
    while not (log.exists() and "sleeps" in log.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert "interrupted during step 'kubernetes'; it may be half done, and is redone by" in err
    assert cluster.ledger()["deploy all"]["steps"]["kubernetes"]["status"] == "interrupted"

    agent = cluster.agent(tmp_path)
    try:
        resumed = cluster.deploy("--resume")
    finally:
        agent.stop()
    assert resumed.rc == 0, resumed.text
    assert subcommands(cluster.kk_calls()) == [
        "init registry",
        "artifact image push",
        "create cluster",
        "create cluster",
    ]


def default_sigint() -> None:
    """Ctrl-C as at a terminal: a test run started in the background (``cmd &``) ignores SIGINT, and a
    Python started with it ignored never raises KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
