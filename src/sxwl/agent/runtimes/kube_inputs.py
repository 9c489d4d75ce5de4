"""Fine-tunes on Kubernetes (docs/agent.md, "Fine-tunes on Kubernetes"): what a pod adds when its
attempt has inputs and runs the trainer.

- The ``inputs`` init container runs ``sxwl.agent.pod_fetcher`` (its file travels in the upload
  Secret, like the uploader's) on the uploader's image, as nobody, with the Secret mounted. It
  fetches each input (from the agent's cache, or the cloud) with the attempt's upload token,
  checks its sha256 and size, and leaves it read-only in the ``sxwl-inputs`` emptyDir: a model's
  archive unpacked, a file as it is. Last it writes the ``TrainerRun``, whose paths are those the
  main container sees.
- The main container runs the CPod's trainer image (``python3 -m sxwl.trainer``) under the
  wrapper of kube_wrapper.py, the inputs mounted read-only; its checkpoints and adapter go out
  through the uploader like any job's outputs.

With ``--serve-inputs`` the agent has fetched the inputs into its cache before it made the Job
(cache_server.py), and the fetcher reads them from there (SXWL_INPUTS_CACHE_URL), falling back to
the cloud; the heartbeat reports that cache, so the scheduler prefers this CPod for the next job
with the same inputs. Without it each pod fetches its own from the cloud."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sxwl.agent import pod_fetcher
from sxwl.agent.runtimes.kube_objects import KubeJob
from sxwl.agent.runtimes.kube_uploads import (
    CA_KEY,
    TOKEN_DIR,
    TOKEN_KEY,
    TOKEN_VOLUME,
    UPLOADER_SECURITY,
    UploadConfig,
)
from sxwl.agent.runtimes.kube_wrapper import OUTPUT_DIR, SHARED_DIR
from sxwl.protocol import Assignment
from sxwl.protocol.finetune import TrainerRun, TrainerSpec
from sxwl.protocol.reasons import Reason

INPUTS = "inputs"
INPUTS_VOLUME = "sxwl-inputs"
INPUTS_DIR = "/sxwl-inputs"
RUN_FILE = "trainer-run.json"
FETCHER_KEY = "pod_fetcher.py"
FETCHER = Path(pod_fetcher.__file__).read_bytes()
# The fetcher streams each input to disk and unpacks from there: its memory stays small whatever
# the model's size. Its CPU matters only for the sha256.
INPUTS_RESOURCES = {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}
# The trainer reads the model from its directory, never a hub; the libraries' caches go to the
# pod's writable shared volume rather than a home directory the image may not have.
TRAINER_ENV = {"HF_HUB_OFFLINE": "1", "HF_HOME": f"{SHARED_DIR}/hf-home", "TOKENIZERS_PARALLELISM": "false"}


def fine_tune_refusal(assignment: Assignment, takes_fine_tunes: bool) -> Reason | None:
    """Why this runtime cannot start the attempt's pod, if it is a fine-tune's it cannot run."""
    if not assignment.inputs and assignment.trainer is None:
        return None
    if not takes_fine_tunes:
        return Reason.of("kube.no_fine_tunes")
    if assignment.upload_token is None:
        return Reason.of("kube.no_upload_token")
    return None


def start_refusal(assignment: Assignment, fine_tunes: bool, dev_envs: bool, endpoints: bool) -> Reason | None:
    """Why the runtime cannot run the attempt: a dev environment or an endpoint replica where it
    runs none, inputs it cannot fetch (a dev environment's, a replica's model and a fine-tune's come
    alike), a job without an image."""
    dev_env, engine = assignment.jupyter is not None, assignment.engine is not None
    if dev_env and not dev_envs:
        return Reason.of("kube.no_dev_envs")
    if engine and not endpoints:
        return Reason.of("kube.no_engine")
    problem = fine_tune_refusal(assignment, fine_tunes or dev_env or engine)
    if problem is None and not (assignment.image or assignment.trainer or dev_env or engine):
        return Reason.of("kube.no_image")
    return problem


def trainer_run(spec: TrainerSpec, assignment: Assignment) -> TrainerRun:
    """The trainer's run, every path as the main container sees it."""
    names = {item.name for item in assignment.inputs}
    if not {"model", "training_file"} <= names:
        raise RuntimeError("a fine-tune needs the inputs model and training_file")

    def where(name: str) -> str | None:
        return f"{INPUTS_DIR}/{name}" if name in names else None

    return TrainerRun(
        **spec.model_dump(),
        model_dir=f"{INPUTS_DIR}/model",
        training_file=f"{INPUTS_DIR}/training_file",
        validation_file=where("validation_file"),
        resume_from=where("resume"),
        output_dir=OUTPUT_DIR,
    )


def trainer_command() -> list[str]:
    return ["python3", "-m", "sxwl.trainer", f"{INPUTS_DIR}/{RUN_FILE}"]


def volume() -> dict[str, Any]:
    return {"name": INPUTS_VOLUME, "emptyDir": {}}


MAIN_MOUNT = {"name": INPUTS_VOLUME, "mountPath": INPUTS_DIR, "readOnly": True}


def init_container(job: KubeJob, assignment: Assignment, config: UploadConfig) -> dict[str, Any]:
    inputs = [item.model_dump(mode="json") for item in assignment.inputs]
    env = [
        {"name": "SXWL_UPLOAD_URL", "value": config.url},
        {"name": "SXWL_JOB_ID", "value": job.job_id},
        {"name": "SXWL_ATTEMPT", "value": str(job.attempt)},
        {"name": "SXWL_UPLOAD_TOKEN_FILE", "value": f"{TOKEN_DIR}/{TOKEN_KEY}"},
        {"name": "SXWL_INPUTS_DIR", "value": INPUTS_DIR},
        {"name": "SXWL_INPUTS", "value": json.dumps(inputs, separators=(",", ":"))},
        {"name": "PYTHONUNBUFFERED", "value": "1"},
        {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
    ]
    if assignment.trainer is not None:
        run = trainer_run(assignment.trainer, assignment)
        env.append({"name": "SXWL_TRAINER_RUN", "value": run.model_dump_json()})
    if config.ca_pem is not None:
        env.append({"name": "SXWL_UPLOAD_CA_FILE", "value": f"{TOKEN_DIR}/{CA_KEY}"})
    if config.cache_url is not None:
        env.append({"name": "SXWL_INPUTS_CACHE_URL", "value": config.cache_url})
    return {
        "name": INPUTS,
        "image": config.image,
        "command": ["python3", "-I", f"{TOKEN_DIR}/{FETCHER_KEY}"],
        "env": env,
        "volumeMounts": [
            {"name": INPUTS_VOLUME, "mountPath": INPUTS_DIR},
            {"name": TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True},
        ],
        "securityContext": UPLOADER_SECURITY,
        "resources": INPUTS_RESOURCES,
    }


def input_problem(pods: list[Any]) -> Reason | None:
    """Why a pod's inputs did not arrive, for the job's reason: the fetcher's own ``error: …`` line,
    or how its container failed; None when none failed."""
    for pod in pods:
        for status in pod.status.init_container_statuses or []:
            ended = status.state.terminated if status.name == INPUTS and status.state else None
            if ended is None or not ended.exit_code:
                continue
            message = (ended.message or "").strip()
            if message.startswith("error: "):
                return Reason.of("kube.inputs", error=message.removeprefix("error: "))
            return Reason.of(
                "kube.fetcher_failed", detail=message or ended.reason or f"exit code {ended.exit_code}"
            )
    return None
