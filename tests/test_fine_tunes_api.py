"""Fine-tunes through OpenAI's REST API (``/v1/fine_tuning/jobs``), with the CPod's agent driven by
hand over the agent protocol: inputs, progress from the log, checkpoints and resumes, the adapter
(SQLite and PostgreSQL)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from sxwl.cloud.db.finetune_models import CatalogModel, FileStatus, FineTune, ModelKind
from sxwl.cloud.db.models import Job
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.services.fleet import cpods as cpod_service
from sxwl.protocol.finetune import Progress, checkpoint_artifact, progress_line
from tests.conftest import login, register
from tests.support.agent import eventually
from tests.support.clock import TestClock
from tests.support.cpods import beat, gpu_node
from tests.support.finetune_rows import add_file, add_model
from tests.test_admin_api import make_admin
from tests.test_cpods_api import ctx_of
from tests.test_jobs_api import PRODUCT, Setup

BASE = "tiny-llama"
MODEL_TAR = b"a model directory, as a tar" * 50
TRAIN = b'{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n' * 3
VALID = TRAIN[: len(TRAIN) // 3]
URL = "/v1/fine_tuning/jobs"


class FineTunes(Setup):
    def __init__(self, client: TestClient) -> None:
        super().__init__(client)
        self.ctx = ctx_of(client)
        self.user_id: str = client.get("/api/v1/me", headers=self.user).json()["id"]
        add_model(self.ctx, BASE, MODEL_TAR)
        add_file(self.ctx, self.user_id, "file-train", TRAIN)
        add_file(self.ctx, self.user_id, "file-valid", VALID, examples=1)

    def create(self, **body: Any) -> Any:
        payload = {
            "model": BASE,
            "training_file": "file-train",
            "validation_file": "file-valid",
            "suffix": "demo",
            "gpus": 1,
            "gpu_product": PRODUCT,
        } | body
        return self.client.post(URL, headers=self.user, json=payload)

    def created(self, **body: Any) -> dict[str, Any]:
        response = self.create(**body)
        assert response.status_code == 200, response.text
        out: dict[str, Any] = response.json()
        return out

    def get(self, fine_tune_id: str) -> dict[str, Any]:
        out: dict[str, Any] = self.client.get(f"{URL}/{fine_tune_id}", headers=self.user).json()
        return out

    def events(self, fine_tune_id: str, **params: Any) -> dict[str, Any]:
        out: dict[str, Any] = self.client.get(
            f"{URL}/{fine_tune_id}/events", headers=self.user, params={"limit": 100} | params
        ).json()
        return out

    def messages(self, fine_tune_id: str) -> list[str]:
        return [e["message"] for e in self.events(fine_tune_id)["data"]]

    def fetch(self, job_id: str, name: str, attempt: int = 1) -> Any:
        return self.client.get(
            f"/api/v1/agent/jobs/{job_id}/inputs/{name}", headers=self.agent, params={"attempt": attempt}
        )

    def put(self, job_id: str, path: str, data: bytes, attempt: int = 1) -> Any:
        return self.client.put(
            f"/api/v1/agent/jobs/{job_id}/artifacts/{path}?attempt={attempt}",
            headers=self.agent,
            content=data,
        )

    def running(self, **body: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        """A fine-tune whose first attempt runs, and that attempt's assignment."""
        fine_tune = self.created(**body)
        (assignment,) = eventually(lambda: self.poll()["assignments"], what="the assignment")
        assert self.status(fine_tune["job_id"], 1, "running").status_code == 200
        return fine_tune, assignment

    def job_row(self, job_id: str) -> Job:
        with self.ctx.db.session() as session:
            job = session.get(Job, job_id)
            assert job is not None
            session.expunge(job)
            return job


@pytest.fixture
def ft(client: TestClient) -> FineTunes:
    return FineTunes(client)


