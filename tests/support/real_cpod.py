"""A cloud and a Kubernetes CPod whose jobs run on the real test nodes (tests/support/k8s_node.py):
`sxwl serve` listening on the host's address (tenant pods upload their artifacts to it), a provider
and a user, and `sxwl-agent --runtime kubernetes` placing tenant pods on the real nodes. Used by
tests/k8s/test_real_jobs.py and bench/k8s_jobs.py."""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from sxwl.agent.runtimes.kube_objects import JOB_ID
from tests.support.agent import AgentProcess, eventually
from tests.support.cloud import CloudProcess
from tests.support.k8s import REPO, K8sCluster
from tests.support.k8s_images import PYTHON_IMAGE
from tests.support.k8s_node import RealNodes
from tests.support.k8s_node_config import REAL_LABEL, REAL_TAINT
from tests.support.net import free_port

# The tiny-lm example at /opt/tiny-lm of the Debian + python3 + numpy test image.
TINY_LM_IMAGE = "sxwl.test/tiny-lm:1"
TINY_LM_DIR = "/opt/tiny-lm"
TERMINAL = ("succeeded", "failed", "cancelled")


def tiny_lm_image(nodes: RealNodes) -> str:
    example = REPO / "examples" / "tiny-lm"
    files = {f"{TINY_LM_DIR}/{name}": example / name for name in ("train.py", "input.txt")}
    return nodes.image_with_files(PYTHON_IMAGE, TINY_LM_IMAGE, files)


def placement_flags() -> list[str]:
    """What a provider sets (chart values jobs.podNodeSelector / podTolerations) to keep sxwl's
    tenant pods on its dedicated nodes: here, the real nodes, never the KWOK ones."""
    taint = f"{REAL_TAINT['key']}={REAL_TAINT['value']}:{REAL_TAINT['effect']}"
    return ["--pod-node-selector", f"{REAL_LABEL[0]}={REAL_LABEL[1]}", "--pod-toleration", taint]


