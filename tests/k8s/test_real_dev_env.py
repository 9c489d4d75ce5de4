"""A dev environment on a Kubernetes CPod (docs/dev-envs.md, "On Kubernetes"), on the real test
nodes: JupyterLab in a pod of the tenant's namespace, reached through the cloud and the agent's
tunnel at the pod's address, its workspace a PersistentVolumeClaim that outlives the pod. The test
control plane has no storage provisioner, but its kube-controller-manager runs the PV controller:
the claim binds to a PersistentVolume made here (hostPath, a storage class without provisioner)."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sxwl.agent.runtimes.kube_devenv import POLICY, claim_name
from sxwl.agent.runtimes.kube_objects import DEV_ENV
from tests.support.agent import eventually
from tests.support.k8s import K8sCluster
from tests.support.k8s_jupyter import jupyter_image
from tests.support.k8s_node import RealNodes
from tests.support.real_cpod import RealCPod

pytestmark = pytest.mark.k8s
pytest.importorskip("jupyterlab", reason="dev environments need the devenv extra: pip install -e '.[devenv]'")

PASSWORD = "correct horse"


class World:
    def __init__(self, cpod: RealCPod, volume: Path, storage_class: str) -> None:
        self.cpod, self.volume, self.storage_class = cpod, volume, storage_class
        self.email = f"dev-{uuid.uuid4().hex[:6]}@example.com"
        body = {"email": self.email, "password": PASSWORD, "role": "user"}
        httpx.post(f"{cpod.url}/api/v1/auth/register", json=body).raise_for_status()
        login = {"email": self.email, "password": PASSWORD}
        token = httpx.post(f"{cpod.url}/api/v1/auth/login", json=login).json()["access_token"]
        self.user = {"Authorization": f"Bearer {token}"}
        self.user_id: str = httpx.get(f"{cpod.url}/api/v1/me", headers=self.user).json()["id"]

    def console(self) -> httpx.Client:
        """A browser-like client signed in to the console (its session cookie, nothing else)."""
        client = httpx.Client(base_url=self.cpod.url, timeout=30)
        match = re.search(r'name="csrf_token" value="([^"]+)"', client.get("/login").text)
        assert match
        form = {"csrf_token": match.group(1), "email": self.email, "password": PASSWORD}
        assert client.post("/login", data=form).status_code in (200, 303)
        return client

    def env(self, env_id: str) -> dict[str, Any]:
        found: dict[str, Any] = httpx.get(
            f"{self.cpod.url}/api/v1/dev-envs/{env_id}", headers=self.user
        ).json()
        return found

    def kubectl_json(self, *args: str) -> dict[str, Any]:
        namespace = f"sxwl-tenant-{self.user_id}"
        text = self.cpod.cluster.kubectl("get", *args, "-n", namespace, "-o", "json", check=False)
        found: dict[str, Any] = json.loads(text) if text.strip() else {}
        return found


@pytest.fixture(scope="module")
def world(
    k8s_cluster: K8sCluster, real_nodes: RealNodes, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[World]:
    root = tmp_path_factory.mktemp("real-dev-env")
    volume = root / "volume"
    volume.mkdir()
    volume.chmod(0o777)  # hostPath volumes are not given to the pod's fsGroup
    storage_class = f"sxwl-test-ws-{uuid.uuid4().hex[:6]}"
    k8s_cluster.apply(
        [
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "StorageClass",
                "metadata": {"name": storage_class},
                "provisioner": "kubernetes.io/no-provisioner",
                "volumeBindingMode": "Immediate",
            },
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": storage_class},
                "spec": {
                    "capacity": {"storage": "1Gi"},
                    "accessModes": ["ReadWriteOnce"],
                    "persistentVolumeReclaimPolicy": "Retain",
                    "storageClassName": storage_class,
                    "hostPath": {"path": str(volume), "type": "Directory"},
                },
            },
        ]
    )
    cpod = None
    try:
        cpod = RealCPod(
            k8s_cluster,
            real_nodes,
            root,
            *("--dev-env-image", jupyter_image(real_nodes)),
            *("--workspace-storage-class", storage_class, "--workspace-size", "1Gi"),
        )
        yield World(cpod, volume, storage_class)
    finally:
        if cpod is not None:
            cpod.stop()
        for kind in ("pv", "storageclass"):
            k8s_cluster.kubectl("delete", kind, storage_class, "--wait=false", check=False)


def test_an_environment_keeps_its_workspace_claim_across_pause_and_resume(world: World) -> None:
    url, cpod = world.cpod.url, world.cpod
    created = httpx.post(f"{url}/api/v1/dev-envs", headers=world.user, json={"name": "k8s", "gpus": 0})
    assert created.status_code == 201, created.text
    env_id: str = created.json()["id"]
    claim = claim_name(env_id)
    base = f"/dev/{env_id}"
    browser = world.console()

    def lab_answers() -> bool:
        return (
            world.env(env_id)["status"] == "running" and browser.get(f"{base}/api/status").status_code == 200
        )

    eventually(
        lab_answers, timeout=180, what=f"JupyterLab through the tunnel; agent:\n{cpod.agent_log[-3000:]}"
    )
    pods = world.kubectl_json("pods", "-l", f"{DEV_ENV}={env_id}")["items"]
    assert len(pods) == 1
    spec = pods[0]["spec"]
    assert [
        v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if "persistentVolumeClaim" in v
    ] == [claim]
    main = next(c for c in spec["containers"] if c["name"] == "main")
    # Its token comes from a file of the Secret, never from its command line.
    assert not [arg for arg in main["command"] if "token" in arg.lower()]
    assert {"name": "JUPYTER_TOKEN_FILE", "value": "/sxwl-dev/token"} in main["env"]
    bound = world.kubectl_json("pvc", claim)
    assert bound["status"]["phase"] == "Bound" and bound["spec"]["volumeName"] == world.storage_class
    assert (
        world.kubectl_json("networkpolicy", POLICY)["spec"]["podSelector"]["matchExpressions"][0]["key"]
        == DEV_ENV
    )

    browser.get(f"{base}/lab")
    xsrf = browser.cookies.get("_xsrf")
    assert xsrf
    note = {"type": "file", "format": "text", "content": "kept on the claim\n"}
    written = browser.put(f"{base}/api/contents/hello.txt", json=note, headers={"X-XSRFToken": xsrf})
    assert written.status_code == 201, written.text
    assert (world.volume / "hello.txt").read_text() == "kept on the claim\n"

    # Pause: the pod goes, the claim stays.
    assert httpx.post(f"{url}/api/v1/dev-envs/{env_id}/pause", headers=world.user).status_code == 200
    eventually(lambda: world.env(env_id)["status"] == "paused", timeout=90, what="the environment paused")
    eventually(
        lambda: not world.kubectl_json("pods", "-l", f"{DEV_ENV}={env_id}")["items"],
        timeout=90,
        what="the environment's pod to be gone",
    )
    assert world.kubectl_json("pvc", claim)["status"]["phase"] == "Bound"

    # Resume: a new pod on the same claim, with the file.
    assert httpx.post(f"{url}/api/v1/dev-envs/{env_id}/resume", headers=world.user).status_code == 200
    eventually(lab_answers, timeout=180, what=f"JupyterLab again; agent:\n{cpod.agent_log[-3000:]}")
    read = browser.get(f"{base}/api/contents/hello.txt")
    assert read.status_code == 200 and read.json()["content"] == "kept on the claim\n"

    assert httpx.delete(f"{url}/api/v1/dev-envs/{env_id}", headers=world.user).status_code in (200, 202)
    eventually(lambda: world.env(env_id)["status"] == "stopped", timeout=90, what="the environment stopped")
    eventually(
        lambda: not world.kubectl_json("pods", "-l", f"{DEV_ENV}={env_id}")["items"],
        timeout=90,
        what="the environment's pod to be gone",
    )
    cpod.cluster.kubectl("delete", "pvc", claim, "-n", f"sxwl-tenant-{world.user_id}", check=False)
