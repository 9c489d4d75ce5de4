"""Marks CPods unknown, then offline, when their heartbeats stop."""

from __future__ import annotations

import asyncio
import logging

from sxwl.cloud.context import CloudContext
from sxwl.cloud.db.types import utcnow
from sxwl.cloud.services.fleet import cpods

log = logging.getLogger("sxwl.liveness")


async def run(ctx: CloudContext) -> None:
    started = utcnow()
    while not ctx.notifier.stopping:
        try:
            for cpod_id, status in await asyncio.to_thread(cpods.sweep_liveness, ctx, None, started):
                log.info("cpod %s is now %s", cpod_id, status.value, extra={"event": "cpod_" + status.value})
        except Exception:
            # One failed sweep (say, the database restarting) must not end liveness for good.
            log.exception("liveness sweep failed")
        await asyncio.sleep(ctx.settings.liveness_check_s)
