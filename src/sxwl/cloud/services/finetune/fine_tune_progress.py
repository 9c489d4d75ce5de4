"""A fine-tune's progress, read out of its job's log as the agent appends it (docs/finetune.md):
the trainer's progress lines become events and the fine-tune's progress columns, in the same
transaction as the append, so what the log says and what the fine-tune shows never disagree."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from sxwl.cloud.db.finetune_models import DataFile, FineTune
from sxwl.cloud.db.models import AttemptLog, Job
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.services.finetune import fine_tune_events, fine_tune_outputs
from sxwl.cloud.services.jobs.log_chunks import read_bytes
from sxwl.protocol.finetune import DatasetCount, Progress, parse_progress
from sxwl.protocol.reasons import Reason

# The most log bytes one append reads: an append is a few KiB, so this only bounds a backlog (the
# first append after a cloud upgrade, say). What is left is read by the next append.
MAX_READ = 1 << 20


def absorb(session: Session, job: Job, attempt: int, log: AttemptLog, fresh_at: int, fresh: bytes) -> None:
    """Reads the attempt's output from where the fine-tune last stopped, up to the last complete
    line. Offsets count the bytes the agent sent: the log's kept part is read where it is stored;
    past its cap, the lines of each append are read as they come (``fresh``, sent from ``fresh_at``),
    and a line split between two appends there is missed."""
    fine_tune = session.scalar(select(FineTune).where(FineTune.job_id == job.id).with_for_update())
    if fine_tune is None:
        return
    if fine_tune.parsed_attempt != attempt:
        fine_tune.parsed_attempt, fine_tune.parsed_offset = attempt, 0
    # The first byte not kept: the kept log and the bytes sent coincide before it.
    kept_end = log.kept if log.dropped_at is None else log.dropped_at
    start = fine_tune.parsed_offset
    if start < kept_end:
        start = max(start, log.archived)  # what moved to the store was parsed long ago
        window = read_bytes(
            session, job_id=job.id, attempt=attempt, offset=start, limit=min(MAX_READ, kept_end - start)
        )
        if start + len(window) < kept_end or fresh_at + len(fresh) <= kept_end:
            fine_tune.parsed_offset = start + _lines(session, fine_tune, attempt, window)
            return
        if fresh_at <= kept_end:  # this append crosses the cap: what it drops continues the kept lines
            window += fresh[kept_end - fresh_at :][: MAX_READ - len(window)]
            fine_tune.parsed_offset = start + _lines(session, fine_tune, attempt, window)
            return
        _lines(session, fine_tune, attempt, window)  # the rest of its last line was dropped
        start = kept_end
    if start < fresh_at:
        # The line this append continues began in bytes that were dropped: read from the next one.
        cut = fresh.find(b"\n")
        if cut < 0:
            fine_tune.parsed_offset = fresh_at + len(fresh)
            return
        start = fresh_at + cut + 1
    window = fresh[start - fresh_at :][:MAX_READ]
    fine_tune.parsed_offset = start + _lines(session, fine_tune, attempt, window)


def _lines(session: Session, fine_tune: FineTune, attempt: int, window: bytes) -> int:
    """Applies the progress lines among the complete lines of ``window``; returns the bytes read."""
    end = window.rfind(b"\n")
    if end < 0:
        # One line longer than the whole window is no progress line (those are short): skip it.
        return len(window) if len(window) >= MAX_READ else 0
    found = []
    for raw in window[: end + 1].splitlines():
        progress = parse_progress(raw.decode("utf-8", "replace"))
        if progress is not None:
            _apply(session, fine_tune, attempt, progress)
            found.append(progress)
    # A checkpoint's upload can overtake the log lines of its step: they give it its losses.
    fine_tune_outputs.steps_logged(session, fine_tune, attempt, found)
    return end + 1


def _apply(session: Session, fine_tune: FineTune, attempt: int, progress: Progress) -> None:
    if progress.total_steps:
        fine_tune.total_steps = progress.total_steps
    if progress.kind in ("metrics", "eval", "done", "resumed"):
        fine_tune.step = progress.step  # a resumed attempt starts again from its checkpoint's step
    if progress.loss is not None and progress.kind == "metrics":
        fine_tune.loss = progress.loss  # the training loss: the one logged at the latest step
    if progress.eval_loss is not None:
        fine_tune.eval_loss = progress.eval_loss
    if progress.tokens_per_s is not None:
        fine_tune.tokens_per_s = progress.tokens_per_s
    if progress.trained_tokens is not None:
        fine_tune.trained_tokens = progress.trained_tokens
    fine_tune.progress_at = utcnow()
    if progress.kind in ("metrics", "eval"):
        data = {
            "step": progress.step,
            "total_steps": progress.total_steps or fine_tune.total_steps,
            "loss": progress.loss,
            "eval_loss": progress.eval_loss,
            "learning_rate": progress.learning_rate,
            "tokens_per_s": progress.tokens_per_s,
            "epoch": progress.epoch,
            "elapsed_s": progress.elapsed_s,
        }
        code = "ft.step" + ("_loss" if progress.loss is not None else "")
        code += "_eval" if progress.eval_loss is not None else ""
        message = Reason.of(
            code, step=progress.step, total=data["total_steps"], loss=progress.loss, eval=progress.eval_loss
        )
        fine_tune_events.add(session, fine_tune, message, attempt=attempt, type="metrics", data=data)
    elif progress.kind == "dataset" and progress.dataset is not None:
        _count_tokens(session, fine_tune, attempt, progress.dataset)
    elif progress.kind == "started":
        fine_tune_events.add(session, fine_tune, _started(progress.message), attempt=attempt)
    elif progress.kind == "resumed":
        resumed = Reason.of("ft.resumed", step=progress.step, attempt=attempt)
        fine_tune_events.add(session, fine_tune, resumed, attempt=attempt)
    elif progress.kind == "done":
        done = Reason.text(progress.message) if progress.message else Reason.of("ft.done")
        fine_tune_events.add(session, fine_tune, done, attempt=attempt)
    # "checkpoint" lines only announce an upload: the checkpoint counts once its artifact arrives.


def _count_tokens(session: Session, fine_tune: FineTune, attempt: int, count: DatasetCount) -> None:
    """Keeps what the base model's tokenizer made of the file on the file, and says it in an event."""
    file_id = fine_tune.training_file if count.file == "training_file" else fine_tune.validation_file
    file = session.get(DataFile, file_id) if file_id else None
    if file is None:
        return
    counts = count.model_dump(exclude={"file"})
    file.token_counts = {**file.token_counts, fine_tune.model_name: counts}  # a new dict: JSON columns
    text = Reason.of(
        "ft.tokens_training" if count.file == "training_file" else "ft.tokens_validation",
        file=file.id,
        examples=count.examples,
        tokens=count.tokens,
        trained=count.loss_tokens,
        model=fine_tune.model_name,
    )
    fine_tune_events.add(session, fine_tune, text, attempt=attempt, data=counts)
    if count.dropped:
        dropped = Reason.of("ft.dropped", n=count.dropped, file=file.id)
        fine_tune_events.add(session, fine_tune, dropped, attempt=attempt, level="warn")


def _started(message: str | None) -> Reason:
    """The trainer says where it runs as "on <device>" (sxwl.trainer.progress)."""
    if message and message.startswith("on "):
        return Reason.of("ft.started_on", device=message[3:])
    return Reason.text(message) if message else Reason.of("ft.started")
