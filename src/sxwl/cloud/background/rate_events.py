"""Deletes rate-limit events that have left every window, so the table holds only live ones."""

from __future__ import annotations

import asyncio
import logging

from sxwl.cloud.context import CloudContext
from sxwl.cloud.kit import ratelimit

log = logging.getLogger("sxwl.ratelimit")

# Expired events are never counted (the limiter's queries skip them); this only bounds the table.
SWEEP_EVERY_S = 60.0


async def run(ctx: CloudContext) -> None:
    while not ctx.notifier.stopping:
        try:
            await asyncio.to_thread(ratelimit.sweep, ctx.db)
        except Exception:
            # One failed sweep (say, the database restarting) must not end the sweeping for good.
            log.exception("rate event sweep failed")
        await asyncio.sleep(SWEEP_EVERY_S)
