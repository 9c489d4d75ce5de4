"""The ``openai`` Python client against /v1/fine_tuning/jobs, as users call it (base_url=<cloud>/v1,
api_key=<an API token>). Skipped where the client is not installed."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

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
