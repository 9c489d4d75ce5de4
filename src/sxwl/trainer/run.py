"""One fine-tune: the base model with a LoRA adapter, trained by ``transformers.Trainer`` on the
run's data, checkpointed and resumed through tars, the adapter written at the end."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING
from torch import nn
from torch.utils.data import Dataset
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PrinterCallback,
    Trainer,
    TrainingArguments,
    set_seed,
)
from transformers.utils import logging as hf_logging

from sxwl.protocol.finetune import ADAPTER_ARTIFACT, BASE_LEARNING_RATE, Progress, TrainerRun
from sxwl.trainer import TrainerError
from sxwl.trainer.artifacts import unpack, write_tar
from sxwl.trainer.data import IGNORE, Example, load_examples
from sxwl.trainer.progress import Reporter, emit

# Metric points a run reports at most (about): every step for the short runs of a small dataset.
MAX_LOG_POINTS = 500


class Examples(Dataset[dict[str, list[int]]]):
    def __init__(self, examples: list[Example]) -> None:
        self.examples = examples

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        e = self.examples[i]
        return {"input_ids": e.input_ids, "labels": e.labels}


class Collator:
    """Right-pads a batch: pad ids masked out of attention, -100 labels out of the loss."""

    def __init__(self, pad_id: int) -> None:
        self.pad_id = pad_id

    def __call__(self, batch: list[dict[str, list[int]]]) -> dict[str, torch.Tensor]:
        width = max(len(b["input_ids"]) for b in batch)
        ids, labels, mask = [], [], []
        for b in batch:
            gap = width - len(b["input_ids"])
            ids.append(b["input_ids"] + [self.pad_id] * gap)
            labels.append(b["labels"] + [IGNORE] * gap)
            mask.append([1] * len(b["input_ids"]) + [0] * gap)
        return {
            "input_ids": torch.tensor(ids, dtype=torch.long),
            "labels": torch.tensor(labels, dtype=torch.long),
            "attention_mask": torch.tensor(mask, dtype=torch.long),
        }


def output_dir_of(run: TrainerRun) -> Path:
    """$SXWL_OUTPUT_DIR as the agent sets it (the directory it uploads), else the run's."""
    return Path(os.environ.get("SXWL_OUTPUT_DIR") or run.output_dir)


def target_modules(model: nn.Module, model_type: str) -> list[str] | None:
    """None where peft knows the architecture's LoRA targets; else the names of the Linear layers
    inside attention blocks, or of all Linear layers but the output head when none is found."""
    if model_type in TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING:
        return None
    linear = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    attention = {n.rsplit(".", 1)[-1] for n in linear if "attn" in n or "attention" in n}
    names = attention or {n.rsplit(".", 1)[-1] for n in linear} - {"lm_head"}
    if not names:
        raise TrainerError(
            f"no Linear layer to put LoRA on in this {model_type} model: give lora.target_modules"
        )
    return sorted(names)


