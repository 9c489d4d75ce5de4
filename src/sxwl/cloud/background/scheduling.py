"""Runs scheduling passes when woken (submit, heartbeat, job end) and at least every interval."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from sxwl.cloud.context import CloudContext
from sxwl.cloud.kit import metrics
from sxwl.cloud.services.scheduling import scheduler

log = logging.getLogger("sxwl.scheduler")

# Passes start at most this often: a burst of submits or heartbeats shares one pass instead of
# queueing a pass each, and a lone wake-up after a quiet spell still starts one at once.
MIN_GAP_S = 0.05


async def run(ctx: CloudContext) -> None:
    wake = ctx.notifier.scheduler
    loop = asyncio.get_running_loop()
    while not ctx.notifier.stopping:
        wake.clear()
        started = loop.time()
        try:
            with metrics.SCHEDULING_PASS.time():
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
        await asyncio.sleep(max(0.0, started + MIN_GAP_S - loop.time()))
