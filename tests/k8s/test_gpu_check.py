"""scripts/gpu-check.sh k8s, the GPU check of the Kubernetes runtime, as far as it runs without a GPU:
on a machine without one it lists every missing prerequisite and starts nothing; against the test
control plane it runs its whole course (cloud, agent, a tiny-lm job asking for nvidia.com/gpu: 1)
and reports, in its summary, what only a real GPU node can pass."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.support.k8s import OUTCOME, K8sCluster

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu-check.sh"


def check_env(tmp_path: Path, path_prefix: str = "") -> dict[str, str]:
    """This test's sources for the venv's sxwl, and TMPDIR in tmp_path to see what the check leaves."""
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    entries = [str(Path(e).resolve()) for e in env.get("PYTHONPATH", "").split(os.pathsep) if e]
    env["PYTHONPATH"] = os.pathsep.join(entries)
    env["TMPDIR"] = str(tmp_path)
    if path_prefix:
        env["PATH"] = f"{path_prefix}{os.pathsep}{env['PATH']}"
    return env


def test_missing_prerequisites_are_listed_and_nothing_starts(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "no-such-kubeconfig"
    done = subprocess.run(
        [SCRIPT, "k8s", "--use-venv", sys.prefix, "--kubeconfig", str(kubeconfig)],
        env=check_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 3, done.stdout + done.stderr
    assert "missing: no --image: name an image with python3 and PyTorch" in done.stdout
    assert f"missing: no kubeconfig at {kubeconfig}: give --kubeconfig or set KUBECONFIG" in done.stdout
    assert "FAIL prerequisites:" in done.stdout and "nothing was started" in done.stdout
    assert [p.name for p in tmp_path.iterdir()] == []  # no work dir: no cloud, no agent


@pytest.mark.k8s
def test_the_check_runs_its_course_on_the_test_cluster(k8s_cluster: K8sCluster, tmp_path: Path) -> None:
    suffix = uuid.uuid4().hex[:6]
    (node,) = k8s_cluster.add_gpu_nodes(
        f"gpu-check-{suffix}", 1, product=f"NVIDIA-H200-CHECK-{suffix}", memory_mib=143771, gpus=1
    )
    # The prerequisites ask nvidia-smi for a GPU, which no machine of the test suite has: a stand-in
    # answers with a name. Everything else is real: KWOK's node, the API server, cloud and agent.
    stand_in = tmp_path / "bin"
    stand_in.mkdir()
    (stand_in / "nvidia-smi").write_text('#!/bin/sh\necho "NVIDIA H200"\n')
    (stand_in / "nvidia-smi").chmod(0o755)
    argv = [str(SCRIPT), "k8s", "--use-venv", sys.prefix, "--image", "registry.example/torch:1"]
    argv += ["--kubeconfig", str(k8s_cluster.kubeconfig), "--node", node, "--timeout", "150"]
    out = tmp_path / "check.out"
    with out.open("w") as log:
        proc = subprocess.Popen(
            argv, env=check_env(tmp_path, f"{stand_in}{os.pathsep}{k8s_cluster.bins}"), stdout=log, stderr=log
        )
        try:
            # KWOK runs no container: the pod ends as it is told, here with success.
            while proc.poll() is None:
                pods = json.loads(
                    k8s_cluster.kubectl("get", "pods", "-A", "-l", "sxwl.ai/job-id", "-o", "json")
                )
                for pod in pods["items"]:
                    if pod["spec"].get("nodeName") == node and OUTCOME not in pod["metadata"]["annotations"]:
                        meta = pod["metadata"]
                        k8s_cluster.kubectl(
                            "annotate", "pod", "-n", meta["namespace"], meta["name"], f"{OUTCOME}=succeed"
                        )
                time.sleep(0.5)
        finally:
            if proc.poll() is None:
                proc.terminate()
            proc.wait(60)
    text = out.read_text()
    summary = text.split("== summary ==", 1)[1]
    assert "PASS the CPod is online and shows the node's GPU" in summary
    tenant = next(line for line in summary.splitlines() if line.startswith("PASS the pod in "))
    assert tenant.endswith("asks for nvidia.com/gpu: 1"), summary
    assert "PASS the job succeeded (exit code 0)" in summary
    # What needs a real GPU node: the pod's log and its files.
    assert "FAIL the log does not show CUDA in use (the log is empty)" in summary
    assert "FAIL no checkpoint artifact" in summary
    assert proc.returncode == 1, text
    # Its namespaces go with it (the tenant's and the agent's own).
    namespace = tenant.split()[3]
    gone = k8s_cluster.kubectl("get", "namespace", namespace, "-o", "json", check=False)
    assert not gone or json.loads(gone)["status"]["phase"] == "Terminating"
