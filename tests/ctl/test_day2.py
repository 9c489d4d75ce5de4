"""`deploy install ceph`, `status`, `add nodes`, `delete node`: through the same runner, with the
recorded helm/kubectl and KubeKey stand-ins; hosts are real sshd processes where SSH is involved."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.ctl.conftest import MakeHosts, Result, run_ctl
from tests.ctl.hosts import SshdHost, config_text


class Deployed:
    """A work dir as `deploy all` leaves it (kubeconfig and ledger), for the day-2 commands."""

    def __init__(self, tmp_path: Path, text: str, artifact: Path, hosts: list[str]) -> None:
        self.config = tmp_path / "conf" / "config-sample.conf"
        self.config.parent.mkdir(exist_ok=True)
        self.config.write_text(text)
        self.work = self.config.parent / ".3kctl"
        self.work.mkdir()
        (self.work / "kubeconfig").write_text("apiVersion: v1\nkind: Config\n")
        (self.work / "state.json").write_text(json.dumps({"deploy all": {"steps": {}, "hosts": hosts}}))
        self.artifact = artifact
        self.records = tmp_path / "records"

    def run(self, *args: str, responses: list[dict[str, Any]] | None = None) -> Result:
        if responses is not None:
            (self.records / "kube").mkdir(parents=True, exist_ok=True)
            (self.records / "kube" / "responses.json").write_text(json.dumps(responses))
        env = {
            "SXWL_3KCTL_FAKE_KK": str(self.records / "kk"),
            "SXWL_3KCTL_FAKE_KUBE": str(self.records / "kube"),
            "SXWL_3KCTL_POLL_INTERVAL": "0.1",
        }
        return run_ctl(*args, "-f", str(self.config), "--artifact", str(self.artifact), env=env)

    def calls(self, kind: str) -> list[dict[str, Any]]:
        path = self.records / kind / f"{kind}-calls.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def hosts(self) -> list[str]:
        state: list[str] = json.loads((self.work / "state.json").read_text())["deploy all"]["hosts"]
        return state


STATIC = """\
hosts:
  - {name: master1, internalAddress: 10.1.0.1, privateKeyPath: KEY}
  - {name: worker1, internalAddress: 10.1.0.2, privateKeyPath: KEY}
  - {name: worker2, internalAddress: 10.1.0.3, privateKeyPath: KEY}
roleGroups:
  etcd: [master1]
  control-plane: [master1]
  worker: [worker[1:2]]
  registry: [master1]
ceph:
  devices: [sdb, /dev/sdc]
