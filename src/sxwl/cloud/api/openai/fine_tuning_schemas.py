"""The fine-tuning API's objects, in OpenAI's shapes (``fine_tuning.job``, its events and
checkpoints) with our extensions after OpenAI's fields. Money is micro-yuan."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel


class HyperparametersOut(BaseModel):
    n_epochs: int
    batch_size: int
    learning_rate_multiplier: float


class FineTuneErrorOut(BaseModel):
    code: str
    message: str
    param: str | None = None


class ProgressOut(BaseModel):
    step: int
    total_steps: int
    percent: float | None


class CostOut(BaseModel):
    so_far: int
    expected_total: int | None


class FineTuningJobOut(BaseModel):
    id: str
    object: Literal["fine_tuning.job"] = "fine_tuning.job"
    model: str
    created_at: int
    finished_at: int | None
    fine_tuned_model: str | None
    organization_id: str
    result_files: list[str]
    status: str
    validation_file: str | None
    training_file: str
    hyperparameters: HyperparametersOut
    trained_tokens: int | None
    error: FineTuneErrorOut | None
    seed: int
    estimated_finish: int | None
    suffix: str | None
    # Ours: the job underneath, the adapter's shape, the GPUs, progress and money.
    job_id: str
    lora: dict[str, Any]
    gpu_product: str | None
    gpus: int
    progress: ProgressOut
    cost: CostOut
    # Ours, where OpenAI's object has no place for it: what a queued fine-tune waits for, or why it
    # failed or was cancelled (null otherwise). The `openai` client keeps it as an extra field.
    reason: str | None


class FineTuningJobListOut(BaseModel):
    object: Literal["list"] = "list"
    data: list[FineTuningJobOut]
    has_more: bool


class FineTuningEventOut(BaseModel):
    object: Literal["fine_tuning.job.event"] = "fine_tuning.job.event"
    id: str
    created_at: int
    level: str
    message: str
    type: str
    data: dict[str, Any] | None


class FineTuningEventListOut(BaseModel):
    object: Literal["list"] = "list"
    data: list[FineTuningEventOut]
    has_more: bool


class CheckpointMetricsOut(BaseModel):
    step: int
    train_loss: float | None = None
    valid_loss: float | None = None


class FineTuningCheckpointOut(BaseModel):
    object: Literal["fine_tuning.job.checkpoint"] = "fine_tuning.job.checkpoint"
    id: str
    created_at: int
    fine_tuned_model_checkpoint: str
    step_number: int
    metrics: CheckpointMetricsOut
    fine_tuning_job_id: str


class FineTuningCheckpointListOut(BaseModel):
    object: Literal["list"] = "list"
    data: list[FineTuningCheckpointOut]
    has_more: bool
    first_id: str | None = None
    last_id: str | None = None
