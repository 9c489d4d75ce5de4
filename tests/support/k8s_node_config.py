"""The configuration files of one real test node (tests/support/k8s_node.py): containerd's, the CNI
bridge network's, the kubelet's, and CoreDNS's Corefile. Why each setting is there:
docs/k8s-testing.md, "Real nodes"."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

CLUSTER_DOMAIN = "cluster.local"
CNI_BIN_DIR = "/usr/lib/cni"
REAL_TAINT = {"key": "sxwl.test/real", "value": "true", "effect": "NoSchedule"}
REAL_LABEL = ("sxwl.test/node", "real")


@dataclass(frozen=True)
class NodePaths:
    """Everything of one node lives under `root` (a folder of pytest's temp dir)."""

    root: Path

    @property
    def containerd_root(self) -> Path:
        return self.root / "containerd"

    @property
    def containerd_state(self) -> Path:
        return self.root / "containerd-state"

    @property
    def socket(self) -> Path:
        return self.root / "containerd.sock"

    @property
    def cni_conf_dir(self) -> Path:
        return self.root / "cni" / "net.d"

    @property
    def kubelet_root(self) -> Path:
        return self.root / "kubelet"

    @property
    def logs(self) -> Path:
        return self.root / "logs"


def containerd_config(paths: NodePaths, sandbox_image: str, stream_ip: str) -> str:
    cri = '[plugins."io.containerd.grpc.v1.cri"'
    return f"""\
version = 2
root = "{paths.containerd_root}"
state = "{paths.containerd_state}"
# Only overlayfs is used: the others would only probe the host and log.
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
]

[grpc]
  address = "{paths.socket}"
[ttrpc]
  address = "{paths.socket}.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""

# Its default is /opt/containerd on the host.
[plugins."io.containerd.internal.v1.opt"]
  path = "{paths.containerd_root}/opt"

{cri}]
  sandbox_image = "{sandbox_image}"
  # runc cannot set a negative oom_score_adj here (no CAP_SYS_RESOURCE): never ask for less than ours.
  restrict_oom_score_adj = true
  disable_apparmor = true
  # exec/attach/port-forward: the kubelet (in the host's network namespace) proxies to this address.
  stream_server_address = "{stream_ip}"
  stream_server_port = "0"
{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  # runc's state, by default /run/containerd/runc on the host.
  Root = "{paths.containerd_state}/runc"
{cri}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{paths.cni_conf_dir}"
  max_conf_num = 1
"""


def cni_config(network: str, bridge: str, subnet: str, ipam_dir: Path) -> str:
    """A Linux bridge with host-local addresses; the bridge is the pods' gateway to the host."""
    bridge_plugin: dict[str, Any] = {
        "type": "bridge",
        "bridge": bridge,
        "isGateway": True,
        "ipMasq": False,
        "hairpinMode": True,
        "ipam": {
            "type": "host-local",
            "ranges": [[{"subnet": subnet}]],
            "routes": [{"dst": "0.0.0.0/0"}],
            "dataDir": str(ipam_dir),
        },
    }
    return json.dumps({"cniVersion": "1.0.0", "name": network, "plugins": [bridge_plugin]}, indent=2)


@dataclass(frozen=True)
class KubeletSettings:
    node_ip: str
    port: int
    healthz_port: int
    dns_ip: str
    ca_file: Path
    serving_cert: Path
    serving_key: Path
    cgroup_root: str


def kubelet_config(paths: NodePaths, s: KubeletSettings) -> str:
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": s.node_ip,
        "port": s.port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": s.healthz_port,
        "tlsCertFile": str(s.serving_cert),
        "tlsPrivateKeyFile": str(s.serving_key),
        # Only clients with a certificate of the test CA (the API server) reach its API.
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(s.ca_file)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "containerRuntimeEndpoint": f"unix://{paths.socket}",
        # This machine has cgroup v1 (hybrid) and no systemd; the kubelet refuses v1 unless told.
        "cgroupDriver": "cgroupfs",
        # A root per node: a kubelet removes the pod cgroups under its root that it does not know.
        "cgroupRoot": s.cgroup_root,
        "failCgroupV1": False,
        "failSwapOn": False,
        "clusterDNS": [s.dns_ip],
        "clusterDomain": CLUSTER_DOMAIN,
        # An empty base resolv.conf: pods get only the cluster's search domains and nameserver.
        "resolvConf": str(paths.root / "resolv.conf"),
        "podLogsDir": str(paths.root / "pod-logs"),
        "registerNode": True,
        "registerWithTaints": [REAL_TAINT],
        # The test images are imported, never pulled: image GC and disk-pressure eviction must not
        # remove them or the pods on a machine whose disk is fuller than a real node's would be.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "nodeStatusUpdateFrequency": "5s",
        "shutdownGracePeriod": "0s",
    }
    return yaml.safe_dump(config, sort_keys=False)


def corefile(listen_ip: str, ready_port: int, kubeconfig: Path) -> str:
    """The kubernetes plugin only: `<hostname>.<subdomain>.<ns>.svc.cluster.local` of headless
    Services, Service names and pod IP names; no upstream (the test machine has no other DNS to ask)."""
    return f"""\
{CLUSTER_DOMAIN}:53 {{
    bind {listen_ip}
    errors
    log
    ready 127.0.0.1:{ready_port}
    kubernetes {CLUSTER_DOMAIN} {{
        kubeconfig {kubeconfig} sxwl-test
        pods insecure
        ttl 5
    }}
}}
"""


def coredns_rbac(user: str) -> list[dict[str, Any]]:
    """What CoreDNS's kubernetes plugin reads, as its upstream manifests grant it."""
    rules = [
        {
            "apiGroups": [""],
            "resources": ["endpoints", "services", "pods", "namespaces"],
            "verbs": ["list", "watch"],
        },
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
    ]
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "sxwl-test:coredns"},
            "rules": rules,
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "sxwl-test:coredns"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "sxwl-test:coredns",
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        },
    ]
