"""The ``openai`` Python client against /v1/fine_tuning/jobs, as users call it (base_url=<cloud>/v1,
api_key=<an API token>). Skipped where the client is not installed."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from sxwl.protocol.finetune import Progress, checkpoint_artifact, progress_line
from tests.support.agent import eventually
from tests.test_fine_tunes_api import BASE, FineTunes
from tests.test_jobs_api import PRODUCT

openai = pytest.importorskip("openai")


def test_the_openai_client_creates_lists_and_cancels(client: TestClient) -> None:
    ft = FineTunes(client)
    token = ft.user["Authorization"].removeprefix("Bearer ")
    api = openai.OpenAI(api_key=token, base_url="http://testserver/v1", http_client=client, max_retries=0)
    job = api.fine_tuning.jobs.create(
        model=BASE,
        training_file="file-train",
        hyperparameters={"n_epochs": 2},
        suffix="sdk",
        extra_body={"gpus": 1, "gpu_product": PRODUCT},
    )
    assert job.status == "queued" and job.model == BASE and job.hyperparameters.n_epochs == 2
    assert [j.id for j in api.fine_tuning.jobs.list()] == [job.id]
    assert api.fine_tuning.jobs.retrieve(job.id).training_file == "file-train"
    events = list(api.fine_tuning.jobs.list_events(job.id))
    assert events[0].message == "Fine-tuning job queued"
    assert list(api.fine_tuning.jobs.checkpoints.list(job.id)) == []
    assert api.fine_tuning.jobs.cancel(job.id).status in ("cancelled", "queued")
    with pytest.raises(openai.NotFoundError):
        api.fine_tuning.jobs.create(model="no-such-model", training_file="file-train")


def test_checkpoints_list_the_losses_logged_at_their_own_steps(client: TestClient) -> None:
    """Each checkpoint's metrics are its step's, whether its upload arrives after its log lines or
    before them (the agent ships the log in batches; a checkpoint is uploaded as soon as it exists)."""
    ft = FineTunes(client)
    token = ft.user["Authorization"].removeprefix("Bearer ")
    api = openai.OpenAI(api_key=token, base_url="http://testserver/v1", http_client=client, max_retries=0)
    fine_tune, _ = ft.running()
    job_id = fine_tune["job_id"]
    losses = {step: round(3.0 - step * 0.05, 4) for step in range(1, 31)}
    evals = {10: 2.71, 20: 2.42, 30: 2.13}

    def line(**fields: object) -> bytes:
        return (progress_line(Progress.model_validate(fields)) + "\n").encode()

    def lines(steps: range) -> bytes:
        out = b""
        for step in steps:
            out += line(kind="metrics", step=step, total_steps=30, loss=losses[step], elapsed_s=step)
            if step in evals:
                out += line(kind="eval", step=step, total_steps=30, eval_loss=evals[step], elapsed_s=step)
                out += line(kind="checkpoint", step=step, checkpoint=checkpoint_artifact(step))
        return out

    offset = 0
    for steps, uploads_first in ((range(1, 11), False), (range(11, 21), True), (range(21, 31), False)):
        last = steps[-1]
        if uploads_first:  # the checkpoint's upload overtakes the lines of its step
            assert ft.put(job_id, checkpoint_artifact(last), f"step {last}".encode()).status_code == 201
            assert api.fine_tuning.jobs.checkpoints.list(fine_tune["id"]).data[0].metrics.train_loss is None
        data = lines(steps)
        assert ft.log(job_id, 1, offset, data).status_code == 200
        offset += len(data)
        if not uploads_first:
            assert ft.put(job_id, checkpoint_artifact(last), f"step {last}".encode()).status_code == 201
    listed = list(api.fine_tuning.jobs.checkpoints.list(fine_tune["id"]))
    assert [c.step_number for c in listed] == [30, 20, 10]
    for checkpoint in listed:
        step = checkpoint.step_number
        assert checkpoint.metrics.step == step
        assert checkpoint.metrics.train_loss == losses[step], step
        assert checkpoint.metrics.valid_loss == evals[step], step
    logged = {
        int(e.data["step"]): e.data["loss"]
        for e in api.fine_tuning.jobs.list_events(fine_tune["id"], limit=100)
        if e.type == "metrics" and e.data and e.data.get("loss") is not None
    }
    assert {c.step_number: c.metrics.train_loss for c in listed} == {s: logged[s] for s in (10, 20, 30)}


def test_a_queued_fine_tune_says_what_it_waits_for(client: TestClient) -> None:
    """The reason is ours (OpenAI's object has no field for it): the client keeps it as an extra."""
    ft = FineTunes(client)
    token = ft.user["Authorization"].removeprefix("Bearer ")
    api = openai.OpenAI(api_key=token, base_url="http://testserver/v1", http_client=client, max_retries=0)
    job = api.fine_tuning.jobs.create(
        model=BASE, training_file="file-train", extra_body={"gpus": 64, "gpu_product": PRODUCT}
    )

    def waiting() -> str | None:
        reason = api.fine_tuning.jobs.retrieve(job.id).model_extra["reason"]
        return reason if reason and "scheduler" not in reason else None

    reason = eventually(waiting, what="the scheduler's reason")
    assert reason == f"no online CPod offers 64 × {PRODUCT}"
    assert api.fine_tuning.jobs.retrieve(job.id).error is None  # waiting is no error
    cancelled = api.fine_tuning.jobs.cancel(job.id)
    assert cancelled.status == "cancelled" and cancelled.model_extra["reason"]
