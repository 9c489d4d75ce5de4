"""A fine-tune as the cloud, the agent and the trainer speak of it (docs/finetune.md): the user's
hyperparameters and LoRA settings with their limits, what an attempt fetches onto its CPod, the spec
the trainer runs, and the progress lines it prints."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, ValidationError, ValidatorFunctionWrapHandler, WrapValidator

from sxwl.protocol.fields import Int64, Name, NonNegInt64, Strict, Text, Wire, WireIn
from sxwl.protocol.jobs import MAX_GPUS_PER_NODE

MAX_EPOCHS = 50
MAX_BATCH_SIZE = 256
MAX_LR_MULTIPLIER = 10.0
DEFAULT_EPOCHS = 3
DEFAULT_BATCH_SIZE = 4
# The learning rate a multiplier of 1 gives: a usual one for LoRA adapters.
BASE_LEARNING_RATE = 2e-4
MAX_SEQ_LEN = 8192

Auto = Literal["auto"]


def _auto_or(what: str) -> WrapValidator:
    """One error naming the field for a value that is neither "auto" nor a number in range, rather
    than one per branch of the union (``n_epochs.constrained-int``, ``n_epochs.literal['auto']``)."""

    def check(value: object, handler: ValidatorFunctionWrapHandler) -> object:
        try:
            return handler(value)
        except ValidationError:
            raise ValueError(f'must be "auto" or {what}') from None

    return WrapValidator(check)


class Hyperparameters(Strict):
    """OpenAI's names and "auto" (the default) for each; ``resolved`` gives the numbers used."""

    n_epochs: Annotated[
        Annotated[int, Field(ge=1, le=MAX_EPOCHS)] | Auto, _auto_or(f"an integer from 1 to {MAX_EPOCHS}")
    ] = "auto"
    batch_size: Annotated[
        Annotated[int, Field(ge=1, le=MAX_BATCH_SIZE)] | Auto,
        _auto_or(f"an integer from 1 to {MAX_BATCH_SIZE}"),
    ] = "auto"
    learning_rate_multiplier: Annotated[
        Annotated[float, Field(gt=0, le=MAX_LR_MULTIPLIER)] | Auto,
        _auto_or(f"a number above 0 and at most {MAX_LR_MULTIPLIER:g}"),
    ] = "auto"

    def resolved(self) -> ResolvedHyperparameters:
        return ResolvedHyperparameters(
            n_epochs=DEFAULT_EPOCHS if self.n_epochs == "auto" else self.n_epochs,
            batch_size=DEFAULT_BATCH_SIZE if self.batch_size == "auto" else self.batch_size,
            learning_rate_multiplier=1.0
            if self.learning_rate_multiplier == "auto"
            else self.learning_rate_multiplier,
        )


class ResolvedHyperparameters(Wire):
    n_epochs: int = Field(ge=1, le=MAX_EPOCHS)
    batch_size: int = Field(ge=1, le=MAX_BATCH_SIZE)
    learning_rate_multiplier: float = Field(gt=0, le=MAX_LR_MULTIPLIER)


class LoraSettings(Wire):
    """Our extension of OpenAI's body: the adapter's shape. ``target_modules`` None: the
    architecture's attention projections, as peft chooses them for known architectures."""

    rank: int = Field(default=8, ge=1, le=256)
    alpha: int = Field(default=16, ge=1, le=1024)
    dropout: float = Field(default=0.05, ge=0, le=0.5)
    target_modules: list[Name] | None = Field(default=None, min_length=1, max_length=32)


SUFFIX = r"^[A-Za-z0-9_.-]{1,40}$"


class LoraIn(Strict, LoraSettings):
    """``LoraSettings`` in a request body: unknown fields refused, no coercion."""

    model_config = Strict.model_config  # not Wire's, which ignores unknown fields


class FineTuneRequest(Strict):
    """A fine-tune to create: OpenAI's body (``POST /v1/fine_tuning/jobs``) with our extensions
    (``lora``, the GPUs, a cost cap). The REST API, the console's form and ``sxwl finetune create``
    validate with it."""

    model: Name = Field(min_length=1, max_length=200)
    training_file: Name = Field(min_length=1, max_length=40)
    validation_file: Name | None = Field(default=None, min_length=1, max_length=40)
    hyperparameters: Hyperparameters = Field(default_factory=Hyperparameters)
    suffix: str | None = Field(default=None, pattern=SUFFIX)
    seed: int | None = Field(default=None, ge=0, le=2**31 - 1)
    lora: LoraIn = Field(default_factory=LoraIn)
    gpu_product: Name | None = Field(default=None, min_length=1, max_length=128)
    gpus: int = Field(default=0, ge=0, le=MAX_GPUS_PER_NODE)  # 0: on CPUs (tiny models, tests)
    max_cost: NonNegInt64 | None = None  # micro-yuan; refused at creation when the estimate is higher


