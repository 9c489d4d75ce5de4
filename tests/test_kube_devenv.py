"""A dev environment's objects on the kubernetes runtime (kube_devenv.py): its Job runs JupyterLab
on the workspace claim with its token from the Secret (never on a command line), the inputs where
the local runtime puts them, as the pod's own user, under the program that restores and saves the
workspace (pod_workspace.py), with the grace to save it; the claim is owned by nothing (it outlives
the Job); the policy admits only the agent's pods; the tunnel reaches only a running attempt's pod;
and a runtime without a dev environment image refuses one."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from kubernetes_asyncio.client import ApiClient

from sxwl.agent.forward_targets import TcpTarget
from sxwl.agent.runtimes import kube_inputs
from sxwl.agent.runtimes.jupyter import LAB_START
from sxwl.agent.runtimes.kube_devenv import (
    DEV_DIR,
    IDENTITY,
    JUPYTER_PORT,
    KEEPER,
    KEEPER_SOURCE,
    SSH_PORT,
    DevEnvSettings,
    addresses,
    claim_manifest,
    dress,
    lab_assignment,
    policy_manifest,
    secret_manifest,
    target,
)
from sxwl.agent.runtimes.kube_inputs import start_refusal
from sxwl.agent.runtimes.kube_manifests import job_manifest
from sxwl.agent.runtimes.kube_objects import CONTAINER, DEV_ENV, KubeJob, record_from
from sxwl.agent.runtimes.kube_uploads import UploadConfig
from sxwl.agent.runtimes.kubernetes import KubernetesRuntime
from sxwl.cloud.services.scheduling.placement import CPodCapacity, Need
from sxwl.protocol import Assignment
from sxwl.protocol.devenvs import WORKSPACE_INPUT, DevEnvSpec
from sxwl.protocol.finetune import JobInput
from sxwl.protocol.reasons import english
from tests.support.threads import run_on_thread

TOKEN = "j" * 40
SETTINGS = DevEnvSettings(
    image="registry.example/jupyter:1",
    agent_namespace="sxwl-system",
    agent_labels={"sxwl.ai/component": "agent"},
    storage_class="ceph-rbd",
    size="50Gi",
)
UPLOADS = UploadConfig(url="https://cloud.example", image="registry.example/sxwl-agent:1")


def record() -> KubeJob:
    return KubeJob(
        job_id="j1",
        attempt=3,
        name="dev",
        owner_id="u1",
        namespace="sxwl-tenant-u1",
        k8s_name="sxwl-j1-3",
        nodes=1,
        gpus_per_node=0,
        max_runtime_s=None,
        started_at=0.0,
    )


def assignment(**fields: Any) -> Assignment:
    spec = DevEnvSpec(base_url="/dev/env1/", workspace="env1", token=TOKEN, ssh_keys=["ssh-ed25519 AAAA k"])
    body: dict[str, Any] = {
        "job_id": "j1",
        "attempt": 3,
        "name": "dev",
        "owner_id": "u1",
        "command": ["placeholder"],
        "gpus_per_node": 0,
        "nodes": 1,
        "upload_token": "sxup_" + "t" * 43,
        "jupyter": spec,
        "inputs": [JobInput(name="model-0", sha256="ab" * 32, size=10, archive=True)],
        **fields,
    }
    return Assignment(**body)


def manifest(given: Assignment) -> dict[str, Any]:
    assert given.jupyter is not None
    made = job_manifest(
        record(),
        lab_assignment(given, SETTINGS),
        master_port=29500,
        stop_grace_s=10,
        run_as_non_root=False,
        pod_annotations={},
        uploads=UPLOADS,
    )
    return dress(made, record(), given, SETTINGS)


def test_the_pod_runs_jupyterlab_on_the_claim_with_its_token_from_the_secret() -> None:
    job = manifest(assignment())
    template = job["spec"]["template"]
    assert template["metadata"]["labels"][DEV_ENV] == "env1"
    pod = template["spec"]
    main = next(c for c in pod["containers"] if c["name"] == CONTAINER)
    assert main["image"] == SETTINGS.image
    command = " ".join(main["command"])
    assert "from jupyterlab.labapp import main" in command and f"--ServerApp.port={JUPYTER_PORT}" in command
    assert "--ServerApp.base_url=/dev/env1/" in command and f"{IDENTITY}.ProxiedIdentityProvider" in command
    assert TOKEN not in json.dumps(job)  # only in the Secret
    env = {e["name"]: e.get("value") for e in main["env"]}
    assert env["JUPYTER_TOKEN_FILE"] == f"{DEV_DIR}/token" and env["SXWL_DEV_SSH_SOCKET"] == f"tcp:{SSH_PORT}"
    mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
    assert mounts["/sxwl/work"]["name"] == "sxwl-work"
    assert mounts["/sxwl/work/inputs"].get("readOnly") is True  # the fetched models, as on a local CPod
    assert kube_inputs.MAIN_MOUNT["mountPath"] == kube_inputs.INPUTS_DIR  # a fine-tune's pods unchanged
    assert mounts[DEV_DIR]["readOnly"] is True
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["sxwl-work"]["persistentVolumeClaim"] == {"claimName": "sxwl-ws-env1"}
    assert volumes["sxwl-dev"]["secret"]["defaultMode"] == 0o440
    assert pod["securityContext"]["runAsUser"] == 1000 and pod["securityContext"]["fsGroup"] == 1000
    assert pod["automountServiceAccountToken"] is False  # as every tenant pod
    assert [c["name"] for c in pod["initContainers"]] == ["inputs"]
    assert "resources" not in main  # no GPUs, no cores or memory asked for, no agent default
    # The cores and memory it asked for are the pod's limits (and so its requests).
    sized = manifest(assignment(cpus=4, memory_mib=8192))["spec"]["template"]["spec"]["containers"][0]
    assert sized["resources"] == {"limits": {"cpu": "4", "memory": "8192Mi"}}
    # An environment that names its own image runs on it.
    assert (
        manifest(assignment(image="me/lab:2"))["spec"]["template"]["spec"]["containers"][0]["image"]
        == "me/lab:2"
    )


def test_the_secret_holds_the_token_and_keys_and_goes_with_the_job_while_the_claim_stays() -> None:
    spec = assignment().jupyter
    assert spec is not None
    secret = secret_manifest(record(), spec, "uid-1")
    assert secret["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    assert data["token"] == TOKEN
    assert data["authorized_keys"] == "ssh-ed25519 AAAA k\n"
    assert "PasswordAuthentication no" in data["sshd_config"]
    assert "ProxiedIdentityProvider" in data[f"{IDENTITY}.py"]
    claim = claim_manifest(record(), spec, SETTINGS)
    assert "ownerReferences" not in claim["metadata"]
    assert claim["spec"]["storageClassName"] == "ceph-rbd"
    assert claim["spec"]["resources"]["requests"]["storage"] == "50Gi"
    default = claim_manifest(record(), spec, DevEnvSettings(image="x", agent_namespace="a", agent_labels={}))
    assert "storageClassName" not in default["spec"]  # the cluster's default class


def test_the_policy_admits_only_the_agents_pods_to_the_two_ports() -> None:
    policy = policy_manifest(SETTINGS)["spec"]
    assert policy["podSelector"] == {"matchExpressions": [{"key": DEV_ENV, "operator": "Exists"}]}
    (rule,) = policy["ingress"]
    assert rule["from"] == [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "sxwl-system"}},
            "podSelector": {"matchLabels": {"sxwl.ai/component": "agent"}},
        }
    ]
    assert [p["port"] for p in rule["ports"]] == [JUPYTER_PORT, SSH_PORT]
    # An agent outside the cluster names no pods of its own: no pod is admitted.
    outside = DevEnvSettings(image="x", agent_namespace="a", agent_labels={})
    assert policy_manifest(outside)["spec"]["ingress"] == []


def _pod(phase: str, ip: str | None, dev: bool = True) -> Any:
    labels = {DEV_ENV: "env1"} if dev else {}
    return SimpleNamespace(
        status=SimpleNamespace(phase=phase, pod_ip=ip),
        metadata=SimpleNamespace(deletion_timestamp=None, labels=labels),
    )


def test_the_tunnel_reaches_only_a_running_environments_pod() -> None:
    found = addresses(
        {
            "j1:3": [_pod("Running", "10.250.0.7")],
            "j2:1": [_pod("Pending", None)],
            "j3:1": [_pod("Running", "10.1.1.1", False)],
        }
    )
    assert found == {"j1:3": "10.250.0.7"}
    assert target("dev-env.j1.3", found) == TcpTarget("10.250.0.7", JUPYTER_PORT)
    assert target("dev-ssh.j1.3", found) == TcpTarget("10.250.0.7", SSH_PORT, raw=True)
    assert target("dev-env.j2.1", found) is None
    assert target("10.250.0.7:8888", found) is None  # an address the cloud names is never a target


def test_a_runtime_without_a_dev_environment_image_refuses_one() -> None:
    refused = start_refusal(assignment(), fine_tunes=True, dev_envs=False, endpoints=True)
    assert refused is not None and "--dev-env-image" in str(english(refused))
    # No trainer image needed for an environment's inputs.
    assert start_refusal(assignment(), fine_tunes=False, dev_envs=True, endpoints=False) is None
    plain = assignment(jupyter=None, inputs=[])
    refused = start_refusal(plain, fine_tunes=False, dev_envs=True, endpoints=True)
    assert refused is not None and refused.code == "kube.no_image"


def _main(job: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = next(
        c for c in job["spec"]["template"]["spec"]["containers"] if c["name"] == CONTAINER
    )
    return found


def test_jupyterlab_runs_under_the_program_that_restores_and_saves_the_workspace() -> None:
    job = manifest(assignment(artifact_max_bytes=1 << 30))
    main = _main(job)
    command = main["command"]
    keeper = command.index(f"{DEV_DIR}/{KEEPER}")  # under the wrapper, JupyterLab's argv after it
    assert command[keeper - 2 : keeper] == ["python3", "-I"] and command[keeper + 1 : keeper + 4] == [
        "python3",
        "-c",
        LAB_START,  # the local runtime's fast start
    ]
    env = {e["name"]: e.get("value") for e in main["env"]}
    assert env["SXWL_WORKSPACE"] == "/sxwl/work" and env["SXWL_WORKSPACE_MAX_BYTES"] == str(1 << 30)
    assert env["SXWL_OUTPUT_DIR"] == "/sxwl/output"  # where the uploader takes workspace.tar from
    assert "SXWL_WORKSPACE_SAVED" not in env  # nothing to restore: the claim is used as it is
    assert "uploader" in [c["name"] for c in job["spec"]["template"]["spec"]["containers"]]
    # The pod's grace leaves time to save the workspace, whatever the agent's --stop-grace.
    assert job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == int(SETTINGS.save_grace_s)
    spec = assignment().jupyter
    assert spec is not None
    secret = secret_manifest(record(), spec, "uid-1")
    assert base64.b64decode(secret["data"][KEEPER]) == KEEPER_SOURCE


def test_a_resume_elsewhere_restores_the_saved_workspace_from_its_input() -> None:
    saved = JobInput(name=WORKSPACE_INPUT, sha256="cd" * 32, size=10240, archive=True)
    job = manifest(assignment(inputs=[saved]))
    env = {e["name"]: e.get("value") for e in _main(job)["env"]}
    assert env["SXWL_WORKSPACE_SAVED"] == "/sxwl/work/inputs/workspace"
    (fetcher,) = job["spec"]["template"]["spec"]["initContainers"]
    fetched = {e["name"]: e.get("value") for e in fetcher["env"]}["SXWL_INPUTS"]
    assert json.loads(fetched)[0]["name"] == WORKSPACE_INPUT  # unpacked there, its members checked


def test_a_dev_environments_stop_keeps_the_grace_to_save_its_workspace(tmp_path: Path) -> None:
    async def started() -> tuple[float, float]:
        async with ApiClient() as api:  # never called: start() only records the attempt
            runtime = KubernetesRuntime(
                api, stop_grace_s=3, state_dir=tmp_path, uploads=UPLOADS, dev_envs=SETTINGS
            )
            plain = assignment(job_id="j2", jupyter=None, inputs=[], image="me/job:1")
            return runtime.start(assignment()).grace(3), runtime.start(plain).grace(3)

    assert run_on_thread(started()) == (SETTINGS.save_grace_s, 3)
    job = record()
    job.min_grace_s = SETTINGS.save_grace_s
    assert job.grace(10) == SETTINGS.save_grace_s
    job.stop_grace_s = 900  # the cloud may ask for more
    assert job.grace(10) == 900
    assert record().grace(10) == 10  # other attempts: the agent's --stop-grace
    # A restarted agent takes it back from its Job's pod template.
    made = manifest(assignment())
    template = SimpleNamespace(
        metadata=SimpleNamespace(labels=made["spec"]["template"]["metadata"]["labels"]),
        spec=SimpleNamespace(
            termination_grace_period_seconds=made["spec"]["template"]["spec"][
                "terminationGracePeriodSeconds"
            ],
            containers=[SimpleNamespace(resources=None)],
        ),
    )
    item = SimpleNamespace(
        metadata=SimpleNamespace(
            name="sxwl-j1-3",
            namespace="sxwl-tenant-u1",
            annotations={},
            labels=made["metadata"]["labels"],
            creation_timestamp=None,
        ),
        spec=SimpleNamespace(template=template, completions=1, active_deadline_seconds=None),
    )
    assert record_from(item).grace(10) == SETTINGS.save_grace_s


def test_a_cpod_without_a_trainer_image_takes_environments_with_inputs_but_no_fine_tunes() -> None:
    """A Kubernetes CPod with a dev environment image fetches an environment's models, files and
    saved workspace itself (its pods' ``inputs`` container), trainer image or not."""
    cpod = CPodCapacity(id="c1", takes_dev_envs=True, takes_fine_tunes=False)
    restored = (("cd" * 32, 10240),)
    assert cpod.refuses(Need(None, 0, 1, inputs=restored, dev_env=True)) is None
    assert cpod.refuses(Need(None, 0, 1, inputs=restored)) == "fine-tune"
    assert cpod.refuses(Need(None, 0, 1, trainer=True, dev_env=True)) == "fine-tune"
