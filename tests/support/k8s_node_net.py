"""The host side of the real test nodes (docs/k8s-testing.md, "Networking"): each node's containerd,
and so its CNI bridge and pods, lives in a network namespace of its own, joined to the host by a veth
pair; the kubelets stay in the host's namespace (they reach the API server on loopback) and each one
binds the host end of its node's veth, which is its node IP. Each kubelet also gets a cgroup root of
its own, so that none sees the other's pod cgroups as orphans to remove.

Node i:  host `sxwlv<i>` 10.251.<i>.1/30 (node IP)  <->  netns `sxwl-real-<i>` eth0 10.251.<i>.2/30,
         pods 10.250.<i>.0/24 behind the node's bridge; the host routes 10.250.<i>.0/24 via .2.
Everything here is undone by tests/support/k8s_host.py (new links, netns, cgroups, ip_forward).
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.support.k8s import StartError
from tests.support.k8s_host import CGROUP_ROOT


@dataclass(frozen=True)
class NodeNet:
    index: int

    @property
    def netns(self) -> str:
        return f"sxwl-real-{self.index}"

    @property
    def host_link(self) -> str:
        return f"sxwlv{self.index}"

    @property
    def node_ip(self) -> str:
        return f"10.251.{self.index}.1"

    @property
    def netns_ip(self) -> str:
        return f"10.251.{self.index}.2"

    @property
    def pod_subnet(self) -> str:
        return f"10.250.{self.index}.0/24"

    @property
    def cgroup_root(self) -> str:
        return f"sxwl-real-{self.index}"


def _ip(*args: str, netns: str | None = None) -> None:
    command = ["ip", *(["-n", netns] if netns else []), *args]
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=30)
    if result.returncode != 0:
        hint = ""
        if "File exists" in result.stderr:
            hint = (
                " (left by a test session that was killed before its teardown? stop its kubelets and "
                "containerds, then `ip netns delete sxwl-real-<i>`)"
            )
        raise StartError(f"{' '.join(command)} failed: {result.stderr.strip()}{hint}")


def create_network(net: NodeNet) -> None:
    """The node's namespace, its veth pair, addresses and routes; the host forwards between nodes."""
    _ip("netns", "add", net.netns)
    _ip("link", "add", net.host_link, "type", "veth", "peer", "name", "eth0", "netns", net.netns)
    _ip("addr", "add", f"{net.node_ip}/30", "dev", net.host_link)
    _ip("link", "set", net.host_link, "up")
    _ip("link", "set", "lo", "up", netns=net.netns)
    _ip("addr", "add", f"{net.netns_ip}/30", "dev", "eth0", netns=net.netns)
    _ip("link", "set", "eth0", "up", netns=net.netns)
    _ip("route", "add", "default", "via", net.node_ip, netns=net.netns)
    _ip("route", "add", net.pod_subnet, "via", net.netns_ip, "dev", net.host_link)
    # Pods of one node reach another's through the host (tests/support/k8s_host.py restores it).
    Path("/proc/sys/net/ipv4/ip_forward").write_text("1")


def create_cgroup_root(net: NodeNet) -> None:
    """`/<cgroup root>` in every cgroup v1 hierarchy (the kubelet checks that its root exists)."""
    for hierarchy in sorted(CGROUP_ROOT.iterdir()):
        if not (hierarchy / "tasks").exists():  # not a v1 hierarchy (the unified one, a symlink)
            continue
        path = hierarchy / net.cgroup_root
        path.mkdir(exist_ok=True)
        # A new cpuset has no CPUs nor memory nodes, so nothing could join it: inherit the parent's.
        for name in ("cpuset.cpus", "cpuset.mems"):
            if (path / name).exists() and not (path / name).read_text().strip():
                (path / name).write_text((hierarchy / name).read_text())
