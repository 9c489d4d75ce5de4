"""How long a tiny-lm job takes to show its first log line and to hand back its checkpoint, on a
Kubernetes CPod whose pods run on a real node (tests/support/k8s_node.py) against the local runtime,
in the same run.

Starts the test control plane, one real node (kubelet + containerd + runc), a cloud with
`sxwl-agent --runtime kubernetes` (tests/support/real_cpod.py) and a second cloud with
`sxwl-agent --runtime local`; submits the same tiny-lm job (``--steps`` steps, numpy) ``--repeat``
times to each, one at a time, and measures from the job's ``assigned`` event (the cloud's clock; the
client runs on the same machine):

- **first log line**: until the job's log, read through the API every 50 ms, is not empty;
- **artifact downloadable**: until the checkpoint is listed and its bytes came down.

Prints the medians and the ratio Kubernetes / local, and appends a dated section to bench/RESULTS.md.
Run (as root, after ``make k8s-bins``): ``.venv/bin/python bench/k8s_jobs.py [--repeat 3] [--steps 60]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

import httpx  # noqa: E402
from bench.common import Processes, append_results, interrupt_on_sigterm  # noqa: E402
from tests.support.agent import AgentProcess, eventually  # noqa: E402
from tests.support.cloud import CloudProcess  # noqa: E402
from tests.support.k8s import K8sCluster, bin_dir  # noqa: E402
from tests.support.k8s_node import RealNodes  # noqa: E402
from tests.support.net import free_port  # noqa: E402
from tests.support.real_cpod import RealCPod  # noqa: E402

POLL_S = 0.05


class Target:
    """Where a job is submitted and how its progress is read: the cloud's URL and a user's headers."""

    def __init__(self, url: str, user: dict[str, str], body: Callable[[int], dict[str, Any]]) -> None:
        self.url, self.user, self.body = url, user, body

    def get(self, path: str) -> httpx.Response:
        return httpx.get(f"{self.url}/api/v1/jobs/{path}", headers=self.user, timeout=30)

    def run(self, steps: int) -> tuple[float, float]:
        """One job: (seconds from assignment to the first log line, to the checkpoint downloaded)."""
        response = httpx.post(f"{self.url}/api/v1/jobs", headers=self.user, json=self.body(steps))
        response.raise_for_status()
        job_id = response.json()["id"]
        _, first_log = until(lambda: self.get(f"{job_id}/logs").content, "first log line")
        artifacts, _ = until(
            lambda: [a for a in self.get(f"{job_id}/artifacts").json() if a["path"].startswith("checkpoint")],
            "checkpoint",
        )
        self.get(f"{job_id}/artifacts/{artifacts[0]['path']}").raise_for_status()
        downloaded = time.time()
        events = self.get(f"{job_id}/events").json()
        assigned = datetime.fromisoformat(
            next(e["at"] for e in events if e["kind"] == "assigned")
        ).timestamp()
        until(lambda: self.get(job_id).json()["state"] in ("succeeded", "failed"), "end")
        return first_log - assigned, downloaded - assigned


def until(check: Callable[[], Any], what: str, timeout: float = 300) -> tuple[Any, float]:
    """The first truthy value ``check`` returns, polled every 50 ms, and the time.time() it came."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value, time.time()
        time.sleep(POLL_S)
    raise TimeoutError(f"no {what} after {timeout} s")


def account(url: str, role: str) -> dict[str, str]:
    credentials = {"email": f"bench-{role}@example.com", "password": "correct horse"}
    httpx.post(f"{url}/api/v1/auth/register", json={**credentials, "role": role}).raise_for_status()
    token = httpx.post(f"{url}/api/v1/auth/login", json=credentials).json()["access_token"]
    return {"Authorization": f"Bearer {token}"}


def local_target(root: Path, processes: Processes) -> Target:
    cloud = CloudProcess(
        root / "cloud", free_port(), env={"SXWL_DATABASE_URL": f"sqlite:///{root / 'local.db'}"}
    )
    processes.add(cloud.stop)
    provider, user = account(cloud.url, "provider"), account(cloud.url, "user")
    key = httpx.get(f"{cloud.url}/api/v1/me/access-key", headers=provider).json()["access_key"]
    agent = AgentProcess(cloud.url, root / "agent", key, "--heartbeat-interval", "0.3", "--name", "local")
    processes.add(agent.stop)
    eventually(
        lambda: any(
            c["status"] == "online" for c in httpx.get(f"{cloud.url}/api/v1/cpods", headers=provider).json()
        ),
        timeout=60,
        what="the local CPod online",
    )
    example = ROOT / "examples" / "tiny-lm"

    def body(steps: int) -> dict[str, Any]:
        command = f'exec {sys.executable} "{example}/train.py" --backend numpy'
        return {
            "name": "tiny-lm",
            "command": command,
            "gpus_per_node": 0,
            "env": {"TINY_LM_STEPS": str(steps)},
        }

    return Target(cloud.url, user, body)


def k8s_target(root: Path, processes: Processes) -> Target:
    cluster = K8sCluster(root=root / "cluster", bins=bin_dir()).start()
    processes.add(cluster.stop)
    nodes = RealNodes(cluster, root / "nodes", count=1).start()
    processes.add(nodes.stop)
    cpod = RealCPod(cluster, nodes, root / "cpod")
    processes.add(cpod.stop)

    def body(steps: int) -> dict[str, Any]:
        env = {"TINY_LM_DIR": "/opt/tiny-lm", "TINY_LM_STEPS": str(steps), "TINY_LM_BACKEND": "numpy"}
        command = 'exec python3 "$TINY_LM_DIR/train.py"'
        return {"name": "tiny-lm", "command": command, "image": cpod.image, "gpus_per_node": 0, "env": env}

    return Target(cpod.url, cpod.user, body)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    processes = Processes()
    results: dict[str, list[tuple[float, float]]] = {"kubernetes": [], "local": []}
    with interrupt_on_sigterm(), tempfile.TemporaryDirectory(prefix="bench-k8s-jobs-") as temp:
        try:
            targets = {
                "kubernetes": k8s_target(Path(temp) / "k8s", processes),
                "local": local_target(Path(temp) / "local", processes),
            }
            for _ in range(args.repeat):
                for name, target in targets.items():
                    results[name].append(target.run(args.steps))
        finally:
            processes.stop_all()
    median = {
        name: (statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs))
        for name, runs in results.items()
    }
    lines = [
        f"tiny-lm, {args.steps} steps (numpy), {args.repeat} runs each, medians from the `assigned` event:",
        "",
        "| runtime | first log line | checkpoint downloaded |",
        "|---|---|---|",
        *(f"| {name} | {first:.2f} s | {artifact:.2f} s |" for name, (first, artifact) in median.items()),
        "| kubernetes / local | "
        + " | ".join(f"{median['kubernetes'][i] / median['local'][i]:.1f}x" for i in (0, 1))
        + " |",
        "",
        "Every run (first log, checkpoint) in s: "
        + "; ".join(
            f"{name} " + ", ".join(f"({a:.2f}, {b:.2f})" for a, b in runs) for name, runs in results.items()
        ),
    ]
    print("\n".join(lines))
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    machine = f"{platform.node()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}"
    header = f"## k8s_jobs: {stamp}\n\n- {machine}\n\n"
    append_results(header + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