def _line(kind: str, **fields: Any) -> bytes:
    return (progress_line(Progress.model_validate({"kind": kind, **fields})) + "\n").encode()


def test_create_queues_a_trainer_job_whose_agent_fetches_its_inputs(ft: FineTunes) -> None:
    fine_tune = ft.created(hyperparameters={"n_epochs": 2}, seed=7)
    assert fine_tune["id"].startswith("ftjob-") and len(fine_tune["id"]) == 6 + 24
    assert fine_tune["object"] == "fine_tuning.job" and fine_tune["status"] == "queued"
    assert fine_tune["model"] == BASE and fine_tune["training_file"] == "file-train"
    assert fine_tune["hyperparameters"] == {"n_epochs": 2, "batch_size": 4, "learning_rate_multiplier": 1.0}
    assert fine_tune["seed"] == 7 and fine_tune["suffix"] == "demo" and fine_tune["fine_tuned_model"] is None
    job = ft.job(fine_tune["job_id"])
    assert job["command"] == ["sxwl-trainer"] and job["name"] == "ft-demo" and job["gpus_per_node"] == 1
    assert ft.messages(fine_tune["id"])[-1] == "Validating training file: file-train"  # newest first
    assert ft.messages(fine_tune["id"])[0] == "Fine-tuning job queued"

    (assignment,) = eventually(lambda: ft.poll()["assignments"], what="the assignment")
    assert assignment["trainer"]["hyperparameters"]["n_epochs"] == 2 and assignment["trainer"]["seed"] == 7
    inputs = {i["name"]: i for i in assignment["inputs"]}
    assert sorted(inputs) == ["model", "training_file", "validation_file"]
    assert inputs["model"]["archive"] is True and inputs["training_file"]["archive"] is False
    for name, data in (("model", MODEL_TAR), ("training_file", TRAIN), ("validation_file", VALID)):
        got = ft.fetch(fine_tune["job_id"], name)
        assert got.status_code == 200 and got.content == data
        assert hashlib.sha256(got.content).hexdigest() == inputs[name]["sha256"]
        assert inputs[name]["size"] == len(data)
    unknown = ft.fetch(fine_tune["job_id"], "resume")
    assert unknown.status_code == 404
    assert ft.fetch(fine_tune["job_id"], "model", attempt=2).status_code == 403  # never this CPod's


def test_progress_lines_split_across_chunks_become_metrics(ft: FineTunes) -> None:
    fine_tune, _ = ft.running()
    job_id = fine_tune["job_id"]
    log = (
        b"loading the model\n"
        + _line("started", total_steps=10, message="Training started")
        + _line(
            "metrics",
            step=2,
            total_steps=10,
            loss=2.5,
            learning_rate=1e-4,
            epoch=0.2,
            tokens_per_s=50.0,
            elapsed_s=3.5,
        )
        + b"::sxwl-progress:: {not json\n"
        + _line("eval", step=4, total_steps=10, eval_loss=2.25, trained_tokens=800)
    )
    offset = 0
    for size in (7, 40, 3, 61, 500):  # chunk edges fall inside the progress lines
        chunk = log[offset : offset + size]
        assert ft.log(job_id, 1, offset, chunk).status_code == 200
        offset += len(chunk)
        if offset == 7 + 40:  # half a line in: nothing of it counted yet
            assert ft.get(fine_tune["id"])["progress"]["step"] == 0
    assert offset == len(log)

    now = ft.get(fine_tune["id"])
    assert now["status"] == "running"
    assert now["progress"] == {"step": 4, "total_steps": 10, "percent": 40.0}
    assert now["trained_tokens"] == 800
    events = ft.events(fine_tune["id"])["data"]
    metrics = [e for e in events if e["type"] == "metrics"]
    assert [m["data"]["step"] for m in metrics] == [4, 2]
    assert metrics[1]["data"] == {
        "step": 2,
        "total_steps": 10,
        "loss": 2.5,
        "eval_loss": None,
        "learning_rate": 1e-4,
        "tokens_per_s": 50.0,
        "epoch": 0.2,
        "elapsed_s": 3.5,
    }
    assert metrics[0]["data"]["eval_loss"] == 2.25
    assert "Training started" in [e["message"] for e in events]
    assert all(e["object"] == "fine_tuning.job.event" and e["id"].startswith("ftevent-") for e in events)
    # Pages of events: newest first, continued with ``after``.
    first = ft.events(fine_tune["id"], limit=2)
    assert first["has_more"] is True and len(first["data"]) == 2
    rest = ft.events(fine_tune["id"], after=first["data"][-1]["id"])
    assert [e["id"] for e in first["data"] + rest["data"]] == [e["id"] for e in events]


