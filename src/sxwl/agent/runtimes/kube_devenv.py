"""Dev environments on Kubernetes (docs/dev-envs.md, "On Kubernetes"): an environment's attempt is
the runtime's usual one-pod Job, whose main container runs JupyterLab (and, where the image has
OpenSSH, its sshd) instead of the job's command, on the pod's own address.

- **The workspace** is a PersistentVolumeClaim of the provider's storage class, ``sxwl-ws-<id>``
  in the tenant's namespace, mounted at ``/sxwl/work``. Nothing owns it, so it outlives the Job:
  a pause deletes the Job (and its pod) and keeps the claim; a resume on the same CPod makes a new
  Job on the same claim; the cloud's ``forget_workspace`` for a stopped one deletes it (``sweep``).
- **Saved and restored**: JupyterLab runs under ``pod_workspace.py`` (its file in the Secret), which
  saves the workspace as the attempt's ``workspace.tar`` in the output dir once JupyterLab has
  ended, for the pod's ``uploader`` to send with the upload token like any pod's artifact; the pod's
  grace is at least ``save_grace_s`` for it. A resume on another CPod has the saved tar as its
  ``workspace`` input, unpacked by the ``inputs`` init container and copied into the new claim by
  the same program before JupyterLab starts.
- **Models and files** come as a fine-tune's inputs do (kube_inputs.py): the ``inputs`` init
  container fetches them (from the agent's cache) and they are mounted read-only at
  ``/sxwl/work/inputs``.
- **The token** is in a Secret of the attempt's (owned by its Job), mounted where only the pod's
  user reads it and named by ``JUPYTER_TOKEN_FILE``: never on a command line. The same Secret holds
  the owner's SSH keys of this start, the sshd's config and ``jupyter_identity.py``, so any image
  with JupyterLab serves an environment (the project is not needed in it).
- **Reached by the agent only**: JupyterLab and sshd listen on the pod's IP, and the NetworkPolicy
  ``sxwl-dev-envs`` admits only the agent's pod to them (the tenant's own policy leaves dev
  environments' pods out, kube_tenancy.py). The agent finds the address in the cluster's record of
  the attempt's pod, never in what the cloud or the tenant says."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from sxwl.agent import pod_workspace
from sxwl.agent.forward_targets import TcpTarget
from sxwl.agent.runtimes import kube_inputs
from sxwl.agent.runtimes.jupyter import LAB_START, SSH_USER, TOKEN_FILE, lab_flags, sshd_config
from sxwl.agent.runtimes.kube_objects import (
    CONTAINER,
    DEV_ENV,
    MANAGED_BY,
    MANAGER,
    TENANT,
    KubeJob,
    create_ignoring_conflict,
    dns_label,
    labels,
)
from sxwl.protocol import Assignment, attempt_key
from sxwl.protocol.devenvs import INPUTS_SEEN_AT, WORKSPACE_INPUT, DevEnvSpec, parse_target

JUPYTER_PORT = 8888
SSH_PORT = 2222
POLICY = "sxwl-dev-envs"
WORK_DIR = INPUTS_SEEN_AT.rsplit("/", 1)[0]  # /sxwl/work, as on the local runtime
WORK_VOLUME = "sxwl-work"
DEV_DIR = "/sxwl-dev"
DEV_VOLUME = "sxwl-dev"
IDENTITY = "sxwl_jupyter_identity"  # jupyter_identity.py as the pod imports it from DEV_DIR
# Read as a file, not imported: it imports jupyter_server, which the agent's own image does not have.
IDENTITY_SOURCE = (Path(__file__).resolve().parents[1] / "jupyter_identity.py").read_bytes()
KEEPER = "pod_workspace.py"  # what runs JupyterLab, restores and saves the workspace, from DEV_DIR
KEEPER_SOURCE = Path(pod_workspace.__file__).read_bytes()
USER_ID = 1000  # the pod's user, named SSH_USER in the passwd it is given
HOST_KEY = f"{WORK_DIR}/.sxwl-ssh/ssh_host_ed25519_key"  # kept in the workspace: the same after a resume
PASSWD = (
    "root:x:0:0::/root:/bin/sh\n"
    "nobody:x:65534:65534::/nonexistent:/usr/sbin/nologin\n"
    f"{SSH_USER}:x:{USER_ID}:{USER_ID}::{WORK_DIR}:/bin/sh\n"
)


@dataclass(frozen=True)
class DevEnvSettings:
    """The agent's flags for dev environments: the image with JupyterLab (an environment may name
    its own), the workspace's storage class (None: the cluster's default) and size, and how the
    NetworkPolicy finds the agent's pod; ``save_grace_s``, the least time between a pod's SIGTERM
    and SIGKILL, for JupyterLab to end and the workspace to be tarred and uploaded (a workspace
    of the cloud's default artifact cap, 1 GiB, takes well under a minute on a local disk and a
    fast link: five minutes leave room for slower ones)."""

    image: str
    agent_namespace: str
    agent_labels: Mapping[str, str]
    storage_class: str | None = None
    size: str = "20Gi"
    save_grace_s: float = 300.0


def claim_name(workspace: str) -> str:
    return dns_label(f"sxwl-ws-{workspace}")


def secret_name(job: KubeJob) -> str:
    return dns_label(f"{job.k8s_name}-dev")


def claim_manifest(job: KubeJob, spec: DevEnvSpec, settings: DevEnvSettings) -> dict[str, Any]:
    """The workspace's claim: owned by nothing, so deleting a Job never takes it along."""
    claim: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": settings.size}},
    }
    if settings.storage_class:
        claim["storageClassName"] = settings.storage_class
    meta = {MANAGED_BY: MANAGER, TENANT: dns_label(job.owner_id), DEV_ENV: spec.workspace}
    return {"metadata": {"name": claim_name(spec.workspace), "labels": meta}, "spec": claim}


