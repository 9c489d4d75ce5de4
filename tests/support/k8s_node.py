"""Real worker nodes for the test cluster of tests/support/k8s.py (docs/k8s-testing.md, "Real
nodes"): per node a containerd (Debian's, with runc and the CNI plugins) and the pinned kubelet, plus
one CoreDNS as a host process serving cluster.local from the API server. Pods on these nodes really
run: their logs, exit codes, DNS names and TCP connections are the real ones.

The nodes carry the taint `sxwl.test/real=true:NoSchedule` and the label `sxwl.test/node=real`, so
nothing meant for the KWOK nodes lands on them; a pod that wants one tolerates the taint and selects
the label (`RealNodes.pod_placement()`). Images come from scripts/k8s-test-images.sh and are imported,
never pulled (`imagePullPolicy: IfNotPresent` or `Never`).

Each node's containerd, CNI bridge and pods live in a network namespace of their own; the kubelets
and CoreDNS run in the host's (tests/support/k8s_node_net.py). Every process runs in its own process
group and is stopped by its pid; `stop()` then puts back what the kubelet, containerd and the CNI
plugins changed on the host (tests/support/k8s_host.py). One session per machine at a time (a lock
file says so): the nodes use the host's firewall, sysctls, port 53 of the host address and the
kubelet's fixed device-plugin folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tests.support.k8s import K8sCluster, StartError, stop_group
from tests.support.k8s_host import HostRestorer, HostState
from tests.support.k8s_images import (
    PAUSE_IMAGE,
    base_layouts,
    import_archive,
    import_layout,
    layout_with_files,
)
from tests.support.k8s_leftovers import clear_leftovers, forget_spawned, record_root, record_spawned
from tests.support.k8s_node_config import (
    REAL_LABEL,
    REAL_TAINT,
    KubeletSettings,
    NodePaths,
    cni_config,
    containerd_config,
    coredns_rbac,
    corefile,
    kubelet_config,
)
from tests.support.k8s_node_net import NodeNet, create_cgroup_root, create_network
from tests.support.net import free_port

HOST_TOOLS = (
    "containerd",
    "containerd-shim-runc-v2",
    "runc",
    "ctr",
    "nsenter",
    "ip",
    "iptables",
    "nft",
)
MAX_NODES = 4  # pods 10.250.<i>.0/24, links 10.251.<i>.0/30: any small number fits
LOCK_FILE = Path("/tmp/sxwl-test-real-nodes.lock")
COREDNS_USER = "sxwl-test:coredns"
logger = logging.getLogger(__name__)


def host_ip() -> str:
    """The source address of the default route: the node IP (the kubelet refuses loopback ones)."""
    out = subprocess.run(
        ["ip", "-4", "-o", "route", "get", "1.0.0.1"], capture_output=True, text=True, check=False
    )
    words = out.stdout.split()
    if out.returncode != 0 or "src" not in words:
        raise StartError(f"no default IPv4 route, so no node IP for a real node: {out.stderr.strip()}")
    return words[words.index("src") + 1]


@dataclass
class _Process:
    name: str
    process: subprocess.Popen[bytes]
    log: Path


@dataclass
class _Node:
    name: str
    net: NodeNet
    paths: NodePaths
    kubelet_port: int = 0
    healthz_port: int = 0

    @property
    def ip(self) -> str:
        return self.net.node_ip


class RealNodes:
    """`count` real nodes named `real-0`, `real-1`, … joined to `cluster`; start() and stop()."""

    def __init__(self, cluster: K8sCluster, root: Path, count: int = 2) -> None:
        if not 1 <= count <= MAX_NODES:
            raise ValueError(f"1 to {MAX_NODES} real nodes, not {count}")
        missing = [tool for tool in HOST_TOOLS if shutil.which(tool) is None]
        if missing:
            raise StartError(
                f"real test nodes need {', '.join(missing)} on PATH: run scripts/install-test-deps.sh"
            )
        for binary in ("kubelet", "coredns"):
            if not os.access(cluster.bins / binary, os.X_OK):
                raise StartError(f"{cluster.bins / binary} is missing: run `make k8s-bins`")
        self.cluster = cluster
        self.root = root
        self.host_address = host_ip()
        self._nodes = [_Node(f"real-{i}", NodeNet(i), NodePaths(root / f"real-{i}")) for i in range(count)]
        self._processes: list[_Process] = []
        self._lock: IO[str] | None = None
        self._restorer: HostRestorer | None = None
        self._layouts: dict[str, Path] = {}
        self.host_before: HostState | None = None
        self.host_differences: list[str] = []
        self._registered = False

    # -- what tests use --

    @property
    def names(self) -> list[str]:
        return [node.name for node in self._nodes]

    @property
    def dns_ip(self) -> str:
        """Where pods send DNS queries: CoreDNS on port 53 of `host_address`."""
        return self.host_address

    @property
    def node_ips(self) -> dict[str, str]:
        """Each node's InternalIP (its pods' hostIP): the host end of its veth, where its kubelet listens."""
        return {node.name: node.ip for node in self._nodes}

    @property
    def pod_subnets(self) -> list[str]:
        """The nodes' pod networks (routed from the host, not masqueraded): where pods' packets come from."""
        return [node.net.pod_subnet for node in self._nodes]

    @property
    def images(self) -> list[str]:
        return list(self._layouts)

    @staticmethod
    def pod_placement(node: str | None = None) -> dict[str, Any]:
        """The pod spec fields that put a pod on a real node (on `node` when given)."""
        selector = {REAL_LABEL[0]: REAL_LABEL[1]}
        if node is not None:
            selector["kubernetes.io/hostname"] = node
        return {"nodeSelector": selector, "tolerations": [{**REAL_TAINT, "operator": "Equal"}]}

    def has_image(self, ref: str) -> bool:
        """Whether image `ref` is imported into the nodes (a base one, or made by image_with_files)."""
        return ref in self._layouts

    def image_with_files(self, base: str, name: str, files: dict[str, Path]) -> str:
        """Image `name` = image `base` plus `files` ({path in the image: file or folder here}) as one
        layer, imported into every node; returns `name`."""
        if base not in self._layouts:
            raise ValueError(f"unknown base image {base!r}; known: {', '.join(self._layouts)}")
        layout = layout_with_files(self._layouts[base], base, name, files, self.root / "images")
        self._import(name, layout)
        return name

    def import_archive(self, archive: Path, ref: str, node: str) -> str:
        """An OCI archive's image into one node's containerd as `ref`; returns its manifest digest."""
        [found] = [n for n in self._nodes if n.name == node]
        return import_archive(archive, ref, found.paths.socket)

    # -- lifecycle --

    def start(self, timeout: float = 180.0) -> RealNodes:
        """``timeout``: for the processes to come up, counted apart from the images' import (a
        restart imports every image the session built again, minutes on a loaded machine)."""
        try:
            self._start(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        self._take_lock()
        cleared = clear_leftovers([node.net for node in self._nodes])
        if cleared:
            logger.warning(
                "cleared what a killed test session left of its real nodes: %s", "; ".join(cleared)
            )
        record_root(self.root)
        for ref, layout in base_layouts().items():
            self._layouts.setdefault(ref, layout)
        self.host_before = HostState.capture()
        self.host_differences = []
        self._restorer = HostRestorer(self.host_before, [self.root])
        self._start_coredns(deadline)
        for node in self._nodes:
            node.kubelet_port, node.healthz_port = free_port(), free_port()
            # Runtime state only: whatever a previous start left there is stale.
            shutil.rmtree(node.paths.containerd_state, ignore_errors=True)
            create_network(node.net)
            create_cgroup_root(node.net)
            self._start_containerd(node, deadline)
        for ref, layout in self._layouts.items():
            self._import(ref, layout)
        deadline = max(deadline, time.monotonic() + timeout / 2)
        kubelets = [self._start_kubelet(node) for node in self._nodes]
        for node, kubelet in zip(self._nodes, kubelets, strict=True):
            # `kubectl wait` fails at once on a node that is not registered yet: poll for it first.
            self._wait(kubelet, deadline, functools.partial(self._node_ready, node.name))

    def stop(self) -> None:
        """Removes the nodes' pods, stops every process by its pid and restores the host; safe after
        a failed or partial start, and a second time. Then `host_differences` lists what still differs
        from `host_before` (empty when the host is as it was), and `start()` may be called again."""
        if any(p.name.startswith("kubelet") and p.process.poll() is None for p in self._processes):
            self._drain()
        for proc in reversed(self._processes):
            if proc.name.startswith("containerd"):
                self._kill_tasks(proc)
            stop_group(proc.process)
        for node in self._nodes:
            self._kill_shims(node)
        self._processes.clear()
        if self._restorer is not None:
            restorer, self._restorer = self._restorer, None
            problems = restorer.restore()
            after = HostState.capture()
            self.host_differences = problems + restorer.before.differences(after)
        if self._registered:
            self.cluster.kubectl("delete", "node", *self.names, "--ignore-not-found", check=False)
            self._registered = False
        if self._lock is not None:
            forget_spawned()
            self._lock.close()
            self._lock = None

    def __enter__(self) -> RealNodes:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tails(self, lines: int = 30) -> str:
        parts = []
        for log in sorted(self.root.glob("**/logs/*.log")):
            tail = log.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {log} (last {len(tail)} lines) ---\n" + "\n".join(tail))
        return "\n".join(parts)

    # -- internals --

    def _take_lock(self) -> None:
        lock = LOCK_FILE.open("a")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.close()
            raise StartError(
                f"another test session runs real nodes on this machine ({LOCK_FILE} is locked); "
                "they share the host's cgroups, firewall and DNS port, so one at a time"
            ) from None
        self._lock = lock

    def _spawn(self, name: str, args: list[str], logs: Path) -> _Process:
        logs.mkdir(parents=True, exist_ok=True)
        log = logs / f"{name}.log"
        with log.open("ab") as out:
            process = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: stopped through it, never by name
                cwd=logs.parent,
            )
        record_spawned(process.pid)
        proc = _Process(name, process, log)
        self._processes.append(proc)
        return proc

    def _wait(self, proc: _Process, deadline: float, ready: Callable[[], bool]) -> None:
        while not ready():
            if proc.process.poll() is not None:
                raise StartError(
                    f"{proc.name} exited with code {proc.process.returncode} (logs in {proc.log.parent}):\n"
                    f"{self.log_tails()}"
                )
            if time.monotonic() > deadline:
                raise StartError(f"{proc.name} did not become ready in time:\n{self.log_tails()}")
            time.sleep(0.25)

    def _start_coredns(self, deadline: float) -> None:
        work = self.root / "coredns"
        work.mkdir(parents=True, exist_ok=True)
        cert, key = self.cluster.issue_certificate("coredns", COREDNS_USER, client=True)
        kubeconfig = self.cluster.write_cert_kubeconfig(work / "coredns.kubeconfig", cert, key)
        self.cluster.apply(coredns_rbac(COREDNS_USER))
        ready_port = free_port()
        (work / "Corefile").write_text(corefile(self.dns_ip, ready_port, kubeconfig))
        proc = self._spawn(
            "coredns", [str(self.cluster.bins / "coredns"), "-conf", str(work / "Corefile")], work / "logs"
        )
        self._wait(proc, deadline, lambda: _http_ok(f"http://127.0.0.1:{ready_port}/ready"))

    def _start_containerd(self, node: _Node, deadline: float) -> None:
        paths = node.paths
        paths.cni_conf_dir.mkdir(parents=True, exist_ok=True)
        (paths.cni_conf_dir / "10-sxwl.conflist").write_text(
            cni_config(f"sxwl-{node.name}", "cni0", node.net.pod_subnet, paths.root / "ipam")
        )
        config = paths.root / "containerd.toml"
        config.write_text(containerd_config(paths, PAUSE_IMAGE, node.net.netns_ip))
        # In the node's network namespace only (nsenter execs it: the pid is containerd's): the CNI
        # plugins it runs put the bridge and the pods' veths there. Mounts stay the host's.
        netns = f"--net=/run/netns/{node.net.netns}"
        proc = self._spawn(
            f"containerd-{node.name}",
            ["nsenter", netns, "containerd", f"--config={config}", "--log-level=info"],
            paths.logs,
        )
        self._wait(proc, deadline, lambda: self._ctr(node, "version").returncode == 0)

    def _node_ready(self, name: str) -> bool:
        out = self.cluster.kubectl(
            "get",
            "node",
            name,
            "--ignore-not-found",
            "-o",
            "jsonpath={.status.conditions[?(@.type=='Ready')].status}",
            check=False,
        )
        return out.strip() == "True"

    def _start_kubelet(self, node: _Node) -> _Process:
        paths = node.paths
        cert, key = self.cluster.issue_certificate(
            f"kubelet-{node.name}", f"system:node:{node.name}", ["system:nodes"], client=True
        )
        kubeconfig = self.cluster.write_cert_kubeconfig(paths.root / "kubelet.kubeconfig", cert, key)
        serving_cert, serving_key = self.cluster.issue_certificate(
            f"kubelet-{node.name}-serving", node.name, server=True, ips=[node.ip]
        )
        (paths.root / "resolv.conf").write_text("")
        settings = KubeletSettings(
            node_ip=node.ip,
            port=node.kubelet_port,
            healthz_port=node.healthz_port,
            dns_ip=self.dns_ip,
            ca_file=self.cluster.ca_file,
            serving_cert=serving_cert,
            serving_key=serving_key,
            cgroup_root=f"/{node.net.cgroup_root}",
        )
        config = paths.root / "kubelet.yaml"
        config.write_text(kubelet_config(paths, settings))
        self._registered = True
        return self._spawn(
            f"kubelet-{node.name}",
            [
                str(self.cluster.bins / "kubelet"),
                f"--config={config}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={paths.kubelet_root}",
                f"--node-ip={node.ip}",
                f"--hostname-override={node.name}",
                f"--node-labels={REAL_LABEL[0]}={REAL_LABEL[1]}",
                "--v=2",
            ],
            paths.logs,
        )

    def _import(self, ref: str, layout: Path) -> None:
        """Into every node's containerd at once (unpacking the layers is most of a start's time), but
        a node whose image store has ``ref`` from this same layout already: after a restart (the store
        outlives containerd), or a second test asking for the same image. Streaming the trainer
        image's 3 GB again took minutes a time."""
        same = self._layouts.get(ref) == layout
        nodes = [n for n in self._nodes if not (same and ref in self._images(n))]
        with ThreadPoolExecutor(max(len(nodes), 1)) as pool:
            for done in [pool.submit(import_layout, layout, ref, node.paths.socket) for node in nodes]:
                done.result()
        self._layouts[ref] = layout

    def _images(self, node: _Node) -> set[str]:
        listed = self._ctr(node, "images", "ls", "-q")
        return set(listed.stdout.split()) if listed.returncode == 0 else set()

    def _ctr(self, node: _Node, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ctr", f"--address={node.paths.socket}", "-n", "k8s.io", *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )

    def _drain(self) -> None:
        """Deletes the pods on the nodes through the API, so the kubelet stops their containers and
        sandboxes (and the CNI plugin takes their network down) before it stops."""
        for node in self._nodes:
            self.cluster.kubectl(
                "delete",
                "pods",
                "--all",
                "--all-namespaces",
                f"--field-selector=spec.nodeName={node.name}",
                "--grace-period=1",
                "--wait=true",
                "--timeout=60s",
                check=False,
                timeout=90,
            )

    def _kill_tasks(self, proc: _Process) -> None:
        node = next(n for n in self._nodes if proc.name == f"containerd-{n.name}")
        if proc.process.poll() is not None:
            return
        listed = self._ctr(node, "tasks", "ls", "-q")
        for task in listed.stdout.split():
            self._ctr(node, "tasks", "kill", "--signal=SIGKILL", task)
            self._ctr(node, "tasks", "delete", "--force", task)

    def _kill_shims(self, node: _Node) -> None:
        """containerd's shims run in process groups of their own: stopped by the pids they record."""
        for pid_file in node.paths.containerd_state.glob("io.containerd.runtime.v2.task/*/*/shim.pid"):
            try:
                pid = int(pid_file.read_text().strip())
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except (OSError, ValueError):
                continue
            if b"containerd-shim" in cmdline and pid_file.parent.name.encode() in cmdline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 (loopback http)
            return bool(response.status == 200)
    except (OSError, urllib.error.URLError):
        return False