def test_the_trainers_token_counts_land_on_the_files_per_base_model(ft: FineTunes) -> None:
    fine_tune, _ = ft.running()
    training = {"file": "training_file", "examples": 3, "tokens": 120, "loss_tokens": 30}
    validation = {"file": "validation_file", "examples": 0, "tokens": 0, "loss_tokens": 0, "dropped": 1}
    log = _line("dataset", dataset=training) + _line("dataset", dataset=validation)
    assert ft.log(fine_tune["job_id"], 1, 0, log).status_code == 200

    train = ft.client.get("/v1/files/file-train", headers=ft.user).json()["validation"]["tokens"]
    assert train == {BASE: {"examples": 3, "tokens": 120, "loss_tokens": 30, "dropped": 0}}
    valid = ft.client.get("/v1/files/file-valid", headers=ft.user).json()["validation"]["tokens"]
    assert valid[BASE]["dropped"] == 1
    assert ft.messages(fine_tune["id"])[:3] == [
        "1 examples of file file-valid dropped: no assistant token within max_seq_len",
        "Validation file file-valid: 0 examples, 0 tokens (0 trained) with tiny-llama's tokenizer",
        "Training file file-train: 3 examples, 120 tokens (30 trained) with tiny-llama's tokenizer",
    ]
    assert ft.events(fine_tune["id"])["data"][0]["level"] == "warn"
    # A file no fine-tune has tokenized yet has no counts.
    add_file(ft.ctx, ft.user_id, "file-new", TRAIN)
    assert ft.client.get("/v1/files/file-new", headers=ft.user).json()["validation"]["tokens"] == {}


