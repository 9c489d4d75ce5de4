"""Removes what stopped dev environments left: their workspaces on their CPods and their saved tars
in the artifact store (services/devenvs/cleanup.py)."""

from __future__ import annotations

import asyncio
import logging

from sxwl.cloud.context import CloudContext
from sxwl.cloud.services.devenvs import cleanup

log = logging.getLogger("sxwl.dev_envs")


async def run(ctx: CloudContext) -> None:
    while not ctx.notifier.stopping:
        try:
            told, deleted = await cleanup.sweep(ctx)
            if told or deleted:
                log.info(
                    "stopped dev environments: %d workspaces to remove, %d saved tars deleted", told, deleted
                )
        except Exception:
            log.exception("clean-up of stopped dev environments failed")  # the next sweep tries again
        await asyncio.sleep(ctx.settings.dev_env_idle_check_s)
