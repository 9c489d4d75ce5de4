"""The real worker nodes of tests/support/k8s_node.py (docs/k8s-testing.md, "Real nodes"): pods run
in containerd with the offline-built images, their logs and exit codes come back through kubectl,
cluster DNS resolves a headless Service's pod names from inside pods, pods connect over TCP, an image
gets repository files in a layer of their own, and stop() leaves the host as it found it."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import pytest

from tests.support.k8s import REPO, K8sCluster
from tests.support.k8s_host import HostState
from tests.support.k8s_images import PYTHON_IMAGE
from tests.support.k8s_node import RealNodes

pytestmark = pytest.mark.k8s

DONE = ("Succeeded", "Failed")


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def namespace(cluster: K8sCluster) -> str:
    name = unique("real")
    cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    return name


def python_pod(
    name: str, ns: str, code: str, *, image: str = PYTHON_IMAGE, node: str | None = None, **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": spec.pop("labels", {})},
        "spec": {
            "restartPolicy": "Never",
            **RealNodes.pod_placement(node),
            "containers": [
                {
                    "name": "main",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-c", code],
                }
            ],
            **spec,
        },
    }


def wait_phase(cluster: K8sCluster, name: str, ns: str, phases: tuple[str, ...], timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        pod = cluster.get("pod", name, ns)
        if pod.get("status", {}).get("phase") in phases:
            return pod
        if time.monotonic() > deadline:
            raise AssertionError(
                f"pod {ns}/{name} not {phases} after {timeout}s: {json.dumps(pod['status'])}"
            )
        time.sleep(0.5)


def exit_code(pod: Any) -> int:
    code: int = pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"]
    return code


def test_python_pod_log_and_exit_codes(k8s_cluster: K8sCluster, real_nodes: RealNodes) -> None:
    ns = namespace(k8s_cluster)
    ok = "import sys, numpy; print('python', sys.version_info[:2], 'numpy', numpy.__version__)"
    k8s_cluster.apply(
        [
            python_pod("ok", ns, ok),
            python_pod("fails", ns, "print('about to fail', flush=True); raise SystemExit(3)"),
        ]
    )
    done = wait_phase(k8s_cluster, "ok", ns, DONE)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert done["spec"]["nodeName"] in real_nodes.names
    assert exit_code(done) == 0
    assert k8s_cluster.kubectl("logs", "-n", ns, "ok").startswith("python (3, 11) numpy 1.")
    failed = wait_phase(k8s_cluster, "fails", ns, DONE)
    assert failed["status"]["phase"] == "Failed"
    assert exit_code(failed) == 3
    assert k8s_cluster.kubectl("logs", "-n", ns, "fails") == "about to fail\n"


SERVER = """
import socket
with socket.create_server(("", 7000)) as server:
    while True:
        conn, peer = server.accept()
        with conn:
            conn.sendall(f"hello {peer[0]} from {socket.gethostname()}\\n".encode())
"""

CLIENT = """
import json, socket, time
names = ["srv-0.peers", "srv-0.peers.{ns}.svc.cluster.local"]
deadline = time.monotonic() + 60
while True:
    try:
        addresses = {{n: socket.gethostbyname(n) for n in names}}
        with socket.create_connection((names[0], 7000), timeout=5) as conn:
            reply = conn.makefile().readline().strip()
        break
    except OSError as error:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.5)