def test_a_checkpoint_then_the_adapter_registers_the_model(ft: FineTunes) -> None:
    fine_tune, _ = ft.running()
    job_id = fine_tune["job_id"]
    ft.log(job_id, 1, 0, _line("metrics", step=5, total_steps=10, loss=1.5))
    checkpoint = b"checkpoint at step 5"
    assert ft.put(job_id, checkpoint_artifact(5), checkpoint).status_code == 201
    listed = ft.client.get(f"{URL}/{fine_tune['id']}/checkpoints", headers=ft.user).json()
    (entry,) = listed["data"]
    assert entry["object"] == "fine_tuning.job.checkpoint" and entry["id"].startswith("ftckpt-")
    assert entry["step_number"] == 5 and entry["metrics"]["train_loss"] == 1.5
    assert entry["fine_tuning_job_id"] == fine_tune["id"]
    assert entry["fine_tuned_model_checkpoint"] == f"ft:{BASE}:demo:{fine_tune['id']}:ckpt-step-5"
    (resume,) = [i for i in ft.job_row(job_id).inputs if i["name"] == "resume"]
    assert resume["sha256"] == hashlib.sha256(checkpoint).hexdigest() and resume["archive"] is True
    assert resume["object"] == {"job_id": job_id, "attempt": 1, "path": checkpoint_artifact(5)}
    assert "Checkpoint at step 5 saved" in ft.messages(fine_tune["id"])
    # A later checkpoint replaces the resume input; an ordinary output changes nothing.
    assert ft.put(job_id, checkpoint_artifact(8), b"checkpoint at step 8").status_code == 201
    assert ft.put(job_id, "checkpoints/notes.txt", b"not a checkpoint").status_code == 201
    resumes = [i for i in ft.job_row(job_id).inputs if i["name"] == "resume"]
    assert [r["object"]["path"] for r in resumes] == [checkpoint_artifact(8)]
    listed = ft.client.get(f"{URL}/{fine_tune['id']}/checkpoints", headers=ft.user).json()
    assert [c["step_number"] for c in listed["data"]] == [8, 5]

    adapter = b"adapter_config.json and adapter_model.safetensors"
    assert ft.put(job_id, "adapter.tar", adapter).status_code == 201
    assert ft.status(job_id, 1, "succeeded", exit_code=0).status_code == 200
    done = ft.get(fine_tune["id"])
    name = f"ft:{BASE}:demo:{fine_tune['id']}"
    assert done["status"] == "succeeded" and done["fine_tuned_model"] == name and done["finished_at"]
    assert done["error"] is None and done["estimated_finish"] is None
    assert ft.messages(fine_tune["id"])[0] == "The job has successfully completed"
    with ft.ctx.db.session() as session:
        model = session.get(CatalogModel, name)
        assert model is not None and model.kind == ModelKind.ADAPTER and model.owner_id == ft.user_id
        assert model.base_model_id == BASE and model.sha256 == hashlib.sha256(adapter).hexdigest()
        assert model.object == {"job_id": job_id, "attempt": 1, "path": "adapter.tar"}
        assert model.bytes == len(adapter) and model.fine_tune_id == fine_tune["id"]


def test_a_trainer_that_writes_no_adapter_has_failed(ft: FineTunes) -> None:
    fine_tune, _ = ft.running(suffix=None)
    assert ft.status(fine_tune["job_id"], 1, "succeeded", exit_code=0).status_code == 200
    done = ft.get(fine_tune["id"])
    assert done["status"] == "failed" and done["fine_tuned_model"] is None
    assert "adapter.tar" in done["error"]["message"]
    assert ft.job(fine_tune["job_id"])["state"] == "failed"
    assert ft.messages(fine_tune["id"])[0].startswith("the trainer ended without writing adapter.tar")
    with ft.ctx.db.session() as session:
        assert session.scalar(select(func.count()).select_from(CatalogModel)) == 1  # the base only


def test_a_file_a_fine_tune_names_is_not_deleted(ft: FineTunes) -> None:
    fine_tune = ft.created()
    refused = ft.client.delete("/v1/files/file-train", headers=ft.user)
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"]["details"] == {"fine_tune": fine_tune["id"]}
    content = ft.client.get("/v1/files/file-train/content", headers=ft.user)
    assert content.status_code == 200 and content.content == TRAIN  # the bytes are still there


def test_cancel_a_queued_and_a_running_fine_tune(ft: FineTunes) -> None:
    waiting = ft.created(gpus=64)  # no node has 64 GPUs
    cancelled = ft.client.post(f"{URL}/{waiting['id']}/cancel", headers=ft.user)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert ft.messages(waiting["id"])[0].startswith("The job was cancelled: cancelled by dev@example.com")
    again = ft.client.post(f"{URL}/{waiting['id']}/cancel", headers=ft.user)
    assert again.status_code == 409
    said = "This fine-tune has already finished (cancelled); there is nothing to cancel."
    assert again.json()["error"]["message"] == said

    running, _ = ft.running()
    assert ft.client.post(f"{URL}/{running['id']}/cancel", headers=ft.user).json()["status"] == "running"
    (command,) = ft.poll()["commands"]
    assert command["job_id"] == running["job_id"] and command["cancel"] is True
    ft.status(running["job_id"], 1, "failed", exit_code=143)
    assert ft.get(running["id"])["status"] == "cancelled"