class RealCPod:
    """The cloud, its accounts and an agent for the real nodes; `stop()` ends both processes."""

    def __init__(
        self,
        cluster: K8sCluster,
        nodes: RealNodes,
        root: Path,
        *agent_flags: str,
        cloud_env: dict[str, str] | None = None,
    ) -> None:
        self.cluster, self.nodes, self.root = cluster, nodes, root
        self.image = tiny_lm_image(nodes)
        env = {
            "SXWL_DATABASE_URL": f"sqlite:///{root / 'sxwl.db'}",
            "SXWL_HEARTBEAT_INTERVAL_MIN_S": "0.1",
            "SXWL_LIVENESS_CHECK_S": "0.2",
            **(cloud_env or {}),
        }
        self.cloud = CloudProcess(
            root / "cloud", free_port(nodes.host_address), env=env, host=nodes.host_address
        )
        self.url = self.cloud.url
        self.agent: AgentProcess | None = None
        try:
            self.provider = self._account("provider")
            self.key: str = httpx.get(f"{self.url}/api/v1/me/access-key", headers=self.provider).json()[
                "access_key"
            ]
            self.user = self._account("user")
            self.user_id: str = httpx.get(f"{self.url}/api/v1/me", headers=self.user).json()["id"]
            self.agent_ns = f"sxwl-agent-{uuid.uuid4().hex[:6]}"
            cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.agent_ns}})
            self.agent_flags = [
                *("--runtime", "kubernetes", "--kubeconfig", str(cluster.kubeconfig)),
                *("--namespace", self.agent_ns, "--heartbeat-interval", "0.3", "--stop-grace", "3"),
                *("--name", f"real-{uuid.uuid4().hex[:4]}", "--uploader-image", self.image),
                *placement_flags(),
                *agent_flags,
            ]
            self.start_agent()
            eventually(self._online, timeout=60, what=f"the CPod online; agent log:\n{self.agent_log}")
        except BaseException:
            self.stop()
            raise

    @property
    def tenant_ns(self) -> str:
        return f"sxwl-tenant-{self.user_id}"

    @property
    def agent_log(self) -> str:
        return self.agent.log if self.agent is not None else ""

    def start_agent(self) -> AgentProcess:
        self.agent = AgentProcess(self.url, self.root / "agent", self.key, *self.agent_flags)
        return self.agent

    def stop(self) -> None:
        if self.agent is not None:
            self.agent.stop()
        self.cloud.stop()

    def _account(self, role: str) -> dict[str, str]:
        credentials = {"email": f"{role}-{uuid.uuid4().hex[:6]}@example.com", "password": "correct horse"}
        httpx.post(f"{self.url}/api/v1/auth/register", json={**credentials, "role": role}).raise_for_status()
        token = httpx.post(f"{self.url}/api/v1/auth/login", json=credentials).json()["access_token"]
        return {"Authorization": f"Bearer {token}"}

    def _online(self) -> bool:
        cpods = httpx.get(f"{self.url}/api/v1/cpods", headers=self.provider).json()
        return any(c["status"] == "online" for c in cpods)

    # ---- what a user does ------------------------------------------------------------------------

    def submit(self, command: str | list[str], *, image: str | None = None, **fields: Any) -> str:
        body = {"name": "real", "command": command, "image": image or self.image, "gpus_per_node": 0}
        response = httpx.post(f"{self.url}/api/v1/jobs", headers=self.user, json={**body, **fields})
        assert response.status_code == 201, response.text
        job_id: str = response.json()["id"]
        return job_id

    def tiny_lm(self, steps: int, **fields: Any) -> str:
        env = {"TINY_LM_DIR": TINY_LM_DIR, "TINY_LM_STEPS": str(steps), **fields.pop("env", {})}
        command = 'exec python3 "$TINY_LM_DIR/train.py"'
        return self.submit(command, name="tiny-lm", env=env, **fields)

    def job(self, job_id: str) -> dict[str, Any]:
        found: dict[str, Any] = httpx.get(f"{self.url}/api/v1/jobs/{job_id}", headers=self.user).json()
        return found

    def wait(
        self, job_id: str, check: Callable[[dict[str, Any]], bool], timeout: float, what: str
    ) -> dict[str, Any]:
        def seen() -> dict[str, Any] | None:
            job = self.job(job_id)
            return job if check(job) else None

        return eventually(
            seen,
            timeout=timeout,
            what=f"job {job_id} {what}; agent log tail:\n{self.agent_log[-3000:]}",
        )

    def finished(self, job_id: str, timeout: float = 180) -> dict[str, Any]:
        return self.wait(job_id, lambda j: j["state"] in TERMINAL, timeout, "to end")

    def log(self, job_id: str) -> str:
        return httpx.get(f"{self.url}/api/v1/jobs/{job_id}/logs", headers=self.user).text

    def artifacts(self, job_id: str) -> dict[str, dict[str, Any]]:
        listed = httpx.get(f"{self.url}/api/v1/jobs/{job_id}/artifacts", headers=self.user).json()
        return {a["path"]: a for a in listed}

    def download(self, job_id: str, path: str) -> bytes:
        response = httpx.get(f"{self.url}/api/v1/jobs/{job_id}/artifacts/{path}", headers=self.user)
        response.raise_for_status()
        data = response.content
        assert hashlib.sha256(data).hexdigest() == self.artifacts(job_id)[path]["sha256"]
        return data

    def pods(self, job_id: str) -> list[dict[str, Any]]:
        text = self.cluster.kubectl(
            "get", "pods", "-n", self.tenant_ns, "-l", f"{JOB_ID}={job_id}", "-o", "json", check=False
        )
        items: list[dict[str, Any]] = json.loads(text)["items"] if text.strip() else []
        return items

    def nothing_left(self, job_id: str, timeout: float = 90) -> None:
        """No pod of the job is left in the cluster (the agent deletes the Job once it reported)."""
        eventually(lambda: not self.pods(job_id), timeout=timeout, what=f"job {job_id}'s pods to be gone")