print(json.dumps({{"addresses": addresses, "reply": reply, "resolv": open("/etc/resolv.conf").read()}}))
"""


def test_dns_of_a_headless_service_and_tcp_between_pods(
    k8s_cluster: K8sCluster, real_nodes: RealNodes
) -> None:
    ns = namespace(k8s_cluster)
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "peers", "namespace": ns},
        "spec": {"clusterIP": "None", "selector": {"app": "peer"}, "ports": [{"name": "tcp", "port": 7000}]},
    }
    # Server and client on different nodes: the connection crosses the host between their networks.
    first, last = real_nodes.names[0], real_nodes.names[-1]
    server = python_pod(
        "srv", ns, SERVER, node=first, hostname="srv-0", subdomain="peers", labels={"app": "peer"}
    )
    k8s_cluster.apply([service, server, python_pod("client", ns, CLIENT.format(ns=ns), node=last)])
    done = wait_phase(k8s_cluster, "client", ns, DONE)
    log = k8s_cluster.kubectl("logs", "-n", ns, "client")
    assert done["status"]["phase"] == "Succeeded", log
    result = json.loads(log)
    server_ip = k8s_cluster.get("pod", "srv", ns)["status"]["podIP"]
    assert result["addresses"] == {"srv-0.peers": server_ip, f"srv-0.peers.{ns}.svc.cluster.local": server_ip}
    client_ip = done["status"]["podIP"]
    assert done["spec"]["nodeName"] == last
    assert k8s_cluster.get("pod", "srv", ns)["spec"]["nodeName"] == first
    assert done["status"]["hostIP"] == real_nodes.node_ips[last]
    assert result["reply"] == f"hello {client_ip} from srv-0"
    assert f"nameserver {real_nodes.dns_ip}" in result["resolv"]
    assert f"search {ns}.svc.cluster.local svc.cluster.local cluster.local" in result["resolv"]
    # exec goes API server -> kubelet (host) -> containerd's stream server in the node's namespace.
    hostname = k8s_cluster.kubectl(
        "exec", "-n", ns, "srv", "--", "python3", "-c", "import os; print(os.uname()[1])"
    )
    assert hostname == "srv-0\n"
    k8s_cluster.kubectl("delete", "namespace", ns, "--wait=false")


def test_image_with_repository_files_runs_tiny_lm(k8s_cluster: K8sCluster, real_nodes: RealNodes) -> None:
    image = real_nodes.image_with_files(
        PYTHON_IMAGE, "sxwl.test/tiny-lm:test", {"/opt/tiny-lm": REPO / "examples" / "tiny-lm"}
    )
    assert image in real_nodes.images
    ns = namespace(k8s_cluster)
    code = (
        "import runpy, sys; sys.argv[1:] = '--steps 3 --backend numpy --output /tmp/out'.split();"
        "runpy.run_path('/opt/tiny-lm/train.py', run_name='__main__')"
    )
    k8s_cluster.apply(python_pod("train", ns, code, image=image))
    done = wait_phase(k8s_cluster, "train", ns, DONE)
    log = k8s_cluster.kubectl("logs", "-n", ns, "train")
    assert done["status"]["phase"] == "Succeeded", log
    assert "tiny-lm numpy MLP" in log
    assert "wrote /tmp/out/" in log


def test_stop_restores_the_host_and_start_again(k8s_cluster: K8sCluster, real_nodes: RealNodes) -> None:
    """With a pod running (a network namespace, a veth on the bridge, mounts, kubepods cgroups, the
    kubelet's firewall chains), stop() puts the host back as it was before start(); a new start()
    then serves pods again (the rest of the session needs it)."""
    ns = namespace(k8s_cluster)
    k8s_cluster.apply(python_pod("sleeper", ns, "import time; time.sleep(600)"))
    wait_phase(k8s_cluster, "sleeper", ns, ("Running",))
    before = real_nodes.host_before
    assert before is not None
    running = HostState.capture()
    changed = {line.split(":")[0] for line in before.differences(running)}
    assert {"links", "netns", "mounts", "cgroups", "firewall"} <= changed, changed

    real_nodes.stop()
    assert real_nodes.host_differences == []
    assert before.differences(HostState.capture()) == []

    real_nodes.start()
    k8s_cluster.apply(python_pod("again", ns, "print('again')"))
    done = wait_phase(k8s_cluster, "again", ns, DONE)
    assert done["status"]["phase"] == "Succeeded"
    assert k8s_cluster.kubectl("logs", "-n", ns, "again") == "again\n"
