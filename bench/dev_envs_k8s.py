"""What a dev environment's user waits for on a Kubernetes CPod (docs/dev-envs.md, "On Kubernetes"),
as bench/dev_envs.py measures it on a local one: create → first kernel execution and resume →
first kernel execution, after a first environment was created and stopped (a warm CPod), with
where each start's time went.

The world is tests/k8s/test_real_dev_env.py's: the tests' control plane and one real node
(kubelet, containerd, runc), the JupyterLab test image imported there, `sxwl serve` and a real
`sxwl-agent` on the Kubernetes runtime; each environment's workspace is a claim bound to a
hostPath volume. Everything shares this machine's CPUs. SSH throughput is bench/dev_envs.py's: the
tunnel's path from the agent on is the same. Appends a dated section to bench/RESULTS.md.
Run: ``.venv/bin/python bench/dev_envs_k8s.py`` (as root, like the tests' real nodes).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

from bench.common import Processes, append_results, interrupt_on_sigterm, machine_line, utc_now  # noqa: E402
from bench.dev_envs import Site, start_lines, starts  # noqa: E402
from tests.k8s.test_real_dev_env import World, persistent_volume, without_provisioner  # noqa: E402
from tests.support.k8s import K8sCluster, bin_dir  # noqa: E402
from tests.support.k8s_jupyter import jupyter_image  # noqa: E402
from tests.support.k8s_node import RealNodes  # noqa: E402
from tests.support.real_cpod import RealCPod  # noqa: E402

START_TIMEOUT_S = 300.0  # a pod's start on a loaded 2-core machine


def world(root: Path, processes: Processes) -> World:
    """The control plane, one real node with the JupyterLab image, a storage class with a volume
    for each of the bench's two claims, and a CPod (cloud and agent) using them."""
    cluster = K8sCluster(root=root / "cluster", bins=bin_dir()).start()
    processes.add(cluster.stop)
    nodes = RealNodes(cluster, root / "nodes", count=1).start()
    processes.add(nodes.stop)
    storage_class = without_provisioner(cluster, f"sxwl-bench-ws-{uuid.uuid4().hex[:6]}")
    volumes = root / "volumes"
    volumes.mkdir()
    volume = persistent_volume(cluster, volumes, storage_class, storage_class)
    persistent_volume(cluster, volumes, f"{storage_class}-b", storage_class)
    cpod = RealCPod(
        cluster,
        nodes,
        root / "cpod",
        *("--dev-env-image", jupyter_image(nodes)),
        *("--workspace-storage-class", storage_class, "--workspace-size", "1Gi"),
    )
    processes.add(cpod.stop)
    return World(cpod, volume, storage_class)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-append", action="store_true", help="print the results only")
    args = parser.parse_args()
    processes = Processes()
    with interrupt_on_sigterm(), tempfile.TemporaryDirectory(prefix="bench-dev-envs-k8s-") as tmp:
        try:
            load_before = os.getloadavg()[0]
            found = world(Path(tmp), processes)
            site = Site(found.cpod.url, found.user, found.console, START_TIMEOUT_S)
            timed = starts(site, {"gpus": 0})
            load_after = os.getloadavg()[0]
        finally:
            processes.stop_all()
    lines = [
        f"## dev_envs_k8s: {utc_now()}",
        "",
        "`bench/dev_envs_k8s.py`: a real agent on the Kubernetes runtime, one real node (kubelet, "
        "containerd, runc) running the JupyterLab test image, its workspace a claim, reached through "
        "`sxwl serve` and the tunnel; all processes, the control plane's included, share this "
        "machine's CPUs.",
        "",
        machine_line(),
        f"- 1-minute load average: {load_before:.2f} before, {load_after:.2f} after",
        "",
        *start_lines(timed),
    ]
    print("\n".join(lines))
    if not args.no_append:
        append_results("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
