"""Rates usage, charges the day's storage of saved workspaces, counts GPU time offered, releases held
earnings, and stops the work of users whose balance is empty."""

from __future__ import annotations

import asyncio
import logging
import time

from sxwl.cloud.context import CloudContext
from sxwl.cloud.services.devenvs import storage
from sxwl.cloud.services.jobs import balance_stop
from sxwl.cloud.services.money import earnings, metering, offers

log = logging.getLogger("sxwl.metering")


RELEASE_EVERY_S = 600.0  # earnings are held for days: releasing more often gains nothing


def one_round(ctx: CloudContext, release: bool) -> None:
    result = metering.meter_once(ctx)
    if result.rated:
        log.debug("rated %d attempts, %d micro-yuan", result.rated, result.charged)
    if charged := storage.charge_once(ctx):
        log.debug("charged %d saved workspaces for today", charged)
    offers.account_once(ctx)
    if release:
        earnings.release_once(ctx)
    for job_id in balance_stop.stop_exhausted(ctx):
        log.info("job %s: balance exhausted, stopping it", job_id, extra={"event": "balance_exhausted"})


async def run(ctx: CloudContext) -> None:
    released_at = -RELEASE_EVERY_S
    while not ctx.notifier.stopping:
        release = time.monotonic() - released_at >= min(RELEASE_EVERY_S, ctx.settings.earnings_hold_s or 1)
        try:
            await asyncio.to_thread(one_round, ctx, release)
            if release:
                released_at = time.monotonic()
        except Exception:
            # A failed round (the database restarting, say) rates nothing; the next one catches up.
            log.exception("metering round failed")
        await asyncio.sleep(ctx.settings.metering_interval_s)