def test_a_requeued_attempt_resumes_from_the_last_checkpoint(ft: FineTunes) -> None:
    fine_tune, _ = ft.running()
    job_id = fine_tune["job_id"]
    checkpoint = b"checkpoint at step 3"
    assert ft.put(job_id, checkpoint_artifact(3), checkpoint).status_code == 201
    cpod_service.sweep_liveness(ft.ctx, utcnow() + timedelta(seconds=40))  # unknown
    cpod_service.sweep_liveness(ft.ctx, utcnow() + timedelta(seconds=200))  # offline → requeued
    assert ft.get(fine_tune["id"])["status"] == "queued"
    lost = ft.messages(fine_tune["id"])[0]
    assert lost.startswith("Attempt 1 was lost") and "resumes from the checkpoint at step 3" in lost
    stale = ft.fetch(job_id, "model", attempt=1)
    assert stale.status_code == 409 and stale.json()["error"]["details"]["stop"] is True

    ft.seq += 1
    beat(ft.client, ft.token, ft.seq, [gpu_node("w1", count=8)])  # the CPod comes back
    for command in ft.poll()["commands"]:
        ft.client.post(f"/api/v1/agent/commands/{command['id']}/ack", headers=ft.agent)
    (again,) = eventually(lambda: ft.poll()["assignments"], what="the second attempt")
    assert again["attempt"] == 2
    (resume,) = [i for i in again["inputs"] if i["name"] == "resume"]
    assert resume["sha256"] == hashlib.sha256(checkpoint).hexdigest() and resume["archive"] is True
    got = ft.fetch(job_id, "resume", attempt=2)
    assert got.status_code == 200 and got.content == checkpoint

    assert ft.status(job_id, 2, "running").status_code == 200
    ft.log(job_id, 2, 0, _line("resumed", step=3, total_steps=10))
    assert ft.messages(fine_tune["id"])[0] == "Resumed from checkpoint at step 3 (attempt 2)"
    assert ft.get(fine_tune["id"])["progress"]["step"] == 3


def _nothing_created(ft: FineTunes) -> None:
    with ft.ctx.db.session() as session:
        assert session.scalar(select(func.count()).select_from(FineTune)) == 0
        assert session.scalar(select(func.count()).select_from(Job)) == 0


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"model": "no-such-model"}, 404, "model"),
        ({"model": "someone-elses"}, 404, "model"),
        ({"model": "an-adapter"}, 422, "model"),
        ({"training_file": "file-nope"}, 404, "training_file"),
        ({"training_file": "file-broken"}, 422, "training_file"),
        ({"validation_file": "file-theirs"}, 404, "validation_file"),
        ({"hyperparameters": {"n_epochs": 0}}, 422, "hyperparameters.n_epochs"),
        (
            {"hyperparameters": {"learning_rate_multiplier": -1}},
            422,
            "hyperparameters.learning_rate_multiplier",
        ),
        ({"suffix": "has spaces"}, 422, "suffix"),
        ({"max_cost": 1000}, 422, "max_cost"),  # no price yet: no estimate to hold it to
    ],
)
def test_bad_requests_name_the_field_and_create_nothing(
    ft: FineTunes, body: dict[str, Any], status: int, field: str
) -> None:
    other = register(ft.client, "other@example.com", "user")["id"]
    add_model(ft.ctx, "someone-elses", b"private", owner_id=other)
    add_model(ft.ctx, "an-adapter", b"adapter", kind=ModelKind.ADAPTER, base_model_id=BASE)
    add_file(ft.ctx, ft.user_id, "file-broken", b"{not json\n", status=FileStatus.ERROR, examples=0)
    add_file(ft.ctx, other, "file-theirs", VALID)
    response = ft.create(**body)
    assert response.status_code == status, response.text
    named = [d["field"] for d in response.json()["error"]["details"]]
    # A field that is a number or "auto" is named with the branch of the union that refused it.
    assert any(name == field or name.startswith(field + ".") for name in named), named
    _nothing_created(ft)


