"""What a killed test session leaves of its real nodes is cleared by the next one
(tests/support/k8s_leftovers.py): its recorded process groups, the processes in its nodes' network
namespaces and cgroups, the namespaces, veths and cgroup roots. Here a "killed session" is made by
hand with node index 3, which no session's `RealNodes` uses (they use 0 and 1), and pids and roots
files of the test's own, so the session's real nodes are never touched. In the Kubernetes group so that it
never runs while a `HostRestorer` on another worker compares the host."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.k8s_host import CGROUP_ROOT
from tests.support.k8s_leftovers import clear_leftovers, kubelet_only_tables, record_root, record_spawned
from tests.support.k8s_node_net import NodeNet, create_cgroup_root, create_network

pytestmark = pytest.mark.k8s

NET = NodeNet(3)
IP_FORWARD = Path("/proc/sys/net/ipv4/ip_forward")  # create_network turns it on


def _sleeper(*prefix: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([*prefix, "sleep", "600"], start_new_session=True)


def _dead(process: subprocess.Popen[bytes]) -> bool:
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        return False
    return True


def _v1_hierarchies() -> list[Path]:
    return [h for h in sorted(CGROUP_ROOT.iterdir()) if (h / "tasks").exists()]


def test_a_killed_sessions_nodes_are_cleared_and_nothing_else(tmp_path: Path) -> None:
    pids_file, roots_file, log_links = tmp_path / "pids", tmp_path / "roots", tmp_path / "containers"

    def clear() -> list[str]:
        return clear_leftovers(
            [NET], pids_file=pids_file, roots_file=roots_file, log_links=log_links, firewall=False
        )

    # The killed session's nodes' folder: a store, and a volume its kubelet left mounted.
    root = tmp_path / "killed session" / "real-nodes"
    (root / "real-3" / "containerd").mkdir(parents=True)
    (root / "real-3" / "containerd" / "blob").write_bytes(b"x" * 4096)
    volume = root / "real-3" / "kubelet" / "pods" / "p" / "volumes" / "token"
    volume.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(volume)], check=True)
    (volume / "token").write_text("secret")
    record_root(root, roots_file=roots_file)
    # Its kubelet's link to a container's log, and one of something else's.
    log = root / "real-3" / "kubelet" / "pods" / "p" / "main" / "0.log"
    log.parent.mkdir(parents=True)
    log.write_text("hello\n")
    log_links.mkdir()
    (log_links / "p_ns_main-1.log").symlink_to(log)
    (log_links / "other.log").symlink_to(tmp_path / "elsewhere.log")
    forwarding = IP_FORWARD.read_text()
    create_network(NET)
    create_cgroup_root(NET)
    kubelet = _sleeper()  # a process group the killed session spawned (its kubelet, say)
    record_spawned(kubelet.pid, pids_file=pids_file)
    shim = _sleeper("ip", "netns", "exec", NET.netns)  # lives in the node's network namespace
    pod = _sleeper()  # lives in the node's cgroup root, as a pod does
    for hierarchy in _v1_hierarchies():
        (hierarchy / NET.cgroup_root / "cgroup.procs").write_text(str(pod.pid))
    # A recorded pid that the kernel gave to another process since: its start time differs.
    bystander = _sleeper()
    with pids_file.open("a") as out:
        out.write(f"{bystander.pid} 1\n")
    try:
        cleared = clear()

        assert all(_dead(p) for p in (kubelet, shim, pod))
        assert bystander.poll() is None
        assert f"process group {kubelet.pid}" in cleared
        assert "1 processes in cgroup /sxwl-real-3" in cleared
        assert f"netns {NET.netns} (1 processes)" in cleared
        assert not Path("/run/netns", NET.netns).exists()
        link = subprocess.run(["ip", "link", "show", NET.host_link], capture_output=True, check=False)
        assert link.returncode != 0
        assert NET.pod_subnet not in subprocess.run(["ip", "route"], capture_output=True, text=True).stdout
        assert not any((h / NET.cgroup_root).exists() for h in _v1_hierarchies())
        assert f"folder {root} (0.0 GiB)" in cleared
        assert f"1 log links into {root}" in cleared
        assert [link.name for link in log_links.iterdir()] == ["other.log"]
        assert not root.exists() and root.parent.is_dir()
        findmnt = subprocess.run(["findmnt", "--mountpoint", str(volume)], capture_output=True, check=False)
        assert findmnt.returncode == 1  # the volume was unmounted, not removed through
        assert not pids_file.exists() and not roots_file.exists()
        # A clean host: nothing to clear, and a new node of the same index starts.
        assert clear() == []
        create_network(NET)
    finally:
        bystander.kill()
        for process in (kubelet, shim, pod):
            process.kill()
        subprocess.run(["ip", "netns", "delete", NET.netns], capture_output=True, check=False)
        subprocess.run(["umount", str(volume)], capture_output=True, check=False)
        clear()
        IP_FORWARD.write_text(forwarding)


# What `nft list ruleset` showed on this machine after a session was killed with its kubelets
# running, plus a table of someone else's and a base chain with a rule that is not the kubelet's.
RULESET = """
table ip mangle {
	chain KUBE-IPTABLES-HINT {
	}

	chain KUBE-KUBELET-CANARY {
	}
}
table ip filter {
	chain KUBE-FIREWALL {
		ip saddr != 127.0.0.0/8 ip daddr 127.0.0.0/8 ct status dnat counter packets 0 bytes 0 drop
	}

	chain OUTPUT {
		type filter hook output priority filter; policy accept;
		counter packets 1382466 bytes 406604236 jump KUBE-FIREWALL
	}

	chain KUBE-KUBELET-CANARY {
	}
}
table ip6 filter {
	chain INPUT {
		type filter hook input priority filter; policy accept;
		tcp dport 22 accept
		jump KUBE-FIREWALL
	}

	chain KUBE-FIREWALL {
	}
}
table inet mine {
	chain input {
		type filter hook input priority filter; policy accept;
	}
}
"""


def test_only_tables_of_nothing_but_the_kubelets_chains_are_removed() -> None:
    """The kubelet's firewall is cleared too (`firewall=True`, as RealNodes.start() calls it), but
    never a table with a rule of someone else's. Tested on text: a live nft here is the session's."""
    assert kubelet_only_tables(RULESET) == ["ip mangle", "ip filter"]
    assert kubelet_only_tables("") == []
