"""Fine-tunes through the whole system (docs/finetune.md): `sxwl serve` and real `sxwl-agent`
processes on loopback, the local runtime's sandbox, and the trainer really training the tiny Llama on
CPUs. A user drives it with the official `openai` client; a CPod lost mid-run hands the work to
another, which resumes from the last checkpoint that reached the cloud."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.agent import eventually
from tests.support.places import private_dir
from tests.support.tiny_finetune import build_model, register_public_model, run_python, write_dataset
from tests.test_jobs_process import World

pytest.importorskip("peft", reason="fine-tunes need the training extra: pip install -e '.[train]'")
openai = pytest.importorskip("openai")

__all__ = ["private_dir"]  # the fixture
MODEL = "tiny-llama"
TERMINAL = ("succeeded", "failed", "cancelled")


class FineTuneWorld(World):
    """A cloud with the tiny model registered as public and a user with an `openai` client."""

    def __init__(self, root: Path, db_url: str, **env: str) -> None:
        super().__init__(root, db_url, **env)
        self.model_dir = build_model(root / MODEL)
        register_public_model(
            MODEL, self.model_dir, {**os.environ, **self.env, "SXWL_DATA_DIR": str(root / "cloud")}
        )
        token = self.user["Authorization"].removeprefix("Bearer ")
        self.api = openai.OpenAI(api_key=token, base_url=f"{self.url}/v1", max_retries=0)

    def dataset(self, examples: int) -> str:
        path = write_dataset(self.root / "train.jsonl", examples)
        with path.open("rb") as handle:
            file = self.api.files.create(file=handle, purpose="fine-tune")
        assert file.status == "processed", file
        file_id: str = file.id
        return file_id

    def wait_status(self, fine_tune_id: str, *statuses: str, timeout: float = 300) -> Any:
        def reached() -> Any:
            job = self.api.fine_tuning.jobs.retrieve(fine_tune_id)
            return job if job.status in statuses else None

        return eventually(reached, timeout=timeout, what=f"fine-tune {fine_tune_id} {'/'.join(statuses)}")

    def messages(self, fine_tune_id: str) -> list[str]:
        return [e.message for e in self.api.fine_tuning.jobs.list_events(fine_tune_id, limit=100)]


@pytest.fixture
def ftworld(tmp_path: Path, db_url: str) -> Iterator[FineTuneWorld]:
    w = FineTuneWorld(tmp_path, db_url)
    yield w
    w.close()


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_fine_tune_from_the_openai_client_to_an_adapter_that_loads(
    ftworld: FineTuneWorld, private_dir: Path
) -> None:
    # The agent's state below a dir the trainer's uid cannot search, on a path with spaces (a clone
    # in root's home): the trainer still reads its run file and inputs (docs/agent.md, "Isolation").
    ftworld.agent("a", state_dir=private_dir / "agent state")
    ftworld.online()
    training = ftworld.dataset(24)
    job = ftworld.api.fine_tuning.jobs.create(
        model=MODEL,
        training_file=training,
        hyperparameters={"n_epochs": 2, "batch_size": 4},
        suffix="e2e",
        extra_body={"gpus": 0},
    )
    done = ftworld.wait_status(job.id, *TERMINAL)
    assert done.status == "succeeded", ftworld.messages(job.id)
    assert done.fine_tuned_model == f"ft:{MODEL}:e2e:{job.id}"
    assert done.trained_tokens and done.trained_tokens > 0
    # The trainer's count of the file's tokens with the base's tokenizer is now the file's.
    file = httpx.get(f"{ftworld.url}/v1/files/{training}", headers=ftworld.user).json()
    counted = file["validation"]["tokens"][MODEL]
    assert counted["examples"] == 24 and 0 < counted["loss_tokens"] < counted["tokens"]
    events = list(ftworld.api.fine_tuning.jobs.list_events(job.id, limit=100))
    metrics = [e for e in events if e.type == "metrics" and e.data and e.data.get("loss") is not None]
    assert len(metrics) >= 6 * 2 - 1  # a point per step: 24 examples / 4 per step, 2 epochs
    steps = sorted({int(e.data["step"]) for e in metrics})
    assert steps[-1] == 12
    checkpoints = list(ftworld.api.fine_tuning.jobs.checkpoints.list(job.id))
    assert sorted(c.step_number for c in checkpoints) == [6, 12]
    model = ftworld.api.models.retrieve(done.fine_tuned_model)
    assert model.id == done.fine_tuned_model
    adapter = ftworld.root / "adapter.tar"
    got = httpx.get(
        f"{ftworld.url}/api/v1/models/{model.id}/content", headers=ftworld.user, follow_redirects=True
    )
    assert got.status_code == 200
    adapter.write_bytes(got.content)
    with tarfile.open(adapter) as tar:
        tar.extractall(ftworld.root / "adapter", filter="data")
    loaded = run_python(
        "import sys, torch\n"
        "from peft import PeftModel\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "base = AutoModelForCausalLM.from_pretrained(sys.argv[1])\n"
        "model = PeftModel.from_pretrained(base, sys.argv[2])\n"
        "tok = AutoTokenizer.from_pretrained(sys.argv[2])\n"
        "ids = tok('Translate to Chinese: cat', return_tensors='pt').input_ids\n"
        "out = model.generate(ids, max_new_tokens=3, do_sample=False)\n"
        "print(type(model).__name__, out.shape[1] > ids.shape[1])\n",
        str(ftworld.model_dir),
        str(ftworld.root / "adapter"),
    )
    assert loaded.split() == ["PeftModelForCausalLM", "True"]


def _kill_cpod(world: FineTuneWorld, name: str) -> None:
    """The machine is lost: its agent and every process of its jobs (which outlive the agent, in
    their own sessions) die at once."""
    world.agents[0].signal(signal.SIGKILL)
    state_dir = str(world.root / f"agent-{name}")
    subprocess.run(["pkill", "-KILL", "-f", state_dir], check=False)


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_lost_cpod_hands_the_fine_tune_to_another_which_resumes_from_its_checkpoint(
    ftworld: FineTuneWorld,
) -> None:
    ftworld.agent("a")
    ftworld.online()
    training = ftworld.dataset(80)
    job = ftworld.api.fine_tuning.jobs.create(
        model=MODEL,
        training_file=training,
        hyperparameters={"n_epochs": 6, "batch_size": 4},
        extra_body={"gpus": 0},
    )
    first = eventually(
        lambda: list(ftworld.api.fine_tuning.jobs.checkpoints.list(job.id)) or None,
        timeout=300,
        what="a first checkpoint in the cloud",
    )
    saved_step = max(c.step_number for c in first)
    _kill_cpod(ftworld, "a")
    ftworld.agent("b")
    done = ftworld.wait_status(job.id, *TERMINAL)
    messages = ftworld.messages(job.id)
    assert done.status == "succeeded", messages
    underlying = httpx.get(f"{ftworld.url}/api/v1/jobs/{done.job_id}", headers=ftworld.user).json()
    assert underlying["attempt"] == 2
    resumed = [m for m in messages if m.startswith("Resumed from checkpoint")]
    assert len(resumed) == 1, messages
    assert f"step {saved_step}" in resumed[0] or any(
        f"step {s}" in resumed[0] for s in range(saved_step, 121)
    )
    steps = [c.step_number for c in ftworld.api.fine_tuning.jobs.checkpoints.list(job.id)]
    assert max(steps) == 120 and len(steps) == len(set(steps))  # 80 / 4 × 6, and no step saved twice
    log = httpx.get(
        f"{ftworld.url}/api/v1/jobs/{done.job_id}/logs", headers=ftworld.user, params={"attempt": 2}
    ).text
    progress = [
        json.loads(line.split(" ", 1)[1]) for line in log.splitlines() if line.startswith("::sxwl-progress::")
    ]
    # The dataset's token count first, then training goes on from the checkpoint.
    assert [p["kind"] for p in progress[:2]] == ["dataset", "resumed"], progress[:2]
    assert progress[1]["step"] >= saved_step
    time.sleep(0)  # nothing else: the first attempt's late files are fenced (tests/test_fine_tunes_api.py)