def policy_manifest(settings: DevEnvSettings) -> dict[str, Any]:
    """Ingress to the namespace's environments only from the agent's pods, only to their two ports;
    without their labels (an agent outside the cluster), from no pod."""
    agent = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": settings.agent_namespace}},
        "podSelector": {"matchLabels": dict(settings.agent_labels)},
    }
    ports = [{"protocol": "TCP", "port": port} for port in (JUPYTER_PORT, SSH_PORT)]
    return {
        "metadata": {"name": POLICY, "labels": {MANAGED_BY: MANAGER}},
        "spec": {
            "podSelector": {"matchExpressions": [{"key": DEV_ENV, "operator": "Exists"}]},
            "policyTypes": ["Ingress"],
            "ingress": [{"from": [agent], "ports": ports}] if settings.agent_labels else [],
        },
    }


def secret_manifest(job: KubeJob, spec: DevEnvSpec, owner_uid: str) -> dict[str, Any]:
    """The attempt's token, the owner's keys and the files JupyterLab and sshd read, owned by its Job."""
    files = {
        TOKEN_FILE: spec.token.encode(),
        "authorized_keys": "".join(f"{line}\n" for line in spec.ssh_keys).encode(),
        "sshd_config": sshd_config(HOST_KEY, f"{DEV_DIR}/authorized_keys").encode(),
        "passwd": PASSWD.encode(),
        f"{IDENTITY}.py": IDENTITY_SOURCE,
        KEEPER: KEEPER_SOURCE,
    }
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": job.k8s_name, "uid": owner_uid}
    return {
        "metadata": {"name": secret_name(job), "labels": labels(job), "ownerReferences": [owner]},
        "type": "Opaque",
        "data": {key: base64.b64encode(value).decode() for key, value in files.items()},
    }