# A dev environment's mounts are ``model-<i>`` and ``file-<i>``, and its saved ``workspace``
# (protocol/devenvs.py); an endpoint's replica fetches its ``adapter`` beside its ``model``.
InputName = (
    Literal["model", "training_file", "validation_file", "resume", "workspace", "adapter"]
    | Annotated[str, Field(pattern=r"^(model|file)-[0-9]{1,2}$")]
)


class JobInput(Wire):
    """A file an attempt needs on its CPod, fetched from the cloud (``paths.JOB_INPUT``) once per
    sha256 and kept in the CPod's cache. ``archive``: a tar the agent unpacks (a model's directory,
    a checkpoint) rather than a file it hands over as it is."""

    name: InputName
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: NonNegInt64
    archive: bool = False


class TrainerSpec(Wire):
    """What the trainer is asked to do (``Assignment.trainer``): the same for every attempt."""

    hyperparameters: ResolvedHyperparameters
    lora: LoraSettings = Field(default_factory=LoraSettings)
    seed: int = Field(default=42, ge=0, le=2**31 - 1)
    max_seq_len: int = Field(default=512, ge=8, le=MAX_SEQ_LEN)
    # None: a checkpoint at the end of each epoch.
    checkpoint_every_steps: int | None = Field(default=None, ge=1)


class TrainerRun(TrainerSpec):
    """A ``TrainerSpec`` with where the agent put each input on the CPod: the file the trainer reads."""

    model_dir: str
    training_file: str
    validation_file: str | None = None
    resume_from: str | None = None  # a checkpoint's tar, when an earlier attempt saved one
    output_dir: str


# Files the trainer writes under $SXWL_OUTPUT_DIR. A checkpoint appears in CHECKPOINT_DIR by a rename,
# complete, and the agent uploads it while the job runs; the adapter is uploaded at the end.
CHECKPOINT_DIR = "checkpoints"
ADAPTER_ARTIFACT = "adapter.tar"


def checkpoint_artifact(step: int) -> str:
    return f"{CHECKPOINT_DIR}/step-{step:08d}.tar"


# A line of the job's output that starts with this is progress (one JSON object follows), which the
# cloud turns into the fine-tune's events; other lines are the log as usual.
PROGRESS_PREFIX = "::sxwl-progress:: "

ProgressKind = Literal["dataset", "started", "resumed", "metrics", "eval", "checkpoint", "done"]
DatasetRole = Literal["training_file", "validation_file"]


class DatasetCount(Wire):
    """What the base model's tokenizer made of a file, as the trainer tokenized it (kind "dataset"):
    the examples kept and their tokens after truncation to ``max_seq_len``, the tokens the loss is
    computed on, and the examples dropped for having none within ``max_seq_len``."""

    file: DatasetRole
    examples: NonNegInt64
    tokens: NonNegInt64
    loss_tokens: NonNegInt64
    dropped: NonNegInt64 = 0


class Progress(Wire):
    kind: ProgressKind
    step: NonNegInt64 = 0
    total_steps: NonNegInt64 = 0
    epoch: float | None = None
    loss: float | None = None
    eval_loss: float | None = None
    learning_rate: float | None = None
    tokens_per_s: float | None = None
    trained_tokens: NonNegInt64 | None = None
    # Seconds since the attempt's training began, by the trainer's own clock (kinds "metrics" and
    # "eval"): the step rate comes from these, not from when lines reach the cloud, which is in
    # batches of many steps.
    elapsed_s: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    checkpoint: Text | None = Field(default=None, max_length=1024)  # its artifact path, kind "checkpoint"
    dataset: DatasetCount | None = None  # kind "dataset"
    message: Text | None = Field(default=None, max_length=500)


def progress_line(progress: Progress) -> str:
    return PROGRESS_PREFIX + progress.model_dump_json(exclude_none=True)


# What a Kubernetes CPod puts before each line of a pod's log (kube_logs.py); a fine-tune has one
# rank, so only rank 0's lines are its progress.
RANK_0 = "[rank 0] "


def parse_progress(line: str) -> Progress | None:
    """The progress a log line carries, or None (an ordinary line, or a malformed one: a job's
    output never breaks the cloud)."""
    line = line.removeprefix(RANK_0)
    if not line.startswith(PROGRESS_PREFIX):
        return None
    try:
        return Progress.model_validate_json(line[len(PROGRESS_PREFIX) :])
    except ValueError:
        return None


class CachedInput(WireIn):
    """One entry of a CPod's input cache, as its heartbeat reports it."""

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: Int64 = Field(ge=0)
