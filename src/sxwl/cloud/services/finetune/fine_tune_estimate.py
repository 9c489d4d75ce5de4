"""How far a fine-tune is, when it will end and what it will cost: the percent of its steps done, an
ETA from the recent step rate (the last few metrics events, timed by the trainer, so a slow start or
a resume does not skew it), the cost so far and the expected total. None wherever it is not known
yet."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from sxwl.cloud.db.finetune_models import FineTune, FineTuneEvent
from sxwl.cloud.db.models import TERMINAL_STATES, Job, JobAttempt
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.services.money import billing
from sxwl.protocol.jobs import JobFields
from sxwl.protocol.money import cost

RECENT_EVENTS = 10
# Before a fine-tune runs, its cost is guessed: the time to fetch the inputs and load the model,
# then a time per optimizer step. A LoRA step of a small model at batch size 4 and 512 tokens takes
# well under a second on one GPU and a few on CPUs; 2 s is a middle guess, stated as a guess.
STARTUP_GUESS_S = 120
STEP_GUESS_S = 2.0


@dataclass(frozen=True)
class Estimate:
    percent: float | None
    finish_at: datetime | None
    cost_so_far: int
    expected_total: int | None


def planned_steps(examples: int, batch_size: int, n_epochs: int) -> int:
    return max(1, math.ceil(examples / batch_size)) * n_epochs


def guessed_cost(session: Session, spec: JobFields, steps: int) -> int | None:
    """What a fine-tune of ``steps`` steps would cost at the current price (None: no price yet)."""
    return billing.estimate(session, spec, STARTUP_GUESS_S + math.ceil(steps * STEP_GUESS_S))


def step_rate(session: Session, fine_tune: FineTune) -> float | None:
    """Steps per second over the latest metrics events of the current attempt, timed by the
    trainer's own clock (``elapsed_s``): the agent ships the log in batches, so when the lines reached
    the cloud says nothing of when their steps ran. Lines without it (a trainer older than the
    field) give no rate."""
    rows = session.scalars(
        select(FineTuneEvent.data)
        .where(
            FineTuneEvent.fine_tune_id == fine_tune.id,
            FineTuneEvent.type == "metrics",
            FineTuneEvent.attempt == fine_tune.parsed_attempt,
        )
        .order_by(FineTuneEvent.id.desc())
        .limit(RECENT_EVENTS)
    ).all()
    points = [
        (float(data["elapsed_s"]), int(data["step"]))
        for data in rows
        if data and isinstance(data.get("elapsed_s"), int | float) and isinstance(data.get("step"), int)
    ]
    if len(points) < 2:
        return None
    (last_s, last_step), (first_s, first_step) = points[0], points[-1]
    seconds = last_s - first_s
    if seconds <= 0 or last_step <= first_step:
        return None
    return float((last_step - first_step) / seconds)


def estimate(session: Session, fine_tune: FineTune, job: Job, now: datetime | None = None) -> Estimate:
    return estimates(session, [(fine_tune, job)], now)[0]


def estimates(
    session: Session, pairs: list[tuple[FineTune, Job]], now: datetime | None = None
) -> list[Estimate]:
    """``estimate`` of each fine-tune of a page: its cost and price read for the whole page at once,
    and a step rate (one indexed query of at most ``RECENT_EVENTS`` rows) only for those still
    running, which are few on any page."""
    now = now or utcnow()
    costs = billing.job_costs(session, [job.id for _, job in pairs], now)
    live = [job.id for fine_tune, job in pairs if job.state not in TERMINAL_STATES and fine_tune.total_steps]
    attempts = billing.attempts_of(session, live) if live else {}
    found = []
    for fine_tune, job in pairs:
        so_far = costs[job.id]
        # The step times 100 first, then one division rounded to two places: 7 of 100 steps is 7.0,
        # not 100 × 0.07 = 7.000000000000001.
        total = fine_tune.total_steps
        percent = min(100.0, round(100 * fine_tune.step / total, 2)) if total else None
        if job.state in TERMINAL_STATES:
            found.append(Estimate(percent, None, so_far.cost, so_far.cost))
            continue
        rate = step_rate(session, fine_tune) if fine_tune.total_steps else None
        if rate is None:
            found.append(Estimate(percent, None, so_far.cost, None))
            continue
        remaining_s = max(0, fine_tune.total_steps - fine_tune.step) / rate
        finish_at = (fine_tune.progress_at or now) + timedelta(seconds=remaining_s)
        per_hour = so_far.per_hour or _last_price(attempts.get(job.id, []), job)
        remaining_us = max(0, int((finish_at - now).total_seconds() * 1_000_000))
        found.append(Estimate(percent, finish_at, so_far.cost, so_far.cost + cost(1, per_hour, remaining_us)))
    return found


def _last_price(attempts: list[JobAttempt], job: Job) -> int:
    """What the job's current attempt was placed at, per hour (0 when not placed)."""
    placed = next((a for a in attempts if a.attempt == job.attempt), None)
    return placed.units * placed.price_per_hour if placed is not None else 0
