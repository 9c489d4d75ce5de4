"""Runs scheduling passes when woken (submit, heartbeat, job end) and at least every interval."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from sxwl.cloud.context import CloudContext
from sxwl.cloud.services import scheduler

log = logging.getLogger("sxwl.scheduler")


async def run(ctx: CloudContext) -> None:
    wake = ctx.notifier.scheduler
    while not ctx.notifier.stopping:
        wake.clear()
        try:
            assigned = await asyncio.to_thread(scheduler.schedule_once, ctx)
            for item in assigned:
                log.info(
                    "job %s attempt %d assigned to CPod %s",
                    item.job_id,
                    item.attempt,
                    item.cpod_id,
                    extra={"event": "job_assigned"},
                )
        except Exception:
            log.exception("scheduling pass failed")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), timeout=ctx.settings.scheduler_interval_s)