def test_max_cost_is_held_to_the_estimate(ft: FineTunes) -> None:
    admin = make_admin(ft.client)
    prices = {"prices": [{"product": PRODUCT, "price_per_hour_yuan": "7.20", "fee_percent": "10"}]}
    assert ft.client.put("/api/v1/admin/prices", headers=admin, json=prices).status_code == 200
    # 3 examples in batches of 4, 3 epochs: 3 steps, about 126 s at 7.20 CNY per hour = 252000 µ¥.
    refused = ft.create(max_cost=250_000)
    assert refused.status_code == 422 and refused.json()["error"]["details"][0]["field"] == "max_cost"
    _nothing_created(ft)
    assert ft.created(max_cost=260_000)["status"] == "queued"


def test_too_little_balance_is_402_and_creates_nothing(make_client: Callable[..., TestClient]) -> None:
    ft = FineTunes(make_client(billing_enabled=True))
    response = ft.create()
    assert response.status_code == 402 and response.json()["error"]["code"] == "insufficient_balance"
    _nothing_created(ft)


def test_users_list_only_their_fine_tunes(ft: FineTunes) -> None:
    made = [ft.created(suffix=f"run{i}")["id"] for i in range(3)]
    first = ft.client.get(URL, headers=ft.user, params={"limit": 2}).json()
    assert first["object"] == "list" and first["has_more"] is True
    rest = ft.client.get(URL, headers=ft.user, params={"after": first["data"][-1]["id"]}).json()
    assert rest["has_more"] is False
    assert sorted(j["id"] for j in first["data"] + rest["data"]) == sorted(made)
    register(ft.client, "other@example.com", "user")
    other = login(ft.client, "other@example.com")
    assert ft.client.get(URL, headers=other).json()["data"] == []
    assert ft.client.get(f"{URL}/{made[0]}", headers=other).status_code == 404
    assert ft.client.post(f"{URL}/{made[0]}/cancel", headers=other).status_code == 404
    assert ft.client.get(f"{URL}/{made[0]}/events", headers=other).status_code == 404
    # `all` is an administrator's: anyone else still gets only their own.
    assert ft.client.get(URL, headers=other, params={"all": True}).json()["data"] == []


def test_admins_see_every_users_fine_tunes_when_they_ask(ft: FineTunes) -> None:
    made = ft.created(gpus=64)["id"]  # no node has 64 GPUs: it stays queued
    admin = make_admin(ft.client)
    assert ft.client.get(URL, headers=admin).json()["data"] == []  # by default their own, like jobs
    listed = ft.client.get(URL, headers=admin, params={"all": True}).json()["data"]
    assert [(j["id"], j["organization_id"]) for j in listed] == [(made, ft.user_id)]
    assert ft.client.get(f"{URL}/{made}", headers=admin).json()["id"] == made
    assert ft.client.get(f"{URL}/{made}/events", headers=admin).json()["data"]
    cancelled = ft.client.post(f"{URL}/{made}/cancel", headers=admin)
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"


def _steps(steps: range, total: int, seconds_per_step: float) -> bytes:
    """The trainer's metrics lines of ``steps``, each timed by its clock (``elapsed_s``)."""
    return b"".join(
        _line("metrics", step=s, total_steps=total, loss=3.0 - s / 100, elapsed_s=s * seconds_per_step)
        for s in steps
    )


