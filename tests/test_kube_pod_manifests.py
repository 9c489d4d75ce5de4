"""What a tenant pod of the kubernetes runtime is made of (kube_manifests.py, kube_uploads.py): the
uploader beside the main container, the token Secret that only the uploader mounts, no token in any
environment or command line, the provider's placement flags, and one rank per node."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sxwl.agent import main as agent_main
from sxwl.agent import pod_uploader
from sxwl.agent.pod_settings import memory_quantity, node_selector, toleration
from sxwl.agent.runtimes.kube_manifests import job_manifest
from sxwl.agent.runtimes.kube_objects import KubeJob
from sxwl.agent.runtimes.kube_uploads import UPLOADER_RESOURCES, UploadConfig, secret_manifest
from sxwl.agent.runtimes.kube_wrapper import WRAPPER
from sxwl.protocol import Assignment

TOKEN = "sxup_" + "t" * 43
UPLOADS = UploadConfig(url="https://cloud.example", image="registry.example/sxwl-agent:1", ca_pem=b"PEM")


def record(nodes: int = 1) -> KubeJob:
    return KubeJob(
        job_id="j1",
        attempt=2,
        name="train",
        owner_id="u1",
        namespace="sxwl-tenant-u1",
        k8s_name="sxwl-j1-2",
        nodes=nodes,
        gpus_per_node=1,
        max_runtime_s=None,
        started_at=0.0,
    )


def manifest(job: KubeJob, command: list[str] | str, **kwargs: Any) -> dict[str, Any]:
    assignment = Assignment(
        job_id=job.job_id,
        attempt=job.attempt,
        name=job.name,
        owner_id=job.owner_id,
        command=command,
        image="registry.example/train:1",
        gpus_per_node=1,
        nodes=job.nodes,
        upload_token=TOKEN,
    )
    return job_manifest(
        job,
        assignment,
        master_port=29500,
        stop_grace_s=10,
        run_as_non_root=False,
        pod_annotations={},
        **kwargs,
    )


def test_the_uploader_alone_mounts_the_token_and_no_token_is_in_the_pod_spec() -> None:
    pod = manifest(record(), ["python", "train.py", "--lr", "0.1"], uploads=UPLOADS)["spec"]["template"][
        "spec"
    ]
    main, uploader = pod["containers"]
    assert (main["name"], uploader["name"]) == ("main", "uploader")
    assert main["command"] == ["/bin/sh", "-c", WRAPPER, "sxwl-wrapper", "python", "train.py", "--lr", "0.1"]
    assert {"name": "SXWL_OUTPUT_DIR", "value": "/sxwl/output"} in main["env"]
    assert [m["mountPath"] for m in main["volumeMounts"]] == ["/dev/shm", "/sxwl"]
    assert {m["name"]: (m["mountPath"], m.get("readOnly")) for m in uploader["volumeMounts"]} == {
        "sxwl": ("/sxwl", True),
        "sxwl-upload": ("/sxwl-upload", True),
    }
    secret_volume = next(v for v in pod["volumes"] if v["name"] == "sxwl-upload")
    assert secret_volume["secret"] == {"secretName": "sxwl-j1-2-upload", "defaultMode": 0o444}
    assert uploader["image"] == UPLOADS.image
    assert uploader["command"] == ["python3", "-I", "/sxwl-upload/pod_uploader.py"]
    assert uploader["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert uploader["securityContext"]["readOnlyRootFilesystem"] is True
    env = {e["name"]: e.get("value") for e in uploader["env"]}
    assert (
        env["SXWL_UPLOAD_URL"] == "https://cloud.example"
        and env["SXWL_UPLOAD_CA_FILE"] == "/sxwl-upload/ca.crt"
    )
    assert env["SXWL_UPLOAD_TOKEN_FILE"] == "/sxwl-upload/token"
    assert TOKEN not in json.dumps(pod)
    assert pod["automountServiceAccountToken"] is False

    secret = secret_manifest(record(), TOKEN, UPLOADS, owner_uid="uid-1")
    assert base64.b64decode(secret["data"]["token"]).decode() == TOKEN
    assert base64.b64decode(secret["data"]["ca.crt"]) == b"PEM"
    program = base64.b64decode(secret["data"]["pod_uploader.py"])  # the agent's own copy, run by path
    assert program == Path(pod_uploader.__file__).read_bytes()
    (owner,) = secret["metadata"]["ownerReferences"]
    assert owner == {"apiVersion": "batch/v1", "kind": "Job", "name": "sxwl-j1-2", "uid": "uid-1"}


def test_a_string_command_runs_under_sh_inside_the_wrapper_and_without_uploads_as_before() -> None:
    wrapped = manifest(record(), "python train.py && echo done", uploads=UPLOADS)
    main = wrapped["spec"]["template"]["spec"]["containers"][0]
    assert main["command"][3:] == ["sxwl-wrapper", "/bin/sh", "-c", "python train.py && echo done"]
    plain = manifest(record(), "python train.py")["spec"]["template"]["spec"]
    assert [c["name"] for c in plain["containers"]] == ["main"]
    assert plain["containers"][0]["command"] == ["/bin/sh", "-c", "python train.py"]
    assert [v["name"] for v in plain["volumes"]] == ["dshm"]


def test_placement_flags_and_one_rank_per_node() -> None:
    selector = dict([node_selector("sxwl.test/node=real")])
    tolerations = [toleration("sxwl.test/real=true:NoSchedule"), toleration("gpu:NoExecute")]
    assert tolerations == [
        {"key": "sxwl.test/real", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
        {"key": "gpu", "operator": "Exists", "effect": "NoExecute"},
    ]
    pod = manifest(
        record(nodes=2), ["python"], uploads=UPLOADS, node_selector=selector, tolerations=tolerations
    )["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"sxwl.test/node": "real"}
    assert pod["tolerations"] == tolerations
    (term,) = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term == {
        "labelSelector": {"matchLabels": {"sxwl.ai/job-id": "j1", "sxwl.ai/attempt": "2"}},
        "topologyKey": "kubernetes.io/hostname",
    }
    rank = next(e for e in pod["containers"][1]["env"] if e["name"] == "NODE_RANK")
    assert "job-completion-index" in rank["valueFrom"]["fieldRef"]["fieldPath"]
    assert "affinity" not in manifest(record(), ["python"])["spec"]["template"]["spec"]


def test_a_memory_limit_bounds_the_job_container_only() -> None:
    assert memory_quantity("1.5Gi") == "1.5Gi"
    pod = manifest(record(), ["python"], uploads=UPLOADS, memory_limit="64Mi")["spec"]["template"]["spec"]
    main, uploader = pod["containers"]
    assert main["resources"]["limits"]["memory"] == "64Mi"
    assert uploader["resources"] == UPLOADER_RESOURCES  # the uploader keeps its own small bound
    plain = manifest(record(), ["python"])["spec"]["template"]["spec"]["containers"][0]
    assert plain["resources"]["limits"] == {"nvidia.com/gpu": "1"}


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--pod-node-selector", "no-value", "KEY=VALUE"),
        ("--pod-node-selector", "bad key=x", "label key"),
        ("--pod-toleration", "key=v:Sometimes", "EFFECT"),
        ("--pod-toleration", "=v:NoSchedule", "taint key"),
        ("--upload-ca-file", "/nonexistent/ca.pem", "No such file"),
        ("--agent-pod-label", "app.kubernetes.io/name", "KEY=VALUE"),
        ("--pod-memory-limit", "lots", "512Mi"),
        ("--pod-memory-limit", "0Gi", "positive"),
        ("--pod-memory-limit", "16GB", "16Gi"),
    ],
)
def test_bad_placement_and_upload_flags_stop_the_agent_naming_the_flag(
    flag: str, value: str, says: str, tmp_path: Path
) -> None:
    result = CliRunner().invoke(
        agent_main.app,
        [
            "--api-url",
            "http://127.0.0.1:9",
            "--runtime",
            "kubernetes",
            "--state-dir",
            str(tmp_path),
            flag,
            value,
        ],
    )
    assert result.exit_code == 2
    assert flag in result.output and says in result.output