def lab_assignment(assignment: Assignment, settings: DevEnvSettings) -> Assignment:
    """The assignment as the Job's manifest is made from it: JupyterLab as its command, under the
    program that restores and saves the workspace, on the environment's image or the agent's."""
    assert assignment.jupyter is not None
    listen = ["--ServerApp.ip=0.0.0.0", f"--ServerApp.port={JUPYTER_PORT}", "--ServerApp.port_retries=0"]
    # The local runtime's fast start (jupyter.py, LAB_START); jupyter_lsp stays: the image is the
    # user's, and may hold language servers.
    lab = ["python3", *lab_flags(listen, assignment.jupyter.base_url, WORK_DIR, IDENTITY, ("-c", LAB_START))]
    argv = ["python3", "-I", f"{DEV_DIR}/{KEEPER}", *lab]  # -I: the user's own site files never run in it
    return assignment.model_copy(update={"command": argv, "image": assignment.image or settings.image})


def dress(
    manifest: dict[str, Any], job: KubeJob, assignment: Assignment, settings: DevEnvSettings
) -> dict[str, Any]:
    """The Job of an environment's attempt, from the one kube_manifests.py made of ``lab_assignment``:
    the workspace, the Secret, the inputs where the local runtime puts them, the pod's own user, the
    saved workspace to restore (a ``workspace`` input) and the grace to save it."""
    spec = assignment.jupyter
    assert spec is not None
    template = manifest["spec"]["template"]
    template["metadata"]["labels"][DEV_ENV] = spec.workspace
    pod = template["spec"]
    pod["securityContext"] |= {"runAsUser": USER_ID, "runAsGroup": USER_ID, "fsGroup": USER_ID}
    grace = max(pod["terminationGracePeriodSeconds"], int(settings.save_grace_s))
    pod["terminationGracePeriodSeconds"] = grace
    pod["volumes"] += [
        {"name": WORK_VOLUME, "persistentVolumeClaim": {"claimName": claim_name(spec.workspace)}},
        {"name": DEV_VOLUME, "secret": {"secretName": secret_name(job), "defaultMode": 0o440}},
    ]
    main = next(c for c in pod["containers"] if c["name"] == CONTAINER)
    # The inputs where the local runtime puts them (a new dict: the manifest shares kube_inputs' own).
    main["volumeMounts"] = [
        {**mount, "mountPath": INPUTS_SEEN_AT} if mount["name"] == kube_inputs.INPUTS_VOLUME else mount
        for mount in main["volumeMounts"]
    ]
    main["volumeMounts"] += [
        {"name": WORK_VOLUME, "mountPath": WORK_DIR},
        {"name": DEV_VOLUME, "mountPath": DEV_DIR, "readOnly": True},
        {"name": DEV_VOLUME, "mountPath": "/etc/passwd", "subPath": "passwd", "readOnly": True},
    ]
    env = {
        "JUPYTER_TOKEN_FILE": f"{DEV_DIR}/{TOKEN_FILE}",
        "PYTHONPATH": DEV_DIR,
        "HOME": WORK_DIR,
        "SHELL": "/bin/sh",
        "SXWL_DEV_SSH_CONFIG": f"{DEV_DIR}/sshd_config",
        "SXWL_DEV_SSH_SOCKET": f"tcp:{SSH_PORT}",
        "SXWL_DEV_SSH_HOST_KEY": HOST_KEY,
        "SXWL_WORKSPACE": WORK_DIR,
    }
    if any(item.name == WORKSPACE_INPUT for item in assignment.inputs):
        env["SXWL_WORKSPACE_SAVED"] = f"{INPUTS_SEEN_AT}/{WORKSPACE_INPUT}"
    if assignment.artifact_max_bytes is not None:
        env["SXWL_WORKSPACE_MAX_BYTES"] = str(assignment.artifact_max_bytes)
    main["env"] += [{"name": name, "value": value} for name, value in env.items()]
    main["workingDir"] = WORK_DIR
    main["ports"] = [
        {"name": "jupyter", "containerPort": JUPYTER_PORT},
        {"name": "ssh", "containerPort": SSH_PORT},
    ]
    main["securityContext"] |= {"runAsNonRoot": True}
    return manifest


