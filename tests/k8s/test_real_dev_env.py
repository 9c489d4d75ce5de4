"""A dev environment on a Kubernetes CPod (docs/dev-envs.md, "On Kubernetes"), on the real test
nodes: JupyterLab in a pod of the tenant's namespace, reached through the cloud and the agent's
tunnel at the pod's address, its workspace a PersistentVolumeClaim that outlives the pod and is
saved to the cloud's artifact store by each pause; SSH into it with this machine's OpenSSH client
through ``sxwl dev ssh-config``'s ProxyCommand; and, its CPod revoked and its claim gone, a resume
on another CPod (a second provider's agent on the same cluster) with the saved workspace restored.
The test control plane has no storage provisioner, but its kube-controller-manager runs the PV
controller: each claim binds to a PersistentVolume made here (hostPath, a storage class without
provisioner)."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sxwl.agent.runtimes.kube_devenv import POLICY, claim_name
from sxwl.agent.runtimes.kube_objects import DEV_ENV
from tests.support.agent import AgentProcess, eventually
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

    def artifact(self, job_id: str, path: str) -> bytes:
        response = httpx.get(f"{self.cpod.url}/api/v1/jobs/{job_id}/artifacts/{path}", headers=self.user)
        response.raise_for_status()
        return response.content

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
    storage_class = without_provisioner(k8s_cluster, f"sxwl-test-ws-{uuid.uuid4().hex[:6]}")
    volume = persistent_volume(k8s_cluster, root, storage_class, storage_class)
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
        for kind, name in (
            ("pv", storage_class),
            ("pv", f"{storage_class}-b"),
            ("storageclass", storage_class),
        ):
            k8s_cluster.kubectl("delete", kind, name, "--wait=false", check=False)


def without_provisioner(cluster: K8sCluster, name: str) -> str:
    """A storage class ``name`` whose claims bind to volumes made by hand (persistent_volume)."""
    cluster.apply(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": name},
            "provisioner": "kubernetes.io/no-provisioner",
            "volumeBindingMode": "Immediate",
        }
    )
    return name


def persistent_volume(cluster: K8sCluster, root: Path, name: str, storage_class: str) -> Path:
    """A 1 GiB hostPath volume of ``storage_class`` named ``name``: the folder that holds it."""
    volume = root / name
    volume.mkdir()
    volume.chmod(0o777)  # hostPath volumes are not given to the pod's fsGroup
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": name},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "storageClassName": storage_class,
                "hostPath": {"path": str(volume), "type": "Directory"},
            },
        }
    )
    return volume


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

    # Pause: the pod goes, the claim stays, and the workspace is saved to the artifact store.
    paused_job = world.env(env_id)["job_id"]
    assert httpx.post(f"{url}/api/v1/dev-envs/{env_id}/pause", headers=world.user).status_code == 200
    eventually(lambda: world.env(env_id)["status"] == "paused", timeout=90, what="the environment paused")
    eventually(
        lambda: not world.kubectl_json("pods", "-l", f"{DEV_ENV}={env_id}")["items"],
        timeout=90,
        what="the environment's pod to be gone",
    )
    assert world.kubectl_json("pvc", claim)["status"]["phase"] == "Bound"
    saved = eventually(
        lambda: world.env(env_id)["saved_workspace_bytes"], timeout=60, what="the workspace saved"
    )
    tar = world.artifact(paused_job, "workspace.tar")
    assert len(tar) == saved
    assert _tar_files(tar)["hello.txt"] == b"kept on the claim\n"

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


def _tar_files(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data)) as archive:
        found = {}
        for member in archive:
            assert member.isdir() or member.isreg(), member.name  # nothing else is saved
            handle = archive.extractfile(member)
            if handle is not None:
                found[member.name] = handle.read()
        return found


class Ssh:
    """This machine's OpenSSH client, signed in to the cloud as the user, with a key on the account
    and the Host block of ``sxwl dev ssh-config``."""

    def __init__(self, world: World, root: Path) -> None:
        self.root = root
        self.env = {**os.environ, "SXWL_CONFIG_DIR": str(root / "cfg"), "COLUMNS": "200"}
        said = self.sxwl(
            "login", "--url", world.cpod.url, "--email", world.email, "--password-stdin", stdin=PASSWORD
        )
        assert said.returncode == 0, said.stderr
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / "key")], check=True)
        added = self.sxwl("ssh-keys", "add", str(root / "key.pub"))
        assert added.returncode == 0, added.stderr

    def sxwl(self, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "sxwl.cli", *args]
        return subprocess.run(command, input=stdin, env=self.env, capture_output=True, text=True, timeout=60)

    def configure(self, env_id: str) -> str:
        """The Host block for ``env_id``, with this test's key and known hosts; the host's name."""
        block = self.sxwl("dev", "ssh-config", env_id)
        assert block.returncode == 0 and "ProxyCommand" in block.stdout, block.stderr
        extra = [
            f"IdentityFile {self.root / 'key'}",
            f"UserKnownHostsFile {self.root / 'known_hosts'}",
            "StrictHostKeyChecking accept-new",  # the first time; a changed host key is refused
            "BatchMode yes",
        ]
        (self.root / "config").write_text(block.stdout + "".join(f"  {line}\n" for line in extra))
        return block.stdout.split()[1]

    def run(self, program: str, *args: str) -> subprocess.CompletedProcess[str]:
        argv = [program, "-F", str(self.root / "config"), *args]
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=90)


def test_ssh_and_a_resume_on_another_cpod_with_the_saved_workspace(
    world: World, k8s_cluster: K8sCluster, tmp_path: Path
) -> None:
    """Last in this module: it revokes the module's CPod and runs the rest on a second one."""
    url, cpod, storage_class = world.cpod.url, world.cpod, world.storage_class
    namespace = f"sxwl-tenant-{world.user_id}"
    agent_ns = f"sxwl-agent-{uuid.uuid4().hex[:6]}"
    env_id = ""
    persistent_volume(k8s_cluster, tmp_path, f"{storage_class}-a", storage_class)  # the first claim's
    try:
        ssh = Ssh(world, tmp_path)
        created = httpx.post(f"{url}/api/v1/dev-envs", headers=world.user, json={"name": "moving", "gpus": 0})
        assert created.status_code == 201, created.text
        env_id = created.json()["id"]
        eventually(
            lambda: world.env(env_id)["status"] == "running",
            timeout=180,
            what=f"the environment to run; agent:\n{cpod.agent_log[-3000:]}",
        )
        host = ssh.configure(env_id)

        def ssh_answers() -> subprocess.CompletedProcess[str] | None:
            said = ssh.run("ssh", host, "pwd && id -u")
            return said if said.returncode == 0 else None

        said = eventually(ssh_answers, timeout=120, what="sshd in the environment's pod, through the tunnel")
        assert said.stdout.split() == ["/sxwl/work", "1000"]  # the pod's user, at home in the workspace
        wrote = ssh.run("ssh", host, "mkdir notes && echo written over ssh > notes/ssh.txt")
        assert wrote.returncode == 0, wrote.stderr
        (tmp_path / "up.txt").write_text("copied by scp\n")
        copied = ssh.run("scp", str(tmp_path / "up.txt"), f"{host}:notes/up.txt")
        assert copied.returncode == 0, copied.stderr

        # Paused: saved to the artifact store. Then its CPod is revoked and its claim gone with it.
        paused_job = world.env(env_id)["job_id"]
        assert httpx.post(f"{url}/api/v1/dev-envs/{env_id}/pause", headers=world.user).status_code == 200
        eventually(
            lambda: _job_state(world, paused_job) in ("succeeded", "failed", "cancelled"),
            timeout=120,
            what=f"the paused attempt to end; agent:\n{cpod.agent_log[-3000:]}",
        )
        eventually(lambda: world.env(env_id)["saved_workspace_bytes"], timeout=60, what="the workspace saved")
        files = _tar_files(world.artifact(paused_job, "workspace.tar"))
        assert files["notes/ssh.txt"] == b"written over ssh\n" and files["notes/up.txt"] == b"copied by scp\n"
        assert ".sxwl-ssh/ssh_host_ed25519_key" in files  # its host key goes along
        first_cpod = world.env(env_id)["cpod_id"]
        assert cpod.agent is not None
        cpod.agent.stop()
        revoked = httpx.delete(f"{url}/api/v1/cpods/{first_cpod}", headers=cpod.provider)
        assert revoked.status_code in (200, 204), revoked.text
        k8s_cluster.kubectl("delete", "pvc", claim_name(env_id), "-n", namespace, "--wait=true", timeout=120)
        volume = persistent_volume(k8s_cluster, tmp_path, f"{storage_class}-b", storage_class)

        # A second provider's agent on the same cluster: another CPod, with a new, empty claim.
        provider = {"email": f"provider-b-{uuid.uuid4().hex[:6]}@example.com", "password": PASSWORD}
        httpx.post(f"{url}/api/v1/auth/register", json={**provider, "role": "provider"}).raise_for_status()
        token = httpx.post(f"{url}/api/v1/auth/login", json=provider).json()["access_token"]
        key = httpx.get(f"{url}/api/v1/me/access-key", headers={"Authorization": f"Bearer {token}"}).json()
        k8s_cluster.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": agent_ns}})
        flags = list(cpod.agent_flags)
        flags[flags.index("--namespace") + 1] = agent_ns
        flags[flags.index("--name") + 1] = f"real-b-{uuid.uuid4().hex[:4]}"
        # The module's teardown stops it.
        cpod.agent = AgentProcess(url, cpod.root / "agent-b", key["access_key"], *flags)
        resumed = httpx.post(f"{url}/api/v1/dev-envs/{env_id}/resume", headers=world.user)
        assert resumed.status_code == 200, resumed.text
        eventually(
            lambda: world.env(env_id)["status"] == "running",
            timeout=240,
            what=f"the environment to run on the second CPod; agent:\n{cpod.agent_log[-3000:]}",
        )
        assert world.env(env_id)["cpod_id"] != first_cpod
        assert world.kubectl_json("pvc", claim_name(env_id))["spec"]["volumeName"] == volume.name
        # The same files, and the same host key (known_hosts holds the first one's: another is refused).
        back = eventually(ssh_answers, timeout=120, what="sshd on the second CPod")
        assert back.stdout.split() == ["/sxwl/work", "1000"]
        both = ssh.run("ssh", host, "cat notes/ssh.txt notes/up.txt")
        assert both.stdout == "written over ssh\ncopied by scp\n", both.stderr
        assert (volume / "notes" / "up.txt").read_text() == "copied by scp\n"  # on the new claim
        stopped = httpx.delete(f"{url}/api/v1/dev-envs/{env_id}", headers=world.user)
        assert stopped.status_code in (200, 202)
        eventually(
            lambda: world.env(env_id)["status"] == "stopped", timeout=90, what="the environment stopped"
        )
        eventually(
            lambda: not world.kubectl_json("pods", "-l", f"{DEV_ENV}={env_id}")["items"],
            timeout=120,
            what="the environment's pod to be gone",
        )
    finally:
        if env_id:
            k8s_cluster.kubectl("delete", "pvc", claim_name(env_id), "-n", namespace, check=False)
        k8s_cluster.kubectl("delete", "namespace", agent_ns, "--wait=false", check=False)
        for suffix in ("-a", "-b"):
            k8s_cluster.kubectl("delete", "pv", f"{storage_class}{suffix}", "--wait=false", check=False)


def _job_state(world: World, job_id: str) -> str:
    job = httpx.get(f"{world.cpod.url}/api/v1/jobs/{job_id}", headers=world.user).json()
    return str(job["state"])
