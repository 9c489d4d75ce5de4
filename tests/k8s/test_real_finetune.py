"""A fine-tune on a Kubernetes CPod (docs/agent.md, "Fine-tunes on Kubernetes"), on the real test
nodes: the agent has a trainer image (tests/support/k8s_trainer.py) and serves its input cache
(--serve-inputs): it fetches the tiny Llama and the dataset from the cloud once, reports them in its
heartbeat, and the pod's ``inputs`` init container (Debian's python3, as nobody) reads them from the
agent, never from the cloud; the trainer image trains on them for real, its checkpoints and adapter
go back through the uploader, and the adapter loads with peft."""

from __future__ import annotations

import json
import os
import sqlite3
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.agent import eventually
from tests.support.k8s import K8sCluster
from tests.support.k8s_node import RealNodes
from tests.support.k8s_trainer import trainer_image
from tests.support.net import free_port
from tests.support.real_cpod import RealCPod
from tests.support.tiny_finetune import build_model, register_public_model, run_python, write_dataset
from tests.test_cpod_input_cache import pod_input_requests

pytestmark = pytest.mark.k8s
pytest.importorskip("peft", reason="fine-tunes need the training extra: pip install -e '.[train]'")

MODEL = "tiny-llama"
TERMINAL = ("succeeded", "failed", "cancelled")


@pytest.fixture(scope="module")
def cpod(
    k8s_cluster: K8sCluster, real_nodes: RealNodes, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RealCPod]:
    image = trainer_image(real_nodes)
    serve = f"{real_nodes.host_address}:{free_port(real_nodes.host_address)}"
    real = RealCPod(
        k8s_cluster,
        real_nodes,
        tmp_path_factory.mktemp("real-finetune"),
        *("--trainer-image", image, "--serve-inputs", serve),
    )
    yield real
    real.stop()


def _register_model(cpod: RealCPod) -> Path:
    model_dir = build_model(cpod.root / MODEL)
    settings = {
        "SXWL_DATABASE_URL": f"sqlite:///{cpod.root / 'sxwl.db'}",
        "SXWL_DATA_DIR": str(cpod.root / "cloud"),
    }
    register_public_model(MODEL, model_dir, {**os.environ, **settings})
    return model_dir


def _dataset(cpod: RealCPod, examples: int) -> str:
    path = write_dataset(cpod.root / "train.jsonl", examples)
    with path.open("rb") as handle:
        reply = httpx.post(
            f"{cpod.url}/v1/files",
            headers=cpod.user,
            data={"purpose": "fine-tune"},
            files={"file": ("train.jsonl", handle, "application/jsonl")},
            timeout=60,
        )
    assert reply.status_code in (200, 201), reply.text
    file_id: str = reply.json()["id"]
    return file_id


def _fine_tune(cpod: RealCPod, fine_tune_id: str) -> dict[str, Any]:
    found: dict[str, Any] = httpx.get(
        f"{cpod.url}/v1/fine_tuning/jobs/{fine_tune_id}", headers=cpod.user
    ).json()
    return found


def test_a_fine_tune_trains_in_the_trainer_image_and_hands_back_an_adapter_that_loads(cpod: RealCPod) -> None:
    cpods = httpx.get(f"{cpod.url}/api/v1/cpods", headers=cpod.provider).json()
    assert [c["fine_tunes"] for c in cpods] == [True]  # the agent said so at its start
    model_dir = _register_model(cpod)
    training = _dataset(cpod, 24)
    created = httpx.post(
        f"{cpod.url}/v1/fine_tuning/jobs",
        headers=cpod.user,
        json={
            "model": MODEL,
            "training_file": training,
            "hyperparameters": {"n_epochs": 2, "batch_size": 4},
            "suffix": "k8s",
            "gpus": 0,
        },
    )
    assert created.status_code in (200, 201), created.text
    fine_tune_id: str = created.json()["id"]

    def ended() -> dict[str, Any] | None:
        job = _fine_tune(cpod, fine_tune_id)
        return job if job["status"] in TERMINAL else None

    done = eventually(
        ended, timeout=600, what=f"fine-tune {fine_tune_id} to end; agent:\n{cpod.agent_log[-3000:]}"
    )
    events = httpx.get(
        f"{cpod.url}/v1/fine_tuning/jobs/{fine_tune_id}/events", headers=cpod.user, params={"limit": 100}
    ).json()["data"]
    assert done["status"] == "succeeded", ([e["message"] for e in events], cpod.log(done["job_id"])[-3000:])
    assert done["fine_tuned_model"] == f"ft:{MODEL}:k8s:{fine_tune_id}"
    steps = {int(e["data"]["step"]) for e in events if e["type"] == "metrics" and e.get("data")}
    assert max(steps) == 12  # 24 examples / 4 per step, 2 epochs: the trainer's progress lines came back
    checkpoints = httpx.get(
        f"{cpod.url}/v1/fine_tuning/jobs/{fine_tune_id}/checkpoints", headers=cpod.user
    ).json()["data"]
    assert sorted(c["step_number"] for c in checkpoints) == [6, 12]

    assert done["trained_tokens"] > 0  # the trainer read the dataset its init container fetched
    job_id: str = done["job_id"]
    got = httpx.get(
        f"{cpod.url}/api/v1/models/{done['fine_tuned_model']}/content",
        headers=cpod.user,
        follow_redirects=True,
        timeout=60,
    )
    assert got.status_code == 200
    adapter = cpod.root / "adapter.tar"
    adapter.write_bytes(got.content)
    with tarfile.open(adapter) as tar:
        tar.extractall(cpod.root / "adapter", filter="data")
    loaded = run_python(
        "import sys\n"
        "from peft import PeftModel\n"
        "from transformers import AutoModelForCausalLM\n"
        "model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(sys.argv[1]), sys.argv[2])\n"
        "print(type(model).__name__)\n",
        str(model_dir),
        str(cpod.root / "adapter"),
    )
    assert loaded.strip() == "PeftModelForCausalLM"
    cpod.nothing_left(job_id)

    # The inputs came from the agent's cache, which the cloud now knows this CPod holds.
    assert pod_input_requests(cpod.url) == 0
    with sqlite3.connect(cpod.root / "sxwl.db") as db:
        (cached,) = db.execute("SELECT cached_inputs FROM cpods").fetchone()
        (inputs,) = db.execute("SELECT inputs FROM jobs WHERE id = ?", (job_id,)).fetchone()
    # What the attempt fetched: not the ``resume`` input that its own last checkpoint has become.
    needed = {item["sha256"]: item["size"] for item in json.loads(inputs) if item["name"] != "resume"}
    assert len(needed) == 2  # the model and the training file
    assert {entry["sha256"]: entry["size"] for entry in json.loads(cached)} == needed
