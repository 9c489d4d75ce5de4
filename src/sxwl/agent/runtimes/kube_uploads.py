"""Artifacts from a Kubernetes pod (docs/agent.md, "Artifacts from pods"): the pod's ``uploader``
container, the Secret with the attempt's upload token that only it mounts, the volume it shares with
the main container, and what its termination message says about the upload.

The main container writes to the ``sxwl`` emptyDir (``SXWL_OUTPUT_DIR`` is in it) under the wrapper
of kube_wrapper.py; the uploader mounts that volume read-only and the Secret (mode 0400), and runs
``sxwl.agent.pod_uploader`` (its file, from the Secret), which talks to the cloud with nothing but
the upload token. The main container never mounts the Secret and no token is in any environment or
command line."""

from __future__ import annotations

import base64
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sxwl.agent import pod_uploader
from sxwl.agent.runtimes.kube_objects import KubeJob, labels, rank
from sxwl.agent.runtimes.kube_wrapper import OUTPUT_DIR, SHARED_DIR
from sxwl.protocol.reasons import Reason

UPLOADER = "uploader"
SHARED_VOLUME = "sxwl"
TOKEN_VOLUME = "sxwl-upload"  # noqa: S105 - a volume's name
TOKEN_DIR = "/sxwl-upload"  # noqa: S105 - a mount point
TOKEN_KEY, CA_KEY, PROGRAM_KEY = "token", "ca.crt", "pod_uploader.py"
# The agent's own copy of the program travels in the Secret, so the uploader's code always matches
# the agent's and any image with a python3 can run it (the job's own image, say).
PROGRAM = Path(pod_uploader.__file__).read_bytes()
# The uploader runs as nobody, so a pod of a CPod that enforces non-root (Pod Security "restricted")
# still starts: no capability, a read-only root file system. It reads the Secret's files because only
# its container mounts them (0444 inside that mount namespace alone), and the output because the
# wrapper makes it readable.
NOBODY = 65534
UPLOADER_SECURITY: dict[str, Any] = {
    "runAsUser": NOBODY,
    "runAsGroup": NOBODY,
    "runAsNonRoot": True,
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
}
UPLOADER_RESOURCES = {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"memory": "256Mi"}}


@dataclass(frozen=True)
class UploadConfig:
    """Where the pods' uploaders send artifacts: the cloud's URL as pods reach it, the image that runs
    the uploader (any image with a python3; the agent's own by default), the CA bundle that the
    cloud's certificate is checked against, if not the system's, and the agent's input cache as
    pods reach it (cache_server.py), which a fine-tune's fetcher asks before the cloud."""

    url: str
    image: str
    ca_pem: bytes | None = None
    cache_url: str | None = None


def secret_name(job: KubeJob) -> str:
    return f"{job.k8s_name}-upload"


def secret_manifest(
    job: KubeJob,
    token: str,
    config: UploadConfig,
    owner_uid: str,
    programs: Mapping[str, bytes] | None = None,
) -> dict[str, Any]:
    """The Secret, owned by the attempt's Job, so the garbage collector deletes it with the Job.
    ``programs``: more files that the token's holders run (a fine-tune's fetcher, kube_inputs.py)."""
    files = {TOKEN_KEY: token.encode(), PROGRAM_KEY: PROGRAM, **(programs or {})}
    data = {key: base64.b64encode(value).decode() for key, value in files.items()}
    if config.ca_pem is not None:
        data[CA_KEY] = base64.b64encode(config.ca_pem).decode()
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": job.k8s_name, "uid": owner_uid}
    return {
        "metadata": {"name": secret_name(job), "labels": labels(job), "ownerReferences": [owner]},
        "type": "Opaque",
        "data": data,
    }


def volumes(job: KubeJob) -> list[dict[str, Any]]:
    return [
        {"name": SHARED_VOLUME, "emptyDir": {}},
        {"name": TOKEN_VOLUME, "secret": {"secretName": secret_name(job), "defaultMode": 0o444}},
    ]


MAIN_MOUNT = {"name": SHARED_VOLUME, "mountPath": SHARED_DIR}
MAIN_ENV = {"name": "SXWL_OUTPUT_DIR", "value": OUTPUT_DIR}


def uploader_container(job: KubeJob, config: UploadConfig, rank_env: dict[str, Any]) -> dict[str, Any]:
    env = [
        {"name": "SXWL_UPLOAD_URL", "value": config.url},
        {"name": "SXWL_JOB_ID", "value": job.job_id},
        {"name": "SXWL_ATTEMPT", "value": str(job.attempt)},
        {"name": "NNODES", "value": str(job.nodes)},
        {"name": "NODE_RANK", **rank_env},
        {"name": "SXWL_UPLOAD_TOKEN_FILE", "value": f"{TOKEN_DIR}/{TOKEN_KEY}"},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
    ]
    if config.ca_pem is not None:
        env.append({"name": "SXWL_UPLOAD_CA_FILE", "value": f"{TOKEN_DIR}/{CA_KEY}"})
    return {
        "name": UPLOADER,
        "image": config.image,
        "command": ["python3", "-I", f"{TOKEN_DIR}/{PROGRAM_KEY}"],
        "env": env,
        "volumeMounts": [
            {"name": SHARED_VOLUME, "mountPath": SHARED_DIR, "readOnly": True},
            {"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True},
        ],
        "securityContext": UPLOADER_SECURITY,
        "resources": UPLOADER_RESOURCES,
    }


def upload_problem(pods: list[Any]) -> Reason | None:
    """What went wrong with the pods' uploads, for the job's reason, or None: the uploader's own
    ``error: …`` line, or why its container failed; the first rank's, and how many more had one."""
    problems: list[Reason] = []
    for pod in sorted(pods, key=rank):
        for status in pod.status.container_statuses or []:
            terminated = status.state.terminated if status.name == UPLOADER and status.state else None
            if terminated is None:
                continue
            message = (terminated.message or "").strip()
            if message.startswith("error: "):
                problems.append(Reason.of("kube.uploads", error=message.removeprefix("error: ")))
            elif terminated.exit_code and not message.startswith("ok: "):  # "ok": its own word
                detail = message or terminated.reason or f"exit code {terminated.exit_code}"
                problems.append(Reason.of("kube.uploader_failed", detail=detail))
    if len(problems) > 1:
        return Reason.of("kube.more_ranks", first=problems[0], more=len(problems) - 1)
    return problems[0] if problems else None
