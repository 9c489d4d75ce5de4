"""A fine-tune's pod on the kubernetes runtime (kube_inputs.py): the ``inputs`` init container that
fetches with the upload token, the trainer image in the main container with the inputs read-only,
no token outside the Secret, the fetcher's program in that Secret, why a pod whose inputs did not
arrive failed, and the agent and runtime refusing fine-tunes they cannot run."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import (
    ApiClient,
    V1ContainerState,
    V1ContainerStateTerminated,
    V1ContainerStateWaiting,
    V1ContainerStatus,
    V1Job,
    V1JobCondition,
    V1JobStatus,
    V1ObjectMeta,
    V1Pod,
    V1PodStatus,
)
from typer.testing import CliRunner

from sxwl.agent import main as agent_main
from sxwl.agent import pod_fetcher
from sxwl.agent.runtimes.kube_inputs import FETCHER, FETCHER_KEY, INPUTS
from sxwl.agent.runtimes.kube_manifests import job_manifest
from sxwl.agent.runtimes.kube_objects import CONTAINER, KubeJob
from sxwl.agent.runtimes.kube_status import outcome
from sxwl.agent.runtimes.kube_uploads import UploadConfig, secret_manifest
from sxwl.agent.runtimes.kube_wrapper import WRAPPER
from sxwl.agent.runtimes.kubernetes import KubernetesRuntime
from sxwl.protocol import Assignment
from sxwl.protocol.finetune import (
    RANK_0,
    JobInput,
    Progress,
    ResolvedHyperparameters,
    TrainerRun,
    TrainerSpec,
    parse_progress,
    progress_line,
)
from sxwl.protocol.reasons import english
from tests.support.threads import run_on_thread

TOKEN = "sxup_" + "t" * 43
UPLOADS = UploadConfig(url="https://cloud.example", image="registry.example/sxwl-agent:1", ca_pem=b"PEM")
TRAINER_IMAGE = "registry.example/sxwl-trainer:1"
SHA = "ab" * 32
REFUSAL = "this CPod runs no fine-tunes: its agent needs --trainer-image and --uploader-image"


def record() -> KubeJob:
    return KubeJob(
        job_id="j1",
        attempt=2,
        name="ft",
        owner_id="u1",
        namespace="sxwl-tenant-u1",
        k8s_name="sxwl-j1-2",
        nodes=1,
        gpus_per_node=1,
        max_runtime_s=None,
        started_at=0.0,
    )


def fine_tune(*names: str) -> Assignment:
    inputs = [
        JobInput(name=name, sha256=SHA, size=10 + i, archive=name in ("model", "resume"))
        for i, name in enumerate(names)
    ]
    spec = TrainerSpec(
        hyperparameters=ResolvedHyperparameters(n_epochs=1, batch_size=2, learning_rate_multiplier=1)
    )
    return Assignment(
        job_id="j1",
        attempt=2,
        name="ft",
        owner_id="u1",
        command=["sxwl-trainer"],
        gpus_per_node=1,
        nodes=1,
        upload_token=TOKEN,
        inputs=inputs,
        trainer=spec,
    )


def pod_spec(assignment: Assignment, **kwargs: Any) -> dict[str, Any]:
    manifest = job_manifest(
        record(),
        assignment,
        master_port=29500,
        stop_grace_s=10,
        run_as_non_root=False,
        pod_annotations={},
        **kwargs,
    )
    spec: dict[str, Any] = manifest["spec"]["template"]["spec"]
    return spec


def test_the_inputs_arrive_in_an_init_container_and_the_trainer_image_reads_them_read_only() -> None:
    pod = pod_spec(
        fine_tune("model", "training_file", "resume"), uploads=UPLOADS, trainer_image=TRAINER_IMAGE
    )
    (fetcher,) = pod["initContainers"]
    main, uploader = pod["containers"]
    assert fetcher["name"] == INPUTS and fetcher["image"] == UPLOADS.image
    assert fetcher["command"] == ["python3", "-I", f"/sxwl-upload/{FETCHER_KEY}"]
    assert fetcher["securityContext"]["runAsNonRoot"] is True
    assert {m["name"]: (m["mountPath"], m.get("readOnly")) for m in fetcher["volumeMounts"]} == {
        "sxwl-inputs": ("/sxwl-inputs", None),
        "sxwl-upload": ("/sxwl-upload", True),
    }
    env = {e["name"]: e["value"] for e in fetcher["env"]}
    assert env["SXWL_UPLOAD_TOKEN_FILE"] == "/sxwl-upload/token"
    assert env["SXWL_UPLOAD_CA_FILE"] == "/sxwl-upload/ca.crt"
    assert [(i["name"], i["archive"]) for i in json.loads(env["SXWL_INPUTS"])] == [
        ("model", True),
        ("training_file", False),
        ("resume", True),
    ]
    run = TrainerRun.model_validate_json(env["SXWL_TRAINER_RUN"])
    assert (run.model_dir, run.training_file) == ("/sxwl-inputs/model", "/sxwl-inputs/training_file")
    assert (run.validation_file, run.resume_from) == (None, "/sxwl-inputs/resume")
    assert run.output_dir == "/sxwl/output" and run.hyperparameters.batch_size == 2

    assert main["image"] == TRAINER_IMAGE
    assert main["command"] == [
        "/bin/sh",
        "-c",
        WRAPPER,
        "sxwl-wrapper",
        "python3",
        "-m",
        "sxwl.trainer",
        "/sxwl-inputs/trainer-run.json",
    ]
    mounts = {m["name"]: (m["mountPath"], m.get("readOnly")) for m in main["volumeMounts"]}
    assert mounts["sxwl-inputs"] == ("/sxwl-inputs", True) and "sxwl-upload" not in mounts
    main_env = {e["name"]: e.get("value") for e in main["env"]}
    assert main_env["HF_HUB_OFFLINE"] == "1" and main_env["SXWL_OUTPUT_DIR"] == "/sxwl/output"
    assert uploader["name"] == "uploader"
    assert {"name": "sxwl-inputs", "emptyDir": {}} in pod["volumes"]
    assert TOKEN not in json.dumps(pod)
    assert "SXWL_INPUTS_CACHE_URL" not in env  # no --serve-inputs: the cloud only

    cached = replace(UPLOADS, cache_url="http://sxwl-agent-inputs.sxwl-system.svc:8471")
    (fetcher,) = pod_spec(fine_tune("model", "training_file"), uploads=cached, trainer_image=TRAINER_IMAGE)[
        "initContainers"
    ]
    env = {e["name"]: e["value"] for e in fetcher["env"]}
    assert env["SXWL_INPUTS_CACHE_URL"] == "http://sxwl-agent-inputs.sxwl-system.svc:8471"

    secret = secret_manifest(record(), TOKEN, UPLOADS, "uid-1", {FETCHER_KEY: FETCHER})
    assert base64.b64decode(secret["data"][FETCHER_KEY]) == Path(pod_fetcher.__file__).read_bytes()
    assert FETCHER_KEY not in secret_manifest(record(), TOKEN, UPLOADS, "uid-1")["data"]


def test_a_pod_that_cannot_fetch_or_train_is_never_made() -> None:
    with pytest.raises(ValueError, match="upload token"):
        pod_spec(fine_tune("model", "training_file"), trainer_image=TRAINER_IMAGE)
    with pytest.raises(ValueError, match="trainer_image"):
        pod_spec(fine_tune("model", "training_file"), uploads=UPLOADS)
    with pytest.raises(RuntimeError, match="model and training_file"):
        pod_spec(fine_tune("training_file"), uploads=UPLOADS, trainer_image=TRAINER_IMAGE)


@pytest.mark.parametrize(
    ("uploads", "trainer_image", "takes"),
    [(UPLOADS, TRAINER_IMAGE, True), (UPLOADS, None, False), (None, TRAINER_IMAGE, False)],
)
def test_the_runtime_takes_fine_tunes_only_with_both_images(
    uploads: UploadConfig | None, trainer_image: str | None, takes: bool, tmp_path: Path
) -> None:
    async def started() -> tuple[bool, str]:
        async with ApiClient() as api:  # never called: start() only records the attempt
            runtime = KubernetesRuntime(api, state_dir=tmp_path, uploads=uploads, trainer_image=trainer_image)
            try:
                return runtime.takes_fine_tunes, runtime.start(fine_tune("model", "training_file")).key
            except RuntimeError as exc:
                assert runtime.jobs == {}
                return runtime.takes_fine_tunes, str(exc)

    assert run_on_thread(started()) == (takes, "j1:2" if takes else REFUSAL)


def _failed_pod(init: V1ContainerStateTerminated) -> V1Pod:
    def status(name: str, state: V1ContainerState) -> V1ContainerStatus:
        return V1ContainerStatus(name=name, image="i", image_id="", ready=False, restart_count=0, state=state)

    waiting = V1ContainerState(waiting=V1ContainerStateWaiting(reason="PodInitializing"))
    return V1Pod(
        metadata=V1ObjectMeta(name="p0"),
        status=V1PodStatus(
            phase="Failed",
            init_container_statuses=[status(INPUTS, V1ContainerState(terminated=init))],
            container_statuses=[status(CONTAINER, waiting)],
        ),
    )


@pytest.mark.parametrize(
    ("message", "reason", "says"),
    [
        (
            "error: input training_file: got 9 bytes, expected 10",
            "Error",
            "inputs not fetched: input training_file: got 9 bytes, expected 10",
        ),
        (None, "OOMKilled", "inputs not fetched: the fetcher failed (OOMKilled)"),
    ],
)
def test_a_pod_whose_inputs_did_not_arrive_fails_with_the_fetchers_words(
    message: str | None, reason: str, says: str
) -> None:
    ended = V1ContainerStateTerminated(exit_code=1, reason=reason, message=message)
    failed = V1JobCondition(type="Failed", status="True", reason="BackoffLimitExceeded", message="limit")
    item = V1Job(metadata=V1ObjectMeta(name="sxwl-j1-2"), status=V1JobStatus(conditions=[failed]))
    seen = outcome(record(), item, [_failed_pod(ended)])
    assert seen is not None and seen.outcome == "failed" and english(seen.reason) == says
    assert seen.never_ran  # the main container waited for its inputs: the user's command never ran


def test_a_trainer_image_without_an_uploader_image_stops_the_agent(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        agent_main.app,
        [
            "--api-url",
            "http://127.0.0.1:9",
            "--runtime",
            "kubernetes",
            "--state-dir",
            str(tmp_path),
            "--trainer-image",
            TRAINER_IMAGE,
        ],
        env={"SXWL_UPLOADER_IMAGE": ""},
    )
    assert result.exit_code == 2
    assert "--trainer-image needs --uploader-image" in result.output


def test_the_trainers_progress_is_read_through_the_rank_prefix_of_a_pods_log() -> None:
    progress = Progress(kind="metrics", step=3, total_steps=12, loss=1.5)
    assert parse_progress(RANK_0 + progress_line(progress)) == progress
    assert parse_progress(progress_line(progress)) == progress  # a local CPod's log
    assert parse_progress("[rank 1] " + progress_line(progress)) is None