"""

HEALTH_OK = [{"match": "jsonpath={.status.ceph.health}", "stdout": "HEALTH_OK"}]


@pytest.fixture
def static(tmp_path: Path, ssh_key: Path, artifact: Path) -> Deployed:
    return Deployed(
        tmp_path, STATIC.replace("KEY", str(ssh_key)), artifact, ["master1", "worker1", "worker2"]
    )


def test_ceph_dry_run_plan(static: Deployed) -> None:
    result = static.run("deploy", "install", "ceph", "--dry-run")
    assert result.rc == 0, result.text
    assert "OSDs on worker1: sdb, sdc; worker2: sdb, sdc" in result.out
    assert (
        f"upgrade --install rook-ceph {static.artifact / 'charts' / 'rook-ceph-v1.15.6.tgz'} "
        "--namespace rook-ceph" in result.out
    )
    assert "get cephcluster rook-ceph -o 'jsonpath={.status.ceph.health}'" in result.out
    assert "storageclass.kubernetes.io/is-default-class" in result.out
    assert static.calls("kube") == []


def test_ceph_install_to_health_ok_and_storage_classes(static: Deployed) -> None:
    result = static.run("deploy", "install", "ceph", responses=HEALTH_OK)
    assert result.rc == 0, result.text
    assert "Ceph is HEALTH_OK" in result.out
    values = yaml.safe_load((static.work / "values" / "rook-ceph-cluster.yaml").read_text())
    nodes = values["cephClusterSpec"]["storage"]["nodes"]
    assert nodes == [
        {"name": "worker1", "devices": [{"name": "sdb"}, {"name": "sdc"}]},
        {"name": "worker2", "devices": [{"name": "sdb"}, {"name": "sdc"}]},
    ]
    assert values["cephClusterSpec"]["mon"]["count"] == 1  # two OSD hosts: one mon, replicas 2
    assert values["cephBlockPools"][0]["spec"]["replicated"]["size"] == 2
    assert (
        values["cephClusterSpec"]["cephVersion"]["image"]
        == "dockerhub.kubekey.local/kubesphereio/ceph:v18.2.4"
    )
    calls = [c["argv"] for c in static.calls("kube")]
    assert [a[3] for a in calls if a[1:3] == ["upgrade", "--install"]] == ["rook-ceph", "rook-ceph-cluster"]
    applied = next(c for c in static.calls("kube") if c["argv"][-3:] == ["apply", "-f", "-"])["stdin"]
    classes = list(yaml.safe_load_all(applied))
    assert [c["metadata"]["name"] for c in classes] == ["rook-ceph-block", "rook-cephfs"]
    assert classes[0]["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"] == "true"
    assert calls[-1][-3:] == ["storageclass", "rook-ceph-block", "rook-cephfs"]


def test_ceph_not_healthy_says_what_is_wrong(static: Deployed) -> None:
    details = {"MON_DOWN": {"message": "1/3 mons down", "severity": "HEALTH_WARN"}}
    responses = [
        {"match": "jsonpath={.status.ceph.health}", "stdout": "HEALTH_WARN"},
        {"match": "jsonpath={.status.ceph.details}", "stdout": json.dumps(details)},
    ]
    result = static.run("deploy", "install", "ceph", "--wait-timeout", "1", responses=responses)
    assert result.rc == 1
    assert "step 'ceph-health' failed: Ceph is HEALTH_WARN after 1s: MON_DOWN: 1/3 mons down" in result.err
    assert "--resume" in result.err


def test_ceph_needs_a_deployed_cluster(static: Deployed) -> None:
    (static.work / "kubeconfig").unlink()
    result = static.run("deploy", "install", "ceph")
    assert result.rc == 1
    assert "no cluster yet" in result.err and "3kctl deploy all" in result.err


def test_ceph_without_devices_looks_for_empty_disks(
    tmp_path: Path, ssh_key: Path, make_hosts: MakeHosts, artifact: Path
) -> None:
    hosts = make_hosts(["master1", "worker1"])
    deployed = Deployed(tmp_path, config_text(hosts, ssh_key), artifact, ["master1", "worker1"])
    result = deployed.run("deploy", "install", "ceph", "--yes")
    # This machine's only disk holds its root file system: nothing may be offered to Ceph.
    assert result.rc == 1
    assert "empty disks (no partition, filesystem or mount): worker1: none" in result.out
    assert "no empty disk on any worker" in result.err
    assert deployed.calls("kube") == []


NODES = {
    "items": [
        {
            "metadata": {"name": "master1", "labels": {"node-role.kubernetes.io/control-plane": ""}},
            "status": {
                "conditions": [{"type": "Ready", "status": "True"}],
                "nodeInfo": {"kubeletVersion": "v1.27.16"},
            },
        },
        {
            "metadata": {"name": "worker1", "labels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}},
            "status": {
                "conditions": [{"type": "Ready", "status": "False"}],
                "capacity": {"nvidia.com/gpu": "8"},
                "nodeInfo": {"kubeletVersion": "v1.27.16"},
            },
        },
    ]
}
RELEASES = [
    {"name": n, "namespace": ns, "chart": f"{n}-1", "status": "deployed"}
    for n, ns in (
        ("node-feature-discovery", "node-feature-discovery"),
        ("gpu-operator", "gpu-operator"),
        ("sxwl-agent", "sxwl-system"),
    )
]


def test_status_shows_nodes_components_and_agent(static: Deployed) -> None:
    responses = [
        {"match": "get nodes -o json", "stdout": json.dumps(NODES)},
        {"match": "list -A -o json", "stdout": json.dumps(RELEASES)},
        {
            "match": "get deployment sxwl-agent",
            "stdout": json.dumps({"spec": {"replicas": 1}, "status": {"readyReplicas": 1}}),
        },
    ]
    result = static.run("status", responses=responses)
    assert result.rc == 1  # worker1 is not ready, worker2 never joined
    assert "8 NVIDIA-A100-SXM4-80GB" in result.out
    assert "deployed but not in the cluster: worker2" in result.out
    assert "✓ agent: sxwl-agent 1/1 ready" in result.out
    assert "gpu-operator" in result.out and "✓ deployed" in result.out
    NODES["items"][1]["status"]["conditions"][0]["status"] = "True"  # type: ignore[index]
    (static.work / "state.json").write_text(
        json.dumps({"deploy all": {"steps": {}, "hosts": ["master1", "worker1"]}})
    )
    responses[0]["stdout"] = json.dumps(NODES)
    assert static.run("status", responses=responses).rc == 0
    # A release of the same name in another namespace is not 3kctl's: it is listed apart and does
    # not stand for the one 3kctl installed (release names are unique per namespace only).
    other = {"name": "sxwl-agent", "namespace": "elsewhere", "chart": "sxwl-agent-9", "status": "failed"}
    responses[1]["stdout"] = json.dumps([r for r in RELEASES if r["name"] != "sxwl-agent"] + [other])
    missing = static.run("status", responses=responses)
    assert missing.rc == 1
    assert re.search(r"sxwl-agent\s+│\s+sxwl-system\s+│.*✗ not installed", missing.out), missing.out
    assert re.search(r"sxwl-agent\s+│\s+elsewhere\s+│\s+sxwl-agent-9\s+│\s+failed", missing.out), missing.out
    responses[1]["stdout"] = json.dumps([other, *RELEASES])
    assert static.run("status", responses=responses).rc == 0


def test_add_nodes_joins_only_the_new_hosts(
    tmp_path: Path, ssh_key: Path, make_hosts: MakeHosts, artifact: Path
) -> None:
    hosts = make_hosts(["master1", "worker1", "worker2"])
    deployed = Deployed(tmp_path, config_text(hosts, ssh_key), artifact, ["master1", "worker1"])
    plan = deployed.run("add", "nodes", "--dry-run")
    assert plan.rc == 0, plan.text
    assert "new hosts: worker2" in plan.out and "add nodes --with-packages --yes -f" in plan.out
    result = deployed.run("add", "nodes")
    assert result.rc == 0, result.text
    assert "added worker2" in result.out
    assert "publickey" in hosts[2].log  # the new host was checked over SSH …
    assert "publickey" not in hosts[0].log and "publickey" not in hosts[1].log  # … the others were not
    (call,) = deployed.calls("kk")
    assert call["argv"][1:3] == ["add", "nodes"]
    generated = yaml.safe_load((deployed.records / "kk" / call["cluster_file"]).read_text())
    assert [h["name"] for h in generated["spec"]["hosts"]] == ["master1", "worker1", "worker2"]
    assert deployed.hosts() == ["master1", "worker1", "worker2"]
    again = deployed.run("add", "nodes")
    assert again.rc == 0 and "already part of the CPod" in again.out


def test_delete_node(static: Deployed) -> None:
    plan = static.run("delete", "node", "worker2", "--dry-run")
    assert plan.rc == 0, plan.text
    assert "drain worker2 --ignore-daemonsets --delete-emptydir-data --timeout=300s" in plan.out
    assert f"delete node worker2 -f {static.work / 'kubekey-cluster.yaml'} --yes" in plan.out
    only = static.run("delete", "node", "master1", "--yes")
    assert only.rc == 2 and "master1 is the only control-plane host" in only.err
    unknown = static.run("delete", "node", "worker9", "--yes")
    assert unknown.rc == 2 and "not part of the deployed cluster" in unknown.err
    result = static.run("delete", "node", "worker2", "--yes")
    assert result.rc == 0, result.text
    assert "worker2 removed" in result.out and "delete it from `hosts:` and `roleGroups:`" in result.out
    assert static.calls("kube")[0]["argv"][-5:-3] == ["drain", "worker2"]
    assert static.calls("kk")[0]["argv"][1:4] == ["delete", "node", "worker2"]
    assert static.hosts() == ["master1", "worker1"]


def test_hosts_helper_is_loopback(make_hosts: MakeHosts) -> None:
    (host,) = make_hosts(["probe"], start=False)
    assert isinstance(host, SshdHost) and host.address.startswith("127.0.0.")