def load_base(model_dir: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    if not (model_dir / "config.json").is_file():
        raise TrainerError(f"model_dir: {model_dir} is not a model directory (no config.json)")
    dtype = torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float32
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        # Safetensors only, as the cloud accepts (docs/trainer.md): pickled weights beside them,
        # or an index naming one, are never opened, so nothing of the directory is unpickled.
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, use_safetensors=True)
    except (OSError, ValueError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise TrainerError(
            f"model_dir: cannot load a causal LM and its tokenizer from {model_dir}: {first}"
        ) from e
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def checkpoint_from(tar: str, scratch: Path) -> Path:
    """The checkpoint unpacked, once its trainer state reads: the Trainer's own failure on a
    foreign tar would be a traceback."""
    path = Path(tar)
    if not path.is_file():
        raise TrainerError(f"resume_from: {tar} not found")
    dest = scratch / "resume"
    unpack(path, dest)
    try:
        int(json.loads((dest / "trainer_state.json").read_text())["global_step"])
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise TrainerError(f"resume_from: {tar} is not a trainer checkpoint ({e})") from e
    return dest


def train(run: TrainerRun) -> None:
    # The job's log is read by people and the cloud: no progress bars in it.
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    output = output_dir_of(run)
    output.mkdir(parents=True, exist_ok=True)
    set_seed(run.seed)
    model_dir = Path(run.model_dir)
    if not model_dir.is_dir():
        raise TrainerError(f"model_dir: {model_dir} not found")
    base, tokenizer = load_base(model_dir)
    loaded = load_examples(
        tokenizer, Path(run.training_file), where="training_file", max_seq_len=run.max_seq_len
    )
    emit(Progress(kind="dataset", dataset=loaded.count("training_file")))
    training = loaded.examples
    validation = None
    if run.validation_file:
        loaded = load_examples(
            tokenizer, Path(run.validation_file), where="validation_file", max_seq_len=run.max_seq_len
        )
        emit(Progress(kind="dataset", dataset=loaded.count("validation_file")))
        validation = loaded.examples
    lora = LoraConfig(
        r=run.lora.rank,
        lora_alpha=run.lora.alpha,
        lora_dropout=run.lora.dropout,
        target_modules=run.lora.target_modules or target_modules(base, str(base.config.model_type)),
        task_type="CAUSAL_LM",
    )
    model = get_peft_model(base, lora)
    hp = run.hyperparameters
    steps_per_epoch = math.ceil(len(training) / hp.batch_size)
    total = steps_per_epoch * hp.n_epochs
    cuda = torch.cuda.is_available()
    with tempfile.TemporaryDirectory(prefix="sxwl-trainer-") as scratch_name:
        scratch = Path(scratch_name)
        resume_dir = checkpoint_from(run.resume_from, scratch) if run.resume_from else None
        every = run.checkpoint_every_steps
        args = TrainingArguments(
            output_dir=str(scratch / "trainer"),
            num_train_epochs=hp.n_epochs,
            per_device_train_batch_size=hp.batch_size,
            per_device_eval_batch_size=hp.batch_size,
            learning_rate=BASE_LEARNING_RATE * hp.learning_rate_multiplier,
            seed=run.seed,
            data_seed=run.seed,
            logging_strategy="steps",
            logging_steps=max(1, total // MAX_LOG_POINTS),
            eval_strategy="epoch" if validation else "no",
            save_strategy="steps" if every else "epoch",
            save_steps=every or 500,
            include_num_input_tokens_seen="non_padding",
            report_to="none",
            disable_tqdm=True,
            use_cpu=not cuda,
            bf16=cuda and torch.cuda.is_bf16_supported(),
            dataloader_num_workers=0,
        )
        trainer = Trainer(
            model=model,
            args=args,
            train_dataset=Examples(training),
            eval_dataset=Examples(validation) if validation else None,
            # Any id pads: padded positions are out of attention and of the loss.
            data_collator=Collator(tokenizer.pad_token_id if isinstance(tokenizer.pad_token_id, int) else 0),
        )
        # Our progress lines are the run's report; the Trainer's printed dicts would repeat them.
        trainer.remove_callback(PrinterCallback)
        device = f"cuda ({torch.cuda.get_device_name()})" if cuda else "cpu"
        trainer.add_callback(Reporter(output_dir=output, resuming=resume_dir is not None, device=device))
        trainer.train(resume_from_checkpoint=str(resume_dir) if resume_dir else None)
        adapter = scratch / "adapter"
        trained = trainer.model
        assert isinstance(trained, PeftModel)
        trained.save_pretrained(str(adapter))
        tokenizer.save_pretrained(adapter)
        write_tar(adapter, output / ADAPTER_ARTIFACT)
    emit(
        Progress(
            kind="done",
            step=trainer.state.global_step,
            total_steps=trainer.state.max_steps,
            epoch=trainer.state.epoch,
            trained_tokens=trainer.state.num_input_tokens_seen,
        )
    )