def addresses(pods: Mapping[str, list[Any]]) -> dict[str, str]:
    """The IP of each environment's running pod, by attempt key, as the cluster has it."""
    found: dict[str, str] = {}
    for key, items in pods.items():
        for pod in items:
            running = pod.status.phase == "Running" and pod.metadata.deletion_timestamp is None
            if running and pod.status.pod_ip and DEV_ENV in (pod.metadata.labels or {}):
                found[key] = str(pod.status.pod_ip)
    return found


def target(name: str, addresses: Mapping[str, str]) -> TcpTarget | None:
    """Where the tunnel's target ``dev-env.<job>.<attempt>`` (JupyterLab) or ``dev-ssh.…`` (its sshd,
    raw bytes) is: the address of that attempt's running pod, or None."""
    named = parse_target(name)
    host = addresses.get(attempt_key(named[1], named[2])) if named is not None else None
    if named is None or host is None:
        return None
    ssh = named[0] == "dev-ssh"
    return TcpTarget(host, SSH_PORT if ssh else JUPYTER_PORT, raw=ssh)


class DevEnvs:
    """The runtime's dev environments: their claims, policies and Secrets, and their pods' addresses
    as the runtime's last list of pods had them."""

    def __init__(self, api_client: Any, settings: DevEnvSettings) -> None:
        self.core = client.CoreV1Api(api_client)
        self.networking = client.NetworkingV1Api(api_client)
        self.settings = settings
        self.addresses: dict[str, str] = {}  # attempt -> its running pod's IP
        self.forgotten: set[str] = set()  # stopped environments whose claims are still to delete

    async def prepare(self, job: KubeJob, assignment: Assignment) -> Assignment:
        """The environment's claim (kept from its last attempt, or made now) and its namespace's
        policy, before its Job; the assignment the Job is made of."""
        assert assignment.jupyter is not None
        claim = claim_manifest(job, assignment.jupyter, self.settings)
        await create_ignoring_conflict(
            self.core.create_namespaced_persistent_volume_claim, job.namespace, claim
        )
        policy = policy_manifest(self.settings)
        await create_ignoring_conflict(
            self.networking.create_namespaced_network_policy, job.namespace, policy
        )
        return lab_assignment(assignment, self.settings)

    async def make_secret(self, job: KubeJob, spec: DevEnvSpec, owner_uid: str) -> None:
        manifest = secret_manifest(job, spec, owner_uid)
        await create_ignoring_conflict(self.core.create_namespaced_secret, job.namespace, manifest)

    def seen(self, pods: Mapping[str, list[Any]]) -> None:
        self.addresses = addresses(pods)

    def target(self, name: str, jobs: Mapping[str, KubeJob]) -> TcpTarget | None:
        """The service a tunnel target names, while its attempt runs and is not being stopped."""
        found = target(name, self.addresses)
        named = parse_target(name)
        job = jobs.get(attempt_key(named[1], named[2])) if named is not None else None
        if found is None or job is None or job.outcome is not None or job.stop_at is not None:
            return None
        return found

    def forget(self, workspace: str) -> bool:
        """A stopped environment's workspace: its claim is deleted by the next ``sweep``."""
        self.forgotten.add(workspace)
        return True

    async def sweep(self) -> None:
        """Deletes the forgotten environments' claims, in whichever tenant's namespace (and with each
        its volume, by its storage class's reclaim policy)."""
        for workspace in sorted(self.forgotten):
            listed = await self.core.list_persistent_volume_claim_for_all_namespaces(
                label_selector=f"{MANAGED_BY}={MANAGER},{DEV_ENV}={workspace}"
            )
            for claim in listed.items:
                try:
                    await self.core.delete_namespaced_persistent_volume_claim(
                        claim.metadata.name, claim.metadata.namespace
                    )
                except ApiException as exc:
                    if exc.status != 404:
                        raise
            self.forgotten.discard(workspace)
