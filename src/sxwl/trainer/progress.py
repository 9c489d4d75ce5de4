"""Progress lines on stdout (``protocol.finetune.progress_line``), which the cloud turns into the
fine-tune's events, and the checkpoint tars, from ``transformers.Trainer``'s callbacks."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from sxwl.protocol.finetune import Progress, ProgressKind, checkpoint_artifact, progress_line
from sxwl.trainer.artifacts import write_tar


def emit(progress: Progress) -> None:
    sys.stdout.write(progress_line(progress) + "\n")
    sys.stdout.flush()


class Reporter(TrainerCallback):
    def __init__(self, *, output_dir: Path, resuming: bool, device: str) -> None:
        self.output_dir = output_dir
        self.resuming = resuming
        self.device = device
        self._began = 0.0
        self._last_time = 0.0
        self._last_tokens = 0

    def _progress(self, kind: ProgressKind, state: TrainerState, **fields: object) -> Progress:
        return Progress.model_validate(
            {"kind": kind, "step": state.global_step, "total_steps": state.max_steps, **fields}
        )

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        self._began = self._last_time = time.monotonic()
        self._last_tokens = state.num_input_tokens_seen
        # The Trainer has loaded the checkpoint's state by now: global_step is where it goes on from.
        kind: ProgressKind = "resumed" if self.resuming else "started"
        emit(self._progress(kind, state, epoch=state.epoch, message=f"on {self.device}"))

    def on_log(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        logs: dict[str, float] | None = None,
        **kwargs: object,
    ) -> None:
        if not logs or "loss" not in logs:
            return  # the evaluation's and the run's summary logs: on_evaluate and the end say those
        now = time.monotonic()
        tokens = state.num_input_tokens_seen
        elapsed = now - self._last_time
        rate = (tokens - self._last_tokens) / elapsed if elapsed > 0 else None
        self._last_time, self._last_tokens = now, tokens
        emit(
            self._progress(
                "metrics",
                state,
                epoch=state.epoch,
                loss=float(logs["loss"]),
                learning_rate=float(logs["learning_rate"]) if "learning_rate" in logs else None,
                tokens_per_s=rate,
                trained_tokens=tokens,
                elapsed_s=now - self._began,
            )
        )

    def on_evaluate(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,
        metrics: dict[str, float] | None = None,
        **kwargs: object,
    ) -> None:
        if metrics and "eval_loss" in metrics:
            elapsed = time.monotonic() - self._began
            loss = float(metrics["eval_loss"])
            emit(self._progress("eval", state, epoch=state.epoch, eval_loss=loss, elapsed_s=elapsed))

    # A checkpoint's metrics are those logged at its step: where a save falls between two logging
    # steps, the step is logged too (the Trainer logs, evaluates, then saves, after these callbacks).
    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        if control.should_save:
            control.should_log = True

    def on_epoch_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        if control.should_save:
            control.should_log = True

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: object
    ) -> None:
        # The Trainer has written checkpoint-N in its scratch dir; the tar is what survives the attempt.
        saved = Path(str(args.output_dir)) / f"checkpoint-{state.global_step}"
        artifact = checkpoint_artifact(state.global_step)
        write_tar(saved, self.output_dir / artifact)
        shutil.rmtree(saved, ignore_errors=True)
        emit(self._progress("checkpoint", state, epoch=state.epoch, checkpoint=artifact))