def test_eta_and_expected_cost_come_from_the_trainers_step_rate_when_steps_arrive_in_bursts(
    clock: TestClock, make_client: Callable[..., TestClient]
) -> None:
    # Billing on (attempts are priced only then), its metering loop left to the test.
    ft = FineTunes(make_client(billing_enabled=True, metering_interval_s=3600.0))
    admin = make_admin(ft.client)
    prices = {"prices": [{"product": PRODUCT, "price_per_hour_yuan": "7.20", "fee_percent": "10"}]}
    assert ft.client.put("/api/v1/admin/prices", headers=admin, json=prices).status_code == 200
    top_up = {"user_id": ft.user_id, "amount_yuan": "100", "note": "test"}
    assert ft.client.post("/api/v1/admin/top-ups", headers=admin, json=top_up).status_code == 201
    fine_tune, _ = ft.running()
    started = ft.get(fine_tune["id"])
    assert started["estimated_finish"] is None and started["cost"]["expected_total"] is None
    job_id = fine_tune["job_id"]
    # The trainer runs a step every 2 s. A backlog of 15 steps arrives at once, the next 5 a second
    # later: by arrival, 10 steps took 1 s; by the trainer's clock, 18 s.
    backlog = _steps(range(1, 16), 50, 2.0)
    assert ft.log(job_id, 1, 0, backlog).status_code == 200
    clock.advance(1)
    rest = _steps(range(16, 21), 50, 2.0)
    assert ft.log(job_id, 1, len(backlog), rest).status_code == 200
    now = ft.get(fine_tune["id"])
    # 30 steps left at 2 s each: a minute more, and a minute of one GPU at 7.20 CNY an hour.
    assert now["estimated_finish"] == int(clock.now.timestamp()) + 60
    assert now["cost"]["expected_total"] - now["cost"]["so_far"] == 120_000
    assert now["progress"]["percent"] == 40.0
    # Twenty seconds on, the next batch: 20 steps left.
    clock.advance(20)
    more = _steps(range(21, 31), 50, 2.0)
    assert ft.log(job_id, 1, len(backlog) + len(rest), more).status_code == 200
    later = ft.get(fine_tune["id"])
    assert later["estimated_finish"] == int(clock.now.timestamp()) + 40
    assert later["cost"]["expected_total"] - later["cost"]["so_far"] == 80_000


def test_lines_without_the_trainers_clock_give_no_eta(ft: FineTunes) -> None:
    """A trainer older than ``elapsed_s``: no rate is better than one from arrival times."""
    fine_tune, _ = ft.running()
    lines = b"".join(_line("metrics", step=s, total_steps=50, loss=1.0) for s in range(1, 21))
    assert ft.log(fine_tune["job_id"], 1, 0, lines).status_code == 200
    assert ft.get(fine_tune["id"])["estimated_finish"] is None


def test_bad_cursors_name_the_parameter(ft: FineTunes) -> None:
    made = ft.created()["id"]
    events = ft.client.get(f"{URL}/{made}/events", headers=ft.user, params={"after": "ftevent-x"})
    assert events.status_code == 422 and events.json()["error"]["details"][0]["field"] == "after"
    checkpoints = ft.client.get(f"{URL}/{made}/checkpoints", headers=ft.user, params={"after": "ftckpt-no"})
    assert checkpoints.status_code == 422 and checkpoints.json()["error"]["details"][0]["field"] == "after"
    assert ft.client.get(URL, headers=ft.user, params={"after": "ftjob-none"}).status_code == 404


def test_the_percent_done_is_the_steps_share_rounded_to_two_places(ft: FineTunes) -> None:
    """7 of 100 steps read 7.0 in the API, not 100 × 0.07 = 7.000000000000001; 1 of 3, 33.33."""
    fine_tune, _ = ft.running()
    job_id = fine_tune["job_id"]
    assert ft.log(job_id, 1, 0, _line("metrics", step=7, total_steps=100, loss=1.0)).status_code == 200
    assert ft.get(fine_tune["id"])["progress"]["percent"] == 7.0
    line = _line("metrics", step=1, total_steps=3, loss=1.0)
    size = len(_line("metrics", step=7, total_steps=100, loss=1.0))
    assert ft.log(job_id, 1, size, line).status_code == 200
    assert ft.get(fine_tune["id"])["progress"] == {"step": 1, "total_steps": 3, "percent": 33.33}
